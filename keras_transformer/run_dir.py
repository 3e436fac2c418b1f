"""The run directory: where a training run (§5) keeps its files, and which model is "the" model.

Every path of a run is named here, once; the recipes, the training loop,
checkpoint averaging (§6.1), evaluation, export and serving all ask this module:

    RUN_DIR/
      tokenizer/             the shared subword vocabulary (or source_tokenizer/
                             and target_tokenizer/ for separate vocabularies)
      model.keras            the final model: THE model of the run
      model_averaged.keras   the average of the last checkpoints (§6.1)
      checkpoints/           step-0000500.keras, ...
      backup/                keras.callbacks.BackupAndRestore state
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
LOGS = "logs"
TRAINING_LOG = "training_log.csv"
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
        raise ValueError(f"{model!r} is not a .keras file: pass a .keras model or a run "
                         "directory.")
    return model


def load_model(model_path):
    """Loads a `.keras` model in Keras's safe mode (no arbitrary code), with a
    clear error for a file that is not a model."""
    import keras

    try:
        return keras.saving.load_model(model_path, compile=False, safe_mode=True)
    except Exception as error:  # a damaged zip raises many kinds of errors
        raise ValueError(
            f"Cannot load {model_path!r} as a Keras model ({type(error).__name__}: {error}); "
            "the file may be truncated or not a .keras file."
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
    partial = f"{json_path}.partial-{os.getpid()}"
    with open(partial, "w") as f:
        json.dump(data, f, indent=2)
    os.replace(partial, json_path)
