"""The head family: training from frozen features, save/load with the model's fingerprint."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from dicosa import functional as DF
from dicosa.checkpoint import CheckpointError, save_checkpoint
from dicosa.config import Config, ConfigError
from dicosa.heads import Head, HeadMismatchError, head_class, load_head, register_head, save_head
from dicosa.heads.features import HeadData, SplitFeatures
from dicosa.heads.train import train_head
from dicosa.model import DiCoSA, TextFeatures, VideoFeatures

from .conftest import tiny_checkpoint, tiny_config


@dataclass(frozen=True)
class ProbeConfig:
    steps: int = 60
    lr: float = 0.05


@register_head
class ProbeHead(Head):
    """A linear map of text vectors onto video proxies, trained with InfoNCE: the smallest
    head that learns something, used to test the family's machinery."""

    kind = "test-probe"
    Config = ProbeConfig

    def __init__(self, config: ProbeConfig, dim: int):
        super().__init__(config)
        self.dim = dim
        self.proj = torch.nn.Linear(dim, dim, bias=False)

    def init_args(self) -> dict:
        return {"dim": self.dim}

    def forward(self, text: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.proj(text), dim=-1)

    def loss(self, data: SplitFeatures) -> torch.Tensor:
        proxy = F.normalize(DF.video_proxy(data.video.frames, data.video.frame_mask), dim=-1)
        logits = self(data.text.text) @ proxy.T / 0.1  # [C, V]
        return F.cross_entropy(logits, data.caption_video)

    @classmethod
    def fit(cls, model, data: HeadData, config: ProbeConfig, *, seed=0, progress=True):
        torch.manual_seed(seed)
        head = cls(config, data.train.text.text.shape[1])
        optimizer = torch.optim.Adam(head.parameters(), lr=config.lr)
        head.fit_report = {"loss_before": head.loss(data.train).item()}
        for _ in range(config.steps):
            optimizer.zero_grad()
            head.loss(data.train).backward()
            optimizer.step()
        head.fit_report["loss_after"] = head.loss(data.train).item()
        return head.eval()


def _features(num_videos=16, frames=3, dim=8, seed=0) -> SplitFeatures:
    g = torch.Generator().manual_seed(seed)
    video = torch.randn(num_videos, frames, dim, generator=g)
    # Captions are noisy, rotated copies of their video's mean: learnable by a linear map.
    rotation = torch.linalg.qr(torch.randn(dim, dim, generator=g))[0]
    caption_video = torch.arange(num_videos).repeat(2)
    text = video.mean(1)[caption_video] @ rotation + 0.05 * torch.randn(2 * num_videos, dim,
                                                                        generator=g)
    return SplitFeatures("toy", [f"c{i}" for i in range(len(text))], caption_video,
                         TextFeatures(text), VideoFeatures(video, torch.ones(num_videos, frames,
                                                                             dtype=torch.bool)),
                         [f"v{i}" for i in range(num_videos)])


@pytest.fixture(scope="module")
def model() -> DiCoSA:
    torch.manual_seed(0)
    return DiCoSA.from_config(tiny_config()).eval()


def test_a_head_learns_and_round_trips_with_its_fingerprint(model, tmp_path):
    data = HeadData(_features(), None)
    head = ProbeHead.fit(model, data, ProbeConfig(), seed=1)
    assert head.fit_report["loss_after"] < 0.5 * head.fit_report["loss_before"]
    path = save_head(head, tmp_path / "probe.pt", model, {"note": "unit test"})
    loaded = load_head(path, model)
    assert isinstance(loaded, ProbeHead) and not loaded.training
    assert loaded.config == head.config and loaded.trained["note"] == "unit test"
    assert "date" in loaded.trained
    text = data.train.text.text
    torch.testing.assert_close(loaded(text), head(text), rtol=0, atol=0)


def test_a_head_of_another_model_is_one_sentence(model, tmp_path):
    head = ProbeHead(ProbeConfig(), 8)
    path = save_head(head, tmp_path / "probe.pt", model)
    torch.manual_seed(1)
    other = DiCoSA.from_config(tiny_config()).eval()
    with pytest.raises(HeadMismatchError) as exc:
        load_head(path, other)
    message = str(exc.value)
    assert "trained on a model with different weights" in message and "\n" not in message
    assert "heads train test-probe" in message
    with pytest.raises(HeadMismatchError, match="holds a 'test-probe' head, not a 'lexical'"):
        load_head(path, model, kind="lexical")
    load_head(path)  # no model: inspection only, no check


