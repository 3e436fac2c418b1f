"""The commands of `keras-transformer`: each parses nothing, calls the library and prints.

§6.1 decoding (translate, evaluate), the paper's figures (plot), checkpoint averaging
(§6.1, average), and the outer ring's export and serving. `parser.py` builds their
options and sets each as its subcommand's `run`; the library raises, and
`errors.user_errors` turns what a user can fix into one line.

A MODEL argument is a `.keras` file with its tokenizer beside it, or a run directory (its
`model.keras`; name `RUN_DIR/model_averaged.keras` for the averaged model, see
`keras_transformer.run_files`).
"""

import itertools
import os
import re
import sys
import warnings

from keras_transformer.cli import errors

# Lines translated together when reading a file or a pipe.
BATCH_SIZE = 32


def load_translator(path, max_source_length=None):
    """A `Translator` of MODEL (a `.keras` file or a run directory)."""
    from keras_transformer import run_files
    from keras_transformer.inference import Translator

    model, source_tokenizer, target_tokenizer = run_files.load_translation_model(path)
    return Translator(model, source_tokenizer, target_tokenizer=target_tokenizer,
                      max_source_length=max_source_length)


def sampling_options(args):
    """A `Sampling` from --sample and its options, or None for beam search."""
    from keras_transformer.inference import Sampling

    given = [flag for flag, name in (("--temperature", "temperature"), ("--top-k", "top_k"),
                                     ("--top-p", "top_p"), ("--seed", "seed"))
             if getattr(args, name) is not None]
    if not args.sample:
        if given:
            raise ValueError(f"{', '.join(given)} set(s) sampling: add --sample to sample "
                             "instead of running beam search.")
        return None
    defaults = Sampling()
    return Sampling(**{name: getattr(defaults, name) if getattr(args, name) is None
                       else getattr(args, name)
                       for name in ("temperature", "top_k", "top_p", "seed")})


def translate(args):
    """`keras-transformer translate`: the SENTENCES given, or standard input line by line."""
    sampling = sampling_options(args)
    if sampling is None and args.n_best is not None and args.n_best > args.beam_size:
        raise ValueError(f"--n-best {args.n_best} is more than --beam-size {args.beam_size}: "
                         "beam search keeps beam-size hypotheses, so raise --beam-size.")
    translator = load_translator(args.model, args.max_source_length)
    batch_size = args.batch_size or BATCH_SIZE
    if args.sentences:
        lines, unit = iter(args.sentences), "sentence"
    else:
        # Read at call time, so that a caller (or a test) may replace sys.stdin.
        stdin, unit = sys.stdin, "line"
        if _is_terminal(stdin):
            # Someone types: translate each line as it is entered.
            batch_size = args.batch_size or 1
            print("Translating each line typed; end with Ctrl-D.", file=sys.stderr)
        lines = _stream_lines(stdin)
    search = dict(beam_size=args.beam_size, alpha=args.alpha, sampling=sampling,
                  return_alignment=args.print_alignment)
    _write_translations(translator, lines, sys.stdout, batch_size, args.n_best, search, unit)


def _is_terminal(stream):
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def _stream_lines(stream):
    """The lines of `stream` as they arrive (`readline`, no read-ahead), each
    without its line ending ("\n" or "\r\n"), nothing else stripped."""
    for line in iter(stream.readline, ""):
        if line.endswith("\r\n"):
            line = line[:-2]
        elif line.endswith("\n"):
            line = line[:-1]
        yield line


def _write_translations(translator, lines, out, batch_size, n_best, search, unit):
    """Reads `batch_size` lines at a time, translates them, writes one line
    per line read (`n_best` lines in the n-best format) and flushes `out`
    before reading on. Empty lines are not decoded. With
    `search["return_alignment"]`, each translation is followed by a tab and
    its alignment."""
    from keras_transformer.inference.translator import (
        Hypothesis,
        SourceTruncatedWarning,
        Translation,
    )

    num_return = n_best or 1
    aligned = search.get("return_alignment", False)
    first = 0  # the input number of the batch's first line
    while batch := list(itertools.islice(lines, batch_size)):
        rows = [row for row, line in enumerate(batch) if line]
        with warnings.catch_warnings():
            # Said below, with the input's own line numbers.
            warnings.simplefilter("ignore", SourceTruncatedWarning)
            # Input line numbers name the random streams of sampling, so a
            # line's samples do not depend on --batch-size.
            results = translator.translate(
                [batch[row] for row in rows], batch_size=batch_size, num_return=num_return,
                stream_ids=[first + row for row in rows], **search)
        translations = [Translation([Hypothesis("", 0.0, [], [])] * num_return)] * len(batch)
        for row, result in zip(rows, results):
            translations[row] = result
            if result.truncated:
                print(f"warning: {unit} {first + row + 1} is longer than max_source_length="
                      f"{translator.max_source_length} (tokens + EOS); it was translated "
                      "truncated to it", file=sys.stderr)
        for index, result in enumerate(translations, start=first):
            for hypothesis in result.hypotheses:
                fields = [] if n_best is None else [str(index), f"{hypothesis.score:.4f}"]
                fields.append(_one_line(hypothesis.text))
                if aligned:
                    fields.append(" ".join(f"{source}-{target}" for target, source
                                           in enumerate(hypothesis.alignment)))
                out.write("\t".join(fields) + "\n")
        out.flush()
        first += len(batch)


