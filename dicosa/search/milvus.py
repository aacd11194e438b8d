"""The dense first stage on Milvus: the same code for milvus-lite (a ``.db`` file, embedded)
and a Milvus standalone server or cluster (``http://host:19530``).

One collection per index: ``id`` INT64 primary key = the store's row id, ``proxy``
FLOAT_VECTOR [D] = the unit dense proxy (see :mod:`dicosa.search.dense`), compared by inner
product (= cosine); removal is Milvus's delete by primary key. The per-frame features stay in
the index folder's store, or also in the collection (``MilvusConfig.frames``, Milvus 2.4 on).

A server indexes in the background and searches rows it has not indexed at a lower recall, so
:meth:`MilvusStage.save`, and a search after this process's :meth:`MilvusStage.add`, first
wait until every flushed row is indexed and served indexed (:meth:`MilvusStage.wait_indexed`);
milvus-lite indexes as it inserts. A search within ``strong_for`` seconds of this stage's own
write is Strong, later ones Bounded. Every request is retried for at most ``timeout`` seconds,
then fails in one sentence naming the server; :meth:`MilvusStage.row_ids` says what an
interrupted build holds. docs/milvus.md says more of each, what was measured, and how to run
against a server or a cluster.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from ..checkpoint import write_text_atomic
from ..config import dataclass_from_dict
from ..model import VideoFeatures
from .dense import STAGE_FILE, StageError, candidates_of, check_k, proxy_vectors, query_vectors
from .dense import row_ids as as_row_ids
from .types import Candidates, EncodedQueries

__all__ = ["IndexProgress", "MilvusConfig", "MilvusError", "MilvusStage"]

log = logging.getLogger(__name__)

ID_FIELD, VECTOR_FIELD = "id", "proxy"
FRAMES_FIELD, MASK_FIELD = "frames", "frame_mask"  # with frames > 0: float16 [N·D], bitmask
MAX_TOPK = 16384  # Milvus's limit on k per search
MAX_QUERY = 16384  # and on the rows one query returns


class MilvusError(StageError):
    """Milvus cannot be reached or refused an operation; one sentence."""


@dataclass(frozen=True)
class MilvusConfig:
    """A Milvus first stage. ``index_type=None`` picks FLAT (exact) on milvus-lite, which is
    for small collections and tests, and HNSW on a server."""

    collection: str = "dicosa_dense"
    index_type: Literal["FLAT", "IVF_FLAT", "HNSW", "AUTOINDEX"] | None = None
    nlist: int = 1024  # IVF_FLAT
    nprobe: int = 32
    hnsw_m: int = 32  # HNSW
    ef_construction: int = 200
    ef_search: int = 256
    # Bytes of vectors per insert call (milvus-lite is many times slower on one large call).
    insert_bytes: int = 2 << 20
    # Seconds to connect, and to keep retrying a request the server does not answer.
    timeout: float = 30.0
    # Seconds save() (and a search after add) waits for the server to index and serve every
    # row (module docstring); 0: do not wait, searches may then be partial.
    index_wait: float = 3600.0
    # The server's indexCoord.segment.minSegmentNumRowsToEnableIndex: smaller segments are
    # never indexed, so no wait is made for them.
    index_min_rows: int = 1024
    # Seconds after this stage's last add or remove during which its searches use Strong
    # consistency (they see that write); later ones use Bounded, which sees every write older
    # than the server's common.gracefulTime (keep it below this) without Strong's wait.
    strong_for: float = 10.0
    # > 0: also keep each video's per-frame features (float16, up to this many frames) in the
    # collection, so a searcher needs no local files but the model (see fetch_frames).
    frames: int = 0
    normalize: bool = True

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,254}", self.collection):
            raise StageError(f"Milvus collection name {self.collection!r} must be letters, "
                             "digits and underscores, not starting with a digit")
        if self.index_type not in (None, "FLAT", "IVF_FLAT", "HNSW", "AUTOINDEX"):
            raise StageError(f"Milvus index_type must be FLAT, IVF_FLAT, HNSW or AUTOINDEX, "
                             f"got {self.index_type!r}")
        if not 0 <= self.frames <= 63:  # the frame mask is one INT64 bitmask
            raise StageError(f"Milvus frames must be between 0 and 63, got {self.frames}")
        if not (self.timeout > 0 and self.index_wait >= 0):
            raise StageError(f"Milvus timeout must be > 0 and index_wait >= 0 seconds, got "
                             f"{self.timeout} and {self.index_wait}")


@dataclass(frozen=True)
class IndexProgress:
    """How much of a collection a Milvus server has indexed and serves from indexed segments.

    ``rows``: rows in flushed segments; ``indexed``: of those, in segments whose index is
    built (or that are too small to get one); ``served``: rows the query nodes search from
    sealed segments that have their index loaded (or are too small to get one)."""

    rows: int
    indexed: int
    served: int

    @property
    def done(self) -> bool:
        return self.indexed >= self.rows and self.served >= self.rows


def is_lite(uri: str) -> bool:
    return uri.endswith(".db")


def check_uri(uri: str) -> str:
    """A ``.db`` path (milvus-lite) or an ``http(s)://`` / ``tcp://`` server address."""
    uri = str(uri)
    if is_lite(uri) or re.match(r"(https?|tcp|grpc)://[^/\s]+", uri):
        return uri
    raise MilvusError(f"Milvus URI {uri!r} is neither a milvus-lite file ending in .db nor a "
                      "server address like http://host:19530")


