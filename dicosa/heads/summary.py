"""A first-stage summary distilled from DiCoSA's own scores (``summary="distilled"``).

DiCoSA's S(t, v) pools the frames under the text (Eq. 1) and weighs the K factor cosines by
a query-and-video dependent confidence MLP (Eq. 8): no single query-independent vector per
video reproduces it, and the hand-made linearisation of :mod:`dicosa.search.proxy`
(``"confidence"``) misses much of the exhaustive top 10. This head *learns* the two halves
instead:

    S(t, v)  ≈  q(t) · u(v)

- u(v) = [ W_v [mean_i φ(x_i) ; max_i φ(x_i)] ; c(v) ]: a frame MLP φ over each frame x_i
  (its feature f_i and, with ``confidence``, the confidence summary of that frame), pooled
  by the masked mean and max (max keeps what the sharp text pooling of Eq. 1 sees in one
  frame), projected to ``dim``; then the ``"confidence"`` summary c(v) of the dense proxy.
- q(t) = [ MLP(T ; c(t)) ; α c(t) ]: the same for the text, the MLP's last layer zero at
  start, so training starts exactly at the ``"confidence"`` summary and only improves on it.

Training needs no labels: DiCoSA's exhaustive S of unlabelled captions against unlabelled
videos is the teacher, and a listwise KL divergence (:func:`_distillation_loss`) teaches
above all the order at the head of each ranking, which is what the candidates must hold.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..functional import video_proxy
from ..model import DiCoSA, TextFeatures, VideoFeatures
from .base import Head

__all__ = ["SUMMARY_SUFFIX", "DistilledSummaryHead", "carried_summary", "cut_videos",
           "default_summary", "fit_summary", "summary_beside", "summary_fit_command",
           "teacher_scores"]

log = logging.getLogger(__name__)


class DistilledSummaryHead(Head):
    """Query-independent video vectors and query vectors whose inner product ranks as
    DiCoSA's S does (see the module)."""

    kind = "summary"

    @dataclass(frozen=True)
    class Config:
        dim: int = 128  # learned width; the stage vector adds 2D with ``confidence``
        hidden: int = 256
        confidence: bool = False  # also feed (and keep) the "confidence" summary
        steps: int = 1500
        lr: float = 2e-3
        tau: float = 0.02  # softmax temperature of the listwise distillation, in units of S
        queries_per_step: int = 32
        shared_videos: int = 2048  # random videos every caption of a step is scored against
        top: int = 32  # the teacher's best videos of each caption, in every step
        near: int = 64  # sampled from the teacher's ranks top..window
        window: int = 3000
        teacher_queries: int = 2000  # captions scored exhaustively against the videos
        sphere: bool = True  # one more coordinate puts every video vector on one sphere
        # Cut videos (:func:`cut_videos`) added to the training videos: this many per
        # training video, at most ``cuts_max``; 0 fits on the training videos alone.
        cuts_per_video: int = 64
        cuts_max: int = 20000
        cut_frame_drop: float = 0.3  # the share of a cut video's frames masked out


    def __init__(self, config: Config, embed_dim: int = 512, num_frames: int = 12,
                 calibration: dict | None = None, radius: float = 1.0):
        super().__init__(config)
        self.embed_dim, self.num_frames = embed_dim, num_frames
        self.calibration = calibration  # of the "confidence" summary, fixed at fit time
        self.radius = float(radius)  # of the sphere (``sphere``), fixed at fit time
        extra = 2 * embed_dim if config.confidence else 0
        h, m = config.hidden, config.dim
        self.frame = nn.Sequential(nn.Linear(embed_dim + extra, h), nn.GELU(),
                                   nn.Linear(h, h), nn.GELU())
        self.video_out = nn.Linear(2 * h, m)
        self.query = nn.Sequential(nn.Linear(embed_dim + extra, h), nn.GELU(),
                                   nn.Linear(h, h), nn.GELU(), nn.Linear(h, m))
        nn.init.zeros_(self.query[-1].weight)
        nn.init.zeros_(self.query[-1].bias)
        self.alpha = nn.Parameter(torch.tensor(1.0))  # weight of the confidence summary
        self.scale = nn.Parameter(torch.tensor(1.0))  # training only: student logit scale

    def init_args(self) -> dict:
        return {"embed_dim": self.embed_dim, "num_frames": self.num_frames,
                "calibration": self.calibration, "radius": self.radius}

    @property
    def out_dim(self) -> int:
        return (self.config.dim + (2 * self.embed_dim if self.config.confidence else 0)
                + int(self.config.sphere))

    def _on_sphere(self, vectors: Tensor) -> Tensor:
        """Append sqrt(R² − ‖u‖²) to video vectors (0 to queries): inner products do not
        change, and every video vector gets the norm R, so the inner product ranks as the L2
        distance does, which HNSW routes well (it routes badly over unequal norms)."""
        if not self.config.sphere:
            return vectors
        extra = (self.radius**2 - vectors.pow(2).sum(-1, keepdim=True)).clamp_min(0).sqrt()
        return torch.cat([vectors, extra], -1)

    def _confidence(self, model: DiCoSA):
        from ..search.proxy import Summary

        return Summary(model, "confidence", self.calibration)

    def videos(self, model: DiCoSA, video: VideoFeatures) -> Tensor:
        """``[n, N, D]`` frames (+ mask) -> ``[n, out_dim]`` stage vectors."""
        frames = video.frames.float()
        mask = video.frame_mask.to(frames.device)
        return self._on_sphere(self._videos(frames, mask, *self._frozen(model, frames, mask)))

    def _frozen(self, model: DiCoSA, frames: Tensor,
                mask: Tensor) -> tuple[Tensor | None, Tensor | None]:
        """The "confidence" summaries of each frame ``[n, N, 2D]`` and of the proxy
        ``[n, 2D]`` (None, None without ``confidence``)."""
        if not self.config.confidence:
            return None, None
        summary = self._confidence(model)
        n, num, width = frames.shape
        per_frame = torch.from_numpy(np.concatenate([
            summary.videos(frames[i:i + 8192].reshape(-1, width).cpu().numpy())
            for i in range(0, max(n, 1), 8192)])).view(n, num, -1)
        proxy = torch.from_numpy(summary.videos(video_proxy(frames, mask).cpu().numpy()))
        return per_frame.to(frames.device), proxy.to(frames.device)

    def _videos(self, frames: Tensor, mask: Tensor, per_frame: Tensor | None,
                proxy: Tensor | None) -> Tensor:
        inputs = frames if per_frame is None else torch.cat([frames, per_frame], -1)
        out = self.pool(inputs, mask)
        return out if proxy is None else torch.cat([out, proxy], -1)

    def pool(self, inputs: Tensor, mask: Tensor) -> Tensor:
        """The learned part: ``[n, N, in]`` per-frame inputs -> ``[n, dim]``."""
        hidden = self.frame(inputs)  # [n, N, h]
        weight = mask[..., None].to(hidden.dtype)
        mean = (hidden * weight).sum(1) / weight.sum(1).clamp_min(1)
        peak = hidden.masked_fill(~mask[..., None], float("-inf")).amax(1)
        # A row with no valid frame (indexed from its title alone) pools to zeros, not NaN,
        # which would poison the ANN index.
        peak = torch.where(mask.any(1, keepdim=True), peak, torch.zeros_like(peak))
        return self.video_out(torch.cat([mean, peak], -1))

    def queries(self, model: DiCoSA, text: Tensor) -> Tensor:
        """``[Q, D]`` text vectors -> ``[Q, out_dim]`` query vectors."""
        text = text.float()
        conf = None
        if self.config.confidence:
            conf = self._confidence(model).queries(text).float().to(text.device)
        out = self._queries(text, conf)
        return torch.cat([out, out.new_zeros(len(out), int(self.config.sphere))], -1)

    def _queries(self, text: Tensor, conf: Tensor | None) -> Tensor:
        if conf is None:
            return self.query(text)
        return torch.cat([self.query(torch.cat([text, conf], -1)), self.alpha * conf], -1)

    @classmethod
    def fit(cls, model: DiCoSA, data, config: Config, *, seed: int = 0,
            progress: bool = True) -> DistilledSummaryHead:
        """``data``: ``(videos: VideoFeatures, text: Tensor [Q, D])``, unlabelled videos and
        caption vectors (see :func:`fit_summary`), or a :class:`~dicosa.heads.features.
        HeadData` (its training split's videos and captions: few videos on the benchmarks,
        so prefer many unlabelled ones)."""
        if hasattr(data, "train"):
            # a seeded sample of the captions: a split lists each video's captions together,
            # so its first ``teacher_queries`` would describe only its first videos
            text = data.train.text.text
            pick = torch.randperm(len(text), generator=torch.Generator().manual_seed(seed))
            data = (data.train.video, text[pick[:config.teacher_queries]])
        videos, text = data
        return fit_summary(model, videos, text, config, seed=seed, progress=progress)


