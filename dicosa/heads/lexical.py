"""Word-named sparse vectors on a frozen DiCoSA: VDR (kind ``lexical``) and Dense2Sparse
(kind ``d2s``).

Both heads map DiCoSA's features into the vocabulary space of the model's own tokenizer
(:mod:`dicosa.heads.vocabulary`): dimension ``i`` of a text or video vector is the weight of
word ``i``, so a score is a sum of per-word contributions (:meth:`LexicalHead.explain`) and
an inverted index (:mod:`dicosa.search.sparse`) can search the videos.

* :class:`VDRHead` (Zhou et al., "Retrieval-based disentangled representation learning with
  natural language supervision"): per-frame LayerNorm -> linear to |V| -> elu1p (Eq. 3) ->
  max over frames; the text side the same on the text vector; gates top-k ∪ bag of words
  (Eq. 4); symmetric InfoNCE (Eq. 5) with the non-parametric bag-of-words entry and the
  contrastive (CTS) mask.
* :class:`D2SHead` (Nguyen et al., "Multimodal learned sparse retrieval with probabilistic
  expansion control"): one shared linear -> LayerNorm -> linear to |V| -> log(1 + ReLU)
  (Eqs. 4-5) on the dense text vector and video proxy, distilled from the dense scores
  (Eq. 7) under caption- and word-level Bernoulli expansion control (Algorithm 1, Eq. 6).

Where the papers are vague the choices are listed in docs/heads.md ("Words as concepts").
"""

from __future__ import annotations

import copy
import logging
import math
from dataclasses import dataclass
from typing import Any

import scipy.sparse as sp
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import functional as DF
from ..metrics import ranks_t2v
from ..model import VideoFeatures
from .base import Head
from .features import HeadData, SplitFeatures
from .vocabulary import Vocabulary, build_vocabulary, word_vectors

__all__ = [
    "D2SConfig",
    "D2SHead",
    "LexicalHead",
    "TokenStates",
    "VDRConfig",
    "VDRHead",
    "bernoulli_schedule",
    "cts_mask",
    "elu1p",
    "exact_at_k",
    "flops",
    "semantic_at_k",
    "text_token_states",
    "to_csr",
    "top_k_gate",
]

log = logging.getLogger(__name__)


# -- building blocks ------------------------------------------------------------------------
def elu1p(x: Tensor) -> Tensor:
    """VDR Eq. 3: x + 1 for x >= 0, e^x otherwise (positive, smooth, unbounded)."""
    return F.elu(x) + 1.0


def top_k_gate(values: Tensor, k: int) -> Tensor:
    """``[B, |V|]`` -> 0/1 mask of each row's ``k`` largest entries (exactly min(k, |V|))."""
    k = min(k, values.shape[-1])
    gate = torch.zeros_like(values)
    return gate.scatter_(-1, values.topk(k, dim=-1).indices, 1.0)