def _one_line(text):
    """`text` with any line break replaced by a space: one output line per input."""
    return re.sub(r"[\r\n]+", " ", text)


def evaluate(args):
    """`keras-transformer evaluate`: BLEU of a test set (§6.1)."""
    from keras_transformer import evaluation
    from keras_transformer.training.data import read_parallel

    corpus = read_parallel(args.source, args.reference)
    sources, references = corpus.sources[: args.limit], corpus.targets[: args.limit]
    result = evaluation.evaluate(
        load_translator(args.model, args.max_source_length), sources, references,
        hypotheses_path=args.output,
        beam_size=args.beam_size, alpha=args.alpha, batch_size=args.batch_size,
    )
    print(result.summary())


def plot(args):
    """`keras-transformer plot FIGURE`: one of the paper's figures as a PNG file."""
    from keras_transformer import plots

    if args.figure == "positions":
        print(plots.plot_position_encoding(args.output, length=args.length, d_model=args.d_model))
    elif args.figure == "schedule":
        print(plots.plot_learning_rate(args.output, d_model=args.d_model,
                                       warmup_steps=args.warmup_steps, num_steps=args.num_steps))
    elif args.figure == "training":
        runs = {os.path.basename(os.path.normpath(run)): run for run in args.runs}
        print(plots.plot_training_log(args.output, runs, steps_per_window=args.steps_per_window))
    elif args.figure == "validation":
        runs = {os.path.basename(os.path.normpath(run)): run for run in args.runs}
        print(plots.plot_validation_curve(args.output, runs))
    else:
        paths = plots.plot_translation_attention(
            load_translator(args.model), args.sentence, args.output_dir,
            beam_size=args.beam_size, alpha=args.alpha,
        )
        for path in paths.values():
            print(path)


def average(args):
    """`keras-transformer average`: checkpoint averaging (§6.1)."""
    from keras_transformer import run_files
    from keras_transformer.training.averaging import average_checkpoints
    from keras_transformer.training.fit import list_checkpoints

    paths = args.checkpoints
    if args.run_dir:
        checkpoints = run_files.path(args.run_dir, run_files.CHECKPOINTS)
        paths = list_checkpoints(checkpoints)[-args.last:]
        if not paths:
            raise FileNotFoundError(f"No step-*.keras checkpoints in {checkpoints}.")
    output = args.output or (run_files.path(args.run_dir, run_files.AVERAGED_MODEL)
                             if args.run_dir else "averaged.keras")
    average_checkpoints(paths, output)
    print(f"Averaged {len(paths)} checkpoints into {output}")


def export(args):
    """`keras-transformer export`: a SavedModel, or a CTranslate2 model directory."""
    if args.format == "ctranslate2":
        # SavedModel settings fixed at export: CTranslate2 takes its decoding
        # options at translate time instead.
        given = [flag for flag, value in (
            ("--version", args.version), ("--max-output-length", args.max_output_length),
            ("--max-source-length", args.max_source_length),
            ("--batch-sizes", args.batch_sizes), ("--lengths", args.lengths),
            ("--n-best", args.n_best)) if value is not None]
        if given:
            verb = "applies" if len(given) == 1 else "apply"
            raise ValueError(
                f"{', '.join(given)} {verb} only to --format saved_model: a CTranslate2 model "
                "takes its decoding options (beam_size, max_decoding_length, ...) in "
                "translate_batch.")
        from keras_transformer.inference.ctranslate2_export import export_ctranslate2

        try:
            export_ctranslate2(args.model, args.export_base, quantization=args.quantization,
                               verbose=not args.quiet)
        except ImportError as error:  # ctranslate2 is not installed
            errors.fail(error)
        return
    if args.quantization is not None:
        raise ValueError("--quantization only applies to --format ctranslate2: a SavedModel "
                         "keeps the model's own weights.")
    from keras_transformer.inference.export import export_saved_model

    export_saved_model(args.model, args.export_base, version=args.version,
                       beam_size=args.beam_size, alpha=args.alpha,
                       max_output_length=args.max_output_length,
                       max_source_length=args.max_source_length, batch_sizes=args.batch_sizes,
                       lengths=args.lengths, n_best=args.n_best, verbose=not args.quiet)


def serve(args):
    """`keras-transformer serve`: TensorFlow Serving's REST API over a SavedModel."""
    import dataclasses

    from keras_transformer.inference import serving
    from keras_transformer.inference.serving import BatchingParameters, ServerOptions

    # Every batching parameter, and every server option that has a flag.
    batching = BatchingParameters(**{
        field.name: getattr(args, field.name) for field in dataclasses.fields(BatchingParameters)})
    options = ServerOptions(batching=batching, **{
        field.name: getattr(args, field.name) for field in dataclasses.fields(ServerOptions)
        if field.name != "batching" and hasattr(args, field.name)})
    serving.serve(args.saved_model, options)
