"""Checkpoint averaging (§6.1) as a command: writes one model whose weights are
the mean of the given checkpoints.

    python -m recipes.average --run-dir runs/multi30k-de-en --last 5
    python -m recipes.average a.keras b.keras --output averaged.keras
"""

import argparse
import os

from recipes.common import main_guard


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m recipes.average",
        description="Average the weights of several .keras checkpoints of one run.",
    )
    parser.add_argument("checkpoints", nargs="*", help=".keras files to average")
    parser.add_argument("--run-dir", help="take the newest checkpoints of this run's checkpoints/")
    parser.add_argument("--last", type=int, default=5,
                        help="with --run-dir: how many of the newest checkpoints (default: 5)")
    parser.add_argument("--output", help="where to write the averaged model "
                        "(default: RUN_DIR/model_averaged.keras or averaged.keras)")
    args = parser.parse_args(argv)
    if bool(args.checkpoints) == bool(args.run_dir):
        parser.error("give either checkpoint files or --run-dir, not both and not neither")
    if args.last <= 0:
        parser.error("--last must be positive")

    from keras_transformer.training.averaging import average_checkpoints
    from keras_transformer.training.fit import list_checkpoints

    paths = args.checkpoints
    if args.run_dir:
        paths = list_checkpoints(os.path.join(args.run_dir, "checkpoints"))[-args.last :]
        if not paths:
            raise FileNotFoundError(f"No step-*.keras checkpoints in {args.run_dir}/checkpoints.")
    output = args.output or (
        os.path.join(args.run_dir, "model_averaged.keras") if args.run_dir else "averaged.keras"
    )
    average_checkpoints(paths, output)
    print(f"Averaged {len(paths)} checkpoints into {output}")
    for path in paths:
        print(f"  {path}")


if __name__ == "__main__":
    main_guard(main)