def cut_videos(videos: VideoFeatures, count: int, frame_drop: float,
               generator: torch.Generator) -> VideoFeatures:
    """``count`` videos cut from pairs of ``videos``: the first frames of one, the rest of
    another (a random cut point), then each frame masked out with probability
    ``frame_drop`` (one always kept).

    A training split shows the teacher few of the frame combinations a collection holds
    (new scenes mix objects and motions the training clips show apart). The teacher scores
    cut videos exactly, so the student learns S on more of them without any video beyond
    the training split."""
    frames, mask = videos.frames, videos.frame_mask  # [V, N, D], [V, N]
    total, num = mask.shape
    first = torch.randint(total, (count,), generator=generator)
    second = torch.randint(total, (count,), generator=generator)
    cut = torch.randint(1, max(num, 2), (count,), generator=generator)
    from_first = torch.arange(num)[None] < cut[:, None]  # [count, N]
    cut_frames = torch.where(from_first[..., None], frames[first], frames[second])
    cut_mask = torch.where(from_first, mask[first], mask[second])
    kept = torch.rand(count, num, generator=generator) >= frame_drop
    kept[torch.arange(count), torch.randint(num, (count,), generator=generator)] = True
    cut_mask = cut_mask & kept
    cut_mask[~cut_mask.any(1), 0] = True  # both halves padding: keep a (padded) frame
    return VideoFeatures(cut_frames, cut_mask)


