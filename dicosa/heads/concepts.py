"""Sparse disentangled concept codes for exclusion queries (paper 003, Section 3).

Three training steps on a frozen DiCoSA:

1. **Word codes** (SPINE): a vector per vocabulary word goes through a sparse autoencoder
   ``z = min(1, max(0, W x + b))`` trained with reconstruction + λ₁·ASL + λ₂·PSL. The paper
   starts from GloVe, which cannot be downloaded here; we start from the frozen model's own
   text tower (T of the word alone) or its token embeddings (``word_source``).
2. **Sentence codes**: the normalised mean of a sentence's word codes.
3. **Concept codes**: linear encoders map DiCoSA's text vector T and the query-independent
   video proxy (:func:`dicosa.functional.video_proxy`) to a d-dimensional latent; the mask
   is (sentence code > threshold) OR top-k(latent); the code is mask ⊙ latent; a decoder
   reconstructs the input from the code; loss = reconstruction + λ·InfoNCE.

At search time a video has no caption, so its mask is top-k alone; a query's mask is its
sentence code OR top-k (docs/heads.md, "Exclusion queries", for every decision the paper
leaves open).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import functional as DF
from ..metrics import ranks_t2v, retrieval_metrics
from ..model import VideoFeatures
from .base import Head
from .features import HeadData, SplitFeatures, text_vectors
from .vocabulary import caption_words

__all__ = [
    "ConceptCodesConfig",
    "ConceptCodesHead",
    "SpineAutoencoder",
    "average_sparsity_loss",
    "build_vocabulary",
    "caption_words",
    "concept_mask",
    "partial_sparsity_loss",
    "reconstruction_loss",
    "sentence_codes",
    "top_k_mask",
    "word_vectors",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConceptCodesConfig:
    """Hyper-parameters of the concepts head: d and top-k chosen on the synthetic benchmark's
    validation split, the rest SPINE's or the paper's values."""

    dim: int = 128                      # d: latent width = SPINE's hidden units
    top_k: int = 16                     # k of the top-k mask
    sentence_threshold: float = 0.0     # sentence-code entries above this enter the mask
    # Step 1, SPINE word codes.
    word_source: Literal["text_tower", "token_embedding"] = "text_tower"
    target_activation: float = 0.15     # ρ*, SPINE's default
    asl_weight: float = 1.0             # λ₁
    psl_weight: float = 1.0             # λ₂
    spine_noise: float = 0.2            # std of the denoising noise on the word vectors
    spine_steps: int = 1500
    spine_lr: float = 3e-3
    # Step 3, the encoders on DiCoSA's vectors.
    steps: int = 800
    batch_size: int = 128               # videos per step, one caption each
    lr: float = 2e-3
    contrastive_weight: float = 1.0     # λ
    temperature: float = 0.05


# ---------------------------------------------------------------- words and sentences


def build_vocabulary(captions: Sequence[str]) -> list[str]:
    """Every word of ``captions``, sorted (the paper: "all the words used in the training
    dataset")."""
    return sorted({w for c in captions for w in caption_words(c)})


@torch.no_grad()
def word_vectors(model: nn.Module, words: Sequence[str], source: str,
                 batch_size: int = 256) -> Tensor:
    """One vector per word from the frozen model, standardised: ``[V, m]``.

    ``"text_tower"``: T of the word alone (m = D); ``"token_embedding"``: the mean of the
    word's BPE token embeddings (m = the text tower's width). Each dimension is centred and
    scaled to unit variance over the vocabulary: the words of one tower share a large common
    direction, and unit-length inputs make the reconstruction term so small against ASL and
    PSL that SPINE switches nearly every unit off; GloVe's scale (norms of 5-8) is what
    SPINE's loss weights were made for.
    """
    if source == "text_tower":
        vectors = text_vectors(model, list(words), batch_size)
    elif source == "token_embedding":
        from ..clip import get_tokenizer

        tokenize = get_tokenizer(model.config.arch, model.config.max_words)
        device = model.clip.token_embedding.weight.device
        parts = []  # on the CPU, where the head is fitted
        for start in range(0, len(words), batch_size):
            tokens = tokenize(list(words[start:start + batch_size])).to(device)  # [B, L]
            # Tokens between SOT (position 0) and EOT (the largest id, found by argmax).
            eot = tokens.argmax(dim=-1, keepdim=True)
            position = torch.arange(tokens.shape[1], device=device)[None]
            inside = ((position > 0) & (position < eot)).float()  # [B, L]
            embedded = model.clip.token_embedding(tokens).float()  # [B, L, W]
            parts.append((torch.einsum("bl,blw->bw", inside, embedded)
                          / inside.sum(1, keepdim=True).clamp_min(1)).cpu())
        vectors = torch.cat(parts)
    else:
        raise ValueError(f"unknown word_source {source!r}")
    return (vectors - vectors.mean(0)) / vectors.std(0).clamp_min(1e-6)


def sentence_codes(word_codes: Tensor, vocabulary: Sequence[str],
                   sentences: Sequence[str]) -> tuple[Tensor, int]:
    """Step 2: e_S = mean of the codes of the sentence's words, normalised to unit length.

    Words outside the vocabulary are left out of the mean (a sentence with none gets a zero
    code). Returns ``(codes [S, d], number of out-of-vocabulary words skipped)``.
    """
    index = {w: i for i, w in enumerate(vocabulary)}
    counts = torch.zeros(len(sentences), len(vocabulary))  # [S, V] bag of words
    unknown = 0
    for row, sentence in enumerate(sentences):
        for word, n in Counter(caption_words(sentence)).items():
            if word in index:
                counts[row, index[word]] = n
            else:
                unknown += n
    mean = counts @ word_codes.float() / counts.sum(1, keepdim=True).clamp_min(1)
    return F.normalize(mean, dim=-1), unknown


# ---------------------------------------------------------------- SPINE (step 1)


def reconstruction_loss(inputs: Tensor, reconstructed: Tensor) -> Tensor:
    """RL = mean over the data of ‖X − X̃‖²."""
    return (inputs - reconstructed).pow(2).sum(-1).mean()


def average_sparsity_loss(activations: Tensor, target: float) -> Tensor:
    """ASL = Σ_h max(0, ρ_h − ρ*), ρ_h the mean activation of hidden unit h over the data.

    The paper's definition: one average per unit over all of ``activations [n, d]`` (the
    public SPINE code instead squares the excess of per-sample means).
    """
    rho = activations.mean(dim=0)  # [d]
    return F.relu(rho - target).sum()


def partial_sparsity_loss(activations: Tensor) -> Tensor:
    """PSL = mean over the data of Σ_h z_h (1 − z_h): pushes activations to 0 or 1."""
    return (activations * (1 - activations)).sum(-1).mean()


class SpineAutoencoder(nn.Module):
    """SPINE: capped-ReLU code z ∈ [0, 1]^d of an input x, and its linear reconstruction."""

    def __init__(self, in_dim: int, dim: int):
        super().__init__()
        self.encoder = nn.Linear(in_dim, dim)
        self.decoder = nn.Linear(dim, in_dim)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        z = self.encoder(x).clamp(0, 1)  # [n, d]
        return z, self.decoder(z)

    def loss(self, x: Tensor, config: ConceptCodesConfig,
             noise: Tensor | None = None) -> dict[str, Tensor]:
        z, reconstructed = self(x if noise is None else x + noise)
        parts = {"rl": reconstruction_loss(x, reconstructed),
                 "asl": average_sparsity_loss(z, config.target_activation),
                 "psl": partial_sparsity_loss(z)}
        parts["loss"] = (parts["rl"] + config.asl_weight * parts["asl"]
                         + config.psl_weight * parts["psl"])
        return parts


def fit_spine(vectors: Tensor, config: ConceptCodesConfig,
              generator: torch.Generator) -> tuple[Tensor, dict]:
    """Train SPINE on the whole vocabulary at once (every step sees all words, so ρ_h is the
    exact average over the data) and return the clean inputs' codes ``[V, d]``."""
    spine = SpineAutoencoder(vectors.shape[1], config.dim)
    optimizer = torch.optim.Adam(spine.parameters(), lr=config.spine_lr)
    for _ in range(config.spine_steps):
        noise = config.spine_noise * torch.randn(vectors.shape, generator=generator)
        optimizer.zero_grad()
        spine.loss(vectors, config, noise)["loss"].backward()
        optimizer.step()
    with torch.no_grad():
        final = {k: round(float(v), 4) for k, v in spine.loss(vectors, config).items()}
        codes = spine(vectors)[0]
    active = codes > 0
    report = {"spine_" + k: v for k, v in final.items()}
    report.update(vocabulary=len(vectors),
                  word_active_units=round(float(active.sum(1).float().mean()), 2),
                  word_dead_units=int((~active.any(0)).sum()))
    return codes, report


# ---------------------------------------------------------------- masks (step 3)


def top_k_mask(latent: Tensor, k: int) -> Tensor:
    """True at the k largest entries of each row of ``latent [..., d]``."""
    k = min(k, latent.shape[-1])
    index = latent.topk(k, dim=-1).indices
    return torch.zeros_like(latent, dtype=torch.bool).scatter_(-1, index, True)


def concept_mask(latent: Tensor, k: int, sentence_code: Tensor | None = None,
                 threshold: float = 0.0) -> Tensor:
    """E_mask = (e_S > threshold) OR Top_k(E_d); without a sentence code, Top_k alone."""
    mask = top_k_mask(latent, k)
    if sentence_code is not None:
        mask = mask | (sentence_code > threshold)
    return mask


class ConceptCodesHead(Head):
    """Sparse concept codes of texts and videos (module docstring)."""

    kind = "concepts"
    Config = ConceptCodesConfig

    def __init__(self, config: ConceptCodesConfig, input_dim: int, vocabulary: Sequence[str]):
        super().__init__(config)
        self.input_dim = input_dim
        self.vocabulary = list(vocabulary)
        self.register_buffer("word_codes", torch.zeros(len(self.vocabulary), config.dim))
        self.text_encoder = nn.Linear(input_dim, config.dim)
        self.video_encoder = nn.Linear(input_dim, config.dim)
        self.decoder = nn.Linear(config.dim, input_dim)  # one f_decoder, as in the paper

    def init_args(self) -> dict:
        return {"input_dim": self.input_dim, "vocabulary": self.vocabulary}

    # -- codes ----------------------------------------------------------------------------
    def sentence_codes(self, sentences: Sequence[str]) -> Tensor:
        """Step 2's e_S^norm of each sentence, ``[S, d]``."""
        return sentence_codes(self.word_codes, self.vocabulary, sentences)[0]

    def text_latent(self, text: Tensor) -> Tensor:
        """E_d of text vectors T ``[B_t, D]`` -> ``[B_t, d]``."""
        return self.text_encoder(F.normalize(text.float(), dim=-1))

    def video_latent(self, vectors: Tensor) -> Tensor:
        """E_d of video vectors (proxies ``[B_v, D]`` or frames ``[B_v, N, D]``)."""
        return self.video_encoder(F.normalize(vectors.float(), dim=-1))

    @torch.no_grad()
    def text_codes(self, text: Tensor, sentences: Sequence[str]) -> Tensor:
        """Unit-length sparse codes of queries: ``T [B_t, D]`` and their strings -> ``[B_t, d]``."""
        latent = self.text_latent(text)
        mask = concept_mask(latent, self.config.top_k, self.sentence_codes(sentences).to(
            latent.device), self.config.sentence_threshold)
        return F.normalize(latent * mask, dim=-1)

    @torch.no_grad()
    def video_codes(self, frames: Tensor, frame_mask: Tensor) -> Tensor:
        """Unit-length sparse codes of videos from per-frame features ``[B_v, N, D]``: the
        code of the query-independent proxy, masked by top-k alone (no caption at search)."""
        latent = self.video_latent(DF.video_proxy(frames.float(), frame_mask))
        return F.normalize(latent * top_k_mask(latent, self.config.top_k), dim=-1)

    def encode_videos(self, video: VideoFeatures) -> Tensor:
        """What an index stores per video row: :meth:`video_codes` of ``video``, ``[V, d]``."""
        return self.video_codes(video.frames, video.frame_mask)

    def dimension_words(self, dim: int, count: int = 3) -> list[str]:
        """The vocabulary words whose SPINE codes are largest on concept dimension ``dim``."""
        values = self.word_codes[:, dim]
        top = values.topk(min(count, len(values)))
        return [self.vocabulary[i] for i, v in zip(top.indices.tolist(), top.values.tolist(),
                                                   strict=True) if v > 0]

    # -- training -------------------------------------------------------------------------
    def loss(self, text: Tensor, video: Tensor, sentences: Sequence[str]) -> dict[str, Tensor]:
        """L = RL + λ·CL on matched pairs: T ``[B, D]``, proxies ``[B, D]``, captions."""
        cfg = self.config
        sentence = self.sentence_codes(sentences)  # [B, d]
        text_latent, video_latent = self.text_latent(text), self.video_latent(video)
        text_code = text_latent * concept_mask(text_latent, cfg.top_k, sentence,
                                               cfg.sentence_threshold)  # SR_text [B, d]
        video_code = video_latent * concept_mask(video_latent, cfg.top_k, sentence,
                                                 cfg.sentence_threshold)  # SR_img [B, d]
        rl = (reconstruction_loss(F.normalize(text.float(), dim=-1), self.decoder(text_code))
              + reconstruction_loss(F.normalize(video.float(), dim=-1),
                                    self.decoder(video_code)))
        logits = (F.normalize(video_code, dim=-1) @ F.normalize(text_code, dim=-1).T
                  / cfg.temperature)  # [B, B]
        cl = DF.info_nce(logits)
        return {"loss": rl + cfg.contrastive_weight * cl, "rl": rl, "cl": cl}

    @classmethod
    def fit(cls, model: nn.Module, data: HeadData, config: ConceptCodesConfig, *,
            seed: int = 0, progress: bool = True) -> ConceptCodesHead:
        """Steps 1–3 on the frozen ``model``'s training features; reports on validation.
        The caller's global random state is left as it was (layers draw their initial weights
        from a forked, seeded one)."""
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            generator = torch.Generator().manual_seed(seed)
            train = data.train
            vocabulary = build_vocabulary(train.captions)
            head = cls(config, train.text.text.shape[1], vocabulary)
            word_codes, report = fit_spine(word_vectors(model, vocabulary, config.word_source),
                                           config, generator)
            head.word_codes.copy_(word_codes)
            report.update(head._fit_encoders(train, generator, progress))
        if data.val is not None:
            report.update({f"val_{k}": v for k, v in head.retrieval_report(data.val).items()})
        head.fit_report = report
        return head.eval()

    def _fit_encoders(self, train: SplitFeatures, generator: torch.Generator,
                      progress: bool) -> dict:
        proxies = DF.video_proxy(train.video.frames, train.video.frame_mask)  # [V, D]
        optimizer = torch.optim.Adam(self.parameters(), lr=self.config.lr)
        batches = _video_batches(train.num_videos, self.config.batch_size, generator)
        first = last = None
        for step in range(self.config.steps):
            videos = next(batches)
            # One caption per video: two captions of one video in a batch would be negatives.
            captions = train.one_caption_each(videos, generator).tolist()
            parts = self.loss(train.text.text[captions], proxies[videos],
                              [train.captions[c] for c in captions])
            optimizer.zero_grad()
            parts["loss"].backward()
            optimizer.step()
            last = {k: round(v.item(), 4) for k, v in parts.items()}
            first = first or last
            if progress and step % 200 == 0:
                log.info("concepts step %d: %s", step, last)
        return {"loss_first": first, "loss_last": last}

    @torch.no_grad()
    def retrieval_report(self, split: SplitFeatures) -> dict:
        """Text-to-video retrieval with the codes alone on ``split``, and their density."""
        text = self.text_codes(split.text.text, split.captions)
        video = self.video_codes(split.video.frames, split.video.frame_mask)
        metrics = retrieval_metrics(ranks_t2v(text @ video.T, split.caption_video))
        return {"codes_t2v": {k: round(metrics[k], 2) for k in ("R@1", "R@5", "R@10")},
                "text_active_dims": round(float((text != 0).sum(1).float().mean()), 2),
                "video_active_dims": round(float((video != 0).sum(1).float().mean()), 2)}


def _video_batches(num_videos: int, batch: int, generator: torch.Generator):
    """Endless batches of distinct video indices, a fresh permutation each epoch."""
    batch = min(batch, num_videos)
    while True:
        order = torch.randperm(num_videos, generator=generator)
        for start in range(0, num_videos - batch + 1, batch):
            yield order[start:start + batch]
