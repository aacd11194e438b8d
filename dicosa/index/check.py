"""``check``: verify an index folder against its manifest, and repair what is derivable.

What is checked, in order:

1. the manifest reads (a damaged one is a sentence and the end of the check);
2. every shard file against the sha256 the manifest recorded (indexes written before
   checksums were kept: only that the files map);
3. every live row's stored features are finite (a damaged row would score NaN);
4. the dense first stage's files open and match the store (else it is rebuilt when opened);
5. the derived files (a lexical stage, concept codes, title vectors, the faiss stage's
   pending and removed lists, the per-frame stage's under ``frames/``) load; the text index
   (``text.sqlite``) passes SQLite's and FTS5's integrity checks, and holds lines of live
   rows only (lines of rows a write never committed are never searched; reported);
6. files in the folder that no commit names (left by a write that never committed).

It also lists the partial videos (a decode that lost part of the file: cut short, damaged
stretches; each row's ``damage``, :mod:`dicosa.data.damage`): not a problem of the index, which
holds what decoded, but what a user should know of their files.

``repair`` removes rows whose features are damaged (one transaction: their ids become
tombstones, as any removal), deletes derived files that do not load (they are rebuilt from
the shards the next time they are needed; the text index from the videos, by the next
``index`` run), deletes the text lines of rows the manifest does not hold, and deletes the
uncommitted files. A shard whose
checksum differs is reported, never repaired: its rows' features are not derivable; rebuild
the index, or remove those rows' videos and add them again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..search.store import FrameStore, StoreError, finite_rows
from .manifest import MANIFEST, RESERVED, Manifest, ManifestError

__all__ = ["CheckReport", "check_index"]

# Derived files and how to see that one loads; each is rebuilt when missing.
_DERIVED = {
    "dense.pending.npz": lambda p: np.load(p).files,
    "dense.removed.npy": np.load,
    "dense.exact.npz": lambda p: np.load(p).files,
    "concepts.codes.npy": np.load,
    "fusion.titles.npy": np.load,
    "sparse-lexical.npz": lambda p: np.load(p).files,
    "semantic.npz": lambda p: np.load(p).files,
    "title.npz": lambda p: np.load(p).files,
    # the per-frame stage's (summary "frames"), in its folder
    "frames/frames.npz": lambda p: np.load(p).files,
    "frames/dense.pending.npz": lambda p: np.load(p).files,
    "frames/dense.removed.npy": np.load,
    "frames/dense.exact.npz": lambda p: np.load(p).files,
}
# Files an index folder may hold besides shards and derived files.
_KNOWN = {MANIFEST, RESERVED, ".writer.lock", ".writer.json", "first_stage.json",
          "dense.faiss", "lexical.json", "concepts.codes.json", "fusion.titles.json",
          "summary_head.pt", "milvus.db", "seismic.json", "seismic.index", "text.sqlite",
          "text.sqlite-journal"}
_SHARD = re.compile(r"^shard-\d{5}\.(safetensors|csv)$")


@dataclass
class CheckReport:
    directory: Path
    problems: list[str] = field(default_factory=list)  # not repaired
    repaired: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    partial: list[tuple[str, str]] = field(default_factory=list)  # (path, damage)

    @property
    def ok(self) -> bool:
        return not self.problems

    def lines(self) -> list[str]:
        out = [f"checked {self.directory}: " + ", ".join(self.checked)]
        out += [f"problem: {p}" for p in self.problems]
        out += [f"repaired: {r}" for r in self.repaired]
        out += [f"partial video: {path}: {damage}" for path, damage in self.partial]
        out.append("ok" if self.ok else f"{len(self.problems)} problem(s) left")
        return out


def check_index(directory: str | Path, repair: bool = False) -> CheckReport:
    """Check (and with ``repair``, repair) the index in ``directory``; see the module doc."""
    directory = Path(directory)
    report = CheckReport(directory)
    try:
        manifest = Manifest.read(directory)
        store = FrameStore.open(directory, manifest.store)
    except (ManifestError, StoreError, FileNotFoundError) as exc:
        report.problems.append(str(exc))
        return report
    report.checked.append(f"{len(manifest.store['shards'])} shard(s), {len(store)} live rows")
    for name, ids in store.damaged_shards():
        _remove_damaged(directory, store, ids, f"{name} does not match its checksum", repair,
                        report)
        store.removed.update(ids.tolist())
    bad = _non_finite_rows(store)
    if len(bad):
        _remove_damaged(directory, store, bad, "non-finite stored features", repair, report)
    _derived(directory, repair, report)
    _text(directory, store, repair, report)
    _uncommitted(directory, manifest, repair, report)
    _partial(store, report)
    report.checked.append(f"first stage synced: {_synced(manifest, store)}")
    return report


def _non_finite_rows(store: FrameStore) -> np.ndarray:
    live = store.live()
    bad = []
    for start in range(0, len(live), 4096):
        ids = live[start:start + 4096]
        video = store.gather(ids)
        bad.append(ids[~finite_rows(video.frames, video.frame_mask)])
    return np.concatenate(bad) if bad else np.zeros(0, dtype=np.int64)


def _remove_damaged(directory: Path, store: FrameStore, ids: np.ndarray, why: str,
                    repair: bool, report: CheckReport) -> None:
    """Rows whose features cannot be trusted: reported, or (repair) removed in one
    transaction, their paths listed so that the next ``index`` run encodes them again."""
    paths = store.paths(ids)
    what = f"{len(ids)} row(s) with {why} ({', '.join(paths[:3])}{' ...' if len(ids) > 3 else ''})"
    if not repair:
        report.problems.append(what + "; 'check --repair' removes them")
        return
    from .video_index import VideoIndex

    index = VideoIndex.load(directory, verify=False)
    with index.transaction():
        index.store.remove(ids)
    report.repaired.append(what + ": removed; run 'dicosa index' on their folder "
                           "again to encode them anew")


def _derived(directory: Path, repair: bool, report: CheckReport) -> None:
    for name, read in _DERIVED.items():
        path = directory / name
        if not path.is_file():
            continue
        try:
            read(path)
        except Exception as exc:
            what = f"{path} does not load ({type(exc).__name__})"
            if repair:
                path.unlink()
                report.repaired.append(what + ": deleted, rebuilt when next needed")
            else:
                report.problems.append(what + "; 'check --repair' deletes it (derivable)")


def _text(directory: Path, store: FrameStore, repair: bool, report: CheckReport) -> None:
    from ..text.fts import check_text_file
    from .lock import WriterLock

    if repair:  # deleting lines is a write: under the writer lock, like every other
        with WriterLock(directory):
            problems, repaired, checked = check_text_file(directory, store.live(), True)
    else:
        problems, repaired, checked = check_text_file(directory, store.live(), False)
    report.problems += problems
    report.repaired += repaired
    if checked:
        report.checked.append(checked)


def _uncommitted(directory: Path, manifest: Manifest, repair: bool,
                 report: CheckReport) -> None:
    named = {f"{s['name']}.{ext}" for s in manifest.store["shards"] for ext in
             ("safetensors", "csv")}
    for path in sorted(directory.iterdir()):
        name = path.name
        stray = (".tmp-" in name) or (_SHARD.match(name) and name not in named)
        if not stray or not path.is_file():
            continue
        if repair:
            path.unlink()
            report.repaired.append(f"{path}: no commit names it; deleted")
        else:
            report.checked.append(f"uncommitted file {name} (harmless; --repair deletes it)")


def _partial(store: FrameStore, report: CheckReport) -> None:
    videos = store.video_metadata()
    damaged = videos[videos["damage"].fillna("").astype(str).str.len() > 0]
    report.partial = list(zip(damaged["path"].tolist(), damaged["damage"].tolist(),
                              strict=True))
    report.checked.append(f"{len(report.partial)} partial video(s)")


def _synced(manifest: Manifest, store: FrameStore) -> bool:
    return manifest.first_stage.get("synced") == [store.next_id, len(store.removed)]

