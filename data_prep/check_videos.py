"""List every unusable video file of a dataset split (missing, empty or undecodable).

    python data_prep/check_videos.py msrvtt data/msrvtt 1k-A --workers 8
"""

from __future__ import annotations

import argparse
import sys

from dicosa.data.datasets import DATASETS, load_split
from dicosa.data.video import check_videos


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset", choices=sorted(DATASETS))
    parser.add_argument("root", help="folder with the annotation files")
    parser.add_argument("split", nargs="+", help="split name(s), e.g. 9k 1k-A")
    parser.add_argument("--video-dir", default=None, help="default: <root>/videos")
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args(argv)
    num_bad = 0
    for split_name in args.split:
        split = load_split(args.dataset, args.root, split_name, args.video_dir)
        bad = check_videos(split.video_paths, args.workers)
        num_bad += len(bad)
        print(f"{split.name}: {len(bad)} of {split.num_videos} videos unusable")
        for path, reason in bad:
            print(f"BAD {path}: {reason}")
    return 1 if num_bad else 0


if __name__ == "__main__":
    sys.exit(main())
