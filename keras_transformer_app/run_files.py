"""A run's files (§5): the places of what a training run writes, and which model is
"the" model.

Every path of a run is named here or in `keras_transformer.saving` (the model and its
tokenizers, which the library reads), once; the training loop, the resumable run,
checkpoint averaging (§6.1), evaluation, export and serving all ask these two:

    RUN_DIR/
      tokenizer/             the shared subword vocabulary (or source_tokenizer/
                             and target_tokenizer/ for separate vocabularies)
      model.keras            the final model: THE model of the run
      model_averaged.keras   the average of the last checkpoints (§6.1)
      checkpoints/           step-0000500.keras, ...
      backup/                the last window's weights and optimizer state (fit.RunBackup)
      compilation_cache/     JAX's compiled programs, reused by a resumed run
      token_cache/           a large training split's ids, tokenized once
                             (keras_transformer.data.token_cache)
      logs/                  TensorBoard
      training_log.csv       one row per checkpoint window
      results.json           steps, time, BLEU, ...
      model_options.json     the options that made the model, checked at every start

Which model is the model: `model.keras`, always. `translate`, `evaluate`,
`export` and `serve` given a run directory use it, and the recipes export it.
The averaged model is a file beside it, used only when named
(`RUN_DIR/model_averaged.keras`): averaging the last checkpoints helps a run
that has converged but can hurt a short one whose early checkpoints are far
from trained, so it is never picked silently.

Each file is written atomically (`keras_transformer.saving.atomic_path`).
"""

import os

AVERAGED_MODEL = "model_averaged.keras"
CHECKPOINTS = "checkpoints"
BACKUP = "backup"
COMPILATION_CACHE = "compilation_cache"
TOKEN_CACHE = "token_cache"
LOGS = "logs"
TRAINING_LOG = "training_log.csv"
VALIDATION_CURVE = "validation_curve.csv"  # a recipe's --validation-curve
RESULTS = "results.json"
MODEL_OPTIONS = "model_options.json"


def path(run_dir, name):
    """The path of `name` (one of the names above, or of `keras_transformer.saving`'s)
    in `run_dir`."""
    return os.path.join(run_dir, name)
