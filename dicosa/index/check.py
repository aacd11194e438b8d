"""``check``: verify an index folder against its manifest, and repair what can be.

In order: the manifest reads; every shard matches its sha256 and, in one that does not, each
video's CRC32 (:mod:`dicosa.search.row_checksums`) names the damaged rows; the other live
rows' features are finite; the dense first stage matches the store; the derived files and
each plugin's (:meth:`~dicosa.index.plugins.IndexPlugin.check_files`) load; no file is left
that no commit names. The partial videos are listed. ``repair`` encodes the damaged rows'
videos again (:mod:`dicosa.index.repair`) and deletes what does not load or was never
committed; ``docs/data-safety.md`` says what each case gives.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..model import DiCoSA
from ..search.store import FrameStore, StoreError, finite_rows
from ..search.store_check import checksum_failures
from .manifest import Manifest, ManifestError
from .plugins import BUILTIN_PLUGINS, FileCheck, check_derived, plugin_class

__all__ = ["CheckReport", "check_index"]

# The dense stages' derived files and how to see that one loads; each is rebuilt when
# missing. The plugins check their own (IndexPlugin.check_files).
_STAGE_FILES = {"dense.pending.npz": lambda p: np.load(p).files, "dense.removed.npy": np.load,
                "dense.exact.npz": lambda p: np.load(p).files}
# and the per-frame stage's (summary "frames"), in its folder
_DERIVED = {**_STAGE_FILES, "frames/frames.npz": lambda p: np.load(p).files,
            **{f"frames/{name}": read for name, read in _STAGE_FILES.items()}}
_SHARD = re.compile(r"^shard-\d{5}\.(safetensors|csv)$")
_REPAIR = "'dicosa check --repair' encodes them again from their videos"


@dataclass
class CheckReport:
    directory: Path
    problems: list[str] = field(default_factory=list)  # not repaired
    repaired: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what a repair could not do, and why
    partial: list[tuple[str, str]] = field(default_factory=list)  # (path, damage)

    @property
    def ok(self) -> bool:
        return not self.problems

    def add(self, found: FileCheck) -> None:
        self.problems += found.problems
        self.repaired += found.repaired
        self.checked += found.checked

    def lines(self) -> list[str]:
        out = [f"checked {self.directory}: " + ", ".join(self.checked)]
        out += [f"problem: {p}" for p in self.problems]
        out += [f"repaired: {r}" for r in self.repaired]
        out += [f"note: {n}" for n in self.notes]
        out += [f"partial video: {path}: {damage}" for path, damage in self.partial]
        out.append("ok" if self.ok else f"{len(self.problems)} problem(s) left")
        return out


def check_index(directory: str | Path, repair: bool = False,
                model: DiCoSA | None = None) -> CheckReport:
    """Check (and with ``repair``, repair) the index in ``directory``; see the module doc.
    ``model``: what a repair encodes damaged rows with, where the index records no model of
    its own (an index built in Python without ``meta={"model": ...}``)."""
    directory = Path(directory)
    report = CheckReport(directory)
    try:
        manifest, store = _open(directory)
    except (ManifestError, StoreError, FileNotFoundError) as exc:
        report.problems.append(str(exc))
        return report
    report.checked.append(f"{len(manifest.store['shards'])} shard(s), {len(store)} live rows")
    damaged = _damaged_rows(store)
    if damaged and repair:
        _repair(directory, store, damaged, report, model)
        manifest, store = _open(directory)  # what the repair committed
    else:
        report.problems += [f"{what} ({_paths(store, ids)}); {_REPAIR}" for what, ids in damaged]
    report.add(check_derived(directory, _DERIVED, repair))
    live = store.live()
    for key in BUILTIN_PLUGINS:  # each plugin's own files, recorded or left behind
        report.add(plugin_class(key).check_files(directory, live, repair))
    _uncommitted(directory, manifest, repair, report)
    _partial(store, report)
    synced = manifest.first_stage.get("synced") == [store.next_id, len(store.removed)]
    report.checked.append(f"first stage synced: {synced}")
    return report


def _open(directory: Path) -> tuple[Manifest, FrameStore]:
    manifest = Manifest.read(directory)
    return manifest, FrameStore.open(directory, manifest.store)


def _damaged_rows(store: FrameStore) -> list[tuple[str, np.ndarray]]:
    """``(what, live row ids)`` of each damage: shards that fail their checksums, then the
    other rows whose stored features are not finite."""
    damaged = [(failure.sentence(), failure.ids) for failure in checksum_failures(store)]
    seen = np.concatenate([np.zeros(0, np.int64)] + [ids for _, ids in damaged])
    bad = _non_finite_rows(store, seen)
    if len(bad):
        damaged.append((f"{len(bad)} row(s) hold non-finite stored features", bad))
    return damaged


def _non_finite_rows(store: FrameStore, skip: np.ndarray) -> np.ndarray:
    live = np.setdiff1d(store.live(), skip)
    bad = []
    for start in range(0, len(live), 4096):
        ids = live[start:start + 4096]
        video = store.gather(ids)
        bad.append(ids[~finite_rows(video.frames, video.frame_mask)])
    return np.concatenate(bad) if bad else np.zeros(0, dtype=np.int64)


def _paths(store: FrameStore, ids: np.ndarray) -> str:
    """The videos of rows ``ids``, the first few named."""
    paths = list(dict.fromkeys(store.table.paths(ids)))
    more = f" and {len(paths) - 3} more" if len(paths) > 3 else ""
    return ", ".join(paths[:3]) + more


def _repair(directory: Path, store: FrameStore, damaged: list[tuple[str, np.ndarray]],
            report: CheckReport, model: DiCoSA | None) -> None:
    """Every damaged row's video removed and encoded again where it can be, in one
    transaction (:func:`dicosa.index.repair.repair_rows`); what was done, said."""
    from .repair import repair_rows

    done = repair_rows(directory, np.concatenate([ids for _, ids in damaged]), model)
    for what, ids in damaged:
        report.repaired.append(f"{what} ({_paths(store, ids)}): their videos' rows removed")
    if done.encoded:
        report.repaired.append(f"{len(done.encoded)} video(s) encoded again from their files"
                               f" ({', '.join(done.encoded[:3])}"
                               f"{' ...' if len(done.encoded) > 3 else ''})")
    report.notes += [f"{path} was not encoded again: {why}" for path, why in done.not_encoded]
    if done.not_encoded:
        report.notes.append("'dicosa index FOLDER --out INDEX' adds those videos anew where "
                            "their files can be read")


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
    videos = store.table.videos()
    damaged = videos[videos["damage"].fillna("").astype(str).str.len() > 0]
    report.partial = list(zip(damaged["path"].tolist(), damaged["damage"].tolist(),
                              strict=True))
    report.checked.append(f"{len(report.partial)} partial video(s)")