def cts_mask(active: Tensor, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """VDR's contrastive mask for a batch whose query gates are ``active [B, |V|]`` (0/1).

    The dimensions no query activates, V \\ T(B), are dealt out to the B queries
    (|V \\ T(B)| / B each, in random order): query j gets them switched on, and its own
    positive target gets them switched off, so they enter only negative pairs.

    Returns:
        ``(query_extra, target_off)``: ``[B, |V|]`` 0/1 masks.
    """
    batch = active.shape[0]
    unused = torch.nonzero(active.sum(0) == 0).squeeze(1)  # [U]
    unused = unused[torch.randperm(len(unused), generator=generator)]
    share = len(unused) // batch
    extra = torch.zeros_like(active)
    owner = torch.arange(batch).repeat_interleave(share)  # [share * B]
    extra[owner, unused[:share * batch]] = 1.0
    return extra, extra.clone()


def bernoulli_schedule(epoch: int, epochs: int, df: Tensor) -> tuple[float, Tensor]:
    """D2S Eq. 6 after ``epoch`` completed epochs: ``(p_c, p_word [|V|])``.

    p_c starts at 0 and rises by 1/epochs; p_i starts at 1 - df_i and rises by df_i/epochs,
    so both reach 1 when training ends.
    """
    progress = min(epoch / epochs, 1.0)
    return progress, (1.0 - df * (1.0 - progress)).clamp(0.0, 1.0)


def to_csr(vectors: Tensor) -> sp.csr_matrix:
    """Dense ``[N, |V|]`` with zeros -> scipy CSR float32 (what the inverted index takes)."""
    return sp.csr_matrix(vectors.detach().cpu().float().numpy())


@dataclass
class TokenStates:
    """Every token's state from the text tower (one forward with the EOT vector:
    :func:`dicosa.clip.encode_text_token_states`): ``states [B, L, D]``, ``valid [B, L]``."""

    states: Tensor
    valid: Tensor

    def __getitem__(self, index) -> TokenStates:
        return TokenStates(self.states[index], self.valid[index])


@torch.no_grad()
def text_token_states(model: nn.Module, captions: list[str], batch: int = 256) -> TokenStates:
    """The captions' token states from the frozen ``model`` (float32, CPU)."""
    from ..clip import encode_text_token_states, get_tokenizer

    tokenize = get_tokenizer(model.config.arch, model.config.max_words)
    parts = [encode_text_token_states(model.clip, tokenize(captions[i:i + batch]))[1:]
             for i in range(0, len(captions), batch)]
    return TokenStates(torch.cat([p[0] for p in parts]).float().cpu(),
                       torch.cat([p[1] for p in parts]).cpu())


# -- the paper's metrics (D2S Eqs. 1-3) -----------------------------------------------------
def flops(text: Tensor, video: Tensor) -> float:
    """Eq. 1: expected number of dimensions a caption and a video both activate, over all
    pairs: mean_c,v sum_j 1[s_C,j > 0] 1[s_I,j > 0]."""
    return float(((text > 0).float().mean(0) * (video > 0).float().mean(0)).sum())


def exact_at_k(text: Tensor, bow: Tensor, k: int) -> float:
    """Eq. 2: share of each caption's k top-weighted words that occur in the caption."""
    top = text.topk(k, dim=1).indices  # [C, k]
    return float(bow.gather(1, top).sum(1).div(k).mean())


def semantic_at_k(text: Tensor, bow: Tensor, vectors: Tensor, k: int) -> float:
    """Eq. 3: mean over the k top words of the best cosine with a word of the caption, in
    the static word vectors ``vectors [|V|, D]``."""
    unit = F.normalize(vectors, dim=-1)
    cos = unit @ unit.T  # [|V|, |V|]
    top = text.topk(k, dim=1).indices  # [C, k]
    best = torch.where(bow[:, None, :] > 0, cos[top], torch.tensor(-1.0)).amax(-1)  # [C, k]
    has_words = bow.sum(1) > 0
    return float(best[has_words].mean())


def recall_at(sim: Tensor, caption_video: Tensor, ks: tuple[int, ...] = (1, 5, 10)) -> dict:
    """t2v R@k in percent, ties counted against the target (sparse scores tie at 0)."""
    ranks = ranks_t2v(sim, caption_video, ties="pessimistic")
    return {f"R@{k}": float((ranks <= k).float().mean() * 100) for k in ks}


# -- the shared head ------------------------------------------------------------------------
class LexicalHead(Head):
    """What VDR and D2S share: the vocabulary, sparse encodings, words and explanations.

    Subclasses implement ``text_weights`` and ``video_weights`` (the dense |V| weights before
    sparsification) and ``fit``.
    """

    def __init__(self, config: Any, words: list[str], token_ids: list[int], dim: int):
        super().__init__(config)
        self.vocab = Vocabulary(words, token_ids)
        self.dim = dim

    def init_args(self) -> dict[str, Any]:
        return {"words": self.vocab.words, "token_ids": self.vocab.token_ids, "dim": self.dim}

    @classmethod
    def _untrained(cls, model: nn.Module, data: HeadData, config: Any,
                   seed: int) -> tuple[LexicalHead, Tensor]:
        """A seeded head on the training captions' vocabulary, and that vocabulary's word
        vectors (config ``init``) for its projections."""
        torch.manual_seed(seed)
        vocab = build_vocabulary(data.train.captions, model.config.arch, config.distractors)
        head = cls(config, vocab.words, vocab.token_ids, data.train.text.text.shape[1])
        return head, word_vectors(model, vocab, config.init)

    @property
    def words(self) -> list[str]:
        return self.vocab.words

    # subclasses: dense weights V(x) [B, |V|] >= 0
    def text_weights(self, text: Tensor) -> Tensor:
        raise NotImplementedError

    def video_weights(self, video: VideoFeatures) -> Tensor:
        raise NotImplementedError

    def bow(self, texts: list[str]) -> Tensor:
        """The non-parametric query (no network): L2-normalised bag of words ``[B, |V|]``."""
        return F.normalize(self.vocab.bow(texts), dim=-1)

    @torch.no_grad()
    def encode_texts(self, text: Tensor, captions: list[str]) -> Tensor:
        """Parametric sparse query vectors ``[B, |V|]`` from DiCoSA text vectors ``[B, D]``:
        the weights as they are, unless a head gates them."""
        return self.text_weights(text)

    @torch.no_grad()
    def encode_videos(self, video: VideoFeatures) -> Tensor:
        """Sparse video vectors ``[B_v, |V|]`` (what the inverted index stores)."""
        return self.video_weights(video)

    def prepare(self, queries: Any, mode: str = "lexical") -> None:
        """Fill ``queries.extra["lexical"]`` (an :class:`~dicosa.search.types.EncodedQueries`)
        with the queries' sparse vectors as scipy CSR ``[Q, |V|]`` (and ``"lexical_mode"``
        with ``mode``): ``"lexical"`` runs the head on the DiCoSA text vectors, ``"bow"``
        uses only the query's words."""
        texts = [q.text for q in queries.queries]
        if mode == "bow":
            vectors = self.bow(texts)
        elif mode == "lexical":
            vectors = self.encode_texts(self._query_text(queries), texts)
        else:
            raise ValueError(f"unknown lexical query mode '{mode}'; use lexical or bow")
        queries.extra["lexical"] = to_csr(vectors)
        queries.extra["lexical_mode"] = mode

    def _query_text(self, queries: Any) -> Tensor | TokenStates:
        return queries.text.text.float()

    def top_words(self, vector: Tensor, n: int = 10) -> list[tuple[str, float]]:
        """The ``n`` heaviest words of one sparse vector ``[|V|]`` (non-zero ones only)."""
        values, ids = vector.topk(min(n, len(vector)))
        return [(self.vocab.words[i], float(v)) for v, i in zip(values, ids, strict=True) if v > 0]

    def explain(self, query: Tensor, video: Tensor, n: int | None = None) -> dict[str, float]:
        """``{word: contribution}`` of one query ``[|V|]`` and one video ``[|V|]`` sparse
        vector, largest first; with ``n`` None the values sum to the score ``query · video``."""
        contribution = query * video  # [|V|]
        nonzero = torch.nonzero(contribution).squeeze(1)
        order = nonzero[contribution[nonzero].argsort(descending=True)]
        if n is not None:
            order = order[:n]
        return {self.vocab.words[i]: float(contribution[i]) for i in order}

    @torch.no_grad()
    def frame_words(self, video: VideoFeatures, n: int = 5) -> list[list[tuple[str, float]]]:
        """Per-frame top words of one video (``len(video) == 1``): the figure of a video's
        words over time."""
        return [self.top_words(w, n) for w in self.frame_activations(video)]

    @torch.no_grad()
    def frame_activations(self, video: VideoFeatures) -> Tensor:
        """The word weights of each valid frame of one video (``len(video) == 1``):
        ``[N', |V|]`` (:func:`dicosa.visualize_words` draws them)."""
        raise NotImplementedError

    def evaluate(self, data: SplitFeatures, mode: str = "lexical",
                 text: Tensor | TokenStates | None = None) -> dict[str, float]:
        """t2v R@1/5/10 of ``data``'s captions against its videos by the sparse score
        (``text``: the captions' token states, for a head that reads them)."""
        videos = self.encode_videos(data.video)
        if mode == "bow":
            texts = self.bow(data.captions)
        else:
            texts = self.encode_texts(data.text.text if text is None else text, data.captions)
        return recall_at(texts @ videos.T, data.caption_video)


def _batches(data: SplitFeatures, batch_size: int, generator: torch.Generator):
    """Batches of distinct videos with one random caption each: ``(captions [B], videos [B])``
    (distinct videos keep in-batch negatives true negatives)."""
    order = torch.randperm(data.num_videos, generator=generator)
    for start in range(0, len(order), batch_size):
        videos = order[start:start + batch_size]
        if len(videos) >= 2:
            yield data.one_caption_each(videos, generator), videos


def _fit_loop(head: LexicalHead, data: HeadData, loss_fn, seed: int, progress: bool,
              on_epoch=None, select_text=None) -> LexicalHead:
    """AdamW over the config's ``epochs``; keeps the state with the best validation R@5
    (training R@5 if there is no validation split) and records plain facts in ``fit_report``."""
    cfg = head.config
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=0.0)
    select = data.val if data.val is not None else data.train
    best, best_state, best_epoch, losses = -1.0, None, -1, []
    for epoch in range(cfg.epochs):
        if on_epoch is not None:
            on_epoch(epoch)
        head.train()
        total = 0.0
        for captions, videos in _batches(data.train, cfg.batch_size, generator):
            optimizer.zero_grad()
            loss = loss_fn(captions, videos, generator)
            loss.backward()
            optimizer.step()
            total += float(loss.detach())
        losses.append(total)
        head.eval()
        score = head.evaluate(select, text=select_text)["R@5"]
        if progress:
            log.info("epoch %d loss %.4f %s R@5 %.1f", epoch, total, select.name, score)
        if score >= best:
            best, best_state, best_epoch = score, copy.deepcopy(head.state_dict()), epoch
    head.load_state_dict(best_state)
    head.fit_report = {"selected_on": select.name, "selected_epoch": best_epoch,
                       "selected_R@5": round(best, 2), "loss_first_epoch": losses[0],
                       "loss_last_epoch": losses[-1], "vocabulary": len(head.vocab)}
    return head.eval()


