"""The commands of `keras-transformer`: each parses nothing, calls the library and prints.

§6.1 decoding (evaluate; translate, which streams, is `translate.py`), the paper's
figures (plot), checkpoint averaging (§6.1, average), and the outer ring's export and
serving. `parser.py` builds their options and sets each as its subcommand's `run`; the
library raises, and `errors.user_errors` turns what a user can fix into one line.

A MODEL argument is a `.keras` file with its tokenizer beside it, or a run directory (its
`model.keras`; name `RUN_DIR/model_averaged.keras` for the averaged model, see
`keras_transformer_app.run_files`).
"""

import contextlib
import os
import signal
import sys

from keras_transformer_app.cli import errors


def load_translator(path, max_source_length=None, compute_type="default", intra_threads=0):
    """A `Translator` of MODEL: a `.keras` file or a run directory, or a CTranslate2
    export (a version folder, or the export base's highest version), run with
    CTranslate2's `compute_type` and `intra_threads`."""
    from keras_transformer import saving
    from keras_transformer.inference import Translator
    from keras_transformer.inference.ctranslate2 import export_version, load_ctranslate2

    if export_version(path) is not None:
        model, source_tokenizer, target_tokenizer = load_ctranslate2(
            path, compute_type=compute_type, intra_threads=intra_threads)
    else:
        given = [flag for flag, value in (("--compute-type", compute_type != "default"),
                                          ("--intra-threads", intra_threads)) if value]
        if given:
            verb = "applies" if len(given) == 1 else "apply"
            raise ValueError(f"{' and '.join(given)} {verb} only to CTranslate2 exports, and "
                             f"{path!r} is a Keras model.")
        model, source_tokenizer, target_tokenizer = saving.load_translation_model(path)
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


def evaluate(args):
    """`keras-transformer evaluate`: BLEU of a test set (§6.1)."""
    from keras_transformer import evaluation
    from keras_transformer.data.corpora import read_parallel

    if args.output is not None:
        for flag, path in (("--source", args.source), ("--reference", args.reference)):
            if os.path.realpath(args.output) == os.path.realpath(path):
                raise ValueError(f"--output {args.output} is the {flag} file: the hypotheses "
                                 "would replace it. Write them to another file.")
    corpus = read_parallel(args.source, args.reference)
    sources, references = corpus.sources[: args.limit], corpus.targets[: args.limit]
    result = evaluation.evaluate(
        load_translator(args.model, args.max_source_length, args.compute_type,
                        args.intra_threads), sources, references,
        hypotheses_path=args.output,
        beam_size=args.beam_size, alpha=args.alpha, batch_size=args.batch_size,
    )
    print(result.summary())


def plot(args):
    """`keras-transformer plot FIGURE`: one of the paper's figures as a PNG file."""
    from keras_transformer_app import plots

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
        print(plots.plot_validation_curve(args.output, runs, against=args.against))
    else:
        paths = plots.plot_translation_attention(
            load_translator(args.model), args.sentence, args.output_dir,
            beam_size=args.beam_size, alpha=args.alpha,
        )
        for path in paths.values():
            print(path)


def average(args):
    """`keras-transformer average`: checkpoint averaging (§6.1). Warns when the run
    holds fewer checkpoints than --last, and refuses to replace an existing output
    without --force."""
    from keras_transformer import saving
    from keras_transformer_app import run_files
    from keras_transformer_app.training import averaging
    from keras_transformer_app.training.fit import list_checkpoints

    paths = args.checkpoints
    if args.run_dir:
        checkpoints = run_files.path(args.run_dir, run_files.CHECKPOINTS)
        paths = list_checkpoints(checkpoints)[-args.last:]
        if not paths:
            raise FileNotFoundError(f"No step-*.keras checkpoints in {checkpoints}.")
        if len(paths) < args.last:
            print(f"warning: --last {args.last} asks for {args.last} checkpoints, but "
                  f"{checkpoints} holds {len(paths)}: averaging {len(paths)}",
                  file=sys.stderr)
    output = args.output or (run_files.path(args.run_dir, run_files.AVERAGED_MODEL)
                             if args.run_dir else "averaged.keras")
    if os.path.exists(output) and not args.force:
        raise FileExistsError(f"{output} exists: add --force to replace it, or give "
                              "another --output.")
    tokenizer_folder = averaging.tokenizer_folder(paths[-1])
    tokenizers = (averaging.tokenizers_to_copy(tokenizer_folder, output)
                  if tokenizer_folder else None)
    averaging.average_checkpoints(paths, output)
    print(f"Averaged {len(paths)} checkpoint{'s' if len(paths) > 1 else ''} into {output}")
    if tokenizers is not None:
        saving.save_tokenizers(os.path.dirname(os.path.abspath(output)), *tokenizers)
        print(f"Wrote the tokenizer of {tokenizer_folder} beside it")
    elif tokenizer_folder is None:
        print(f"warning: no tokenizer beside {paths[-1]} or in its run directory: "
              f"copy the model's tokenizer/ folder beside {output} to translate with it",
              file=sys.stderr)


