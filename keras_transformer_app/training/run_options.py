"""§5 Training: the options of a run (`RunOptions`), everything but its data and its model.

Each field is the recipe option of the same name, and every value is checked where the
options are made, so an impossible run is refused before any data is read.
`keras_transformer_app.training.run.run` takes them. `check_model_options` keeps a run
directory to the options that made its model.
"""

import dataclasses
import json
import os
from typing import Optional, Sequence, Union

from keras_transformer import saving, tokenizers
from keras_transformer import validation as checks
from keras_transformer_app import run_files
from keras_transformer_app.training import distribution


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How a run trains and is scored: everything but its data and its model.

    Each field is the recipe option of the same name (`steps` is `--steps`).

    Args:
        run_dir: Folder of the run (checkpoints, logs, tokenizer, models, results.json).
        steps: Optimizer steps in all, counting those of a run resumed; or
        epochs: Passes over the training data, converted to steps (give one of the two).
        checkpoint_every: Steps between checkpoints and backups (a Keras "epoch").
        keep_checkpoints: Newest checkpoints kept and averaged (§6.1: 5 base, 20 big).
        name: Name of the run in results.json ("recipe") and in messages.
        precision: Keras dtype policy for training: float32, mixed_float16 or
            mixed_bfloat16.
        seed: Random seed of Keras and of the pipeline's shuffling.
        verbose: `model.fit` verbosity (0, 1 or 2); 0 also hides the test progress.
        distribute, model_parallel: Several devices: "data" or "model" parallel
            (`keras_transformer_app.training.distribution.setup`), or "none". "data" also
            trains over the processes that the environment names.
        peer_timeout: Seconds after which a JAX cluster declares a silent process
            dead and stops the others (TensorFlow's own timeout is 10 s).
        tokenizer: "sentencepiece" (BPE) or "wordpiece".
        vocab_size: Subword vocabulary size (per language with separate vocabularies).
        tokenizer_sample: Learn the vocabulary from this many training pairs, drawn
            uniformly with `seed` (None: from every pair).
        separate_vocabularies: One vocabulary per language instead of a shared one.
        max_sentence_length: Longest training source / target in tokens; longer pairs
            are dropped.
        tokens_per_batch: Token budget per batch and side, padding included.
        bucket_width: Length step of the batching buckets.
        lr_scale: Constant factor on the eq. (3) learning rate.
        cooldown_steps: Steps at the end of the run over which the rate falls linearly
            towards 0, or a share of the run such as "40%" (not in the paper; 0: none).
        loss_chunk_size: Positions at a time of the pre-softmax projection and the
            loss in training and validation (`LabelSmoothedCrossEntropy`'s
            `chunk_size`: the whole logits never exist at once, and the step is
            faster on a CPU; docs/performance.md); 0 projects the batch in one piece.
        beam_size, alpha: Beam search of the scoring (§6.1).
        tune_alpha: Length penalties to try on the validation split; the best replaces
            `alpha` (None: use `alpha`).
        eval_limit: Score only the first N distinct sources of each split.
        bleu_force: sacreBLEU's `force`, for text that looks tokenized (None: warn only
            where the hypotheses look more tokenized than the references).
        validation_curve: Keep every checkpoint and score each on the validation split.
        evaluate_only: Train nothing; score the run's saved models on the test split.
        export_dir: Export `model.keras` as a SavedModel to EXPORT_DIR/VERSION/.
    """

    run_dir: str
    steps: Optional[int] = None
    epochs: Optional[float] = None
    checkpoint_every: int = 500
    keep_checkpoints: int = 5
    name: str = "run"
    precision: str = "float32"
    seed: int = 0
    verbose: int = 1
    distribute: str = "none"
    model_parallel: int = 2
    peer_timeout: int = distribution.PEER_TIMEOUT
    tokenizer: str = "sentencepiece"
    vocab_size: int = 8000
    tokenizer_sample: Optional[int] = None
    separate_vocabularies: bool = False
    max_sentence_length: int = 128
    tokens_per_batch: int = 4096
    bucket_width: int = 8
    lr_scale: float = 1.0
    cooldown_steps: Union[int, str] = 0
    loss_chunk_size: int = 1024
    beam_size: int = 4
    alpha: float = 0.6
    tune_alpha: Optional[Sequence[float]] = None
    eval_limit: Optional[int] = None
    bleu_force: Optional[bool] = None
    validation_curve: bool = False
    evaluate_only: bool = False
    export_dir: Optional[str] = None

    def __post_init__(self):
        if (self.steps is None) == (self.epochs is None):
            raise ValueError(f"Give steps or epochs, one of the two: got steps={self.steps} "
                             f"and epochs={self.epochs}.")
        for name in ("checkpoint_every", "keep_checkpoints", "model_parallel", "peer_timeout",
                     "vocab_size", "max_sentence_length", "tokens_per_batch", "bucket_width",
                     "beam_size"):
            checks.check_positive_int(name, getattr(self, name))
        for name in ("steps", "eval_limit", "tokenizer_sample"):
            if getattr(self, name) is not None:
                checks.check_positive_int(name, getattr(self, name))
        if self.epochs is not None:
            checks.check_positive_number("epochs", self.epochs)
        checks.check_non_negative_int("loss_chunk_size", self.loss_chunk_size)
        checks.check_choice("precision", self.precision, checks.PRECISIONS)
        checks.check_choice("distribute", self.distribute, distribution.KINDS)
        checks.check_choice("tokenizer", self.tokenizer, tokenizers.KINDS)
        checks.check_choice("verbose", self.verbose, (0, 1, 2))
        if self.tokens_per_batch < self.max_sentence_length:
            raise ValueError(f"tokens_per_batch={self.tokens_per_batch} is below "
                             f"max_sentence_length={self.max_sentence_length}: a batch must "
                             "hold the longest sentence.")
        cooldown_steps(self.cooldown_steps, 0)  # its form; its length is checked in `run`
        if self.tune_alpha is not None:
            alphas = tuple(self.tune_alpha)
            if not alphas:
                raise ValueError("tune_alpha is empty: give length penalties, or None.")
            for alpha in alphas:
                checks.check_non_negative_number("tune_alpha", alpha)
            object.__setattr__(self, "tune_alpha", alphas)  # frozen


def cooldown_steps(value, steps):
    """The steps of a cooldown given as `value`: an int >= 0 of steps, or a str such
    as "40%" of the run's `steps`."""
    if isinstance(value, str) and value.endswith("%"):
        try:
            percent = float(value[:-1])
        except ValueError:
            percent = -1.0
        if 0 <= percent <= 100:
            return int(round(percent / 100 * steps))
    elif not isinstance(value, str):
        return checks.check_non_negative_int("cooldown_steps", value)
    raise ValueError(f"cooldown_steps={value!r} must be steps (an integer >= 0) or a "
                     "percentage of the run such as '40%'.")


