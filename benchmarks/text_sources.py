"""Search what is said and written (issue 33): R@1 of visual-only, text-only and fused search
on a collection where the words name something the pictures do not show, and what each
text source costs per hour of video.

The collection: the synthetic benchmark's test clips (coloured shapes moving), each given a
name from :data:`NAMES` in a subtitle file beside it ("this one is called delta"), each name
shared by several clips. A query is the clip's caption and its name ("a red circle moves
left, the one called delta"): the pictures cannot tell clips of the same caption and another
name apart, the words cannot tell clips of the same name apart. The fusion's constants
(``rrf_k``, ``text_weight``) are chosen on a validation collection generated with another
seed, then used on the test collection. DiCoSA is the tiny model trained on the synthetic
benchmark (``common.synthetic_checkpoint``).

Costs are wall-clock seconds of each source per hour of video: subtitles on the collection's
sidecars and streams, speech (PocketSphinx) on clips with espeak-ng speech, OCR (Tesseract,
3 frames per video) on clips with the name burnt in; with how often each source got the name
right. Timings say the machine and whether it was shared.

    python benchmarks/text_sources.py --work /tmp/text-bench --out results/text_sources.json
    python benchmarks/text_sources.py --smoke --out /tmp/smoke.json
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from common import environment, report, synthetic_checkpoint

from dicosa.checkpoint import load
from dicosa.data.synthetic import make_synthetic
from dicosa.index import VideoIndex
from dicosa.plugins.text import attach_text
from dicosa.text.ocr import screen_lines
from dicosa.text.speech import make_recognizer, speech_lines
from dicosa.text.subtitles import subtitle_lines

NAMES = ("alpha", "bravo", "delta", "echo", "golf", "hotel", "kilo", "lima")
GRID_K = (1.0, 3.0, 10.0, 30.0, 60.0)
GRID_WEIGHT = (0.5, 1.0, 2.0)
OCR_FRAMES = 3


def _media():
    """The test helpers that write speech and burnt-in text (tests/_text_media.py)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests import _text_media

    return _text_media


def named_collection(root: Path, seed: int) -> pd.DataFrame:
    """Give each test clip of a synthetic data folder a name in a sidecar; ``[video, caption,
    name, path]`` per clip (its first test caption)."""
    table = pd.read_csv(root / "MSRVTT_JSFUSION_test.csv").drop_duplicates("video_id")
    rng = np.random.default_rng(seed)
    names = [NAMES[i % len(NAMES)] for i in rng.permutation(len(table))]
    rows = []
    for (_, row), name in zip(table.iterrows(), names, strict=True):
        path = root / "videos" / f"{row['video_id']}.mp4"
        path.with_suffix(".srt").write_text(
            f"1\n00:00:00,100 --> 00:00:00,900\nthis one is called {name}\n")
        rows.append({"video": row["video_id"], "caption": row["sentence"], "name": name,
                     "path": str(path.resolve())})
    return pd.DataFrame(rows)


def recall_at_1(index: VideoIndex, table: pd.DataFrame, source: str) -> float:
    queries = [f"{c}, the one called {n}" for c, n in zip(table["caption"], table["name"],
                                                          strict=True)]
    results = index.query(queries, k=1, source=source)
    return float(np.mean([bool(r.hits) and r.hits[0].path == p
                          for r, p in zip(results, table["path"], strict=True)]))


def build(model, root: Path, table: pd.DataFrame, out: Path) -> tuple[VideoIndex, dict]:
    if out.exists():
        shutil.rmtree(out)
    index = VideoIndex.build(model, list(table["path"]), out, num_workers=0, progress=False,
                             backend="exact")
    plugin = attach_text(index)
    seconds = float(index.metadata["duration"].sum())
    work = plugin.reports["subtitles"].work_s
    return index, {"videos": len(index), "video_seconds": seconds, "subtitles_s": work}


def choose(index: VideoIndex, table: pd.DataFrame) -> tuple[dict, list]:
    """The (rrf_k, text_weight) of best fused R@1 on the validation collection; among equals
    the one nearest RRF's published default (k = 60, w = 1): larger k, then w nearest 1."""
    plugin = index.plugins["text"]
    grid = []
    for k in GRID_K:
        for weight in GRID_WEIGHT:
            plugin.rrf_k, plugin.text_weight = k, weight
            grid.append({"rrf_k": k, "text_weight": weight,
                         "fused_r1": recall_at_1(index, table, "all")})
    best = max(grid, key=lambda g: (g["fused_r1"], g["rrf_k"], -abs(g["text_weight"] - 1)))
    return {"rrf_k": best["rrf_k"], "text_weight": best["text_weight"]}, grid


def _unavailable(*needs: str) -> dict | None:
    """``{"skipped": why}`` where a Debian program a cost needs is missing (the tests that
    need it are skipped there too, for the same reason: tests/_system.py), else None."""
    _media()  # puts the repository on the path
    from tests._system import reason

    why = reason(*needs)
    if why is not None:
        logging.warning("skipped: %s", why)
    return None if why is None else {"skipped": why}