def _init_projection(linear: nn.Linear, vectors: Tensor) -> None:
    """Rows = unit word vectors scaled so a LayerNorm'd input (norm ≈ sqrt(D)) gives
    logits of order one: the words' directions survive, their norms (frequency) do not."""
    with torch.no_grad():
        linear.weight.copy_(F.normalize(vectors, dim=-1) * (3.0 / math.sqrt(vectors.shape[1])))
        linear.bias.zero_()


# -- VDR ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class VDRConfig:
    distractors: int = 1000  # vocabulary = caption words + this many other whole words
    init: str = "embedding"  # projection init: embedding | encoded | random (appendix C)
    text_states: str = "eot"  # text side reads: eot (the text vector) | tokens (max over all)
    text_k: int = 4  # top-k expansion of the parametric query (Eq. 4, plus its own words)
    video_k: int = 16  # non-zeros stored per video
    bow_entry: bool = True  # the non-parametric entry in the loss
    cts: bool = True  # the contrastive mask
    temperature: float = 0.07
    epochs: int = 100
    batch_size: int = 64
    lr: float = 3e-3


class VDRHead(LexicalHead):
    """VDR's disentanglement heads for the text and the video side (see module docstring)."""

    kind = "lexical"
    Config = VDRConfig

    def __init__(self, config: VDRConfig, words: list[str], token_ids: list[int], dim: int):
        super().__init__(config, words, token_ids, dim)
        self.text_norm = nn.LayerNorm(dim)
        self.text_proj = nn.Linear(dim, len(words))
        self.video_norm = nn.LayerNorm(dim)
        self.video_proj = nn.Linear(dim, len(words))

    def text_weights(self, text: Tensor | TokenStates) -> Tensor:
        """V_q -> ``[B, |V|]``: of the text vector ``[B, D]`` (config ``text_states=eot``), or
        max-pooled over the valid token states (``tokens``, the paper's text side)."""
        if isinstance(text, TokenStates):
            weights = elu1p(self.text_proj(self.text_norm(text.states.float())))  # [B, L, |V|]
            return weights.masked_fill(~text.valid[..., None], 0.0).amax(1)
        return elu1p(self.text_proj(self.text_norm(text.float())))

    def _query_text(self, queries: Any) -> Tensor | TokenStates:
        if self.config.text_states != "tokens":
            return queries.text.text.float()
        states = queries.extra.get("token_states")
        if not isinstance(states, TokenStates):
            raise ValueError("this lexical head reads token states: encode the queries with "
                             "dicosa.clip.encode_text_token_states and put TokenStates in "
                             "queries.extra['token_states']")
        return states

    def frame_weights(self, frames: Tensor) -> Tensor:
        """Per-frame V_p: ``[B_v, N, D]`` -> ``[B_v, N, |V|]``."""
        return elu1p(self.video_proj(self.video_norm(frames.float())))

    def video_weights(self, video: VideoFeatures) -> Tensor:
        """V_p: max over the valid frames, ``[B_v, |V|]``."""
        weights = self.frame_weights(video.frames)
        return weights.masked_fill(~video.frame_mask[..., None], 0.0).amax(1)

    def text_gate(self, weights: Tensor, bow: Tensor) -> Tensor:
        """Eq. 4: top-k of V(q) or a word of q."""
        return torch.maximum(top_k_gate(weights, self.config.text_k), (bow > 0).float())

    @torch.no_grad()
    def encode_texts(self, text: Tensor | TokenStates, captions: list[str]) -> Tensor:
        weights = self.text_weights(text)
        return F.normalize(weights * self.text_gate(weights, self.vocab.bow(captions)), dim=-1)

    @torch.no_grad()
    def encode_videos(self, video: VideoFeatures) -> Tensor:
        # Normalised over all |V| as in training, then cut to the k largest: the stored
        # values are the training-time values of those words.
        weights = F.normalize(self.video_weights(video), dim=-1)
        return weights * top_k_gate(weights, self.config.video_k)

    @torch.no_grad()
    def frame_activations(self, video: VideoFeatures) -> Tensor:
        weights = self.frame_weights(video.frames[:1])[0]  # [N, |V|]
        return weights[video.frame_mask[0]]  # [N', |V|]

    def loss(self, text: Tensor | TokenStates, bow: Tensor, video: VideoFeatures,
             generator: torch.Generator | None = None) -> Tensor:
        """Eq. 5 on a batch of matched pairs ``text [B, D]``, ``bow [B, |V|]``, ``video``:
        the gated query against the fully activated video, plus (``bow_entry``) the bag of
        words against the video."""
        cfg = self.config
        q_weights = self.text_weights(text)  # [B, |V|]
        p_weights = self.video_weights(video)  # [B, |V|]
        q_gate = self.text_gate(q_weights.detach(), bow)
        p_gate = torch.ones_like(p_weights)
        if cfg.cts:
            extra, off = cts_mask(q_gate, generator)
            q_gate = torch.maximum(q_gate, extra)
            p_gate = p_gate - off
        q = F.normalize(q_weights * q_gate, dim=-1)  # [B, |V|]
        p = F.normalize(p_weights * p_gate, dim=-1)  # [B, |V|]
        sim = q @ p.T  # [B, B]
        loss = DF.info_nce(sim / cfg.temperature)
        if cfg.bow_entry:
            loss = loss + DF.info_nce(F.normalize(bow, dim=-1) @ p.T / cfg.temperature)
        return loss

    @classmethod
    def fit(cls, model: nn.Module, data: HeadData, config: VDRConfig, *, seed: int = 0,
            progress: bool = True) -> VDRHead:
        head, vectors = cls._untrained(model, data, config, seed)
        _init_projection(head.text_proj, vectors)
        _init_projection(head.video_proj, vectors)
        train = data.train
        bow = head.vocab.bow(train.captions)  # [C, |V|]
        text, select_text = train.text.text, None
        if config.text_states == "tokens":
            text = text_token_states(model, train.captions)
            select = data.val if data.val is not None else train
            select_text = text_token_states(model, select.captions)
        elif config.text_states != "eot":
            raise ValueError(f"unknown text_states '{config.text_states}'; use eot or tokens")

        def loss_fn(captions, videos, generator):
            return head.loss(text[captions], bow[captions], train.video[videos], generator)

        return _fit_loop(head, data, loss_fn, seed, progress, select_text=select_text)


