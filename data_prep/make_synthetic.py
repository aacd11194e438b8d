"""Write the synthetic text-video benchmark (MSR-VTT layout) to a folder.

    python data_prep/make_synthetic.py data/synthetic --num-train 300 --num-test 100
"""

from __future__ import annotations

import argparse
import time

from dicosa.data.synthetic import make_synthetic


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", help="output folder")
    parser.add_argument("--num-train", type=int, default=300)
    parser.add_argument("--num-test", type=int, default=100)
    parser.add_argument("--size", type=int, default=64, help="frame height (and width) in px")
    parser.add_argument("--width", type=int, default=None, help="frame width if not square")
    parser.add_argument("--fps", type=int, default=8)
    parser.add_argument("--seconds", type=float, nargs="+", default=[2.5],
                        help="clip length, or LOW HIGH for a random length per clip")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--test-captions", choices=["first", "all"], default="first")
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args(argv)
    if len(args.seconds) not in (1, 2):
        parser.error("--seconds takes one or two values")
    seconds = args.seconds[0] if len(args.seconds) == 1 else tuple(args.seconds)
    start = time.perf_counter()
    root = make_synthetic(
        args.root, num_train=args.num_train, num_test=args.num_test, size=args.size,
        seed=args.seed, fps=args.fps, seconds=seconds, width=args.width,
        test_captions=args.test_captions, num_workers=args.workers,
    )
    print(f"wrote {args.num_train + args.num_test} clips to {root} "
          f"in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
