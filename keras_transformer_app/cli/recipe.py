"""The recipes' command line: §5 training options and §6.1 scoring options, once for all.

Every `python -m recipes.NAME` builds its parser with `build_parser` (the recipe adds
its data options and its defaults), then hands the parsed options to the library:
`run_options` makes the `keras_transformer_app.training.run.RunOptions` (an impossible
combination is a usage error, exit status 2) and `model_config` the
`TransformerConfig`. Each option is the `RunOptions` field (or config field) of the same
name: `--keep-checkpoints` is `keep_checkpoints`.

Nothing here imports Keras until a recipe asks for its options, so that an unknown
`KERAS_BACKEND` is one line rather than a traceback.
"""

import argparse
import dataclasses
import sys

from keras_transformer import validation
from keras_transformer_app.cli import errors, options
from keras_transformer_app.cli.options import (
    length_penalties,
    non_negative_int,
    path,
    positive_float,
    positive_int,
    rate,
    steps_or_percent,
)

PRESETS = ("tiny", "small", "base", "big")
# Model options that override the preset's value when given (TransformerConfig fields).
MODEL_FIELDS = ("num_layers", "d_model", "num_heads", "d_ff", "dropout_rate",
                "attention_dropout_rate", "activation_dropout_rate", "label_smoothing",
                "warmup_steps", "position_encoding", "norm_position", "max_length")
# The model options that make a preset's architecture: a recipe's own values for them
# are its model, which a --preset given on the command line replaces.
ARCHITECTURE_FIELDS = ("num_layers", "d_model", "num_heads", "d_ff", "dropout_rate",
                       "attention_dropout_rate", "activation_dropout_rate",
                       "position_encoding", "norm_position")

