"""What the dense first stage indexes per video: a query-independent summary of DiCoSA's score.

DiCoSA's score is S = Σ_k g_k cos(e_k^t, e_k^v) with the confidence g_k = w_2ᵀ ReLU(a_k(t) +
b_k(v)) + b_2 (Eq. 8), where a is the MLP's text half (bias included) and b its video half.
Two summaries of a video are offered, both from the dense proxy p (the masked frame mean,
Eq. 1 at τ → ∞) so nothing but p is stored:

- ``"mean"``: cos(T, p), one D-vector per video. It ignores the factors and the confidences.
- ``"confidence"`` (default for models with adaptive pooling): the ReLU linearised around the
  collection's mean video half b̄, with each unit's slope its rate of being active (``m``,
  measured on the collection's own proxies used as pseudo-queries):
  g_k ≈ G_k(t) + c_k(v), G_k(t) = w_2ᵀ ReLU(a_k(t) + b̄_k) + b_2,
  c_k(v) = Σ_h m_kh w_2h (b_kh(v) − b̄_kh). Then S ≈ Σ_k G_k ê_k^t·ê_k^v + Σ_k c_k ê_k^t·ê_k^v,
  one inner product of 2D-vectors: query [G_k ê_k^t ; ê_k^t], video [ê_k^v ; c_k ê_k^v].

- ``"distilled"``: a learned head (:mod:`dicosa.heads.summary`) trained to rank as S does,
  from the frames (not only the proxy) and DiCoSA's own scores as the teacher; it needs the
  head (``VideoIndex(..., summary="distilled", summary_head=...)``) and reads every video's
  frames from the store when it is indexed.

How much of DiCoSA's exhaustive top 10 each keeps among the first stage's candidates:
docs/search.md, "The dense summary", and benchmarks/RESULTS.md, "Search quality".
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..model import DiCoSA, VideoFeatures

__all__ = ["SUMMARIES", "Summary"]

SUMMARIES = ("confidence", "mean", "distilled", "frames")
_CALIBRATION_ROWS = 1000


class Summary:
    """Maps dense proxies and text vectors to the first stage's vectors (see the module)."""

    def __init__(self, model: DiCoSA, kind: str, calibration: dict | None = None,
                 head=None):
        if kind not in SUMMARIES:
            raise ValueError(f"unknown first-stage summary {kind!r}: choose "
                             f"{', '.join(SUMMARIES)}")
        if kind == "distilled" and head is None:
            raise ValueError("the 'distilled' summary needs its trained head (summary_head=: "
                             "a dicosa.heads.summary.DistilledSummaryHead or its file)")
        self.model = model
        self.name = kind  # what the manifest records
        base = "confidence" if kind == "frames" else kind  # the vector of one video/frame
        self.kind = (base if model.head.adaptive or base in ("mean", "distilled")
                     else "factors")
        self.calibration = calibration  # {"mean_hidden": [K][H], "active": [K][H]}
        self.head = head  # the DistilledSummaryHead of "distilled"

    @property
    def dim(self) -> int:
        if self.kind == "distilled":
            return self.head.out_dim
        return 2 * self.model.embed_dim if self.kind == "confidence" else self.model.embed_dim

    @property
    def per_frame(self) -> bool:
        """Whether the stage holds every frame (:meth:`frames`) rather than one vector per
        video (:meth:`videos`)."""
        return self.name == "frames"

    @property
    def needs_frames(self) -> bool:
        """Whether the stage's input is computed from the frames (VideoFeatures) rather than
        the proxies."""
        return self.kind == "distilled" or self.per_frame

    @property
    def normalize(self) -> bool:
        """Whether the stage should L2-normalise (only the plain mean is a cosine)."""
        return self.kind == "mean"

    def calibrate(self, proxies: np.ndarray) -> None:
        """Measure b̄ and the active rates on (up to 1,000 of) the collection's proxies."""
        if self.kind != "confidence" or self.calibration is not None:
            return
        head = self.model.head
        with torch.inference_mode():
            sample = self._tensor(proxies[:_CALIBRATION_ROWS])
            mean_hidden = (head.frame_factors(sample) @ head.conf_video.t()).mean(0)  # [K, H]
            pseudo = head.text_factors(sample) @ head.conf_text.t() + head.conf_bias
            active = (pseudo + mean_hidden > 0).float().mean(0)  # [K, H]
        self.calibration = {"mean_hidden": mean_hidden.tolist(), "active": active.tolist()}

    def _tensor(self, array) -> Tensor:
        param = next(self.model.parameters())
        return torch.as_tensor(np.asarray(array), dtype=param.dtype, device=param.device)

    @torch.inference_mode()
    def videos(self, proxies) -> np.ndarray:
        """``[n, D]`` dense proxies (``"distilled"``: the VideoFeatures ``[n, N, D]``) ->
        ``[n, dim]`` float32 stage vectors."""
        if self.kind == "distilled":
            param = next(self.head.parameters())
            return self.head.videos(self.model, proxies.to(param.device)).float().cpu().numpy()
        if self.kind == "mean":
            return np.asarray(proxies, dtype=np.float32)
        head = self.model.head
        raw = head.frame_factors(self._tensor(proxies))  # [n, K, d]
        unit = F.normalize(raw, dim=-1)
        if self.kind == "factors":
            return unit.flatten(1).float().cpu().numpy()
        mean_hidden, active = self._stats(raw)
        w2 = head.conf_out.weight[0]
        shift = torch.einsum("kh,h,nkh->nk", active, w2,
                             raw @ head.conf_video.t() - mean_hidden)  # c_k(v) [n, K]
        return torch.cat([unit.flatten(1), (shift[..., None] * unit).flatten(1)],
                         dim=1).float().cpu().numpy()

    @torch.inference_mode()
    def frames(self, video: VideoFeatures) -> tuple[np.ndarray, np.ndarray]:
        """Every frame summarised as a video of one frame: ``[n, N, D]`` frames ->
        ``([n, N, dim] float32, [n, N] bool mask)``, the rows of the per-frame first stage
        (:mod:`dicosa.search.frames_stage`), compared with :meth:`queries`. Its max over a
        video's frames is the τ → 0 limit of Eq. 1's pooling, as the proxy is the τ → ∞ one.
        """
        if self.kind == "distilled":
            raise ValueError("the per-frame stage summarises frames with the 'confidence' or "
                             "'mean' summary; the distilled head pools frames itself")
        count, num, width = video.frames.shape
        flat = video.frames.reshape(-1, width).float().cpu().numpy()
        vectors = np.concatenate([self.videos(flat[i:i + 65536])
                                  for i in range(0, len(flat), 65536)] or
                                 [np.zeros((0, self.dim), np.float32)])
        return vectors.reshape(count, num, -1), video.frame_mask.cpu().numpy().astype(bool)

    @torch.inference_mode()
    def queries(self, text: Tensor) -> Tensor:
        """``[Q, D]`` text vectors -> ``[Q, dim]`` query vectors for the stage, on the
        model's device (the distilled head's for ``distilled``; ``mean`` returns ``text``)."""
        if self.kind == "distilled":
            return self.head.queries(self.model, text.to(next(self.head.parameters()).device))
        if self.kind == "mean":
            return text
        head = self.model.head
        param = next(self.model.parameters())
        raw = head.text_factors(text.to(param.device, param.dtype))  # [Q, K, d]
        unit = F.normalize(raw, dim=-1)
        if self.kind == "factors":
            return unit.flatten(1) / head.num_concepts
        mean_hidden, _ = self._stats(raw)
        hidden = raw @ head.conf_text.t() + head.conf_bias + mean_hidden  # [Q, K, H]
        weight = F.relu(hidden) @ head.conf_out.weight[0] + head.conf_out.bias[0]  # G_k [Q, K]
        return torch.cat([(weight[..., None] * unit).flatten(1), unit.flatten(1)], dim=1)

    def _stats(self, like: Tensor) -> tuple[Tensor, Tensor]:
        if self.calibration is None:
            raise RuntimeError("the confidence summary is used before calibration")
        return (torch.tensor(self.calibration["mean_hidden"], dtype=like.dtype,
                             device=like.device),
                torch.tensor(self.calibration["active"], dtype=like.dtype, device=like.device))
