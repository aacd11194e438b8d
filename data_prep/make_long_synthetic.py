"""Write the long-video synthetic benchmark (scenes joined into long videos) to a folder.

    python data_prep/make_long_synthetic.py data/long_synthetic --exclude data/synthetic
"""

from __future__ import annotations

import argparse
import time

from dicosa.data.long_synthetic import make_long_synthetic


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", help="output folder")
    parser.add_argument("--videos", type=int, default=20)
    parser.add_argument("--scenes", type=int, default=10, help="scenes per video")
    parser.add_argument("--scene-seconds", type=float, nargs="+", default=[3.0],
                        help="scene length, or LOW HIGH for a random length per scene")
    parser.add_argument("--size", type=int, default=32, help="frame height and width in px")
    parser.add_argument("--fps", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--exclude", default=None,
                        help="the make_synthetic folder the model trained on: its scenes are "
                             "left out (default: make_synthetic's default clips, replayed)")
    parser.add_argument("--exclude-seed", type=int, default=0,
                        help="without --exclude: the seed make_synthetic was run with")
    parser.add_argument("--exclude-clips", type=int, default=400,
                        help="without --exclude: make_synthetic's train + test clip count")
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args(argv)
    if len(args.scene_seconds) not in (1, 2):
        parser.error("--scene-seconds takes one or two values")
    seconds = args.scene_seconds[0] if len(args.scene_seconds) == 1 else tuple(args.scene_seconds)
    start = time.perf_counter()
    try:
        root = make_long_synthetic(
            args.root, num_videos=args.videos, scenes_per_video=args.scenes,
            scene_seconds=seconds, size=args.size, fps=args.fps, seed=args.seed,
            exclude_root=args.exclude, exclude_seed=args.exclude_seed,
            exclude_clips=args.exclude_clips, num_workers=args.workers,
        )
    except (FileNotFoundError, ValueError) as exc:
        parser.error(str(exc))
    print(f"wrote {args.videos} videos of {args.scenes} scenes (and the scenes as clips) to "
          f"{root} in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
