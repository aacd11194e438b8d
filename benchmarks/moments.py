"""Moments in long videos against the same scenes indexed as separate clips (issue 31's bar).

The model is the synthetic benchmark's (``common.synthetic_checkpoint``: trained by
``dicosa.training.train`` on 300 one-second clips, the checkpoint chosen on a validation split
carved from them). The long videos (``data_prep/make_long_synthetic.py``: default 20 videos of
10 scenes of 3 s, hard cuts) show scenes the model never trained on, one caption per scene.

- **long videos**: indexed as a user would (``VideoIndex.build``, the default segments:
  frames at 1 frame/s, PySceneDetect's adaptive detector, windows of N frames; no knowledge of
  the scene boundaries), every row ranked by DiCoSA for every caption;
- **reference**: the scenes indexed as separate clips (N frames each, as the issue's
  reference), ranked the same way; each clip stands for its exact time range in its long
  video, so both lists are measured against the same truths.

Measured (``dicosa.moment_metrics``): right video first (video R@1), right video with a moment
on the scene (temporal IoU >= 0.5) in the top 5 (moment R@5), and the rest of the table; the
bar: long videos reach >= 90% of the reference on both.

Moments are ranges (:func:`dicosa.search.moment.best_moments`): ``--joins`` compares join
levels on the same index (the first is the one measured against the reference; a level above
1 never joins, each moment one row). ``--scene-seconds LOW HIGH`` draws each scene's length,
so that scenes longer than a window (N frames at 1 frame/s) are scored by several windows;
``--seed 1`` is the validation collection the defaults were chosen on, seed 0 the test.

    python benchmarks/moments.py --work WORK --out benchmarks/results/moments.json
    python benchmarks/moments.py --work WORK --scene-seconds 2 12 --joins 0.8 2
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from common import environment, report, synthetic_checkpoint

from dicosa.data.long_synthetic import load_long_synthetic, make_long_synthetic
from dicosa.index.moment_eval import evaluate_split, moment_ranker
from dicosa.index.video_index import VideoIndex
from dicosa.loading import load_model
from dicosa.moment_metrics import evaluate_rankings, format_moment_table
from dicosa.search.moment import JOIN_LEVEL

BAR = 0.9


def reference(model, root: Path, frames) -> dict:
    """The scenes as separate clips, each ranked clip mapped to its range in its long video,
    measured against the long videos' truths."""
    clips, videos = load_long_synthetic(root, as_clips=True), load_long_synthetic(root)
    where = {m["clip"]: (m["video"], m["start"], m["end"])
             for m in json.loads((root / "moments.json").read_text())}
    index = VideoIndex.build(model, [str(p) for p in clips.video_paths], None,
                             backend="exact", progress=False, frame_sampling=frames.sampling,
                             frame_padding=frames.padding)
    rank = moment_ranker(index, clips)
    with torch.inference_mode():
        ranked = rank(clips.captions)
    mapped = []
    for row in ranked:  # best first; a scene longer than a window is several moments of
        best: dict[str, float] = {}  # its clip: the clip once, at its best
        for clip, _, _, score in row:
            best.setdefault(clip, score)
        mapped.append([(*where[clip], score) for clip, score in best.items()])
    result = evaluate_rankings(mapped, videos.truths())
    one_row_each = len(index.store) == len(index)  # scenes longer than a window: several
    return {**result, "videos": len(index), "rows": len(index.store),
            "short_clips_unchanged": unchanged(model, index, clips, frames) if one_row_each
            else "not compared: some scenes are longer than one window"}


