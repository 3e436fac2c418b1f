"""`python -m keras_transformer.cli`: the `keras-transformer` command."""

from keras_transformer.cli import main

if __name__ == "__main__":
    main()