# The recipes' own options, argparse's keywords by destination (`options.SHARED` holds
# those the `keras-transformer` commands take too).
OPTIONS = {
    "run_dir": dict(type=path("output folder"),
                    help="folder for checkpoints, logs, the tokenizer and the final model; "
                         "running the same command again resumes from it"),
    "precision": dict(choices=validation.PRECISIONS, default="float32",
                      help="Keras dtype policy for training (mixed_* keep float32 variables)"),
    "seed": dict(type=non_negative_int, default=0, help="random seed"),
    "verbose": dict(type=int, choices=(0, 1, 2), default=1,
                    help="model.fit verbosity: 0 silent, 1 progress bar (drawn on stderr, "
                         "when it is a terminal), 2 one line per window"),
    "distribute": dict(choices=("none", "data", "model"), default="none",
                       help="several devices: data parallel (JAX DataParallel, TF "
                            "MirroredStrategy) or model parallel (JAX ModelParallel); data "
                            "parallel over several processes when KERAS_DISTRIBUTION_* or "
                            "TF_CONFIG names a cluster (docs/distributed.md)"),
    "model_parallel": dict(type=positive_int, default=2,
                           help="with --distribute model: devices along the model axis"),
    "peer_timeout": dict(type=positive_int, default=60,
                         help="seconds after which a JAX cluster declares a silent process "
                              "dead and stops the others (TensorFlow: 10 s)"),
    "steps": dict(type=positive_int, help="optimizer steps in all (the paper counts steps)"),
    "epochs": dict(type=positive_float, help="passes over the training data, converted to steps"),
    "checkpoint_every": dict(type=positive_int, default=500,
                             help="steps between checkpoints and BackupAndRestore backups"),
    "keep_checkpoints": dict(type=positive_int, default=5,
                             help="newest checkpoints kept and averaged at the end (§6.1: 5 "
                                  "base, 20 big)"),
    "tokenizer": dict(choices=("sentencepiece", "wordpiece"), default="sentencepiece",
                      help="subword algorithm (SentencePiece = BPE)"),
    "vocab_size": dict(type=positive_int, default=8000, help="subword vocabulary size"),
    "separate_vocabularies": dict(action=argparse.BooleanOptionalAction, default=False,
                                  help="learn one vocabulary per language (--vocab-size each); "
                                       "--no-separate-vocabularies learns one shared by both"),
    "max_sentence_length": dict(type=positive_int, default=128,
                                help="longest training source / target in subword tokens; "
                                     "longer pairs are dropped"),
    "tokens_per_batch": dict(type=positive_int, default=4096,
                             help="token budget per batch and side, padding included (paper: "
                                  "~25000)"),
    "bucket_width": dict(type=positive_int, default=8,
                         help="length step of the batching buckets: smaller pads less but "
                              "compiles more train-step shapes"),
    "preset": dict(choices=PRESETS, default="small",
                   help="start the model from this TransformerConfig preset instead of the "
                        "recipe's own; the model options given override it"),
    "max_length": dict(type=positive_int,
                       help="most positions the model accepts (TransformerConfig.max_length): "
                            "its longest input, ids + EOS"),
    "num_layers": dict(type=positive_int, help="N, blocks per stack"),
    "d_model": dict(type=positive_int, help="model width"),
    "num_heads": dict(type=positive_int, help="h, attention heads"),
    "d_ff": dict(type=positive_int, help="feed-forward inner width"),
    "dropout_rate": dict(type=rate, help="P_drop"),
    "attention_dropout_rate": dict(type=rate,
                                   help="dropout on the attention weights (not in the paper)"),
    "activation_dropout_rate": dict(type=rate, help="dropout on the feed-forward ReLU "
                                                    "activations (not in the paper)"),
    "label_smoothing": dict(type=rate, help="ε_ls"),
    "warmup_steps": dict(type=positive_int, help="learning-rate warmup steps"),
    "position_encoding": dict(choices=("sinusoidal", "learned"), help="positional encoding"),
    "norm_position": dict(choices=("post", "pre"), help="LayerNorm placement"),
    "lr_scale": dict(type=positive_float, default=1.0,
                     help="constant factor on the Noam learning-rate schedule"),
    "cooldown_steps": dict(type=steps_or_percent, default=0, metavar="N|P%",
                           help="over the last N steps of the run (or the last P percent of "
                                "them), lower the rate linearly towards 0 (not in the paper; "
                                "0: none)"),
    "loss_chunk_size": dict(type=non_negative_int, default=1024, metavar="N",
                            help="project the decoder's states to the vocabulary and take the "
                                 "loss N positions at a time in training, so that the "
                                 "(tokens x vocabulary) logits never exist whole: less memory, "
                                 "and a faster step on a CPU (0: the whole batch at once)"),
    "tune_alpha": dict(type=length_penalties, metavar="A,B,...",
                       help="before the test split, translate the validation split with each "
                            "of these length penalties (the averaged model's, else the final "
                            "one's) and use the one of highest lower-cased BLEU instead of "
                            "--alpha; the test split plays no part. Added to the command of a "
                            "finished run, it tunes and scores the test split again"),
    "no_tune_alpha": dict(dest="tune_alpha", action="store_const", const=None,
                          help="no α search: score with --alpha (for smoke runs)"),
    "eval_limit": dict(type=positive_int,
                       help="score only the first N distinct sentences of each split scored: "
                            "the test split, and the validation split of the α search and of "
                            "the validation curve (for smoke runs)"),
    "validation_curve": dict(action="store_true",
                             help="keep every checkpoint, and after training score each on "
                                  "the validation split (beam search, --beam-size, --alpha) "
                                  "into RUN_DIR/validation_curve.csv: BLEU against training "
                                  "time (keras-transformer plot validation RUN_DIR draws it); "
                                  "--keep-checkpoints still says how many are averaged"),
    "evaluate_only": dict(action="store_true",
                          help="train nothing: evaluate the run directory's model.keras (and "
                               "model_averaged.keras) on the test split again, e.g. with "
                               "another --beam-size or --eval-limit; results.json keeps the "
                               "training figures"),
    "export_dir": dict(type=path("output folder"),
                       help="also export model.keras as a TensorFlow SavedModel to "
                            "EXPORT_DIR/VERSION/ (the next free version), e.g. "
                            "saved_models/NAME; serve it with keras-transformer serve"),
    "no_export": dict(action="store_true",
                      help="skip the SavedModel export even if --export-dir is set"),
    "train_limit": dict(type=positive_int,
                        help="use only the first N training pairs (smoke runs)"),
}

# The help's groups; ("steps", "epochs") is a choice of one.
GROUPS = (
    ("run", ("run_dir", "precision", "seed", "native_logs", "verbose", "distribute",
             "model_parallel", "peer_timeout", ("steps", "epochs"), "checkpoint_every",
             "keep_checkpoints")),
    ("data", ("tokenizer", "vocab_size", "separate_vocabularies", "max_sentence_length",
              "tokens_per_batch", "bucket_width")),
    ("model (TransformerConfig; unset options keep the preset)",
     ("preset", "max_length", *MODEL_FIELDS[:-1], "lr_scale", "cooldown_steps",
      "loss_chunk_size")),
    ("evaluation", ("beam_size", "alpha", ("tune_alpha", "no_tune_alpha"), "eval_limit",
                    "validation_curve", "evaluate_only", "export_dir", "no_export")),
)


def add(parser, name, **changes):
    """Adds the recipe option `name` (or a shared one of `options.SHARED`) to `parser`
    or an argument group, with `changes` to its keywords."""
    return options.add(parser, name, OPTIONS if name in OPTIONS else options.SHARED,
                       **changes)


