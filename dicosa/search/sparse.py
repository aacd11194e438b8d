"""An exact inverted index over word-named sparse video vectors: the lexical first stage.

The videos' vectors (from a lexical head, :meth:`dicosa.heads.lexical.LexicalHead.encode_videos`)
are held term-major: a scipy CSR matrix ``[|V|, n]`` whose row ``t`` is the posting list of
word ``t`` (the videos that carry it, with their weights). A query's sparse vector
``[Q, |V|]`` times that matrix walks exactly the posting lists of the query's words
(scipy's sparse product touches no other entry), so the scores are exact dot products and a
video that shares no word with the query is never a candidate.

The query vectors come from ``queries.extra["lexical"]`` (scipy CSR ``[Q, |V|]``), filled by
:meth:`~dicosa.heads.lexical.LexicalHead.prepare` in ``"lexical"`` (the head's parametric
query) or ``"bow"`` (the query's own words, no network) mode.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch

from ..files import write_bytes_atomic
from .dense import array_bytes, candidates_of
from .types import Candidates, EncodedQueries

__all__ = ["SparseIndexError", "SparseStage", "lexical_vectors"]

_FORMAT_VERSION = 1
_ROW_KEYS = ("version", "ids", "words", "data", "indices", "indptr")


class SparseIndexError(ValueError):
    """Rows or files that do not fit the sparse index (one sentence)."""


def _as_csr(videos: object, width: int) -> sp.csr_matrix:
    """A ``[n, |V|]`` float32 CSR from a scipy matrix, a numpy array or a torch tensor."""
    if isinstance(videos, torch.Tensor):
        videos = videos.detach().cpu().float().numpy()
    matrix = sp.csr_matrix(videos, dtype=np.float32)
    if matrix.shape[1] != width:
        raise SparseIndexError(f"video vectors have {matrix.shape[1]} dimensions but this "
                               f"index's vocabulary has {width} words")
    if matrix.nnz and (matrix.data < 0).any():
        raise SparseIndexError("sparse video vectors must be non-negative word weights")
    matrix.eliminate_zeros()
    return matrix


def lexical_vectors(queries: EncodedQueries, k: int) -> object:
    """The queries' sparse word vectors (the lexical head's ``extra["lexical"]``) for a search
    of ``k`` rows each; one sentence where either is missing or wrong."""
    if k < 1:
        raise SparseIndexError(f"k must be at least 1, got {k}")
    vectors = queries.extra.get("lexical")
    if vectors is None:
        raise SparseIndexError("the queries carry no lexical vectors; call the lexical "
                               "head's prepare(queries) first")
    return vectors


def by_score(ids: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``ids [n]`` and their ``scores [n]`` by score, ties by the smaller id."""
    order = np.lexsort((ids, -scores))
    return ids[order], scores[order]


