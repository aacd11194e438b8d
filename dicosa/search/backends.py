"""Choosing a dense first stage by a string, and opening the one an index folder saved.

``exact`` (numpy, exhaustive: the reference), ``faiss`` (HNSW or IVF-PQ in the index folder;
``local`` is an alias) and ``milvus`` (a Milvus server, or milvus-lite for a ``.db`` URI).
No backend-specific code lives outside ``dicosa/search/``: callers hold a ``FirstStage``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..config import ConfigError, dataclass_from_dict
from .dense import STAGE_FILE, ExactStage, FaissConfig, FaissStage, StageError
from .types import FirstStage

__all__ = ["BACKENDS", "StageError", "make_first_stage", "open_first_stage"]

BACKENDS = ("exact", "faiss", "milvus")
_ALIASES = {"local": "faiss"}


def _backend(name: str) -> str:
    backend = _ALIASES.get(name, name)
    if backend not in BACKENDS:
        raise StageError(f"unknown first-stage backend {name!r}; known: "
                         f"{', '.join(BACKENDS)} (and 'local' for faiss)")
    return backend


def make_first_stage(backend: str, *, directory: str | os.PathLike, dim: int,
                     uri: str | None = None, **options) -> FirstStage:
    """A new, empty dense first stage for an index in ``directory`` over ``dim``-wide vectors.

    ``options`` are the backend's settings: ``normalize`` for exact; the fields of
    :class:`~dicosa.search.dense.FaissConfig` for faiss; the fields of
    :class:`~dicosa.search.milvus.MilvusConfig` for milvus, whose ``uri`` defaults to
    ``directory/milvus.db`` (milvus-lite).
    """
    backend = _backend(backend)
    if uri is not None and backend != "milvus":
        raise StageError(f"a URI selects a Milvus server; the {backend} backend takes none")
    try:
        if backend == "exact":
            return ExactStage(dim, **options)
        if backend == "faiss":
            return FaissStage(dim, dataclass_from_dict(FaissConfig, options, "faiss."))
        from .milvus import MilvusConfig, MilvusStage  # pymilvus loads only when asked for

        return MilvusStage(dim, uri=uri, directory=directory,
                           config=dataclass_from_dict(MilvusConfig, options, "milvus."))
    except TypeError as exc:  # an unknown keyword for ExactStage
        raise StageError(f"bad option for the {backend} backend: {exc}") from None


def open_first_stage(directory: str | os.PathLike, *, uri: str | None = None) -> FirstStage:
    """The first stage an index folder saved; ``uri`` points a Milvus stage at another server
    (the same collection moved or served elsewhere)."""
    path = Path(directory) / STAGE_FILE
    try:
        info = json.loads(path.read_text())
        backend = _backend(info["backend"])
    except FileNotFoundError:
        raise FileNotFoundError(f"{directory} has no first stage ({STAGE_FILE} is missing)")\
            from None
    except (ValueError, KeyError, TypeError) as exc:
        if isinstance(exc, StageError):
            raise
        raise StageError(f"{path} is not a first-stage description ({exc})") from None
    if uri is not None and backend != "milvus":
        raise StageError(f"a URI selects a Milvus server; the saved {backend} stage takes none")
    try:
        if backend == "exact":
            return ExactStage.open(directory, info)
        if backend == "faiss":
            return FaissStage.open(directory, info)
        from .milvus import MilvusStage

        return MilvusStage.open(directory, info, uri=uri)
    except ConfigError:
        raise
    except (OSError, RuntimeError) as exc:  # faiss raises RuntimeError for damaged files
        if isinstance(exc, FileNotFoundError):
            raise FileNotFoundError(f"{directory}: the {backend} first stage's file is "
                                    f"missing ({Path(exc.filename or '').name})") from None
        raise StageError(f"{directory}: the {backend} first stage cannot be read "
                         f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})")\
            from None