def test_files_that_are_not_heads(model, tmp_path):
    training = tmp_path / "best.pt"
    save_checkpoint(training, {"model": model.state_dict(), "config": Config().to_yaml()})
    with pytest.raises(HeadMismatchError, match="is not a dicosa head file"):
        load_head(training, model)
    # 256 KiB of weights: the byte at a third of the file lies inside them, and torch.load
    # alone would return the damaged weights without complaint.
    path = save_head(ProbeHead(ProbeConfig(), 256), tmp_path / "probe.pt", model)
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupted: its contents no longer match"):
        load_head(path, model)


def test_head_configs_reject_unknown_keys_and_kinds():
    assert ProbeHead.make_config({"steps": "5"}).steps == 5
    with pytest.raises(ConfigError, match="did you mean 'steps'"):
        ProbeHead.make_config({"step": 5})
    with pytest.raises(ValueError, match=r"unknown head 'nope'; known heads: .*test-probe"):
        head_class("nope")


def test_train_head_from_a_checkpoint_encodes_once(tmp_path, monkeypatch):
    model, checkpoint, _ = tiny_checkpoint(tmp_path)

    path = train_head("test-probe", checkpoint, tmp_path / "probe.pt", ["steps=3"], seed=2,
                      progress=False)
    head = load_head(path, model)
    assert head.config.steps == 3
    assert head.trained["train_split"].endswith(":train") and head.trained["seed"] == 2
    assert head.trained["val_split"].endswith(":val")
    assert sorted(p.name.split("-")[1] for p in (checkpoint.parent / "cache").iterdir()) == [
        "text", "text", "video", "video"]  # train and val, texts and videos

    # A second head on the same checkpoint reads the features back: decoding would fail.
    import dicosa.evaluation as evaluation

    monkeypatch.setattr(evaluation, "encode_videos", lambda *a, **k: 1 / 0)
    train_head("test-probe", checkpoint, tmp_path / "again.pt", progress=False)
    assert dataclasses.asdict(load_head(tmp_path / "again.pt", model).config) == {
        "steps": 60, "lr": 0.05}


def test_head_features_are_decoded_and_cached_per_frame_protocol(tmp_path, monkeypatch):
    """Heads learn from the frames their checkpoint's model saw: ``head_data`` decodes with
    its config's protocol, and the cache keeps the protocols apart."""
    import dicosa.evaluation as evaluation
    from dicosa.checkpoint import load
    from dicosa.data.datasets import load_split
    from dicosa.data.protocol import FrameProtocol
    from dicosa.heads.features import head_data, split_features

    model, checkpoint, root = tiny_checkpoint(tmp_path, num_train=3, val_fraction=0.0)
    split = load_split("synthetic", root, "9k")
    cache = tmp_path / "cache"
    released = FrameProtocol("released", "mean")
    plain = split_features(model, split, frames=FrameProtocol(), cache_dir=cache)
    other = split_features(model, split, frames=released, cache_dir=cache)
    # 0.5 s at 8 fps: released keeps frame 0 (1 fps), segments all 4.
    assert other.video.frame_mask.sum(1).tolist() == [1, 1, 1]
    assert plain.video.frame_mask.sum(1).tolist() == [4, 4, 4]
    assert len(list(cache.glob("head-video-*"))) == 2

    # Read back, each under its own protocol: decoding again would fail.
    monkeypatch.setattr(evaluation, "encode_videos", lambda *a, **k: 1 / 0)
    cfg = load(checkpoint)[1]
    for frames, expected in ((FrameProtocol(), plain), (released, other)):
        data = dataclasses.replace(cfg.data, frame_sampling=frames.sampling,
                                   frame_padding=frames.padding)
        got = head_data(model, dataclasses.replace(cfg, data=data), cache_dir=cache).train
        assert torch.equal(got.video.frames, expected.video.frames)
        assert torch.equal(got.video.frame_mask, expected.video.frame_mask)