# -- Dense2Sparse ---------------------------------------------------------------------------
@dataclass(frozen=True)
class D2SConfig:
    distractors: int = 1000
    init: str = "embedding"  # W2 init: embedding | encoded | random
    teacher: str = "dicosa"  # dicosa (Eq. 9 score) | proxy (cosine of text vector and proxy)
    caption_control: bool = True  # caption-level Bernoulli expansion control
    word_control: bool = True  # word-level control, p_i = 1 - df_i at the start
    eta: float = 1e-3  # L1 weight (λη of Eq. 7, with the distillation term weighted 1)
    tau: float = 0.001  # teacher temperature
    epochs: int = 100
    batch_size: int = 64
    lr: float = 3e-3


class D2SHead(LexicalHead):
    """Dense2Sparse: one projection shared by texts and video proxies (see module docstring);
    search reads the plain weights, expansion control being a training device only."""

    kind = "d2s"
    Config = D2SConfig

    def __init__(self, config: D2SConfig, words: list[str], token_ids: list[int], dim: int):
        super().__init__(config, words, token_ids, dim)
        self.inner = nn.Linear(dim, dim)  # W1, ω = D so that W2 can start from word vectors
        self.norm = nn.LayerNorm(dim)
        self.vocab_proj = nn.Linear(dim, len(words))  # W2

    def weights(self, dense: Tensor) -> Tensor:
        """g_ψ (Eqs. 4-5): ``[B, D]`` -> log(1 + ReLU(W2 LN(W1 z))) ``[B, |V|]``."""
        z = F.normalize(dense.float(), dim=-1)  # stored features may be float16
        return torch.log1p(F.relu(self.vocab_proj(self.norm(self.inner(z)))))

    def text_weights(self, text: Tensor) -> Tensor:
        return self.weights(text)

    def video_weights(self, video: VideoFeatures) -> Tensor:
        return self.weights(DF.video_proxy(video.frames.float(), video.frame_mask))

    @torch.no_grad()
    def frame_activations(self, video: VideoFeatures) -> Tensor:
        return self.weights(video.frames[0][video.frame_mask[0]])  # [N', |V|]

    @staticmethod
    def expansion_mask(bow: Tensor, p_caption: float, p_word: Tensor,
                       generator: torch.Generator | None = None) -> Tensor:
        """Algorithm 1's EXPAND as a 0/1 mask ``[B, |V|]``: a caption's own words always
        pass; another word passes if this batch's draws E_C ~ Ber(p_c) and E_i ~ Ber(p_i)
        are both 1 (one draw per batch, as the paper samples)."""
        e_caption = float(torch.rand((), generator=generator) < p_caption)
        e_word = (torch.rand(p_word.shape, generator=generator) < p_word).float()  # [|V|]
        return torch.maximum((bow > 0).float(), e_caption * e_word[None, :])

    def loss(self, text: Tensor, video: VideoFeatures, teacher: Tensor, mask: Tensor) -> Tensor:
        """Eq. 7: soft cross-entropy of the sparse score distributions against the teacher's
        (both directions) plus η·L1 of both sides. ``teacher [B, B]`` dense scores."""
        cfg = self.config
        s_text = self.text_weights(text) * mask  # [B, |V|] expanded caption
        s_video = self.video_weights(video)  # [B, |V|]
        student = s_text @ s_video.T  # [B, B]
        target = teacher / cfg.tau
        c2i = -(target.softmax(1) * student.log_softmax(1)).sum(1).mean()
        i2c = -(target.softmax(0) * student.log_softmax(0)).sum(0).mean()
        l1 = s_text.sum(1).mean() + s_video.sum(1).mean()
        return c2i + i2c + cfg.eta * l1

    @classmethod
    def fit(cls, model: nn.Module, data: HeadData, config: D2SConfig, *, seed: int = 0,
            progress: bool = True) -> D2SHead:
        head, vectors = cls._untrained(model, data, config, seed)
        with torch.no_grad():
            head.inner.weight.copy_(torch.eye(head.dim))
            head.inner.bias.zero_()
        _init_projection(head.vocab_proj, vectors)
        train = data.train
        bow = head.vocab.bow(train.captions)  # [C, |V|]
        df = (bow > 0).float().mean(0)  # [|V|] normalised document frequency
        teacher = _teacher_scores(model, train, config.teacher)  # [C, V]
        schedule = {"p": (0.0, torch.ones(len(df)))}

        def on_epoch(epoch):
            p_c, p_word = bernoulli_schedule(epoch, config.epochs, df)
            schedule["p"] = (p_c if config.caption_control else 1.0,
                             p_word if config.word_control else torch.ones(len(df)))

        def loss_fn(captions, videos, generator):
            mask = head.expansion_mask(bow[captions], *schedule["p"], generator)
            return head.loss(train.text.text[captions], train.video[videos],
                             teacher[captions][:, videos], mask)

        return _fit_loop(head, data, loss_fn, seed, progress, on_epoch)


@torch.no_grad()
def _teacher_scores(model: nn.Module, data: SplitFeatures, teacher: str) -> Tensor:
    """The dense model's scores ``[C, V]`` of every training caption and video."""
    if teacher == "proxy":
        proxy = DF.video_proxy(data.video.frames, data.video.frame_mask)
        return F.normalize(data.text.text, dim=-1) @ F.normalize(proxy, dim=-1).T
    if teacher == "dicosa":
        return model.score(data.text, data.video, chunk=128).float()
    raise ValueError(f"unknown D2S teacher '{teacher}'; use proxy or dicosa")

