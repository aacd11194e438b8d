"""dicosa.convert: the authors' released state-dict layout loads into dicosa exactly."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import yaml

from dicosa.__main__ import main
from dicosa.checkpoint import load, load_checkpoint
from dicosa.config import Config
from dicosa.convert import ConversionError, convert_checkpoint
from dicosa.model import DiCoSA
from tests.conftest import random_batch, tiny_config

MAX_POSITIONS = 12  # the released frame_position_embeddings hold more rows than N_v


def released_state_dict(model: DiCoSA) -> dict[str, torch.Tensor]:
    """``model``'s weights in the released code's key layout (the inverse of the mapping in
    dicosa.convert, written out independently), under DDP's ``module.`` prefix."""
    state = model.state_dict()
    out = {f"module.{k}": v for k, v in state.items() if k.startswith("clip.")}
    for key, value in state.items():
        if key.startswith("temporal.blocks."):
            out[key.replace("temporal.blocks.", "module.transformerClip.resblocks.")] = value
    position = state["temporal.position"]
    extra = torch.randn(MAX_POSITIONS - position.shape[0], position.shape[1])
    out["module.frame_position_embeddings.weight"] = torch.cat([position, extra])
    out["module.weight_fc.0.weight"] = torch.cat([state["head.conf_text"],
                                                  state["head.conf_video"]], dim=1)
    out["module.weight_fc.0.bias"] = state["head.conf_bias"]
    out["module.weight_fc.2.weight"] = state["head.conf_out.weight"]
    out["module.weight_fc.2.bias"] = state["head.conf_out.bias"]
    return out


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    folder = tmp_path_factory.mktemp("released")
    torch.manual_seed(3)
    model_cfg = tiny_config(variant="released")
    model = DiCoSA.from_config(model_cfg).eval()
    state = released_state_dict(model)
    assert not any(k.startswith("module.temporal.") or "head." in k for k in state)
    torch.save(state, folder / "best.pth")
    config = folder / "released.yaml"
    config.write_text(yaml.safe_dump({"protocol": "released",
                                      "model": dataclasses.asdict(model_cfg)}))
    return model, folder, config


def test_converted_checkpoint_scores_identically(released, tmp_path):
    model, folder, config = released
    out = convert_checkpoint(folder / "best.pth", tmp_path / "dicosa.pt", config)
    loaded, cfg = load(out)
    assert cfg.protocol == "released" and cfg.train.freeze_towers
    assert load_checkpoint(out)["converted_from"]["path"] == str(folder / "best.pth")
    batch = random_batch()
    with torch.no_grad():
        expected = model.score(model.encode_text(batch["tokens"]),
                               model.encode_video(batch["frames"], batch["frame_mask"]))
        got = loaded.score(loaded.encode_text(batch["tokens"]),
                           loaded.encode_video(batch["frames"], batch["frame_mask"]))
    torch.testing.assert_close(got, expected, rtol=0, atol=0)  # same weights, same code path


def test_unknown_and_missing_keys_are_listed_in_one_sentence(released, tmp_path, capsys):
    _, folder, config = released
    state = torch.load(folder / "best.pth")
    state["module.extra_head.weight"] = torch.zeros(2)
    del state["module.weight_fc.0.bias"]
    torch.save(state, tmp_path / "odd.pth")
    with pytest.raises(ConversionError) as exc:
        convert_checkpoint(tmp_path / "odd.pth", tmp_path / "out.pt", config)
    message = str(exc.value)
    assert "unknown keys: extra_head.weight" in message
    assert "missing dicosa weights: head.conf_bias" in message and "\n" not in message
    # The command line prints it as one line, with no traceback, and writes nothing.
    code = main(["convert", str(tmp_path / "odd.pth"), "--out", str(tmp_path / "out.pt"),
                 "--config", str(config)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: not a released DiCoSA checkpoint")
    assert "Traceback" not in err and not (tmp_path / "out.pt").exists()


def test_cli_converts_and_says_how_to_evaluate(released, tmp_path, capsys):
    _, folder, config = released
    code = main(["convert", str(folder / "best.pth"), "--out", str(tmp_path / "d.pt"),
                 "--config", str(config)])
    assert code == 0 and (tmp_path / "d.pt").exists()
    assert "python evaluate.py" in capsys.readouterr().out
    paper = Config(model=tiny_config(variant="paper"))
    with pytest.raises(ConversionError, match="variant"):
        from dicosa.convert import convert_released

        convert_released({}, paper.model, {})
