"""The run directory: where a training run (§5) keeps its files, and which model is "the" model.

Every path of a run is named here, once; the recipes, the training loop,
checkpoint averaging (§6.1), evaluation, export and serving all ask this module:

    RUN_DIR/
      tokenizer/             the shared subword vocabulary (or source_tokenizer/
                             and target_tokenizer/ for separate vocabularies)
      model.keras            the final model: THE model of the run
      model_averaged.keras   the average of the last checkpoints (§6.1)
      checkpoints/           step-0000500.keras, ...
      backup/                the last window's weights and optimizer state (fit.RunBackup)
      compilation_cache/     JAX's compiled programs, reused by a resumed run
      logs/                  TensorBoard
      training_log.csv       one row per checkpoint window
      results.json           steps, time, BLEU, ...

Which model is the model: `model.keras`, always. `translate`, `evaluate`,
`export` and `serve` given a run directory use it, and the recipes export it.
The averaged model is a file beside it, used only when named
(`RUN_DIR/model_averaged.keras`). Averaging the last checkpoints helps a run
that has converged (the paper's; Multi30k de→en: BLEU 37.63 against 36.78)
but can hurt a short one whose early checkpoints are far from trained (the
1100-step Tatoeba run: 18.86 against 29.71), so it is never picked silently.

Files are written atomically (`save_model`, `write_json`): a temporary file
beside the target, then a rename, so a killed process never leaves a
truncated model or results file where a later command would trust it.
"""

import json
import os

MODEL = "model.keras"
AVERAGED_MODEL = "model_averaged.keras"
TOKENIZER = "tokenizer"
SOURCE_TOKENIZER = "source_tokenizer"
TARGET_TOKENIZER = "target_tokenizer"
CHECKPOINTS = "checkpoints"
BACKUP = "backup"
COMPILATION_CACHE = "compilation_cache"
LOGS = "logs"
TRAINING_LOG = "training_log.csv"
VALIDATION_CURVE = "validation_curve.csv"  # a recipe's --validation-curve
RESULTS = "results.json"


def path(run_dir, name):
    """The path of one of the names above in `run_dir`."""
    return os.path.join(run_dir, name)


def tokenizer_directories(run_dir, separate=False):
    """The tokenizer folders of a run: `[tokenizer/]`, or `[source_tokenizer/,
    target_tokenizer/]` for separate vocabularies."""
    names = (SOURCE_TOKENIZER, TARGET_TOKENIZER) if separate else (TOKENIZER,)
    return [os.path.join(run_dir, name) for name in names]


def save_tokenizers(run_dir, source_tokenizer, target_tokenizer=None):
    """Saves the tokenizer(s) where `load_tokenizers` finds them: one folder
    for a shared vocabulary (`target_tokenizer` None or the same object)."""
    separate = target_tokenizer is not None and target_tokenizer is not source_tokenizer
    tokenizers = (source_tokenizer, target_tokenizer) if separate else (source_tokenizer,)
    for tokenizer, directory in zip(tokenizers, tokenizer_directories(run_dir, separate)):
        tokenizer.save(directory)


def load_tokenizers(run_dir):
    """(source_tokenizer, target_tokenizer) saved in `run_dir` (the folder of a
    model file); the same object twice for a shared vocabulary."""
    from keras_transformer.training.tokenizers import SubwordTokenizer

    shared, = tokenizer_directories(run_dir)
    if os.path.isdir(shared):
        tokenizer = SubwordTokenizer.load(shared)
        return tokenizer, tokenizer
    source, target = tokenizer_directories(run_dir, separate=True)
    if os.path.isdir(source) and os.path.isdir(target):
        return SubwordTokenizer.load(source), SubwordTokenizer.load(target)
    raise FileNotFoundError(
        f"No tokenizer in {run_dir!r}: expected {shared}/ (or {SOURCE_TOKENIZER}/ and "
        f"{TARGET_TOKENIZER}/), as the recipes write them."
    )


def resolve_model_path(model):
    """The `.keras` file that `model` names: itself, or a run directory's
    `model.keras` (the run's model, see the module docstring)."""
    if os.path.isdir(model):
        candidate = os.path.join(model, MODEL)
        if not os.path.exists(candidate):
            raise FileNotFoundError(
                f"No {MODEL} in {model!r}: pass a .keras file or a run directory that a "
                "recipe has finished."
            )
        return candidate
    if not os.path.exists(model):
        raise FileNotFoundError(f"No model at {model!r}.")
    if not model.endswith(".keras"):
        # The same rule as `load_model`, checked before an export starts a subprocess.
        raise _not_a_keras_file(model)
    return model


