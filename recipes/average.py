"""Checkpoint averaging (§6.1) as a command: writes one model whose weights are
the mean of the given checkpoints. Same as `keras-transformer average`.

    python -m recipes.average --run-dir runs/multi30k-de-en --last 3 --output last3.keras
    python -m recipes.average a.keras b.keras --output averaged.keras
"""

if __name__ == "__main__":  # the process is this script's own: set up before Keras loads
    from keras_transformer_app.logs import start

    start()

import sys

from keras_transformer_app import cli


def main(argv=None):
    return cli.main(["average", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    main()
