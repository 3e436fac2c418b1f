"""A translation model's files (§6.1 decoding needs a model and its vocabulary): the
`.keras` file with its tokenizer folder beside it, and how every file is written.

    FOLDER/
      model.keras            the model (`save_model`, `load_model`)
      tokenizer/             the shared subword vocabulary (or source_tokenizer/
                             and target_tokenizer/ for separate vocabularies)

A folder laid out so (a recipe's run directory is one) names its model:
`load_translation_model(FOLDER)` loads `FOLDER/model.keras` and the tokenizers
beside it, as `Translator`, the exports and the command line do. A `.keras` file
elsewhere is loaded with the tokenizers in its own folder.

Every file and folder the package writes for later code to trust (models, the token
cache, downloads, hypotheses, SavedModel versions, CTranslate2 models) is written
through `atomic_path`: under a hidden temporary name beside its place,
`.partial-PID-NAME`, then renamed, so a killed process never leaves a truncated file
where a later reader would take it for whole. `remove_partials` deletes the leftovers
of killed writers. A write that fails (a full disk, a folder made read-only meanwhile)
leaves nothing behind either, and its error names the path the caller gave, not the
temporary one; a full disk is an `OSError` with `errno.ENOSPC` whatever wrote the file
(Python, HDF5, TensorFlow's SaveV2).
"""

import contextlib
import errno
import json
import os
import shutil

MODEL = "model.keras"
TOKENIZER = "tokenizer"
SOURCE_TOKENIZER = "source_tokenizer"
TARGET_TOKENIZER = "target_tokenizer"


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
        with atomic_path(directory) as partial:
            tokenizer.save(partial)
            if os.path.isdir(directory):  # a folder is renamed over an empty one only
                shutil.rmtree(directory)


def load_tokenizers(run_dir):
    """(source_tokenizer, target_tokenizer) saved in `run_dir` (the folder of a
    model file); the same object twice for a shared vocabulary."""
    from keras_transformer.tokenizers import SubwordTokenizer

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
    """The `.keras` file that `model` names: itself, or a folder's `model.keras`
    (a run directory's: the run's model)."""
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
            "keras_transformer.saving.save_model, from a source you trust."
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
    # Keras picks the format by the suffix, which the temporary name keeps.
    with atomic_path(model_path) as partial:
        model.save(partial)


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
    """Writes `text` (UTF-8, line endings as given) to `text_path`, atomically."""
    with atomic_path(text_path) as partial, open(partial, "w", encoding="utf-8",
                                                 newline="") as f:
        f.write(text)


PARTIAL_PREFIX = ".partial-"


@contextlib.contextmanager
def atomic_path(final_path, overwrite=True, size=None):
    """Yields a temporary path to write a file or a folder into; renames it to
    `final_path` when the block ends without an error, and removes it
    otherwise.

    The temporary path lies beside `final_path` (the same file system, so the
    rename is atomic) and is hidden: `.partial-PID-NAME`, NAME being
    `final_path`'s own name, suffix included. Servers that watch a folder
    (TensorFlow Serving's numbered versions) ignore it while it is written.

    Args:
        final_path: Where the file or folder goes; its folder is created.
        overwrite: Whether an existing file (or empty folder) at `final_path`
            may be replaced; with False, one that exists when the write ends
            raises `FileExistsError` and nothing is replaced.
        size: The bytes the write needs, when known: with less room than that
            where `final_path` goes, the write is refused before it starts,
            with the error a full disk gives (HDF5, whose write fails half-way,
            can crash the process at its exit: `_release_hdf5_files`).
    """
    final_path = os.path.abspath(os.fspath(final_path))
    directory, name = os.path.split(final_path)
    os.makedirs(directory, exist_ok=True)
    if size is not None and shutil.disk_usage(directory).free < size:
        raise _no_space(final_path)
    partial = os.path.join(directory, f"{PARTIAL_PREFIX}{os.getpid()}-{name}")
    _remove(partial)
    try:
        yield partial
        if not overwrite and os.path.exists(final_path):
            raise FileExistsError(f"{final_path} appeared while it was written; nothing was "
                                  "overwritten.")
        os.replace(partial, final_path)
    except Exception as error:
        _release_hdf5_files(partial)
        _remove(partial)  # first: the free space said below counts without it
        failure = _write_failure(error, partial, final_path)
        if failure is None:
            raise
        raise failure from error
    finally:
        _remove(partial)


_NO_SPACE = "No space left on device"


def is_disk_full(error):
    """Whether `error` says a disk is full: an `OSError` with `errno.ENOSPC`, or the
    same said in the text of another library's error (TensorFlow's
    `ResourceExhaustedError` from a SaveV2, HDF5's write failure)."""
    return ((isinstance(error, OSError) and error.errno == errno.ENOSPC)
            or _NO_SPACE in str(error))


def _write_failure(error, partial, final_path):
    """The `OSError` to raise for `error`, raised while `final_path` was written
    under `partial`: one line naming `final_path`; None when `error` is not a
    failure of the write itself (a bug, a signal, a model that cannot be saved)."""
    if is_disk_full(error):
        return _no_space(final_path)
    if isinstance(error, OSError) and error.errno in (errno.EROFS, errno.EACCES, errno.EPERM,
                                                       errno.EDQUOT, errno.EIO):
        reason = error.strerror or os.strerror(error.errno)
        return OSError(error.errno, f"Cannot write {final_path}: {reason}")
    if isinstance(error, OSError) and partial in str(error):
        return type(error)(error.errno, str(error).replace(partial, final_path))
    return None


def _no_space(final_path):
    free = shutil.disk_usage(os.path.dirname(final_path)).free
    return OSError(errno.ENOSPC, f"{_NO_SPACE} to write {final_path} ({_megabytes(free)} "
                                 "free there): free some space, or write to another disk")


def _megabytes(size):
    return f"{size / 2**20:,.1f} MB"


def _release_hdf5_files(path):
    """Closes the HDF5 files still open on `path` after a failed write.

    A `.weights.h5` write that fails (a full disk) leaves HDF5 holding the file
    with unwritten metadata: its cleanup at exit writes again, fails, and the
    process ends in a segmentation fault. Truncating the file first gives that
    last flush room, and the file is removed next in any case. Under JAX, the
    failed write's groups and datasets are let go while the disk is still full
    ("Can't decrement id ref count"), and the process can still crash at its
    exit: a write whose size is known checks the room first (`atomic_path`).
    """
    import sys

    h5py = sys.modules.get("h5py")  # only imported if something wrote HDF5
    if h5py is None:
        return
    for file_id in h5py.h5f.get_obj_ids(types=h5py.h5f.OBJ_FILE):
        try:
            if os.path.abspath(os.fsdecode(file_id.name)) != path:
                continue
            os.ftruncate(file_id.get_vfd_handle(), 0)
            file_id.close()
        except Exception:  # noqa: BLE001,S110  the file is removed next; nothing to save
            pass


def remove_partials(directory):
    """Removes the temporary files and folders that `atomic_path` left in
    `directory` for writers that were killed (their process is gone); those of
    running processes stay.

    Returns:
        The names removed.
    """
    removed = []
    if not os.path.isdir(directory):
        return removed
    for name in os.listdir(directory):
        pid = name[len(PARTIAL_PREFIX):].split("-", 1)[0]
        if not name.startswith(PARTIAL_PREFIX) or not pid.isdigit() or _is_running(int(pid)):
            continue
        _remove(os.path.join(directory, name))
        removed.append(name)
    return removed


def _is_running(pid):
    if pid <= 0:  # not a process of ours (0 would signal our own group)
        return False
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def _remove(path):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)