@torch.inference_mode()
def teacher_scores(model: DiCoSA, text: Tensor, videos: VideoFeatures,
                   chunk: int = 1024, text_chunk: int = 256) -> Tensor:
    """DiCoSA's S of every text against every video, ``[Q, V]`` float16 on the CPU (the
    teacher), computed on the model's device. Blocks of ``text_chunk`` texts × ``chunk``
    videos bound the confidence activations (``[chunk, text_chunk, K, H]`` floats)."""
    param = next(model.parameters())
    text_features = TextFeatures(text.to(param.device, param.dtype))
    return torch.cat([model.score(text_features, videos[i:i + chunk].to(param.device, param.dtype),
                                  chunk=text_chunk).half().cpu()
                      for i in range(0, len(videos), chunk)], 1)


def fit_summary(model: DiCoSA, videos: VideoFeatures, text: Tensor,
                config: DistilledSummaryHead.Config | None = None, *, seed: int = 0,
                progress: bool = True) -> DistilledSummaryHead:
    """Distil DiCoSA's S into a :class:`DistilledSummaryHead` on CPU.

    Args:
        videos: unlabelled training videos, float ``[V, N, D]`` frames as DiCoSA encodes
            them (never the videos the summary will be evaluated on).
        text: caption vectors T ``[Q, D]`` (the first ``teacher_queries`` are used).
    """
    from ..search.proxy import Summary

    config = config or DistilledSummaryHead.Config()
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = model.eval()
    videos = VideoFeatures(videos.frames.float().cpu(), videos.frame_mask.cpu())
    training_videos = len(videos)
    cuts = min(config.cuts_per_video * training_videos, config.cuts_max)
    if cuts:
        extra = cut_videos(videos, cuts, config.cut_frame_drop, generator)
        videos = VideoFeatures(torch.cat([videos.frames, extra.frames]),
                               torch.cat([videos.frame_mask, extra.frame_mask]))
    text = text.float().cpu()[:config.teacher_queries]
    started = time.perf_counter()
    teacher = teacher_scores(model, text, videos).float()  # [Q, V]
    if progress:
        log.info("teacher: %d captions x %d videos in %.0f s", len(text), len(videos),
                 time.perf_counter() - started)
    window = min(config.window, len(videos))
    top = min(config.top, window)
    ranked = teacher.topk(window, dim=1).indices  # [Q, window]
    calibration = None
    if config.confidence:
        conf = Summary(model, "confidence")
        conf.calibrate(video_proxy(videos.frames, videos.frame_mask).numpy())
        calibration = conf.calibration
    head = DistilledSummaryHead(config, embed_dim=videos.frames.shape[-1],
                                num_frames=videos.frames.shape[1], calibration=calibration)
    with torch.no_grad():  # the frozen parts of the inputs, once
        prepared = _Prepared(head, model, videos, text)
    optimiser = torch.optim.Adam(head.parameters(), lr=config.lr)
    # OneCycleLR divides by its warm-up length, pct_start * steps - 1: never 0 (20 steps)
    warm_up = 0.05 if abs(0.05 * config.steps - 1) > 1e-9 else 0.06
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimiser, config.lr,
                                                   total_steps=config.steps, pct_start=warm_up)
    head.train()
    for step in range(1, config.steps + 1):
        loss = _distillation_loss(head, prepared, teacher, ranked, top, generator)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        schedule.step()
        if progress and (step % 100 == 0 or step == config.steps):
            log.info("summary head step %d/%d: loss %.4f (%.0f s)", step, config.steps,
                     loss.item(), time.perf_counter() - started)
    head.eval()
    with torch.no_grad():  # the sphere holds the training videos' vectors with a 25% margin
        norms = torch.cat([prepared.videos(head, ids).norm(dim=-1)
                           for ids in torch.arange(len(videos)).split(8192)])
    head.radius = 1.25 * float(norms.max())
    head.trained = {"videos": training_videos, "cut_videos": cuts, "captions": len(text),
                    "steps": config.steps,
                    "loss": float(loss.item()), "seconds": round(time.perf_counter() - started)}
    head.fit_report = dict(head.trained)  # what ``heads train`` records in the head file
    return head.eval()


