"""`python -m keras_transformer.cli`: the `keras-transformer` command.

Python imports the library (and with it Keras) before this module runs, so TensorFlow's
native start-up lines may show; `python -m keras_transformer_app`, like the installed
`keras-transformer`, sets its process up before anything loads Keras.
"""

from keras_transformer_app import main

if __name__ == "__main__":
    main()
