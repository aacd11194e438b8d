"""An approximate sparse first stage: a seismic index (``pyseismic-lsr``) over the exact
stage's rows.

:class:`SeismicStage` is a :class:`~dicosa.search.sparse.SparseStage` (the same float32 rows,
ids, ``vectors``, rows file) whose ``search`` asks seismic (Bruch et al., SIGIR 2024) for
candidates instead of walking every posting list; it is approximate: a row can be missed. Its
candidates are rescored from the float32 rows; rows added since the build are scored exactly
beside them, and removed ones filtered out, until either passes its fraction of the built rows
and the index is rebuilt; the rows file names the build that goes with it, so a crash leaves
either the old pair or the new one. docs/search.md ("The sparse stage and seismic") says more.

``pyseismic-lsr`` is an optional dependency (``pip install 'dicosa[seismic]'``); asking for
this stage without it is one sentence (:class:`SeismicUnavailableError`).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType

import numpy as np
import scipy.sparse as sp

from ..config import ConfigError, dataclass_from_dict
from .dense import candidates_of, top_k
from .sparse import SparseIndexError, SparseStage, by_score, lexical_vectors
from .types import Candidates, EncodedQueries

__all__ = ["SeismicConfig", "SeismicStage", "SeismicUnavailableError", "import_seismic",
           "seismic_config"]

log = logging.getLogger(__name__)

INSTALL = "pip install pyseismic-lsr (or pip install 'dicosa[seismic]')"
_U16_COMPONENTS = 65_535  # SeismicIndex stores word ids as u16; larger vocabularies need LV
_FLOAT16_TOP = 2.0 ** 14  # the largest weight is scaled to at most this for float16


class SeismicUnavailableError(SparseIndexError):
    """The optional ``pyseismic-lsr`` package is not installed (one sentence)."""


def import_seismic() -> ModuleType:
    """The ``seismic`` module of ``pyseismic-lsr``, or one sentence saying how to install it."""
    try:
        import seismic
    except ImportError:
        raise SeismicUnavailableError(f"the seismic sparse backend needs the pyseismic-lsr "
                                      f"package, which is not installed: {INSTALL}") from None
    return seismic


@dataclass(frozen=True)
class SeismicConfig:
    """Seismic's settings. Build-time ones decide what the index keeps (changing them
    rebuilds it); search-time ones trade speed for recall on every query.

    The build defaults are pyseismic-lsr's own. Search: heap_factor 0.9 as its guidelines
    ([0.7, 1]); query_cut 20, not their 10, which lost more of the exact top 10
    (docs/search.md, "The sparse stage").
    """

    # -- build ---------------------------------------------------------------------------
    n_postings: int = 3500  # postings kept per word on average (the largest weights)
    max_fraction: float = 1.5  # a word's list keeps at most n_postings * max_fraction
    centroid_fraction: float = 0.1  # blocks per list, as a fraction of its length
    summary_energy: float = 0.4  # share of a block's L1 mass its summary keeps
    min_cluster_size: int = 2
    doc_cut: int = 15  # a row's heaviest words used to cluster it into blocks
    # -- search --------------------------------------------------------------------------
    query_cut: int = 20  # the query's heaviest words whose lists are scanned
    heap_factor: float = 0.9  # skip a block scoring below this times the k-th best (0: none)
    sorted: bool = True  # scan a list's blocks best summary first (faster; False: more recall)
    slack: int = 32  # candidates fetched beyond k, rescored exactly, so float16 near-ties
    # at the k-th place fall on the right side
    # -- maintenance ---------------------------------------------------------------------
    rebuild_fraction: float = 0.2  # rebuild once removed rows exceed this share of the built
    pending_fraction: float = 0.05  # ... or once added rows waiting outside it exceed this
    num_threads: int = 0  # seismic's threads for build and batch search (0: every core)

    def __post_init__(self) -> None:
        positive = {"n_postings": self.n_postings, "query_cut": self.query_cut,
                    "min_cluster_size": self.min_cluster_size, "doc_cut": self.doc_cut}
        for name, value in positive.items():
            if value < 1:
                raise SparseIndexError(f"seismic {name} must be at least 1, got {value}")
        if self.max_fraction <= 0 or not 0 < self.centroid_fraction <= 1 \
                or not 0 < self.summary_energy <= 1:
            raise SparseIndexError("seismic max_fraction must be positive and centroid_fraction"
                                   " and summary_energy in (0, 1]")
        if self.heap_factor < 0 or self.slack < 0 or self.num_threads < 0 \
                or not 0 < self.rebuild_fraction <= 1 or not 0 <= self.pending_fraction <= 1:
            raise SparseIndexError("seismic heap_factor, slack and num_threads must be >= 0, "
                                   "rebuild_fraction in (0, 1] and pending_fraction in [0, 1]")

    def build_settings(self) -> dict:
        """The settings the built index depends on."""
        return {f: getattr(self, f) for f in _BUILD_FIELDS}


_BUILD_FIELDS = ("n_postings", "max_fraction", "centroid_fraction", "summary_energy",
                 "min_cluster_size", "doc_cut")


def seismic_config(options: Mapping | SeismicConfig | None) -> SeismicConfig:
    """A :class:`SeismicConfig` from ``KEY=VALUE``-style options (unknown keys, bad values:
    one sentence)."""
    if isinstance(options, SeismicConfig):
        return options
    try:
        return dataclass_from_dict(SeismicConfig, dict(options or {}), "seismic.")
    except ConfigError as exc:
        raise SparseIndexError(str(exc)) from None


@contextmanager
def _rust_output_to_log() -> Iterator[None]:
    """Seismic's Rust code prints its progress on the process's stdout (file descriptor 1),
    which would land in the middle of the command line's output: send it to the debug log.
    (Anything another thread prints meanwhile goes there too.)"""
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 1)
        try:
            yield
        finally:
            os.dup2(saved, 1)
            os.close(saved)
            sink.seek(0)
            text = sink.read().decode(errors="replace").strip()
            if text:
                log.debug("seismic: %s", " | ".join(text.splitlines()))


class SeismicStage(SparseStage):
    """The lexical first stage on seismic (see the module docstring); implements
    ``FirstStage``, with the exact stage's rows, ids and files."""

    backend = "seismic"

    def __init__(self, words: list[str], name: str = "lexical",
                 config: SeismicConfig | Mapping | None = None):
        self._seismic = import_seismic()  # before any work: one sentence if it is missing
        super().__init__(words, name)
        self.config = seismic_config(config)
        self._index = None  # the seismic index over _built, None when stale or empty
        self._built = np.empty(0, dtype=np.int64)  # [b] ascending: the rows it holds
        self._tombstones = np.empty(0, dtype=np.int64)  # [t] ascending: built, since removed
        self._pending: tuple[np.ndarray, sp.csc_matrix] | None = None  # added since the build
        self._stale = False  # the index must be rebuilt before the next search
        self._build_id: str | None = None  # names the index's file; None: not built
        self._saved_id: str | None = None  # the build whose file is in the folder

    # -- rows ------------------------------------------------------------------------------
    def add(self, ids: np.ndarray, videos: object) -> None:
        """Index rows ``ids [n]``: searched exactly beside the seismic index until they
        exceed ``pending_fraction`` of its rows, then the next search or save rebuilds it
        (seismic cannot insert)."""
        super().add(ids, videos)
        self._check_rebuild()

    def remove(self, ids: np.ndarray) -> None:
        """Stop returning rows ``ids``: gone from the rows now, filtered from seismic's
        answers until the rebuild that ``rebuild_fraction`` triggers."""
        super().remove(ids)
        self._check_rebuild()

    def _check_rebuild(self) -> None:
        """Refresh the tombstones and the rows waiting outside the index; mark the index
        stale when either is past its fraction of the built rows."""
        self._tombstones = np.setdiff1d(self._built, self._ids)  # both ascending, unique
        self._pending = None
        built = max(len(self._built), 1)
        waiting = len(self._ids) - (len(self._built) - len(self._tombstones))
        if len(self._tombstones) > self.config.rebuild_fraction * built \
                or waiting > self.config.pending_fraction * built:
            self._stale = True

    def _pending_rows(self) -> tuple[np.ndarray, sp.csc_matrix]:
        """The ids added since the build and their rows ``[p, |V|]``, term-major so that a
        query reads only its words' columns (kept until the next add or remove)."""
        if self._pending is None:
            ids = np.setdiff1d(self._ids, self._built)
            self._pending = (ids, self._rows[self.positions(ids)].tocsc())
        return self._pending

    @property
    def unsaved(self) -> bool:
        """Whether the folder lacks the index this stage would search (rebuilt or never
        written): ``attach_lexical`` then saves even when no row changed."""
        return self._stale or self._build_id != self._saved_id

    def set_config(self, config: SeismicConfig | Mapping) -> None:
        """New settings; a change of a build setting makes the index stale."""
        config = seismic_config(config)
        if config.build_settings() != self.config.build_settings():
            self._stale = True
        self.config = config

    # -- the seismic index -----------------------------------------------------------------
    def build(self) -> None:
        """Bring the seismic index up to date now (else the next search or save does)."""
        if self._stale or (self._build_id is None and len(self._ids)):
            self._build()

    def _build(self) -> None:
        """(Re)build the seismic index over every row."""
        start = time.perf_counter()
        rows = self._rows
        rows.sum_duplicates()  # seismic wants each row's word ids strictly increasing
        self._index = None
        if rows.nnz:
            dataset = self._dataset(rows)
            cfg = self.config
            with _rust_output_to_log():
                self._index = self._seismic_class("SeismicIndex").build_from_dataset(
                    dataset, n_postings=cfg.n_postings, centroid_fraction=cfg.centroid_fraction,
                    min_cluster_size=cfg.min_cluster_size, summary_energy=cfg.summary_energy,
                    max_fraction=cfg.max_fraction, doc_cut=cfg.doc_cut,
                    num_threads=cfg.num_threads)
        self._built = np.sort(self._ids)
        self._tombstones = np.empty(0, dtype=np.int64)
        self._pending = None
        self._stale = False
        self._build_id = uuid.uuid4().hex[:12]
        log.info("built the seismic index of the %s stage: %d rows, %d non-zeros, %.1f s",
                 self.name, len(self._ids), rows.nnz, time.perf_counter() - start)

    def _dataset(self, rows: sp.csr_matrix):
        """A seismic dataset of ``rows``: doc id = the row id as text, component = word id.

        Seismic takes float32 weights but stores them as float16 (largest finite 65,504,
        smallest normal 6.1e-5). A power of two moves the largest weight into (2^13, 2^14]: no
        overflow, every weight above 2^-27 of the largest stays a normal float16, the ranking
        is unchanged (one scale for all rows) and the scaling itself is exact. The scores are
        recomputed from the float32 rows anyway."""
        largest = float(rows.data.max())
        # (the exponent is clipped so that the scale itself is a finite float32)
        exponent = np.clip(np.floor(np.log2(_FLOAT16_TOP / largest)), -126, 126) \
            if largest > 0 else 0
        scale = np.float32(2.0 ** exponent)
        dataset = self._seismic_class("SeismicDataset")(dim=len(self.words))
        dataset.add_documents_by_id([str(i) for i in self._ids],
                                    rows.indices.astype(np.int64),
                                    (rows.data * scale).astype(np.float32),
                                    rows.indptr.astype(np.int64))
        return dataset

    def _seismic_class(self, name: str):
        """Seismic's class ``name``, its ``LV`` form for a vocabulary past u16 word ids."""
        return getattr(self._seismic, name + ("LV" if len(self.words) > _U16_COMPONENTS else ""))

    # -- search ------------------------------------------------------------------------------
    def search(self, queries: EncodedQueries, k: int) -> Candidates:
        """The ``k`` best rows per query that seismic finds, scored exactly (ties go to the
        smaller id); rows sharing no word with the query are not returned (``-1`` pads)."""
        vectors = sp.csr_matrix(lexical_vectors(queries, k), dtype=np.float32)
        if vectors.shape[1] != len(self.words):
            raise SparseIndexError(f"query vectors have {vectors.shape[1]} dimensions but this "
                                   f"index's vocabulary has {len(self.words)} words")
        self.build()
        found = [by_score(*self._rescore(vectors[q], self._candidates(vectors[q], k)))
                 for q in range(vectors.shape[0])]
        return candidates_of(found, k, str(queries.extra.get("lexical_mode", self.name)))

    def _candidates(self, query: sp.csr_matrix, k: int) -> np.ndarray:
        """Live row ids for one query ``[1, |V|]``: seismic's (at least ``k + slack`` where it
        finds that many, tombstones filtered out) and the best ``k + slack`` of the rows added
        since the build, scored exactly."""
        if not query.nnz:
            return np.empty(0, dtype=np.int64)
        want = k + self.config.slack
        pending, rows = self._pending_rows()
        if len(pending):
            scores = rows[:, query.indices] @ query.data  # [p]
            best = top_k(scores[None], want)[0]
            pending = pending[best[scores[best] > 0]]
        if self._index is None:
            return pending
        # Every tombstone could be among the answers: asking for that many more guarantees
        # `want` live rows whenever seismic finds them (the tombstones are bounded by
        # rebuild_fraction of the built rows).
        fetch = min(want + len(self._tombstones), len(self._built))
        components = np.array([str(c) for c in query.indices],
                              dtype=self._seismic.get_seismic_string())
        found = self._index.search("q", components, query.data.astype(np.float32), k=fetch,
                                   query_cut=self.config.query_cut,
                                   heap_factor=self.config.heap_factor,
                                   sorted=self.config.sorted)
        ids = np.fromiter((int(doc) for _, _, doc in found), dtype=np.int64, count=len(found))
        if len(self._tombstones):
            ids = ids[~np.isin(ids, self._tombstones, assume_unique=True)]
        return np.concatenate([ids, pending])

    def _rescore(self, query: sp.csr_matrix, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Exact float32 dot products of ``query [1, |V|]`` with rows ``ids``; rows scoring 0
        dropped (as the exact stage drops rows sharing no word)."""
        if not len(ids):
            return ids, np.empty(0, dtype=np.float32)
        scores = (self._rows[self.positions(ids)] @ query.T).toarray()[:, 0]
        keep = scores > 0
        return ids[keep], scores[keep].astype(np.float32)

    # -- files -------------------------------------------------------------------------------
    def _index_path(self, directory: str | os.PathLike, build_id: str) -> Path:
        return Path(directory) / f"sparse-{self.name}.{build_id}.seismic"

    def save(self, directory: str | os.PathLike) -> None:
        """Write the seismic index (if not in the folder yet), then the rows file that names
        it (the commit point), then delete older index files."""
        self.build()
        directory = Path(directory)
        final = self._index_path(directory, self._build_id)
        # A file of this build's (random) id can only hold this build: written before.
        if self._index is not None and not final.is_file():
            prefix = directory / f".{final.name}.tmp-{os.getpid()}"
            written = Path(f"{prefix}.index.seismic")  # seismic appends this to the prefix
            try:
                with _rust_output_to_log():
                    self._index.save(str(prefix))
                os.replace(written, final)
            finally:
                written.unlink(missing_ok=True)
        info = {"backend": self.backend, "build": self._build_id,
                "indexed": self._index is not None, "config": asdict(self.config)}
        self._write_rows(directory, seismic=np.array(json.dumps(info)), built=self._built)
        self._saved_id = self._build_id
        for old in directory.glob(f"sparse-{self.name}.*.seismic"):
            if old.name != final.name or self._index is None:
                old.unlink(missing_ok=True)

    @classmethod
    def load(cls, directory: str | os.PathLike, name: str = "lexical",
             config: SeismicConfig | Mapping | None = None) -> SeismicStage:
        """The stage saved in ``directory`` by either backend. Its seismic index is reopened
        when the rows file names one that is there and readable; else (an exact stage's
        folder, a lost file) it is rebuilt from the rows at the first search or save.
        ``config`` None keeps the saved settings; a change of build settings rebuilds."""
        stage = cls([], name)
        extra = stage._read_rows(directory)
        info = json.loads(str(extra["seismic"])) if "seismic" in extra else {}
        stage.config = seismic_config(info.get("config") or config)
        stage._stale = True
        if info.get("build") and "built" in extra:
            stage._reopen(Path(directory), info, extra["built"].astype(np.int64))
        if config is not None:
            stage.set_config(config)
        return stage

    def _reopen(self, directory: Path, info: dict, built: np.ndarray) -> None:
        """Attach the saved seismic index named by ``info`` (or leave the stage stale)."""
        index = None
        if info.get("indexed"):
            path = self._index_path(directory, info["build"])
            try:
                with _rust_output_to_log():
                    index = self._seismic_class("SeismicIndex").load(str(path))
            except OSError as exc:  # seismic raises IOError for missing or damaged files
                log.warning("rebuilding the seismic index of the %s stage from its rows: %s",
                            self.name, str(exc).splitlines()[0] if str(exc) else exc)
                return
        self._index, self._built = index, built
        self._build_id = self._saved_id = info["build"]
        self._stale = False
        self._check_rebuild()  # rows added or removed since the build, as before the save
