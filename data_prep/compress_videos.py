"""Re-encode a folder of videos to a low frame rate and short side (resumable, parallel).

    python data_prep/compress_videos.py data/msrvtt/raw_videos data/msrvtt/videos --fps 3
"""

from __future__ import annotations

import argparse
import sys

from dicosa.data.compress import CODECS, compress_videos


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", help="folder of source videos (searched recursively)")
    parser.add_argument("dst", help="output folder; must not be src or inside it")
    parser.add_argument("--fps", type=float, default=3)
    parser.add_argument("--short-side", type=int, default=224)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=None, help="seconds per video")
    parser.add_argument("--codec", choices=CODECS, default="mjpeg",
                        help="mjpeg (default) is what dicosa decodes fastest; h264 is smaller")
    parser.add_argument("--keep-aspect", action="store_true",
                        help="keep the whole frame instead of the centre square dicosa uses")
    args = parser.parse_args(argv)
    try:
        report = compress_videos(args.src, args.dst, args.fps, args.short_side, args.workers,
                                 timeout=args.timeout, codec=args.codec,
                                 square=not args.keep_aspect)
    except (ValueError, FileNotFoundError) as exc:
        parser.error(str(exc))
    print(f"done {report['done']}, already there {report['skipped']}, "
          f"failed {len(report['failed'])}")
    for path, reason in report["failed"]:
        print(f"FAILED {path}: {reason}")
    return 1 if report["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