def unchanged(model, index: VideoIndex, clips, frames) -> dict:
    """The same clips indexed as an index without segments stores them (one row of N frames
    per video, the layout before moments): equal features and rankings show that short-clip
    search did not change."""
    before = VideoIndex.build(model, [str(p) for p in clips.video_paths], None,
                              backend="exact", progress=False, segments=False,
                              frame_sampling=frames.sampling, frame_padding=frames.padding)
    now, then = (i.store.gather(i.store.live()) for i in (index, before))
    same = [[h.path for h in a] == [h.path for h in b] for a, b in zip(
        index.search(clips.captions, k=10, candidates=None),
        before.search(clips.captions, k=10, candidates=None), strict=True)]
    return {"max_abs_feature_difference": float((now.frames.float()
                                                 - then.frames.float()).abs().max()),
            "same_masks": bool((now.frame_mask == then.frame_mask).all()),
            "same_top10_fraction": sum(same) / len(same)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default="benchmarks/results/moments-work")
    parser.add_argument("--videos", type=int, default=20)
    parser.add_argument("--scenes", type=int, default=10)
    parser.add_argument("--scene-seconds", type=float, nargs="+", default=[3.0],
                        help="a scene's length, or LOW HIGH drawn per scene")
    parser.add_argument("--joins", type=float, nargs="+", default=[JOIN_LEVEL, 2.0],
                        help="join levels of moments (the first is the reported one)")
    parser.add_argument("--seed", type=int, default=0, help="the long videos' seed")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny: 2 videos of 3 scenes, a random-weight model")
    parser.add_argument("--out", help="JSON result file")
    args = parser.parse_args()
    if args.smoke:
        args.videos, args.scenes = 2, 3
    if len(args.scene_seconds) not in (1, 2):
        parser.error("--scene-seconds takes one or two values")
    seconds = (args.scene_seconds[0] if len(args.scene_seconds) == 1
               else tuple(args.scene_seconds))
    work = Path(args.work)
    started = time.perf_counter()
    if args.smoke:  # the pipeline only: random weights, the training scenes replayed
        checkpoint, data = None, None
    else:
        checkpoint, data, _ = synthetic_checkpoint(work)
    trained = time.perf_counter()
    name = "-".join(f"{x:g}" for x in args.scene_seconds)
    root = work / f"long-{args.videos}x{args.scenes}-{name}s-seed{args.seed}"
    if not (root / "moments.json").is_file():
        make_long_synthetic(root, num_videos=args.videos, scenes_per_video=args.scenes,
                            scene_seconds=seconds, seed=args.seed, exclude_root=data)
    model, _, frames = load_model(checkpoint, None if checkpoint else "configs/synthetic.yaml",
                                  [])
    model.eval()
    with tempfile.TemporaryDirectory() as folder:  # one index, measured at every join level
        by_join = {level: evaluate_split(model, load_long_synthetic(root), index_dir=folder,
                                         frame_sampling=frames.sampling, join=level,
                                         frame_padding=frames.padding, progress=False)
                   for level in args.joins}
    long = by_join[args.joins[0]]
    ref = reference(model, root, frames)
    for level, result in by_join.items():
        print(f"join level {level:g}: " + ", ".join(
            f"R@{k} IoU>={t:g} {result['VCMR'][f'R@{k},IoU>={t:g}']:.1f}"
            for t in (0.5, 0.7) for k in (1, 5)))
    print(format_moment_table(long, "long videos (segments found by the index)"))
    print(format_moment_table(ref, "reference: the scenes indexed as separate clips"))
    figures = {
        "video_r1": (long["VR"]["R@1"], ref["VR"]["R@1"]),
        "moment_r5_iou0.5": (long["VCMR"]["R@5,IoU>=0.5"], ref["VCMR"]["R@5,IoU>=0.5"]),
    }
    ratios = {k: round(a / b, 3) if b else None for k, (a, b) in figures.items()}
    met = all(r is not None and r >= BAR for r in ratios.values())
    print("long / reference: " + ", ".join(f"{k} {a:.1f} / {b:.1f} = {ratios[k]}"
                                           for k, (a, b) in figures.items())
          + f" (bar {BAR}: {'met' if met else 'missed'})")
    report({"benchmark": "moments", "checkpoint": str(checkpoint),
            "selected_on": "validation split carved from the training clips",
            "videos": args.videos, "scenes_per_video": args.scenes,
            "scene_seconds": args.scene_seconds, "long_seed": args.seed,
            "joins": args.joins, "long": long, "reference": ref,
            "long_by_join": {f"{level:g}": {key: r[key] for key in ("VCMR", "SVMR", "VR")}
                             for level, r in by_join.items()},
            "ratios": ratios, "bar": BAR, "met": met,
            "train_s": round(trained - started, 1),
            "measure_s": round(time.perf_counter() - trained, 1),
            **environment("cpu")}, args.out)


if __name__ == "__main__":
    main()