class HelpFormatter(argparse.HelpFormatter):
    """Shows an option's default after its help, as a user would type it ("0.8,1.0"
    for a list), unless the help says it already or there is none (a flag, or an
    option whose absence the help explains)."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if isinstance(action, argparse.BooleanOptionalAction) and "(default" not in text:
            flag = action.option_strings[0 if default else 1]
            return f"{text} (default: {flag})"
        if ("(default" in text or not action.option_strings or action.nargs == 0
                or default is None or default is False or default is argparse.SUPPRESS):
            return text
        if isinstance(default, (tuple, list)):
            default = ",".join(map(str, default))
        return f"{text} (default: {str(default).replace('%', '%%')})"


def build_parser(name, description, defaults, run_dir=None):
    """The options every recipe takes; `defaults` maps option destination → default,
    and `run_dir` says in words where the run goes without --run-dir (runs/NAME)."""
    parser = argparse.ArgumentParser(
        prog=f"python -m recipes.{name}", description=description,
        formatter_class=HelpFormatter)
    for title, names in GROUPS:
        group = parser.add_argument_group(title)
        for option in names:
            if isinstance(option, tuple):
                one_of = group.add_mutually_exclusive_group()
                for choice in option:
                    add(one_of, choice)
            elif option == "run_dir":
                add(group, option, help=f"{OPTIONS['run_dir']['help']} (default: "
                                        f"{run_dir or 'runs/' + name})")
            elif option == "preset":
                add(group, option, help=f"{OPTIONS['preset']['help']} (default: "
                                        f"{_recipe_model(defaults)})")
            else:
                add(group, option)
    parser.set_defaults(**defaults)
    errors.name_options_of(parser)  # the flags its error lines name
    return parser


def _recipe_model(defaults):
    """The recipe's own model in words: its preset and the architecture it sets."""
    preset = defaults.get("preset", OPTIONS["preset"]["default"])
    changes = [f"{field.replace('_', ' ')} {defaults[field]}" for field in ARCHITECTURE_FIELDS
               if field in defaults]
    return f"{preset}" + (f" with {', '.join(changes)}" if changes else "")


def given(argv=None):
    """The destinations of the options written on a command line (the process's by
    default): `--alpha 0.6` and `--alpha=0.6` give "alpha"; the negative spelling of a
    yes/no option gives its destination too (`--no-tune-alpha` gives "tune_alpha")."""
    argv = sys.argv[1:] if argv is None else argv
    names = {word[2:].split("=")[0].replace("-", "_") for word in argv
             if word.startswith("--")}
    return names | {name[3:] for name in names if name.startswith("no_")}


def run_options(parser, args, name, run_dir=None):
    """The `RunOptions` of parsed recipe options, named `name`; the run goes to
    --run-dir, else to `run_dir`, else to runs/NAME. A path that cannot be right
    (`options.check_paths`) or an impossible combination is a usage error that
    names the flags."""
    from keras_transformer_app.cli.errors import flag_names, option_flags
    from keras_transformer_app.training.run import RunOptions

    options.check_paths(parser, args)
    values = {field.name: getattr(args, field.name) for field in dataclasses.fields(RunOptions)
              if hasattr(args, field.name)}
    values["run_dir"] = args.run_dir or run_dir or f"runs/{name}"
    if args.steps is not None:
        values["epochs"] = None  # --steps replaces a recipe's default --epochs
    if args.no_export:
        values["export_dir"] = None
    try:
        return RunOptions(**values, name=name)
    except ValueError as error:
        parser.error(flag_names(str(error), option_flags(parser)))


def model_config(args, argv=None):
    """The `TransformerConfig` of the recipe's model and the model options given on
    the command line `argv` (the process's by default). With --preset given, the
    preset replaces the recipe's own architecture (its values of
    `ARCHITECTURE_FIELDS`); the recipe's other model defaults (warmup, label
    smoothing, length) stay. Its vocabulary sizes are --vocab-size, which `run`
    replaces with the learned vocabulary's."""
    from keras_transformer import TransformerConfig

    written = given(argv)
    fields = MODEL_FIELDS if "preset" not in written else [
        field for field in MODEL_FIELDS if field not in ARCHITECTURE_FIELDS or field in written]
    overrides = {field: getattr(args, field) for field in fields
                 if getattr(args, field, None) is not None}
    if args.separate_vocabularies:
        overrides.update(target_vocab_size=args.vocab_size, share_embeddings=False)
    return getattr(TransformerConfig, args.preset)(vocab_size=args.vocab_size, **overrides)