def _not_a_keras_file(model_path):
    return ValueError(
        f"{model_path!r} is not a .keras file: keras-transformer loads only Keras 3 .keras "
        "files (no legacy .h5 or other formats). Pass a .keras model or a run directory; "
        "convert a model you trust with keras.saving.load_model(PATH).save('NAME.keras')."
    )


def load_model(model_path):
    """Loads a `.keras` model in Keras's safe mode, with a clear error for a
    file that is not one of ours.

    Only local `.keras` files are read: other suffixes (legacy `.h5`), folders
    and remote paths are refused before Keras sees them. Keras refuses what
    would run code while the model is rebuilt: in safe mode a `Lambda` layer's
    Python bytecode, in any mode a class or function from a module outside its
    own packages (this package's layers are registered, so they load). Our
    recipes never write either; the error says so.
    """
    import keras

    model_path = os.fspath(model_path)
    if not model_path.endswith(".keras"):
        raise _not_a_keras_file(model_path)
    if os.path.isdir(model_path):
        raise ValueError(f"{model_path!r} is a folder, not a .keras file: pass the model file "
                         "(a zip that model.save('NAME.keras') writes) or its run directory.")
    if not os.path.isfile(model_path):
        raise FileNotFoundError(f"No model at {model_path!r}.")
    try:
        return keras.saving.load_model(model_path, compile=False, safe_mode=True)
    except Exception as error:  # a damaged zip raises many kinds of errors
        # Keras wraps the refusal in errors about the enclosing layers: look
        # down the chain for it.
        refusal, seen = None, error
        while seen is not None and refusal is None:
            message = str(seen)
            if ("safe_mode" in message or message.startswith("Could not locate ")
                    or "Non-modeling APIs" in message or "KerasSaveable" in message):
                refusal = message
            seen = seen.__cause__ or seen.__context__
        if refusal is None:
            raise ValueError(
                f"Cannot load {model_path!r} as a Keras model ({type(error).__name__}: "
                f"{error}); the file may be truncated or not a .keras file."
            ) from error
        # Keras's first sentence names what it refused; the rest of its message
        # is advice (turning safe mode off) that does not apply here.
        detail = refusal.split(". ")[0].rstrip(".")
        raise ValueError(
            f"Cannot load {model_path!r}: the file contains code that Keras's safe mode refuses "
            f"to run ({detail}): a Lambda layer, or a class or function from a module that "
            "neither Keras nor keras-transformer defines. It is not a model that "
            "keras-transformer's recipes write: use a .keras file written by a recipe or "
            "run_dir.save_model, from a source you trust."
        ) from error


def load_translation_model(model):
    """Loads (model, source_tokenizer, target_tokenizer) from a `.keras` file
    with its tokenizer beside it, or from a run directory."""
    model_path = resolve_model_path(model)
    loaded = load_model(model_path)
    source_tokenizer, target_tokenizer = load_tokenizers(
        os.path.dirname(os.path.abspath(model_path)))
    return loaded, source_tokenizer, target_tokenizer


def save_model(model, model_path):
    """`model.save(model_path)`, atomically."""
    directory = os.path.dirname(os.path.abspath(model_path))
    os.makedirs(directory, exist_ok=True)
    # Keras picks the format by the suffix, so the temporary name keeps it.
    partial = os.path.join(directory, f".partial-{os.getpid()}-{os.path.basename(model_path)}")
    try:
        model.save(partial)
        os.replace(partial, model_path)
    finally:
        if os.path.exists(partial):
            os.remove(partial)


def read_json(json_path, default=None):
    """The JSON object at `json_path`, or `default` if there is no file."""
    if not os.path.exists(json_path):
        return default
    with open(json_path) as f:
        return json.load(f)


def write_json(json_path, data):
    """Writes `data` as indented JSON, atomically."""
    write_text(json_path, json.dumps(data, indent=2))


def write_text(text_path, text):
    """Writes `text` to `text_path` atomically: a temporary file beside it,
    then a rename."""
    partial = f"{text_path}.partial-{os.getpid()}"
    with open(partial, "w", newline="") as f:
        f.write(text)
    os.replace(partial, text_path)
