"""`python -m keras_transformer_app`: the `keras-transformer` command."""

from keras_transformer_app import main

if __name__ == "__main__":
    main()
