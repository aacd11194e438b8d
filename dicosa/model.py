"""DiCoSA's modules: the temporal transformer, the concept head, and the full model."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from open_clip.model import CLIP
from torch import Tensor, nn

from . import functional as DF
from .clip import CLIP_MEAN, CLIP_STD, clip_dims, encode_text_tokens, load_clip
from .config import ModelConfig
from .distributed import gather_features


@dataclass
class TextFeatures:
    """Text vectors T, ``[B_t, D]``."""

    text: Tensor

    def __len__(self) -> int:
        return self.text.shape[0]

    def to(self, device: torch.device | str | None = None,
           dtype: torch.dtype | None = None) -> TextFeatures:
        return TextFeatures(self.text.to(device=device, dtype=dtype))

    def __getitem__(self, index) -> TextFeatures:
        return TextFeatures(self.text[index])


@dataclass
class VideoFeatures:
    """Per-frame vectors after the temporal transformer, ``[B_v, N, D]``, and the frame mask."""

    frames: Tensor
    frame_mask: Tensor  # [B_v, N] bool, False for padding

    def __len__(self) -> int:
        return self.frames.shape[0]

    def to(self, device: torch.device | str | None = None,
           dtype: torch.dtype | None = None) -> VideoFeatures:
        return VideoFeatures(self.frames.to(device=device, dtype=dtype),
                             self.frame_mask.to(device=device))

    def __getitem__(self, index) -> VideoFeatures:
        return VideoFeatures(self.frames[index], self.frame_mask[index])


class TemporalTransformer(nn.Module):
    """Bidirectional transformer over the frame vectors of a video, with a residual around it.

    Its blocks and positional embedding start as copies of the first ``layers`` blocks and the
    first N_v positional rows of CLIP's text transformer (paper, Appendix B).
    """

    def __init__(self, clip: CLIP, layers: int, num_frames: int):
        super().__init__()
        dims = clip_dims(clip)
        if layers > dims["text_layers"]:
            raise ValueError(
                f"temporal_layers={layers} but CLIP's text transformer has only "
                f"{dims['text_layers']} blocks to initialise from"
            )
        if num_frames > dims["context_length"]:
            raise ValueError(f"num_frames={num_frames} exceeds CLIP's {dims['context_length']} "
                             "positional rows")
        if dims["embed_dim"] != dims["text_width"]:
            raise ValueError(
                f"frame vectors are {dims['embed_dim']}-d but CLIP's text blocks are "
                f"{dims['text_width']}-d; this architecture cannot initialise the temporal "
                "transformer"
            )
        self.num_heads = dims["text_heads"]
        self.position = nn.Parameter(clip.positional_embedding[:num_frames].detach().clone())
        self.blocks = nn.ModuleList(copy.deepcopy(b) for b in clip.transformer.resblocks[:layers])

    def forward(self, frames: Tensor, frame_mask: Tensor) -> Tensor:
        """``[B, N, D]`` frame vectors and ``[B, N]`` mask -> ``[B, N, D]``."""
        batch, num, _ = frames.shape
        if num > self.position.shape[0]:
            raise ValueError(f"{num} frames but the temporal transformer holds "
                             f"{self.position.shape[0]} positions")
        # Additive key-padding mask, one row per (video, head), as nn.MultiheadAttention takes it.
        key_mask = torch.zeros(batch, 1, 1, num, device=frames.device, dtype=frames.dtype)
        key_mask = key_mask.masked_fill(~frame_mask[:, None, None, :], float("-inf"))
        attn_mask = key_mask.expand(batch, self.num_heads, num, num).reshape(-1, num, num)
        x = frames + self.position[:num].to(frames.dtype)
        for block in self.blocks:
            x = block(x, attn_mask=attn_mask)
        return frames + x


class ConceptHead(nn.Module):
    """Concept factors (Eq. 2) and the confidence MLP of adaptive pooling (Eq. 8).

    ``variant="paper"`` learns a projection W_k per factor and modality (one D×D linear,
    reshaped to K×D/K); ``"released"`` splits the vector as it is.

    The projections start as the identity, i.e. as the released split: text and video
    factors then begin as aligned as CLIP's vectors are. Independent default initialisations
    scramble the two modalities differently (on ViT-B/32 the mean cosine of matched factors
    falls from 0.70 to 0.00) and the head has to relearn CLIP's alignment.
    """

    def __init__(self, dim: int, num_concepts: int, expansion: int = 4, project: bool = True,
                 adaptive: bool = True):
        super().__init__()
        if dim % num_concepts:
            raise ValueError(f"feature width {dim} is not divisible by K={num_concepts}")
        self.num_concepts = num_concepts
        width = dim // num_concepts
        self.text_proj = nn.Linear(dim, dim, bias=False) if project else None
        self.video_proj = nn.Linear(dim, dim, bias=False) if project else None
        if project:
            nn.init.eye_(self.text_proj.weight)
            nn.init.eye_(self.video_proj.weight)
        self.adaptive = adaptive
        if adaptive:
            # Linear(2D/K -> H) on [e^t; e^v], split into its text and video halves.
            hidden = expansion * width
            first = nn.Linear(2 * width, hidden)
            self.conf_text = nn.Parameter(first.weight[:, :width].detach().clone())  # [H, d]
            self.conf_video = nn.Parameter(first.weight[:, width:].detach().clone())  # [H, d]
            self.conf_bias = nn.Parameter(first.bias.detach().clone())  # [H]
            self.conf_out = nn.Linear(hidden, 1)

    def text_factors(self, text: Tensor) -> Tensor:
        """``[B_t, D] -> [B_t, K, d]``."""
        if self.text_proj is not None:
            text = self.text_proj(text)
        return DF.split_concepts(text, self.num_concepts)

    def frame_factors(self, frames: Tensor) -> Tensor:
        """``[B_v, N, D] -> [B_v, N, K, d]``; projecting frames then pooling equals pooling then
        projecting, and costs B_v·N rather than B_t·B_v projections."""
        if self.video_proj is not None:
            frames = self.video_proj(frames)
        return DF.split_concepts(frames, self.num_concepts)

    def text_hidden(self, text_factors: Tensor) -> Tensor | None:
        if not self.adaptive:
            return None
        return text_factors @ self.conf_text.t() + self.conf_bias  # [B_t, K, H]

    def frame_hidden(self, frame_factors: Tensor) -> Tensor | None:
        if not self.adaptive:
            return None
        return frame_factors @ self.conf_video.t()  # [B_v, N, K, H]

    def confidence(self, text_factors: Tensor, video_factors: Tensor) -> Tensor:
        """g_k = MLP([e_k^t; e_k^v]) for given factor pairs ``[..., K, d]`` -> ``[..., K]``."""
        if not self.adaptive:
            return torch.full(text_factors.shape[:-1], 1.0 / self.num_concepts,
                              device=text_factors.device)
        hidden = F.relu(text_factors @ self.conf_text.t() + video_factors @ self.conf_video.t()
                        + self.conf_bias)
        return self.conf_out(hidden).squeeze(-1)


class DiCoSA(nn.Module):
    """CLIP towers + temporal transformer + concept head; ``forward(batch)`` returns the losses."""

    # The fingerprint of the checkpoint a model was loaded from without some of its weights
    # (dicosa.checkpoint.load(towers="text")); None: it is computed from the weights held.
    recorded_fingerprint: dict | None = None

    def __init__(self, clip: CLIP, config: ModelConfig):
        super().__init__()
        self.config = config
        self.clip = clip
        dims = clip_dims(clip)
        self.embed_dim = dims["embed_dim"]
        self.image_size = dims["image_size"]
        self.num_concepts = config.num_concepts if config.use_factors else 1
        # temporal_layers 0: the frame vectors go to the head as CLIP's image tower gives them.
        self.temporal = (TemporalTransformer(clip, config.temporal_layers, config.num_frames)
                         if config.temporal_layers else None)
        self.head = ConceptHead(
            self.embed_dim,
            self.num_concepts,
            expansion=config.confidence_expansion,
            project=config.variant == "paper" and config.use_factors,
            adaptive=config.use_adaptive_pooling and config.use_factors,
        )
        self.mask_mode = "before" if config.variant == "paper" else "after"
        self.register_buffer("pixel_mean", torch.tensor(CLIP_MEAN).view(1, 3, 1, 1),
                             persistent=False)
        self.register_buffer("pixel_std", torch.tensor(CLIP_STD).view(1, 3, 1, 1),
                             persistent=False)
        self.set_grad_checkpointing(config.grad_checkpointing)
        self._similarity_fn = DF.concept_similarity

    @classmethod
    def from_config(cls, config: ModelConfig) -> DiCoSA:
        """Build the model and load CLIP weights as ``config.pretrained`` says."""
        return cls(load_clip(config.arch, config.pretrained), config)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute the image tower's activations in the backward pass (memory mode).

        The image tower holds nearly all activation memory (B·N_v frames × 50 tokens × 12
        blocks); the text tower (B × 32 tokens) and the temporal transformer (B × N_v) hold
        little, so recomputing them would cost time and save almost nothing.
        """
        self.clip.visual.set_grad_checkpointing(enable)

    def compile_towers(self, **compile_kwargs) -> None:
        """torch.compile the image and text towers and the temporal transformer in place
        (``nn.Module.compile`` keeps state-dict keys, so checkpoints are unaffected)."""
        self.clip.visual.compile(**compile_kwargs)
        self.clip.transformer.compile(**compile_kwargs)
        if self.temporal is not None:
            self.temporal.compile(**compile_kwargs)

    def compile_scoring(self, **compile_kwargs) -> None:
        """torch.compile the pairwise similarity (fuses the confidence MLP's epilogue)."""
        self._similarity_fn = torch.compile(DF.concept_similarity, **compile_kwargs)

    @property
    def logit_scale(self) -> Tensor:
        """1/τ' of Eq. 10: CLIP's learned scale, clamped at ``logit_scale_max`` (τ' = 0.01)."""
        return self.clip.logit_scale.exp().clamp(max=self.config.logit_scale_max)

    # -- encoders -------------------------------------------------------------------------
    def encode_text(self, tokens: Tensor, tower: Callable[[Tensor], Tensor] | None = None
                    ) -> TextFeatures:
        """``tokens [B_t, L]`` (L = max_words) -> T ``[B_t, D]`` (unit vectors with
        ``normalize_features``). ``tower``: another forward of CLIP's text tower to use (the
        CPU one of :mod:`dicosa.text_tower`); None: the model's own."""
        text = encode_text_tokens(self.clip, tokens) if tower is None else tower(tokens)
        return TextFeatures(F.normalize(text, dim=-1) if self.config.normalize_features
                            else text)

    def encode_video(self, frames: Tensor, frame_mask: Tensor | None = None) -> VideoFeatures:
        """``frames [B_v, N, 3, H, W]`` (uint8 0–255, or float already normalised) and
        ``frame_mask [B_v, N]`` -> per-frame vectors after the temporal transformer."""
        if frames.ndim != 5 or frames.shape[2] != 3:
            raise ValueError(f"frames must be [B, N, 3, H, W], got shape {tuple(frames.shape)}")
        batch, num = frames.shape[:2]
        if frame_mask is None:
            frame_mask = torch.ones(batch, num, dtype=torch.bool, device=frames.device)
        if frame_mask.shape != (batch, num):
            raise ValueError(f"frame_mask must be [{batch}, {num}], got {tuple(frame_mask.shape)}")
        frame_mask = frame_mask.bool()
        if not frame_mask.any(dim=1).all():
            raise ValueError("every video needs at least one valid frame (a row of frame_mask "
                             "is all False)")
        if frames.shape[-1] != self.image_size or frames.shape[-2] != self.image_size:
            raise ValueError(f"frames are {frames.shape[-2]}x{frames.shape[-1]} px but the image "
                             f"tower takes {self.image_size}x{self.image_size}")
        frame_vectors = self.encode_frames(frames.flatten(0, 1)).view(batch, num, -1)
        return self.contextualise(frame_vectors, frame_mask)

    def encode_frames(self, images: Tensor) -> Tensor:
        """The image tower alone, frame by frame: ``images [F, 3, H, W]`` (uint8 0–255, or
        float already normalised) -> ``[F, D]``. A long video's frames are encoded this way
        once, in batches, and grouped into clips afterwards (:meth:`contextualise`)."""
        if images.dtype == torch.uint8:
            images = (images.float() / 255.0 - self.pixel_mean) / self.pixel_std
        return self.clip.encode_image(images)

    def contextualise(self, frame_vectors: Tensor, frame_mask: Tensor) -> VideoFeatures:
        """Image-tower vectors of clips ``[B_v, N, D]`` (mask ``[B_v, N]``) -> the per-frame
        vectors DiCoSA scores: the temporal transformer, then the optional normalisation."""
        if self.temporal is not None:
            frame_vectors = self.temporal(frame_vectors, frame_mask)
        if self.config.normalize_features:
            frame_vectors = F.normalize(frame_vectors, dim=-1)
        return VideoFeatures(frame_vectors, frame_mask)

    # -- scoring --------------------------------------------------------------------------
    def score(self, text: TextFeatures, video: VideoFeatures, chunk: int | None = None) -> Tensor:
        """S ``[B_t, B_v]`` (Eq. 9) for every pair, computed ``chunk`` texts at a time.

        Each entry depends on its own text and video only, so any chunking gives the same
        matrix; chunking bounds the ``[chunk, B_v, K, H]`` confidence activations.
        """
        video_side = self._video_side(video)
        if chunk is None or chunk >= len(text):
            return self._score_block(text.text, video, video_side)[0]
        return torch.cat([
            self._score_block(text.text[i:i + chunk], video, video_side)[0]
            for i in range(0, len(text), chunk)
        ])

    def explain(self, text: TextFeatures, video: VideoFeatures) -> dict[str, Tensor]:
        """Everything behind S: pooling weights a, per-factor cosines s_k and confidences g_k."""
        video_side = self._video_side(video)
        similarity, cosines, confidences, weights = self._score_block(text.text, video, video_side)
        return {"similarity": similarity, "cosines": cosines, "confidences": confidences,
                "weights": weights}

    def _video_side(self, video: VideoFeatures) -> tuple[Tensor, Tensor | None]:
        frame_factors = self.head.frame_factors(video.frames)  # [B_v, N, K, d]
        return frame_factors, self.head.frame_hidden(frame_factors)

    def _score_block(self, text: Tensor, video: VideoFeatures,
                     video_side: tuple[Tensor, Tensor | None]):
        frame_factors, frame_hidden = video_side
        weights = DF.pooling_weights(text, video.frames, video.frame_mask,
                                     self.config.pool_temperature, self.mask_mode)
        text_factors = self.head.text_factors(text)  # [B_t, K, d]
        out_weight = out_bias = None
        if self.head.adaptive:
            out_weight, out_bias = self.head.conf_out.weight[0], self.head.conf_out.bias[0]
        similarity, cosines, confidences = self._similarity_fn(
            text_factors, frame_factors, weights, self.head.text_hidden(text_factors),
            frame_hidden, out_weight, out_bias,
        )
        return similarity, cosines, confidences, weights

    # -- training -------------------------------------------------------------------------
    def forward(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """Losses on a batch of matched pairs: ``tokens [B, L]``, ``frames [B, N, 3, H, W]``,
        ``frame_mask [B, N]``. Under torch.distributed the features of every process are
        gathered (with gradients), so the contrastive loss sees the global batch."""
        tokens, frames = batch["tokens"], batch["frames"]
        if tokens.shape[0] != frames.shape[0]:
            raise ValueError(f"batch has {tokens.shape[0]} captions but {frames.shape[0]} videos")
        text = self.encode_text(tokens).text
        video = self.encode_video(frames, batch.get("frame_mask"))
        text, frames_out, frame_mask = gather_features(text, video.frames, video.frame_mask)
        return self.losses(TextFeatures(text), VideoFeatures(frames_out, frame_mask))

    def losses(self, text: TextFeatures, video: VideoFeatures) -> dict[str, Tensor]:
        """L = L_S + α·L_D + β·L_A (paper) or the released code's weighting (docs/training.md)."""
        cfg = self.config
        video_side = self._video_side(video)  # per-frame factors, shared by both terms
        similarity = self._score_block(text.text, video, video_side)[0]  # [B, B]
        loss_sim = DF.info_nce(self.logit_scale * similarity)
        out = {"loss_sim": loss_sim, "logit_scale": self.logit_scale.detach()}
        if not cfg.use_factors:
            out["loss"] = loss_sim
            return out

        # Factors of matched pairs: text i with video i pooled under text i.
        weights = DF.matched_pooling_weights(text.text, video.frames, video.frame_mask,
                                             cfg.pool_temperature, self.mask_mode)  # [B, N]
        text_factors = self.head.text_factors(text.text)  # [B, K, d]
        frame_factors = video_side[0]  # [B, N, K, d]
        video_factors = torch.einsum("bn,bnkc->bkc", weights.to(frame_factors.dtype),
                                     frame_factors)
        if cfg.variant == "paper":
            corr = DF.factor_correlation(text_factors, video_factors)
            loss_decouple, loss_align = DF.decoupling_loss(corr), DF.alignment_loss(corr)
            loss = loss_sim + cfg.alpha * loss_decouple + cfg.beta * loss_align
        else:
            # The released code weights the diagonal term by α and the off-diagonal one by β.
            corr = DF.factor_correlation_released(text_factors, video_factors, cfg.max_words)
            loss_decouple, loss_align = DF.decoupling_loss(corr), DF.alignment_loss(corr)
            loss = loss_sim + cfg.alpha * loss_align + cfg.beta * loss_decouple
        out.update(loss=loss, loss_decouple=loss_decouple, loss_align=loss_align)
        return out
