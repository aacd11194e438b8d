"""Evaluate a checkpoint on a benchmark split: ``dicosa evaluate`` for a checkout (see
``evaluate.py --help``).

    python evaluate.py --split 1k-A --checkpoint runs/msrvtt/best.pt --postprocess dsl qbnorm
"""

from dicosa.cli.evaluate_cmd import main

if __name__ == "__main__":
    main()