def speech_cost(folder: Path, count: int) -> dict:
    """PocketSphinx on ``count`` clips of espeak-ng speech (6 s each, the sentence from 1 s):
    seconds per hour of audio, the names it heard, its word error rate."""
    if skipped := _unavailable("espeak-ng"):
        return skipped
    media = _media()
    recognizer = make_recognizer("pocketsphinx")
    errors = words = heard = 0
    spent = audio = 0.0
    for i in range(count):
        name = NAMES[i % len(NAMES)]
        sentence = f"this one is called {name}"
        clip = media.write_clip(folder / f"speech{i}.mp4", 6.0, size=(64, 48), sound=np.concatenate(
            [media.silence(1.0), media.say(sentence)]))
        lines, said = speech_lines(clip, [(0.0, 6.0)], recognizer)
        spent, audio = spent + said.work_s, audio + said.seconds
        hypothesis = " ".join(ln.text for ln in lines).split()
        heard += name in hypothesis
        errors += _edit_distance(sentence.split(), hypothesis)
        words += len(sentence.split())
    return {"clips": count, "audio_s": audio, "work_s": spent,
            "s_per_hour": 3600 * spent / audio, "names_heard": heard / count,
            "word_error_rate": errors / words, "voice": f"espeak-ng {media.VOICE}"}


def ocr_cost(folder: Path, count: int) -> dict:
    """Tesseract on :data:`OCR_FRAMES` frames of ``count`` 6 s clips (320x180) with the name
    shown from 1 s: seconds per frame and per hour at one row per clip, names read."""
    if skipped := _unavailable("tesseract", "fonts"):
        return skipped
    media = _media()
    spent = frames = read = 0
    for i in range(count):
        name = NAMES[i % len(NAMES)].upper()
        clip = media.write_clip(folder / f"ocr{i}.mp4", 6.0, text=(f"CALLED {name}", 1.0, 6.0))
        lines, found = screen_lines(clip, [(0.0, 6.0)], OCR_FRAMES)
        spent, frames = spent + found.work_s, frames + found.frames
        read += any(name in ln.text.split() for ln in lines)
    per_frame = spent / frames
    return {"clips": count, "frames": frames, "work_s": spent, "s_per_frame": per_frame,
            "names_read": read / count,
            "s_per_hour_of_6s_rows": 3600 / 6.0 * OCR_FRAMES * per_frame,
            "s_per_hour_of_60s_rows": 3600 / 60.0 * OCR_FRAMES * per_frame}


def subtitle_cost(table: pd.DataFrame, seconds_per_clip: float) -> dict:
    started = time.perf_counter()
    lines = sum(len(subtitle_lines(p)[0]) for p in table["path"])
    spent = time.perf_counter() - started
    return {"videos": len(table), "lines": lines, "work_s": spent,
            "s_per_video": spent / len(table),
            "s_per_hour_of_clips": 3600 * spent / (seconds_per_clip * len(table))}


def _edit_distance(a: list[str], b: list[str]) -> int:
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        previous, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (x != y))
    return row[-1]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", default=None, help="folder for data and the trained model")
    parser.add_argument("--out", default=None)
    parser.add_argument("--smoke", action="store_true", help="tiny, for the test suite")
    parser.add_argument("--test-clips", type=int, default=200)
    parser.add_argument("--cost-clips", type=int, default=8)
    parser.add_argument("--shared", action="store_true",
                        help="say that the machine was shared with other work while timing")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    torch.manual_seed(0)
    work = Path(args.work or tempfile.mkdtemp(prefix="dicosa-text-"))
    try:
        return _run(args, work)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


def _run(args: argparse.Namespace, work: Path) -> dict:
    clips = 16 if args.smoke else args.test_clips
    # The first-stage summary the training would fit is not used here (every row is
    # reranked): not fitted.
    checkpoint, _, _ = synthetic_checkpoint(work, smoke=args.smoke,
                                            num_train=40 if args.smoke else 300,
                                            num_test=clips,
                                            overrides={"train": {"fit_summary": False}})
    model = load(checkpoint)[0]
    val_root = make_synthetic(work / f"val-{clips}", num_train=0, num_test=clips, size=32,
                              seconds=1.0, seed=1001)
    test_root = make_synthetic(work / f"test-{clips}", num_train=0, num_test=clips, size=32,
                               seconds=1.0, seed=2002)
    val_table, test_table = named_collection(val_root, 1), named_collection(test_root, 2)
    val_index, _ = build(model, val_root, val_table, work / "val-index")
    chosen, grid = choose(val_index, val_table)
    test_index, built = build(model, test_root, test_table, work / "test-index")
    plugin = test_index.plugins["text"]
    plugin.rrf_k, plugin.text_weight = chosen["rrf_k"], chosen["text_weight"]
    recall = {source: recall_at_1(test_index, test_table, source)
              for source in ("visual", "text", "all")}
    costs_dir = work / "costs"
    costs_dir.mkdir(exist_ok=True)
    count = 2 if args.smoke else args.cost_clips
    result = {
        "collection": {"test_clips": len(test_table), "names": len(NAMES),
                       "clips_per_name": len(test_table) / len(NAMES),
                       "validation_seed": 1001, "test_seed": 2002},
        "chosen_on_validation": chosen, "validation_grid": grid,
        "r_at_1_visual": recall["visual"], "r_at_1_text": recall["text"],
        "r_at_1_fused": recall["all"],
        "chance_text_only": 1.0 / (len(test_table) / len(NAMES)),
        "cost_subtitles": subtitle_cost(test_table, 1.0),
        "cost_speech": speech_cost(costs_dir, count),
        "cost_ocr": ocr_cost(costs_dir, count),
        "index": built,
        "environment": {**environment("cpu"),
                        "shared": "2-core machine, shared with other work" if args.shared
                        else "not stated"},
    }
    return report(result, args.out)


if __name__ == "__main__":
    main()