# The options that make the model (its config, the vocabulary's size and layout); the
# rest (steps, batch size, scoring, export) may change between sittings of one run.
_VOCABULARY_OPTIONS = ("tokenizer", "vocab_size", "separate_vocabularies")
_SIZED_BY_THE_TOKENIZER = ("vocab_size", "target_vocab_size")


def check_model_options(options, config, write=True):
    """Records the model's options in `RUN_DIR/model_options.json` at the run's first
    start; at a later start, refuses options that differ from them, in one line naming
    each. Without the check, a finished run said "Nothing left to do" to `--d-model 64`
    and an unfinished one failed on its backup with Keras's list of variables."""
    wanted = {name: value for name, value in dataclasses.asdict(config).items()
              if name not in _SIZED_BY_THE_TOKENIZER}
    wanted.update({name: getattr(options, name) for name in _VOCABULARY_OPTIONS})
    wanted = json.loads(json.dumps(wanted))  # tuples as lists, as read back
    path = run_files.path(options.run_dir, run_files.MODEL_OPTIONS)
    recorded = saving.read_json(path)
    if recorded is None:
        # A run started before the record was kept has none: it is not checked.
        started = any(os.path.exists(run_files.path(options.run_dir, name)) for name in
                      (run_files.RESULTS, run_files.BACKUP, saving.MODEL))
        if write and not started:
            saving.write_json(path, wanted)
        return
    changed = [name for name in wanted if name in recorded and recorded[name] != wanted[name]]
    if changed:
        def listed(values):
            return ", ".join(f"{name}={values[name]}" for name in changed)

        raise ValueError(
            f"The run directory {options.run_dir} holds a model of {listed(recorded)}; this "
            f"command asks for {listed(wanted)}. Give another --run-dir for a new model, or "
            "this run's own options to go on with it.")