def _distillation_loss(head: DistilledSummaryHead, prepared: _Prepared, teacher: Tensor,
                       ranked: Tensor, top: int, generator: torch.Generator) -> Tensor:
    """One step's KL divergence between the head's and DiCoSA's score distributions over a
    batch of captions, each against videos shared by the batch and its own teacher's top
    ``top`` (and ``config.near`` more from the rest of its ``ranked`` window)."""
    config = head.config
    queries, videos = teacher.shape  # [Q, V]
    window = ranked.shape[1]
    shared_count = min(config.shared_videos, videos)
    qs = torch.randint(queries, (config.queries_per_step,), generator=generator)
    shared = torch.randint(videos, (shared_count,), generator=generator)
    own = ranked[qs, :top]
    if window > top and config.near:
        near = torch.randint(top, window, (config.near,), generator=generator)
        own = torch.cat([own, ranked[qs][:, near]], 1)  # [B, top + near]
    # Each distinct video once: on a small training set most of a step's videos repeat.
    unique, where = torch.unique(torch.cat([shared, own.flatten()]), return_inverse=True)
    vec = prepared.videos(head, unique)[where]
    query = prepared.queries(head, qs)
    student = torch.cat([query @ vec[:shared_count].t(),
                         torch.einsum("bm,bcm->bc", query,
                                      vec[shared_count:].view(len(qs), own.shape[1], -1))], 1)
    target = torch.cat([teacher[qs][:, shared], teacher[qs[:, None], own]], 1)
    return F.kl_div(F.log_softmax(student * head.scale / config.tau, 1),
                    F.log_softmax(target / config.tau, 1), log_target=True,
                    reduction="batchmean")


class _Prepared:
    """The training set's inputs that do not change while training (the frozen summary)."""

    def __init__(self, head: DistilledSummaryHead, model: DiCoSA, videos: VideoFeatures,
                 text: Tensor):
        self.frames, self.mask = videos.frames, videos.frame_mask
        self.text = text
        self.per_frame, self.proxy = head._frozen(model, self.frames, self.mask)
        self.conf_text = None
        if head.config.confidence:
            self.conf_text = head._confidence(model).queries(text).float().cpu().clone()

    def videos(self, head: DistilledSummaryHead, ids: Tensor) -> Tensor:
        per_frame, proxy = ((None, None) if self.proxy is None
                            else (self.per_frame[ids], self.proxy[ids]))
        return head._videos(self.frames[ids], self.mask[ids], per_frame, proxy)

    def queries(self, head: DistilledSummaryHead, qs: Tensor) -> Tensor:
        return head._queries(self.text[qs], None if self.conf_text is None else self.conf_text[qs])


# -- the summary a checkpoint carries -----------------------------------------------------------
# A checkpoint ``best.pt`` carries its fitted summary as ``best.summary.pt`` beside it (a head
# file: the model's fingerprint inside, so a summary of another model is never used).
SUMMARY_SUFFIX = ".summary.pt"
# recall@10 of the exhaustive DiCoSA top 10 in the two-stage top 10 at C = 1,000, as
# benchmarks/RESULTS.md measures it, quoted in the notices below
_RECALL = {"distilled": 0.97, "confidence": 0.66, "frames": 0.78, "confidence-20k": 0.38,
           "frames-zero-shot": 0.98, "mean-zero-shot": 0.91}


def summary_beside(checkpoint: str | Path) -> Path:
    """Where the summary of ``checkpoint`` is kept: ``best.pt`` -> ``best.summary.pt``."""
    checkpoint = Path(checkpoint)
    return checkpoint.with_name(checkpoint.stem + SUMMARY_SUFFIX)


def summary_fit_command(checkpoint: str | Path) -> str:
    """The one command that fits the summary of ``checkpoint`` on its training data and
    keeps it where :func:`carried_summary` finds it."""
    return (f"dicosa heads train summary --checkpoint {checkpoint} "
            f"--out {summary_beside(checkpoint)}")


