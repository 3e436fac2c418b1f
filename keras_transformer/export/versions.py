"""SavedModel version folders and loading (§6.1 search, served), in TensorFlow Serving's layout.

An export base (e.g. `saved_models/NAME/`) holds one folder per version,
`1/`, `2/`, ..., each a SavedModel with `assets.extra/keras_transformer.json`
(the export's settings) beside its variables, or a CTranslate2 export
(`keras_transformer.export.ctranslate2`: `model.bin`, `config.json` and the
settings in `keras_transformer.json`). TensorFlow Serving loads the highest
SavedModel version; our built-in server (`keras_transformer_app.serving`) and
command line load the highest version of either engine. Both ignore other names.

A version is written by `write_version`: into a hidden folder beside its final
place, renamed when complete, so a killed export never leaves a half-written
version where a server would load it; the hidden folders of exports whose
process is gone are removed at the next export.
"""

import contextlib
import json
import os

from keras_transformer import saving, validation
from keras_transformer.inference.ctranslate2 import is_ctranslate2_export

#: The export's settings, beside the variables, where TensorFlow Serving
#: keeps extra assets.
METADATA_PATH = os.path.join("assets.extra", "keras_transformer.json")


def versions(export_base):
    """The integer versions under `export_base`, ascending (hidden partial
    exports and other names are ignored, as TensorFlow Serving ignores them)."""
    if not os.path.isdir(export_base):
        return []
    return sorted(int(name) for name in os.listdir(export_base)
                  if name.isdigit() and os.path.isdir(os.path.join(export_base, name)))


def next_version(export_base, version=None):
    """The version an export writes: `version` itself if it is free, or one
    above the highest present (1 for a new export base) for None.

    Raises:
        ValueError: for a version that is not a positive integer.
        FileExistsError: for a version that exists (one is never overwritten).
    """
    if version is None:
        present = versions(export_base)
        return present[-1] + 1 if present else 1
    if not isinstance(version, int):  # "5" or 2.0 would name another folder
        raise ValueError(f"version={version!r} must be a positive integer (TF Serving layout).")
    version = validation.check_positive_int("version", version, "TF Serving layout")
    if os.path.exists(os.path.join(export_base, str(version))):
        raise FileExistsError(
            f"{os.path.join(export_base, str(version))} exists: a served version is never "
            "overwritten. Pick another --version or leave it out for the next one."
        )
    return version


@contextlib.contextmanager
def write_version(export_base, version):
    """Yields a temporary folder to write version `version` into; renames it
    to `export_base/version` when the block ends without an error, and
    deletes it otherwise (`saving.atomic_path`: a hidden, non-numeric
    name, which TensorFlow Serving ignores while it is written). The
    temporary folders of exports whose process is gone are removed first."""
    os.makedirs(export_base, exist_ok=True)
    saving.remove_partials(export_base)
    with saving.atomic_path(os.path.join(export_base, str(version)),
                               overwrite=False) as partial:
        os.makedirs(partial)
        yield partial


def write_metadata(version_path, metadata):
    """Writes the export's settings to `METADATA_PATH` in a version folder."""
    os.makedirs(os.path.join(version_path, os.path.dirname(METADATA_PATH)), exist_ok=True)
    with open(os.path.join(version_path, METADATA_PATH), "w") as f:
        json.dump(metadata, f, indent=2)


def read_metadata(version_path):
    """The settings an export wrote beside its variables."""
    path = os.path.join(version_path, METADATA_PATH)
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{version_path!r} has no {METADATA_PATH}: it was not written by "
            "keras-transformer export.")
    with open(path) as f:
        return json.load(f)


def is_version(path):
    """Whether `path` is a complete version folder of either engine: a SavedModel
    with its export settings, or a CTranslate2 export."""
    return is_ctranslate2_export(path) or all(
        os.path.exists(os.path.join(path, name)) for name in ("saved_model.pb", METADATA_PATH))


def engine(version_path):
    """"ctranslate2" for a CTranslate2 export, "saved_model" otherwise."""
    return "ctranslate2" if is_ctranslate2_export(version_path) else "saved_model"


def is_version_folder(path):
    """Whether `path` is itself a version (a SavedModel or a CTranslate2 export)
    rather than an export base holding versions."""
    return os.path.exists(os.path.join(path, "saved_model.pb")) or is_ctranslate2_export(path)


def latest_version_path(path):
    """`path` if it is a version itself (`is_version_folder`); else the highest
    version under it."""
    if is_version_folder(path):
        return path
    if not os.path.isdir(path):
        raise FileNotFoundError(f"No exported model at {path!r}.")
    found = versions(path)
    if not found:
        raise FileNotFoundError(
            f"{path!r} holds no version directory (1/, 2/, ... with saved_model.pb, or a "
            "CTranslate2 export): export one with `keras-transformer export MODEL " + path +
            "` (add --format ctranslate2 for CTranslate2)."
        )
    version_path = os.path.join(path, str(found[-1]))
    if not is_version_folder(version_path):
        raise FileNotFoundError(f"{version_path!r} holds neither a saved_model.pb nor a "
                                "CTranslate2 export: export it again.")
    return version_path


def load_saved_model(path):
    """Loads an exported translation SavedModel (the highest version of a
    `saved_models/NAME` directory, or a version directory) with TensorFlow and
    tensorflow_text only. Returns `(loaded, version_path)`."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  registers the tokenizer ops the graph uses

    version_path = latest_version_path(path)
    return tf.saved_model.load(version_path), version_path