def export(args):
    """`keras-transformer export`: a SavedModel or a CTranslate2 export, as
    EXPORT_BASE/VERSION/."""
    if args.format == "ctranslate2":
        # Compiled shapes are the SavedModel's; CTranslate2 compiles nothing.
        given = [flag for flag, value in (("--batch-sizes", args.batch_sizes),
                                          ("--lengths", args.lengths)) if value is not None]
        if given:
            verb = "applies" if len(given) == 1 else "apply"
            raise ValueError(
                f"{', '.join(given)} {verb} only to --format saved_model: CTranslate2 compiles "
                "no shapes, it runs any batch size and length.")
        from keras_transformer.export.ctranslate2 import export_ctranslate2

        try:
            export_ctranslate2(args.model, args.export_base, version=args.version,
                               quantization=args.quantization, beam_size=args.beam_size,
                               alpha=args.alpha, max_output_length=args.max_output_length,
                               max_source_length=args.max_source_length, n_best=args.n_best,
                               verbose=not args.quiet)
        except ImportError as error:  # ctranslate2 is not installed
            errors.fail(error)
        return
    if args.quantization is not None:
        raise ValueError("--quantization only applies to --format ctranslate2: a SavedModel "
                         "keeps the model's own weights.")
    from keras_transformer.export import versions
    from keras_transformer.export.saved_model import export_saved_model

    version = versions.next_version(args.export_base, args.version)
    with _finished_once_published(os.path.join(args.export_base, str(version))):
        export_saved_model(args.model, args.export_base, version=version,
                           beam_size=args.beam_size, alpha=args.alpha,
                           max_output_length=args.max_output_length,
                           max_source_length=args.max_source_length,
                           batch_sizes=args.batch_sizes, lengths=args.lengths,
                           n_best=args.n_best, verbose=not args.quiet)


@contextlib.contextmanager
def _finished_once_published(version_path):
    """Ends the export with status 0 once its version is published: a Ctrl-C or
    SIGTERM that comes after the rename (while the summary is printed, or while
    TensorFlow shuts down) finds nothing left to stop, so the command says the
    version is whole and ignores later signals (`logs.finished`) instead of ending
    with 130 or 143 over a complete export. One that comes before the rename stops
    the export, which publishes nothing."""
    from keras_transformer.export import versions
    from keras_transformer_app import logs

    try:
        yield
    except (KeyboardInterrupt, errors.Terminated):
        if not versions.is_version(version_path):
            raise
        print(f"{version_path} was complete when the signal came: the export is done.",
              file=sys.stderr)
        errors.signal_answered()
    logs.finished()


def serve(args):
    """`keras-transformer serve`: TensorFlow Serving's REST API over a SavedModel."""
    import dataclasses

    from keras_transformer_app.serving.batching import BatchingParameters
    from keras_transformer_app.serving.options import ServerOptions
    from keras_transformer_app.serving.server import serve

    # Every batching parameter, and every server option that has a flag.
    batching = BatchingParameters(**{
        field.name: getattr(args, field.name) for field in dataclasses.fields(BatchingParameters)
        if getattr(args, field.name) is not None})  # --num-batch-threads: the CPU cores
    options = ServerOptions(batching=batching, **{
        field.name: getattr(args, field.name) for field in dataclasses.fields(ServerOptions)
        if field.name != "batching" and hasattr(args, field.name)})
    try:
        stopped_by = serve(args.saved_model, options)
    except KeyboardInterrupt:  # before the server took over the signals: while binding
        stopped_by = signal.SIGINT
    except errors.Terminated:
        stopped_by = signal.SIGTERM
    if stopped_by in (signal.SIGINT, signal.SIGTERM):
        _end_after_shutdown(stopped_by)


def _end_after_shutdown(signal_number):
    """After the graceful shutdown (the requests in flight answered, the batch threads
    stopped), the command ends at once with the signal's status (130, 143). A version
    still loading or warming up is left where it is: ending the interpreter the usual
    way would wait for its thread to finish the warm-up (minutes), or abort inside
    TensorFlow's C++ loader."""
    if signal_number == signal.SIGINT:
        print(file=sys.stderr)  # after the ^C the terminal shows
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(128 + signal_number)
