"""Checking the frame store's files: which live rows a shard file that differs from its
recorded sha256 reaches, found by the videos' CRC32s (:mod:`dicosa.search.row_checksums`)
where the shard keeps them; ``dicosa check`` and its repair act on them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..files import file_sha256
from .row_checksums import damaged_videos
from .row_videos import Located
from .shards import Shard

__all__ = ["ChecksumFailure", "checksum_failures", "verify"]


@dataclass
class ChecksumFailure:
    """A shard file that differs from its checksum, and the live rows that cannot be trusted
    for it."""

    path: Path  # the first of the shard's files that differs
    ids: np.ndarray  # int64 [n] live row ids
    by_row: bool  # True: named by their videos' CRC32s; False: every live row of the shard
    files: list[str] = field(default_factory=list)  # every differing file's suffix

    def sentence(self) -> str:
        """What is damaged, as one sentence (no advice: the caller's)."""
        what = "is missing" if not self.path.is_file() else "does not match its checksum"
        rows = _span(self.ids)
        if self.by_row and len(self.ids) == 1:
            return f"{self.path} {what}: its row {rows} fails its own checksum"
        if self.by_row:
            return f"{self.path} {what}: its rows {rows} fail their own checksums"
        return f"{self.path} {what} (rows {rows}: the whole shard)"


def _span(ids: np.ndarray) -> str:
    """Row ids as a reader takes them in: ``3``, ``3, 7``, ``4..9`` or ``3, 7, 8 and 5 more``."""
    ids = np.asarray(ids)
    if len(ids) > 2 and ids[-1] - ids[0] == len(ids) - 1:
        return f"{ids[0]}..{ids[-1]}"
    shown = ", ".join(str(i) for i in ids[:3])
    return shown + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")


def verify(store: Located) -> list[str]:
    """Read every shard file whose checksum the manifest recorded and compare: one sentence
    per shard whose damage reaches live rows (empty: none does). Reads the whole store."""
    return [failure.sentence() for failure in checksum_failures(store)]


def checksum_failures(store: Located) -> list[ChecksumFailure]:
    """Each shard whose files differ from their recorded sha256 in a way that reaches live
    rows: those rows, found by the videos' CRC32s where the shard keeps them (the whole shard
    where it keeps none, its csv differs, or the damage lies outside every video). A shard
    whose damaged videos are all removed is sound again. Reads every shard whole."""
    found = []
    for shard in store.shards:
        differs = _differing_files(store, shard)
        if not differs:
            continue
        ids = np.arange(shard.first_id, shard.first_id + shard.count, dtype=np.int64)
        videos = None if "csv" in differs else damaged_videos(shard)
        if videos is not None and len(videos):
            ids = ids[np.isin(shard.video_of(ids - shard.first_id), videos)]
        ids = ids[store.is_live(ids)]
        if len(ids):
            found.append(ChecksumFailure(
                shard._directory / f"{shard.name}.{differs[0]}", ids,
                videos is not None and len(videos) > 0, differs))
    return found


def _differing_files(store: Located, shard: Shard) -> list[str]:
    """The suffixes (``safetensors``, ``csv``) of ``shard``'s files that are missing or
    differ from their recorded sha256; none for a shard without checksums or without live
    rows (a repair removes a damaged one's)."""
    if shard.sha256 is None or shard._directory is None or shard.name is None:
        return []
    ids = np.arange(shard.first_id, shard.first_id + shard.count)
    if not store.is_live(ids).any():
        return []
    return [suffix for suffix, expected in shard.sha256.items()
            if file_sha256(shard._directory / f"{shard.name}.{suffix}") != expected]