class SparseStage:
    """The lexical first stage (see the module docstring); implements ``FirstStage``."""

    backend = "exact"  # what ``attach_lexical(..., backend=)`` names this stage

    def __init__(self, words: list[str], name: str = "lexical"):
        self.name = name
        self.words = list(words)
        self._ids = np.empty(0, dtype=np.int64)  # [n] store row ids
        self._rows = sp.csr_matrix((0, len(self.words)), dtype=np.float32)  # [n, |V|]
        self._postings: sp.csr_matrix | None = None  # [|V|, n], built on first search
        # [n] argsort of _ids and _ids in that order, made when first needed
        self._order: np.ndarray | None = None
        self._sorted_ids: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self._ids)

    @property
    def ids(self) -> np.ndarray:
        return self._ids.copy()

    @property
    def nbytes(self) -> int:
        """Memory held by the rows and ids (and the term-major copy, once a search made it)."""
        held = [m for m in (self._rows, self._postings) if m is not None]
        return self._ids.nbytes + sum(m.data.nbytes + m.indices.nbytes + m.indptr.nbytes
                                      for m in held)

    def add(self, ids: np.ndarray, videos: object) -> None:
        """Index rows ``ids [n]`` with their sparse vectors ``videos [n, |V|]``."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        rows = _as_csr(videos, len(self.words))
        if rows.shape[0] != len(ids):
            raise SparseIndexError(f"{len(ids)} ids for {rows.shape[0]} video vectors")
        if len(np.unique(ids)) != len(ids) or np.isin(ids, self._ids).any():
            raise SparseIndexError("row ids must be new and distinct (a row is indexed once)")
        self._ids = np.concatenate([self._ids, ids])
        self._rows = sp.vstack([self._rows, rows], format="csr")
        self._postings = self._order = None

    def remove(self, ids: np.ndarray) -> None:
        """Stop returning rows ``ids`` (unknown ids are ignored)."""
        keep = ~np.isin(self._ids, np.asarray(ids, dtype=np.int64))
        self._ids = self._ids[keep]
        self._rows = self._rows[keep]
        self._postings = self._order = None

    def positions(self, ids: np.ndarray) -> np.ndarray:
        """Where rows ``ids [n]`` are in the stored matrix (SparseIndexError for a row this
        stage does not hold); the sort behind it is kept until the rows change, so a search
        that looks up its candidates pays O(C log n), not a sort (or a copy) of every row."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if self._order is None or self._sorted_ids is None:
            self._order = np.argsort(self._ids, kind="stable")
            self._sorted_ids = self._ids[self._order]
        held = self._sorted_ids  # [n] ascending
        at = np.searchsorted(held, ids)
        found = at < len(held)
        found[found] = held[at[found]] == ids[found]
        if not found.all():
            raise SparseIndexError(f"row {int(ids[~found][0])} is not in the {self.name} stage")
        return self._order[at]

    def vectors(self, ids: np.ndarray) -> sp.csr_matrix:
        """The stored sparse vectors ``[n, |V|]`` of rows ``ids [n]`` (SparseIndexError for a
        row this stage does not hold)."""
        return self._rows[self.positions(ids)]

    def scores(self, queries: sp.csr_matrix) -> sp.csr_matrix:
        """Exact dot products ``[Q, n]`` of ``queries [Q, |V|]`` with every indexed video,
        as a sparse matrix holding only the videos that share a word with the query."""
        if queries.shape[1] != len(self.words):
            raise SparseIndexError(f"query vectors have {queries.shape[1]} dimensions but this "
                                   f"index's vocabulary has {len(self.words)} words")
        if self._postings is None:
            self._postings = self._rows.T.tocsr()  # term-major: row t = posting list of t
        return (sp.csr_matrix(queries, dtype=np.float32) @ self._postings).tocsr()

    def search(self, queries: EncodedQueries, k: int) -> Candidates:
        """The ``k`` best rows per query by sparse dot product; ties go to the smaller id;
        rows sharing no word with the query are not returned (``-1`` pads)."""
        matched = self.scores(lexical_vectors(queries, k))
        found = []
        for q in range(matched.shape[0]):
            start, end = matched.indptr[q], matched.indptr[q + 1]
            cols, values = matched.indices[start:end], matched.data[start:end]
            keep = values > 0
            if keep.sum() > k:
                # Only rows scoring at least the k-th best can be among the k: sorting just
                # them (ties at that score included) gives the same list as sorting every
                # match, which at 100k rows was most of the search's time.
                kth = np.partition(values[keep], -k)[-k]
                keep &= values >= kth
            found.append(by_score(self._ids[cols[keep]], values[keep]))
        return candidates_of(found, k, str(queries.extra.get("lexical_mode", self.name)))

    # -- files ------------------------------------------------------------------------------
    def _path(self, directory: str | os.PathLike) -> Path:
        return Path(directory) / f"sparse-{self.name}.npz"

    def save(self, directory: str | os.PathLike) -> None:
        """Write ``sparse-<name>.npz`` into ``directory`` atomically, with the umask; a seismic
        index file of this stage left by the other backend is deleted (the rows file just
        written no longer names it, so it could only take disk)."""
        self._write_rows(directory)
        for stale in Path(directory).glob(f"sparse-{self.name}.*.seismic"):
            stale.unlink(missing_ok=True)

    def _write_rows(self, directory: str | os.PathLike, **extra: np.ndarray) -> None:
        """The rows file, plus ``extra`` arrays a subclass keeps beside them (the stage of
        another backend reads the same file and ignores them)."""
        rows = self._rows
        write_bytes_atomic(self._path(directory), array_bytes(
            version=np.int64(_FORMAT_VERSION), ids=self._ids,
            words=np.array(self.words, dtype=str), data=rows.data, indices=rows.indices,
            indptr=rows.indptr, **extra))

    @classmethod
    def load(cls, directory: str | os.PathLike, name: str = "lexical") -> SparseStage:
        """The stage saved in ``directory`` (one-sentence SparseIndexError if damaged)."""
        stage = cls([], name)
        stage._read_rows(directory)
        return stage

    def _read_rows(self, directory: str | os.PathLike) -> dict[str, np.ndarray]:
        """Fill this stage from its rows file; returns the file's other arrays."""
        path = self._path(directory)
        try:
            with np.load(path, allow_pickle=False) as f:
                if int(f["version"]) != _FORMAT_VERSION:
                    raise SparseIndexError(f"{path} is a sparse index of format version "
                                           f"{int(f['version'])}; this dicosa reads "
                                           f"{_FORMAT_VERSION}")
                words = [str(w) for w in f["words"]]
                rows = sp.csr_matrix((f["data"], f["indices"], f["indptr"]),
                                     shape=(len(f["ids"]), len(words)), dtype=np.float32)
                ids = f["ids"].astype(np.int64)
                extra = {key: f[key] for key in f.files if key not in _ROW_KEYS}
        except (FileNotFoundError, SparseIndexError):
            raise
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
            raise SparseIndexError(f"{path} is not a readable sparse index ({exc})") from None
        self.words, self._ids, self._rows = words, ids, rows
        self._postings = self._order = None
        return extra