def connect(uri: str, timeout: float):
    """A ``MilvusClient``; any failure to reach the engine is one :class:`MilvusError`."""
    with warnings.catch_warnings():  # milvus-lite 2.5 imports the deprecated pkg_resources
        warnings.simplefilter("ignore", UserWarning)
        from pymilvus import MilvusClient
    if is_lite(uri):
        Path(uri).parent.mkdir(parents=True, exist_ok=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return MilvusClient(uri=uri, timeout=timeout)
    except ModuleNotFoundError as exc:
        if exc.name != "pkg_resources":
            raise
        # milvus-lite 2.5 (a .db file) imports pkg_resources, which setuptools 82 removed
        raise MilvusError(f"milvus-lite (for {uri}) needs pkg_resources, which setuptools 82 "
                          "removed: pip install 'setuptools<82'") from None
    except Exception as exc:  # pymilvus raises MilvusException, ConnectionError, ...
        raise MilvusError(f"cannot reach Milvus at {uri} ({_first_line(exc)})") from None


def _vector_bytes(value) -> bytes:
    """pymilvus returns a float16 vector as ``[bytes]`` (or bytes)."""
    return value[0] if isinstance(value, list) else value


def _first_line(exc: BaseException) -> str:
    text = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return str(text).strip().splitlines()[0][:200].replace(". ", "; ")


def _unreachable(detail: str) -> bool:
    """pymilvus's message for a server that does not answer (gRPC UNAVAILABLE, retried)."""
    return any(sign in detail for sign in ("failed to connect", "Connection refused",
                                           "UNAVAILABLE"))


class MilvusStage:
    """Dense first stage in a Milvus collection (see module docstring)."""

    name = "dense"
    backend = "milvus"

    def __init__(self, dim: int, *, uri: str | None = None,
                 directory: str | os.PathLike | None = None,
                 config: MilvusConfig | None = None, _create: bool = True) -> None:
        if uri is None:
            if directory is None:
                raise StageError("a Milvus first stage needs a URI or an index directory "
                                 "(for its milvus-lite file)")
            uri = str(Path(directory) / "milvus.db")
        self.dim, self.uri, self.config = int(dim), check_uri(uri), config or MilvusConfig()
        self.client = connect(self.uri, self.config.timeout)
        self.collection = self.config.collection
        self._unsettled = False  # rows added since the server last indexed everything
        self._last_write = -math.inf  # time.monotonic() of this stage's last add or remove
        if _create:
            self._create()
        elif not self._call("has_collection", self.collection):
            raise MilvusError(f"Milvus at {self.uri} has no collection {self.collection!r}; "
                              "was the index built against another server?")
        self._call("load_collection", self.collection, timeout=self._wait_timeout)

    # -- collection ---------------------------------------------------------------------
    @property
    def index_type(self) -> str:
        if self.config.index_type is not None:
            return self.config.index_type
        return "FLAT" if is_lite(self.uri) else "HNSW"

    def _index_params(self):
        cfg, kind = self.config, self.index_type
        params = {"IVF_FLAT": {"nlist": cfg.nlist},
                  "HNSW": {"M": cfg.hnsw_m, "efConstruction": cfg.ef_construction}}.get(kind, {})
        index_params = self.client.prepare_index_params()
        index_params.add_index(VECTOR_FIELD, index_type=kind, index_name=VECTOR_FIELD,
                               metric_type="IP", params=params)
        if cfg.frames:  # Milvus loads a collection only when every vector field has an index
            index_params.add_index(FRAMES_FIELD, index_type="FLAT", metric_type="IP")
        return index_params

    def _create(self) -> None:
        from pymilvus import DataType, MilvusClient

        if self._call("has_collection", self.collection):
            raise StageError(f"Milvus at {self.uri} already has a collection "
                             f"{self.collection!r}; open it or choose another collection name")
        if self.config.frames:
            self._check_float16()
        schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field(ID_FIELD, DataType.INT64, is_primary=True)
        schema.add_field(VECTOR_FIELD, DataType.FLOAT_VECTOR, dim=self.dim)
        if self.config.frames:
            schema.add_field(FRAMES_FIELD, DataType.FLOAT16_VECTOR,
                             dim=self.config.frames * self.dim)
            schema.add_field(MASK_FIELD, DataType.INT64)
        # Strong consistency: a query right after add/remove sees them (searches: strong_for).
        self._call("create_collection", self.collection, schema=schema,  # and loads it
                   index_params=self._index_params(), consistency_level="Strong",
                   timeout=self._wait_timeout)

    def _check_float16(self) -> None:
        """Frames are a FLOAT16_VECTOR field, which Milvus has from 2.4 on."""
        if is_lite(self.uri):
            return
        version = str(self._call("get_server_version"))
        found = re.match(r"v?(\d+)\.(\d+)", version)
        if found and (int(found[1]), int(found[2])) < (2, 4):
            raise MilvusError(f"keeping frames in Milvus (frames > 0) needs a FLOAT16_VECTOR "
                              f"field, which Milvus has from 2.4 on, but {self.uri} runs "
                              f"{version}: build with frames=0 and the frame store on shared "
                              "storage, or upgrade the server")

    @property
    def _request_timeout(self) -> int:
        # pymilvus bounds its retries of an unanswered request only by an int timeout.
        return max(1, math.ceil(self.config.timeout))

    @property
    def _wait_timeout(self) -> int:
        return max(self._request_timeout, math.ceil(self.config.index_wait))

    def _call(self, method: str, *args, **kwargs):
        """A client call whose failure is one sentence naming the server and the operation;
        retried for at most ``config.timeout`` seconds unless ``timeout`` says otherwise."""
        kwargs.setdefault("timeout", self._request_timeout)
        return self._guard(method.replace("_", " "),
                           lambda: getattr(self.client, method)(*args, **kwargs))

    def _guard(self, what: str, call):
        try:
            return call()
        except StageError:
            raise
        except Exception as exc:
            detail = _first_line(exc)
            if _unreachable(detail):
                detail = detail.rpartition("message=")[2]  # past pymilvus's retry notice
                raise MilvusError(f"cannot reach Milvus at {self.uri} to {what} (is the "
                                  f"server running? {detail})") from None
            raise MilvusError(f"Milvus at {self.uri} failed to {what} ({detail})") from None

    def close(self) -> None:
        self.client.close()

    def __len__(self) -> int:
        return self._count("")

    def _count(self, condition: str) -> int:
        rows = self._call("query", self.collection, filter=condition,
                          output_fields=["count(*)"])
        return int(rows[0]["count(*)"])

    # -- FirstStage ---------------------------------------------------------------------
    def add(self, ids: np.ndarray, videos: object) -> None:
        """``videos``: the dense proxy ``[n, D]`` or ``VideoFeatures``; a stage that keeps
        frames (``config.frames > 0``) needs ``VideoFeatures``."""
        vectors = proxy_vectors(videos, self.dim, self.config.normalize)
        ids = as_row_ids(ids, len(vectors))
        self._check_new(ids)
        rows = [{ID_FIELD: int(i), VECTOR_FIELD: v} for i, v in zip(ids, vectors, strict=True)]
        width = 4 * self.dim
        if self.config.frames:
            frames, masks = self._frame_fields(videos)
            for row, frame, mask in zip(rows, frames, masks, strict=True):
                row[FRAMES_FIELD], row[MASK_FIELD] = frame, mask
            width += 2 * self.config.frames * self.dim
        batch = max(1, self.config.insert_bytes // width)
        self._unsettled = self._unsettled or (not is_lite(self.uri) and len(rows) > 0)
        self._last_write = time.monotonic()
        for start in range(0, len(rows), batch):
            # Rows carry numpy vectors: pymilvus packs them without Python lists.
            self._call("insert", self.collection, rows[start:start + batch])

    def _frame_fields(self, videos: object) -> tuple[np.ndarray, list[int]]:
        """``VideoFeatures`` -> float16 ``[n, N·D]`` (zero-padded) and the masks as bitmasks."""
        if not isinstance(videos, VideoFeatures):
            raise StageError("this Milvus stage keeps frames: add VideoFeatures, not proxies")
        count, num_frames = videos.frame_mask.shape
        if num_frames > self.config.frames:
            raise StageError(f"videos have {num_frames} frames but the Milvus collection "
                             f"keeps at most {self.config.frames}")
        frames = np.zeros((count, self.config.frames, self.dim), dtype=np.float16)
        frames[:, :num_frames] = videos.frames.detach().to(torch.float16).cpu().numpy()
        bits = (videos.frame_mask.cpu().long() << torch.arange(num_frames)).sum(1)
        return frames.reshape(count, -1), bits.tolist()

    def fetch_frames(self, ids: np.ndarray) -> VideoFeatures:
        """The stored per-frame features of rows ``ids`` (in that order), float16
        ``[n, frames, D]``: DiCoSA reranks from these when no local store exists."""
        if not self.config.frames:
            raise StageError("this Milvus collection keeps no frames (built with frames=0)")
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        found = {}
        for start in range(0, len(ids), 1000):
            for row in self._call("get", self.collection, ids=ids[start:start + 1000].tolist(),
                                  output_fields=[FRAMES_FIELD, MASK_FIELD]):
                found[int(row[ID_FIELD])] = row
        missing = [int(i) for i in ids if int(i) not in found]
        if missing:
            raise StageError(f"row {missing[0]} is not in the Milvus collection "
                             f"({len(missing)} of {len(ids)} missing)")
        num = self.config.frames
        frames = np.stack([np.frombuffer(_vector_bytes(found[int(i)][FRAMES_FIELD]),
                                         dtype=np.float16) for i in ids])
        bits = torch.tensor([found[int(i)][MASK_FIELD] for i in ids], dtype=torch.long)
        mask = (bits[:, None] >> torch.arange(num)) & 1 == 1  # [n, frames]
        return VideoFeatures(torch.from_numpy(frames.reshape(len(ids), num, self.dim)), mask)

    def _check_new(self, ids: np.ndarray) -> None:
        """Milvus keeps both rows when a primary key is inserted twice: refuse instead."""
        if not len(ids) or not self._count(
                f"{ID_FIELD} >= {int(ids.min())} and {ID_FIELD} <= {int(ids.max())}"):
            return  # one query for the usual case: new ids above every held one
        for start in range(0, len(ids), 1000):
            chunk = ids[start:start + 1000].tolist()
            found = self._call("query", self.collection, filter=f"{ID_FIELD} in {chunk}",
                               output_fields=[ID_FIELD], limit=len(chunk))
            if found:
                raise StageError(f"row id {found[0][ID_FIELD]} is already in the Milvus "
                                 "collection; row ids are never reused")

    def remove(self, ids: np.ndarray) -> None:
        ids = as_row_ids(ids)
        if len(ids):
            self._last_write = time.monotonic()
            self._call("delete", self.collection, ids=ids.tolist())

    def search(self, queries: EncodedQueries, k: int) -> Candidates:
        k = check_k(k)
        if k > MAX_TOPK:
            raise StageError(f"Milvus returns at most {MAX_TOPK} candidates per query, "
                             f"asked for {k}")
        texts = query_vectors(queries, self.dim, self.config.normalize)
        if self._unsettled and self.config.index_wait > 0:
            self.wait_indexed()  # rows added by this process: search them indexed
        cfg = self.config
        params = {"IVF_FLAT": {"nprobe": cfg.nprobe},
                  "HNSW": {"ef": max(cfg.ef_search, k)}}.get(self.index_type, {})
        recent = time.monotonic() - self._last_write < cfg.strong_for
        consistency = {} if is_lite(self.uri) else {
            "consistency_level": "Strong" if recent else "Bounded"}
        hits = self._call("search", self.collection, data=list(texts), limit=k,
                          anns_field=VECTOR_FIELD, output_fields=[],
                          search_params={"metric_type": "IP", "params": params}, **consistency)
        return candidates_of([([hit["id"] for hit in found], [hit["distance"] for hit in found])
                              for found in hits], k, self.name)

    # -- persistence --------------------------------------------------------------------
    def describe(self, directory: str | os.PathLike | None = None) -> dict:
        """The stage's description; a milvus-lite file inside ``directory`` is stored relative
        to it, so the index folder can move."""
        uri = self.uri
        if directory is not None and is_lite(uri):
            inside = os.path.relpath(Path(uri).resolve(), Path(directory).resolve())
            uri = self.uri if inside.startswith("..") else inside
        return {"backend": self.backend, "name": self.name, "dim": self.dim, "uri": uri,
                "config": asdict(self.config)}

    def save(self, directory: str | os.PathLike) -> None:
        """Flush the collection (Milvus persists it), wait until the server has indexed and
        serves every row (module docstring), and write the description."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.wait_indexed()
        write_text_atomic(directory / STAGE_FILE, json.dumps(self.describe(directory), indent=2))

    # -- freshness ----------------------------------------------------------------------
    def index_progress(self) -> IndexProgress:
        """What the server has indexed and serves indexed now (a server, not milvus-lite)."""
        from pymilvus.grpc_gen.common_pb2 import SegmentState

        described = self._call("describe_index", self.collection, VECTOR_FIELD) or {}
        rows, indexed = int(described.get("total_rows", 0)), int(described.get("indexed_rows", 0))
        # The query nodes' segments; MilvusClient has no call for it, its connection has.
        segments = self._guard("list the loaded segments", lambda: self.client._get_connection()
                               .get_query_segment_info(self.collection,
                                                       timeout=self._request_timeout))
        served = 0
        for segment in segments:
            small = segment.num_rows < self.config.index_min_rows
            if segment.state == SegmentState.Sealed and (segment.index_name or small):
                served += segment.num_rows
        return IndexProgress(rows=rows, indexed=min(indexed, rows), served=served)

    def wait_indexed(self) -> IndexProgress | None:
        """Flush, then wait (at most ``config.index_wait`` seconds, logging progress every
        10 s) until the server has indexed every flushed row and serves it from an indexed
        segment; returns the last progress seen (None on milvus-lite, which only flushes)."""
        if is_lite(self.uri):
            self._call("flush", self.collection)
            return None
        # A flush waits for the data to be written, so it gets the long timeout, which would
        # also be how long it retries a server that is down: ask whether it is up first.
        self._guard("flush", lambda: self.client.get_server_version(
            timeout=self._request_timeout))
        self._call("flush", self.collection, timeout=self._wait_timeout)
        if self.config.index_wait == 0:
            self._unsettled = False
            return None
        start = last_log = time.monotonic()
        while not (progress := self.index_progress()).done:
            waited = time.monotonic() - start
            if waited > self.config.index_wait:
                raise MilvusError(
                    f"Milvus at {self.uri} has indexed {progress.indexed} and serves "
                    f"{progress.served} of {progress.rows} rows indexed after {waited:.0f} s, "
                    "so searches would miss neighbours: wait and save again, or raise the "
                    "stage option index_wait")
            if time.monotonic() - last_log >= 10:
                log.info("Milvus at %s: %d of %d rows indexed, %d served indexed (%.0f s)",
                         self.uri, progress.indexed, progress.rows, progress.served, waited)
                last_log = time.monotonic()
            time.sleep(0.25)
        self._unsettled = False
        return progress

    def row_ids(self) -> np.ndarray:
        """Every row id in the collection, sorted (what an interrupted build holds: add the
        rest to resume it)."""
        ids = self._ids_from(0)  # row ids are non-negative
        if len(ids) != len(self) or (len(ids) and (np.diff(ids) == 0).any()):
            raise MilvusError(f"Milvus at {self.uri} holds some row id of collection "
                              f"{self.collection!r} more than once")
        return ids

    def _ids_from(self, low: int) -> np.ndarray:
        """The ids ``>= low`` in the collection, sorted, read in windows of MAX_QUERY
        consecutive ids (each holds at most MAX_QUERY rows, what one query may return,
        unless an id is there twice, which :meth:`row_ids` checks)."""
        found: list[int] = []
        while self._count(f"{ID_FIELD} >= {low}"):
            window = f"{ID_FIELD} >= {low} and {ID_FIELD} < {low + MAX_QUERY}"
            found += [row[ID_FIELD] for row in self._call(
                "query", self.collection, filter=window, output_fields=[ID_FIELD],
                limit=MAX_QUERY)]
            low += MAX_QUERY
        return np.sort(np.asarray(found, dtype=np.int64))

    @classmethod
    def open(cls, directory: str | os.PathLike, info: dict, uri: str | None = None,
             ) -> MilvusStage:
        config = dataclass_from_dict(MilvusConfig, info.get("config", {}), "milvus.")
        if uri is None:
            uri = info["uri"]
            if is_lite(uri) and not Path(uri).is_absolute():
                uri = str(Path(directory) / uri)
            if is_lite(uri) and not Path(uri).is_file():
                raise FileNotFoundError(f"the milvus-lite file {uri} of this index is missing")
        return cls(info["dim"], uri=uri, config=config, _create=False)