def carried_summary(checkpoint: str | Path, model: DiCoSA) -> DistilledSummaryHead | None:
    """The distilled summary fitted for ``checkpoint`` (:func:`summary_beside`), checked
    against ``model`` (the checkpoint's, loaded), or None when there is none or it was
    fitted for other weights (a ``best.pt`` rewritten after its summary was fitted)."""
    from .base import HeadMismatchError, load_head

    path = summary_beside(checkpoint)
    if not path.is_file():
        return None
    try:
        return load_head(path, model, kind="summary")
    except HeadMismatchError as exc:
        log.warning("not using %s: %s", path, exc)
        return None


def default_summary(checkpoint: str | Path | None, model: DiCoSA,
                    choice: str | None = None, backend: str | None = None
                    ) -> tuple[dict, str]:
    """The first-stage summary an index of ``model`` uses, as ``VideoIndex`` keyword
    arguments, and the one line that says which it is and what recall to expect.

    Args:
        checkpoint: the checkpoint ``model`` was loaded from (None: a model from a config).
        choice: the user's ``--summary``: ``"frames"``, ``"confidence"``, ``"distilled"``
            (the carried one, an error without it) or a head file; None takes the carried
            summary when there is one, else ``"frames"`` (``"confidence"`` on Milvus, which
            the per-frame stage does not run on).
        backend: the index's first-stage backend (None: the default, local).
    """
    from .base import load_head

    if choice not in (None, "confidence", "distilled", "frames"):
        head = load_head(choice, model, kind="summary")
        return ({"summary": "distilled", "summary_head": head},
                f"first stage: the distilled summary {choice}")
    head = carried_summary(checkpoint, model) if checkpoint is not None else None
    if choice == "distilled" and head is None:
        where = (f"{checkpoint} carries none ({summary_beside(checkpoint)})" if checkpoint
                 else "a model without a checkpoint carries none")
        raise ValueError(f"--summary distilled needs a fitted summary and {where}; fit one "
                         f"with: {summary_fit_command(checkpoint or 'CKPT')}")
    if head is not None and choice in (None, "distilled"):
        return ({"summary": "distilled", "summary_head": head},
                f"first stage: the distilled summary fitted with {checkpoint} (on the "
                f"synthetic benchmark it keeps ~{_RECALL['distilled']:.0%} of DiCoSA's top 10 "
                "at C=1,000 of 100k)")
    if choice is None:
        choice = "confidence" if backend == "milvus" else "frames"
    return {"summary": choice}, _untrained_notice(checkpoint, model, choice, backend)


def _untrained_notice(checkpoint: str | Path | None, model: DiCoSA, kind: str,
                      backend: str | None) -> str:
    """The line that says which summary an index without a fitted head uses (see
    :func:`default_summary`) and what recall to expect."""
    fit = (f"; fit a distilled summary (~{_RECALL['distilled']:.0%}) with: "
           f"{summary_fit_command(checkpoint)}" if checkpoint is not None else "")
    if not model.head.adaptive:  # e.g. the zero-shot preset: unit frames, no MLP
        if kind == "frames":
            return ("first stage: 'frames' (every frame's vector, a video ranked by its best "
                    f"frame: ~{_RECALL['frames-zero-shot']:.0%} of the zero-shot top 10 at "
                    "C=1,000 of 10k on generated clips, against "
                    f"~{_RECALL['mean-zero-shot']:.0%} for --summary confidence, the frame "
                    "mean)")
        return "first stage: the cosine of the frame mean (this model has no confidence MLP)"
    if kind == "frames":
        return ("first stage: 'frames' (every frame's confidence summary, a video ranked by "
                f"its best frame, no training needed: expect ~{_RECALL['frames']:.0%} of "
                f"DiCoSA's top 10 at C=1,000 of 20k, against ~{_RECALL['confidence-20k']:.0%} for "
                f"--summary confidence{fit})")
    milvus = (" (the 'frames' default runs on the local or exact backend, not milvus)"
              if backend == "milvus" else "")
    if checkpoint is None:
        return f"first stage: the 'confidence' summary{milvus}"
    return (f"first stage: the 'confidence' summary{milvus} ({checkpoint} carries no fitted "
            f"summary: expect two-stage search to keep ~{_RECALL['confidence']:.0%} of "
            f"DiCoSA's top 10 at C=1,000 of 100k rather than ~{_RECALL['distilled']:.0%}; fit "
            f"one with: {summary_fit_command(checkpoint)})")
