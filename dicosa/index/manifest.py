"""The manifest: what an index folder holds, read, checked and committed as one file.

``manifest.json`` is the commit point of every change: a change writes its new files first,
then the manifest that names them, atomically and fsync'ed. Its fields, and
``reserved.json`` (the ids a write in progress may hand out: tombstones if it never
commits), are described in ``docs/index-format.md``; what this guarantees, in
``docs/data-safety.md``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..data.protocol import FrameProtocol
from ..data.segments import SegmentPolicy
from ..files import write_text_atomic

__all__ = ["FORMAT", "MANIFEST", "READABLE", "RESERVED", "VERSION", "Manifest",
           "ManifestError", "read_reserved", "write_reserved"]

FORMAT = "dicosa-video-index"
VERSION = 5  # int8 frames; 4 for an index with segments; 3 for another frame protocol; else 2
READABLE = (1, 2, 3, 4, 5)
MANIFEST = "manifest.json"
RESERVED = "reserved.json"
# Indexes decoded with this before their manifest recorded the frame protocol (``frames``).
UNRECORDED_FRAMES = FrameProtocol("segments", "black")
_STORE_KEYS = ("num_frames", "dim", "frame_dtype", "next_id", "removed", "shards")
_REBUILD = "rebuild the index with 'dicosa index'"


class ManifestError(ValueError):
    """A manifest that is missing, damaged or of a version this dicosa cannot read."""


@dataclass
class Manifest:
    """One committed state of an index folder (see the module docstring)."""

    fingerprint: dict | None = None
    store: dict = field(default_factory=dict)  # FrameStore.manifest()
    first_stage: dict = field(default_factory=dict)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    frames: FrameProtocol = UNRECORDED_FRAMES
    meta: dict = field(default_factory=dict)
    generation: int = 0
    num_videos: int = 0
    segments: SegmentPolicy | None = None

    @classmethod
    def read(cls, directory: str | Path) -> Manifest:
        """The manifest in ``directory``; ManifestError (one sentence) when it cannot be
        used, FileNotFoundError when there is none."""
        path = Path(directory) / MANIFEST
        if not path.is_file():
            raise FileNotFoundError(f"{directory} is not a video index (no {MANIFEST})")
        try:
            raw = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ManifestError(f"{path} is damaged; {_REBUILD}") from None
        except OSError as exc:
            raise ManifestError(f"{path} cannot be read ({exc.strerror})") from None
        return cls.from_json(raw, path)

    @classmethod
    def from_json(cls, raw: object, path: Path) -> Manifest:
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise ManifestError(f"{path} is not a {FORMAT} manifest")
        if raw.get("version") not in READABLE:
            raise ManifestError(f"{path}: index format version {raw.get('version')} is not "
                                f"supported (this dicosa reads versions 1 to {VERSION}); "
                                f"{_REBUILD}")
        missing = [k for k in ("fingerprint", "shards") if k not in raw]
        if missing:
            raise ManifestError(f"{path} lacks {', '.join(repr(k) for k in missing)}: it is "
                                f"damaged; {_REBUILD}")
        frames = raw.get("frames") or UNRECORDED_FRAMES.as_dict()
        try:
            return cls(
                fingerprint=raw["fingerprint"],
                store={k: raw[k] for k in _STORE_KEYS if k in raw},
                first_stage=raw.get("first_stage") or {"backend": "local"},
                skipped=[(s["path"], s["reason"]) for s in raw.get("skipped", [])],
                frames=FrameProtocol(frames["sampling"], frames["padding"]),
                meta=raw.get("meta") or {},
                generation=int(raw.get("generation", 0)),
                num_videos=int(raw.get("num_videos", 0)),
                segments=(SegmentPolicy.from_dict(raw["segments"]) if raw.get("segments")
                         else None))
        except (KeyError, TypeError, ValueError) as exc:
            raise ManifestError(f"{path} is damaged ({type(exc).__name__}: {exc}); "
                                f"{_REBUILD}") from None

    def as_json(self) -> dict:
        return {
            "format": FORMAT,
            # The lowest version that describes the folder: older dicosa versions read an
            # index as before unless it holds what they cannot read.
            "version": self.version,
            "generation": self.generation,
            "fingerprint": self.fingerprint,
            "num_videos": self.num_videos,
            **self.store,
            "first_stage": self.first_stage,
            "skipped": [{"path": p, "reason": r} for p, r in self.skipped],
            "frames": self.frames.as_dict(),
            **({"segments": self.segments.as_dict()} if self.segments is not None else {}),
            "meta": self.meta,
        }

    @property
    def version(self) -> int:
        shards = self.store.get("shards", [])
        if self.store.get("frame_dtype", "float16") != "float16" or any(
                s.get("frames", "float16") != "float16" for s in shards):
            return 5
        if any(s.get("layout") == "runs" for s in shards):
            return 4
        return 2 if self.frames == UNRECORDED_FRAMES else 3

    def write(self, directory: str | Path) -> None:
        """Commit: the manifest replaces the old one whole (atomic, fsync'ed)."""
        write_text_atomic(Path(directory) / MANIFEST, json.dumps(self.as_json(), indent=1),
                          sync=True)


def read_reserved(directory: str | Path) -> int:
    """The id after the last one a write may have handed out (0: none recorded)."""
    path = Path(directory) / RESERVED
    try:
        return int(json.loads(path.read_text())["next_id"])
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return 0  # a damaged record only loses the tombstoning of an uncommitted write


def write_reserved(directory: str | Path, next_id: int) -> None:
    write_text_atomic(Path(directory) / RESERVED, json.dumps({"next_id": int(next_id)}))
