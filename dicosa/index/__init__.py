"""The video index: manifest, writer lock, ingest, stage set, searcher, plugin contract and
the :class:`VideoIndex` façade over them (see ``docs/architecture.md``)."""

from ..fingerprint import fingerprint_mismatch, model_fingerprint
from .hits import Hit
from .ingest import list_videos
from .lock import IndexBusyError
from .manifest import FORMAT, MANIFEST, ManifestError
from .plugins import IndexContext, IndexPlugin
from .searcher import DEFAULT_CANDIDATES, SearchMode, SearchResult
from .stages import DEFAULT_BACKEND, SUMMARY_HEAD
from .video_index import VideoIndex, open_index

__all__ = ["DEFAULT_BACKEND", "DEFAULT_CANDIDATES", "FORMAT", "MANIFEST", "SUMMARY_HEAD", "Hit",
           "IndexBusyError", "IndexContext", "IndexPlugin", "ManifestError", "SearchMode",
           "SearchResult", "VideoIndex", "fingerprint_mismatch", "list_videos",
           "model_fingerprint", "open_index"]
