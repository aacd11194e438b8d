"""Mul2vec (paper 004): topic ("semantic") vectors that keep a video findable when a
modality is missing.

The tensor D (documents x words x videos) holds the tf-idf of word v in document n of video
l, normalised to [0, 1] per document (Sec. 3.3). Documents are a video's captions while
training; at indexing time a video's title. Neural tensor factorisation (NTF) predicts
each entry from CP factors Θ (documents), T (words), G (videos) and an MLP over the frozen
model's contextual vectors (Eqs. 2-4), trained on observed and sampled zero entries (Eq. 5).
Two triplet losses align the levels (Eq. 8): ILM pulls a video's g_l towards its documents'
θ_n, DLM pulls each document's contextual vector towards its θ_n.

The paper leaves open how a new document or video gets its vector without retraining. Here
DLM trains two amortised encoders, θ = f(e) from a DiCoSA text vector (queries, titles) and
g = f_v(p) from a video proxy, so an indexed video's semantic vector is built from whichever
of its title and frames it has (:meth:`Mul2vecHead.entity_vectors`) and a query's from its
text (:meth:`Mul2vecHead.query_vectors`); fused scoring is in :mod:`dicosa.search.title_fusion`.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import functional as DF
from ..data.incomplete import words
from .base import Head
from .features import HeadData, SplitFeatures, text_vectors

__all__ = ["Mul2vecConfig", "Mul2vecHead", "TensorEntries", "ilm_dlm_triplet",
           "sample_negatives", "tfidf_entries"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Mul2vecConfig:
    topics: int = 50  # K, as in the paper
    hidden: int = 256  # width of the MLP pathway (Eq. 3)
    mlp_layers: int = 3  # "#layers of the NTF network" (Sec. 4.1)
    dropout: float = 0.0  # the paper's 0.2 gave a worse held-out MAE (benchmarks/RESULTS.md)
    margin: float = 0.2  # ε of Eqs. 6-7, on L2-normalised vectors
    lambda_ilm: float = 0.1
    lambda_dlm: float = 0.1
    weight_decay: float = 1e-5  # λ_ω of Eq. 5
    negatives: int = 1  # sampled zero entries per observed entry
    heldout: float = 0.1  # fraction of observed entries kept out of training (for the MAE)
    steps: int = 1500
    batch_size: int = 256  # observed entries per step (and documents per triplet batch)
    lr: float = 3e-3
    min_count: int = 1  # a word enters the vocabulary after this many training documents


# ------------------------------------------------------------------------- the tensor


@dataclass
class TensorEntries:
    """The observed entries of D: ``doc [E]``, ``word [E]``, ``entity [E]`` (long) and
    ``value [E]`` (float32 in (0, 1])."""

    doc: Tensor
    word: Tensor
    entity: Tensor
    value: Tensor

    def __len__(self) -> int:
        return len(self.value)

    def __getitem__(self, index) -> TensorEntries:
        return TensorEntries(self.doc[index], self.word[index], self.entity[index],
                             self.value[index])

    def __add__(self, other: TensorEntries) -> TensorEntries:
        return TensorEntries(torch.cat([self.doc, other.doc]), torch.cat([self.word, other.word]),
                             torch.cat([self.entity, other.entity]),
                             torch.cat([self.value, other.value]))


def tfidf_entries(documents: list[str], doc_entity: Tensor,
                  vocab: dict[str, int]) -> TensorEntries:
    """The tf-idf entries of D for ``documents`` (each belongs to one entity).

    tf = count / document length; idf = log((1 + N) / (1 + df)) + 1 (smoothed, so a word in
    every document still has a non-zero entry, unlike sampled negatives); each document's
    entries are divided by its largest, so every document spans (0, 1] (Sec. 3.3: "we
    normalize d into [0, 1] to avoid gaps between texts"). Words outside ``vocab`` are
    ignored.
    """
    tokenised = [[w for w in words(d) if w in vocab] for d in documents]
    df = Counter(w for doc in tokenised for w in set(doc))
    n = len(documents)
    doc, word, entity, value = [], [], [], []
    for i, tokens in enumerate(tokenised):
        if not tokens:
            continue
        weights = {w: c / len(tokens) * (math.log((1 + n) / (1 + df[w])) + 1)
                   for w, c in Counter(tokens).items()}
        top = max(weights.values())
        for w, x in weights.items():
            doc.append(i)
            word.append(vocab[w])
            entity.append(int(doc_entity[i]))
            value.append(x / top)
    return TensorEntries(torch.tensor(doc, dtype=torch.long), torch.tensor(word, dtype=torch.long),
                         torch.tensor(entity, dtype=torch.long),
                         torch.tensor(value, dtype=torch.float32))


def sample_negatives(observed: TensorEntries, present: Tensor, num_entities: int, count: int,
                     generator: torch.Generator) -> TensorEntries:
    """``count`` unobserved (zero) entries per observed one: half swap the word for one the
    document lacks, half swap the entity for another (a document belongs to one entity).

    ``present [N, V]`` bool marks the words of each document.
    """
    doc = observed.doc.repeat(count)
    word, entity = observed.word.repeat(count), observed.entity.repeat(count)
    swap_word = torch.rand(len(doc), generator=generator) < 0.5
    vocab = present.shape[1]
    new_word = torch.randint(vocab, (len(doc),), generator=generator)
    for _ in range(20):  # rejection: resample the words the document has
        clash = present[doc, new_word]
        if not clash.any():
            break
        new_word[clash] = torch.randint(vocab, (int(clash.sum()),), generator=generator)
    word = torch.where(swap_word & ~present[doc, new_word], new_word, word)
    swapped = word != observed.word.repeat(count)
    offset = torch.randint(1, max(num_entities, 2), (len(doc),), generator=generator)
    entity = torch.where(swapped, entity, (entity + offset) % num_entities)
    return TensorEntries(doc, word, entity, torch.zeros(len(doc)))


# ------------------------------------------------------------------------- the losses


def ilm_dlm_triplet(anchor: Tensor, positive: Tensor, group: Tensor, margin: float) -> Tensor:
    """Eqs. 6-7 with in-batch negatives: ``anchor[i]`` must be closer to ``positive[i]`` than
    to any ``positive[j]`` of another group by ``margin`` (Euclidean distance between
    L2-normalised vectors; hinge averaged over every valid (i, j)).

    ``group [B]`` names the entity of each row: rows of the same entity are not negatives
    of each other (two captions of one video are no contradiction).
    """
    anchor, positive = F.normalize(anchor, dim=-1), F.normalize(positive, dim=-1)
    dist = torch.cdist(anchor, positive)  # [B, B]
    hinge = (dist.diagonal()[:, None] - dist + margin).clamp_min(0)  # [B, B]
    valid = group[:, None] != group[None, :]
    return (hinge * valid).sum() / valid.sum().clamp_min(1)


# ------------------------------------------------------------------------- the head


class Mul2vecHead(Head):
    """NTF over (document, word, video) with amortised encoders for new texts and videos.

    ``dim`` is the width D of DiCoSA's vectors, ``vocab`` the words of the tensor's second
    mode, ``num_docs`` and ``num_entities`` the sizes of its first and third modes.
    """

    kind = "mul2vec"
    Config = Mul2vecConfig

    def __init__(self, config: Mul2vecConfig, dim: int, vocab: list[str], num_docs: int,
                 num_entities: int):
        super().__init__(config)
        self.dim, self.vocab = dim, list(vocab)
        self.num_docs, self.num_entities = num_docs, num_entities
        k = config.topics
        # Semantic representations: Θ, T, G of Eq. 1.
        self.doc_topics = nn.Parameter(0.5 * torch.randn(num_docs, k))
        self.word_topics = nn.Parameter(0.5 * torch.randn(len(vocab), k))
        self.entity_topics = nn.Parameter(0.5 * torch.randn(num_entities, k))
        layers, width = [], 3 * dim
        for _ in range(config.mlp_layers):
            layers += [nn.Linear(width, config.hidden), nn.ReLU(), nn.Dropout(config.dropout)]
            width = config.hidden
        self.mlp = nn.Sequential(*layers)  # Eq. 3 over [e_n; e_v; e_l]
        self.h = nn.Linear(k + config.hidden, 1)  # hᵀ of Eq. 4
        self.text_encoder = self._encoder(dim, config)  # θ = f(e), trained by DLM
        self.video_encoder = self._encoder(dim, config)  # g = f_v(video proxy)

    @staticmethod
    def _encoder(dim: int, config: Mul2vecConfig) -> nn.Module:
        return nn.Sequential(nn.Linear(dim, config.hidden), nn.ReLU(),
                             nn.Linear(config.hidden, config.topics))

    def init_args(self) -> dict:
        return {"dim": self.dim, "vocab": self.vocab, "num_docs": self.num_docs,
                "num_entities": self.num_entities}

    # -- Eqs. 2-4 ----------------------------------------------------------------------
    def predict(self, theta: Tensor, t: Tensor, g: Tensor, e_doc: Tensor, e_word: Tensor,
                e_entity: Tensor) -> Tensor:
        """d̂ ``[E]`` from semantic ``θ, t, g [E, K]`` and contextual ``e [E, D]`` vectors."""
        interaction = theta * t * g  # [E, K] φ_NTF, Eq. 2
        z = self.mlp(torch.cat([e_doc, e_word, e_entity], dim=-1))  # [E, H] φ_MLP,H, Eq. 3
        return torch.sigmoid(self.h(torch.cat([interaction, z], dim=-1))).squeeze(-1)  # Eq. 4

    def predict_entries(self, entries: TensorEntries, context: dict[str, Tensor]) -> Tensor:
        """d̂ for entries of the training tensor (``context``: e_doc [N, D], e_word [V, D],
        e_entity [L, D])."""
        return self.predict(self.doc_topics[entries.doc], self.word_topics[entries.word],
                            self.entity_topics[entries.entity], context["doc"][entries.doc],
                            context["word"][entries.word], context["entity"][entries.entity])

    # -- vectors for search ------------------------------------------------------------
    def query_vectors(self, text: Tensor) -> Tensor:
        """θ_q ``[Q, K]`` (unit norm) of DiCoSA text vectors ``[Q, D]``: queries or titles."""
        return F.normalize(self.text_encoder(text), dim=-1)

    def entity_vectors(self, title_text: Tensor, has_title: Tensor, proxy: Tensor,
                       has_video: Tensor, frames_lost: Tensor | None = None) -> Tensor:
        """g ``[V, K]`` (unit norm) of indexed videos from whatever each one has: the titles'
        DiCoSA text vectors ``title_text [V, D]`` where ``has_title [V]``, the video proxies
        ``proxy [V, D]`` where ``has_video [V]`` (False for text-only entries), and
        ``frames_lost [V]``, the fraction of frames known to be lost.

        The title view f(title) and the video view f_v(proxy) are averaged with weights
        has_title and has_video * (1 - frames_lost): an entity's vector is the mean of its
        views, as ILM pulls G towards its documents and DLM pulls f_v(p_l) towards G.
        """
        lost = frames_lost if frames_lost is not None else torch.zeros(len(proxy))
        w_title = has_title.float()[:, None]  # [V, 1]
        w_video = (has_video.float() * (1 - lost.float()))[:, None]  # [V, 1]
        if bool(((w_title + w_video) <= 0).any()):
            raise ValueError("every indexed video needs a title or decodable frames")
        views = (w_title * F.normalize(self.text_encoder(title_text), dim=-1)
                 + w_video * F.normalize(self.video_encoder(proxy), dim=-1))
        return F.normalize(views, dim=-1)

    # -- training ----------------------------------------------------------------------
    def losses(self, entries: TensorEntries, context: dict[str, Tensor],
               docs: Tensor, doc_entity: Tensor) -> dict[str, Tensor]:
        """L_D (Eq. 5, mean over the entries; weight decay is the optimiser's), ILM on the
        documents ``docs [B]`` and their entities, DLM for documents and entities."""
        prediction = self.predict_entries(entries, context)
        entity = doc_entity[docs]
        theta, g = self.doc_topics[docs], self.entity_topics[entity]
        margin = self.config.margin
        ilm = ilm_dlm_triplet(g, theta, entity, margin)
        dlm = (ilm_dlm_triplet(self.text_encoder(context["doc"][docs]), theta, entity, margin)
               + ilm_dlm_triplet(self.video_encoder(context["entity"][entity]), g, entity,
                                 margin))
        d = F.mse_loss(prediction, entries.value)
        total = d + self.config.lambda_ilm * ilm + self.config.lambda_dlm * dlm
        return {"loss": total, "L_D": d, "ILM": ilm, "DLM": dlm}

    @classmethod
    def fit(cls, model: nn.Module, data: HeadData, config: Mul2vecConfig, *, seed: int = 0,
            progress: bool = True) -> Mul2vecHead:
        """Train on the training split's captions; report the held-out MAE and validation
        recall of the semantic score alone (no fusion: that is
        :mod:`dicosa.search.title_fusion`)."""
        torch.manual_seed(seed)
        generator = torch.Generator().manual_seed(seed)
        train = data.train
        vocab = build_vocab(train.captions, config.min_count)
        doc_entity = train.caption_video
        entries = tfidf_entries(train.captions, doc_entity, vocab)
        head = cls(config, train.text.text.shape[1], list(vocab), len(train.captions),
                   train.num_videos)
        # e_v: each word alone through the frozen text tower
        context = {"doc": train.text.text, "word": text_vectors(model, list(vocab)),
                   "entity": DF.video_proxy(train.video.frames, train.video.frame_mask)}
        present = torch.zeros(len(train.captions), len(vocab), dtype=torch.bool)
        present[entries.doc, entries.word] = True
        order = torch.randperm(len(entries), generator=generator)
        cut = round(config.heldout * len(entries))
        heldout, fitted = entries[order[:cut]], entries[order[cut:]]
        heldout_zero = sample_negatives(heldout, present, train.num_videos, 1, generator)
        optimizer = torch.optim.Adam(head.parameters(), lr=config.lr,
                                     weight_decay=config.weight_decay)
        head.train()
        for step in range(config.steps):
            pick = torch.randint(len(fitted), (config.batch_size,), generator=generator)
            batch = fitted[pick]
            negatives = sample_negatives(batch, present, train.num_videos, config.negatives,
                                         generator)
            both = batch + negatives
            docs = torch.randint(len(train.captions), (config.batch_size,), generator=generator)
            parts = head.losses(both, context, docs, doc_entity)
            optimizer.zero_grad()
            parts["loss"].backward()
            optimizer.step()
            if progress and step % 200 == 0:
                log.info("mul2vec step %d: %s", step,
                         {k: round(v.item(), 4) for k, v in parts.items()})
        head.eval()
        with torch.no_grad():
            head.fit_report = {
                "vocabulary": len(vocab), "entries": len(entries),
                "heldout_mae_observed": _mae(head, heldout, context),
                "heldout_mae_zero": _mae(head, heldout_zero, context),
                "heldout_mae": _mae(head, heldout + heldout_zero, context),
            }
            if data.val is not None:
                head.fit_report["val_semantic_t2v_r1"] = semantic_recall(head, data.val)
        return head


def _mae(head: Mul2vecHead, entries: TensorEntries, context: dict[str, Tensor]) -> float:
    if not len(entries):
        return float("nan")
    return (head.predict_entries(entries, context) - entries.value).abs().mean().item()


def build_vocab(documents: list[str], min_count: int = 1) -> dict[str, int]:
    """word -> column of D, for words in at least ``min_count`` documents (sorted)."""
    counts = Counter(w for d in documents for w in set(words(d)))
    return {w: i for i, w in enumerate(sorted(w for w, c in counts.items() if c >= min_count))}


@torch.no_grad()
def semantic_recall(head: Mul2vecHead, split: SplitFeatures, k: int = 1) -> float:
    """t2v R@k (%) of cos(θ_q, f_v(proxy)) alone on ``split`` (all captions as queries)."""
    proxy = DF.video_proxy(split.video.frames, split.video.frame_mask)
    ones = torch.ones(split.num_videos, dtype=torch.bool)
    g = head.entity_vectors(proxy, ~ones, proxy, ones)
    sim = head.query_vectors(split.text.text) @ g.T  # [C, V]
    rank = (sim > sim.gather(1, split.caption_video[:, None])).sum(1)
    return float((rank < k).float().mean() * 100)
