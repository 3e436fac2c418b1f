"""Keras's own int8 weight quantization, `model.quantize("int8")`, on decoding
speed and BLEU (issue 18 item 3).

Two parts, float32 against int8 each time:

1. A trained run (default `runs/quickstart`). Its `model.keras` is loaded
   twice: once as it is, once more to be quantized with `model.quantize("int8")`
   (optionally `--filters`, Keras's regex / list of regexes on layer names).
   Both translate one test set with `Translator` (the quickstart's test split
   `synthetic_translation(500, seed=3)`, as ctranslate2_quality.py,
   or `--sources` / `--references`), greedy and beam 4 with α = 0.6 (§6.1).
   Reported per (model, search): BLEU (sacreBLEU 13a, cased), exact match,
   sentences/s (batch 32, the test set's order, the second of two passes, so
   that compilation is excluded; with `--passes P`, the median of P passes
   after the first, and the best pass; float32's and int8's timed passes
   alternate) and how many sentences' output ids equal the float32 model's.

2. The benchmarks' default-size model with random weights (d_model 256, 4
   heads, d_ff 1024, N = 3, vocabulary 8000; `common.transformer_config`, as
   benchmarks/decoding.py): the cached `greedy_search` and `beam_search` (beam
   4, α 0.6) at forced lengths (EOS gets an output bias of -1e9, so every run
   makes exactly n tokens), float32 and an int8 copy with the same weights.
   Each (model, search, n) is run once to compile, then timed `--repeats`
   times, the float32 and int8 runs alternating so that a slow spell of a
   shared machine falls on both. Reported: seconds per batch (median), ms per
   new token, int8 / float32 time (of the medians, and of the fastest runs)
   and the fraction of int8's tokens equal to float32's.

What `quantize("int8")` does to this model: Keras quantizes every leaf layer
that implements `quantize` (Dense, EinsumDense, Embedding, ...): the attention
projections (EinsumDense) and the feed-forward layers (Dense). The int8 kernels
are per-output-channel abs-max, and by default the inputs are quantized per
token (abs-max) at every call, so the matmul runs int8 x int8 -> int32. Layers
without `quantize` (our `TokenEmbedding`, which is also the tied output
projection, LayerNormalization, the position encoding) stay float32; Keras
warns for each of them, and the script reports those warnings.

    KERAS_BACKEND=jax python benchmarks/experiments/quantize.py
    KERAS_BACKEND=jax python benchmarks/experiments/quantize.py --quick  # smoke run
    KERAS_BACKEND=jax python benchmarks/experiments/quantize.py --passes 3 --repeats 7
    KERAS_BACKEND=tensorflow python benchmarks/experiments/quantize.py --passes 3 --repeats 7
    KERAS_BACKEND=torch python benchmarks/experiments/quantize.py --limit 64 --lengths 32 \
        --repeats 3
"""

import argparse
import collections
import os
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
import common  # noqa: E402  (puts the repository on sys.path)

BATCH = 32  # sentences per Translator batch, as ctranslate2_quality.py
SEARCHES = (("greedy", 1, 0.0), ("beam 4, α 0.6", 4, 0.6))


def quantize(model, mode, filters=None):
    """Quantizes `model` in place. Returns a summary: seconds, the quantized
    layers (name: class), Keras's warnings grouped by message, and the error if
    `quantize` raised."""
    summary = {"mode": mode, "filters": filters, "error": None}
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            model.quantize(mode, filters=filters)
        except Exception as error:  # noqa: BLE001  (reported, not hidden)
            summary["error"] = f"{type(error).__name__}: {error}"
    summary["seconds"] = time.perf_counter() - start
    quantized = {}
    for layer in model._flatten_layers():
        if getattr(layer, "quantization_mode", None):
            quantized[layer.path if hasattr(layer, "path") else layer.name] = \
                type(layer).__name__
    summary["quantized_layers"] = quantized
    summary["quantized_classes"] = dict(collections.Counter(quantized.values()))
    messages = collections.Counter(str(w.message).split("\n")[0] for w in caught)
    summary["warnings"] = dict(messages)
    return summary


def weight_bytes(model):
    """(bytes of all variables, {dtype: bytes})."""
    by_dtype = collections.Counter()
    for variable in model.weights:
        by_dtype[str(variable.dtype)] += int(np.prod(variable.shape)) * np.dtype(
            str(variable.dtype)).itemsize
    return sum(by_dtype.values()), dict(by_dtype)


def strip_eos(ids, eos_id):
    ids = [int(i) for i in ids]
    return ids[:-1] if ids[-1:] == [eos_id] else ids


def run_model_part(args):
    """Part 1: float32 and int8 translations of a trained run's test set."""
    from keras_transformer import run_files
    from keras_transformer.evaluation import bleu_scores
    from keras_transformer.inference import Translator

    sources, references = common.test_set(args.sources, args.references, args.limit)

    def score(texts):
        cased, _ = bleu_scores(texts, references, force=True)
        exact = sum(h.strip() == r.strip() for h, r in zip(texts, references)) / len(references)
        return cased.score, exact

    details, translators = {}, {}
    for variant in ("float32", args.mode):  # a freshly loaded model for each
        model, source_tokenizer, target_tokenizer = run_files.load_translation_model(args.run_dir)
        total, by_dtype = weight_bytes(model)
        details[variant] = {"weight_bytes": total, "weight_bytes_by_dtype": by_dtype}
        if variant != "float32":
            summary = quantize(model, args.mode, args.filters)
            total, by_dtype = weight_bytes(model)
            details[variant].update(quantize=summary, weight_bytes=total,
                                    weight_bytes_by_dtype=by_dtype)
            common.progress(f"{variant}: quantize took {summary['seconds']:.2f} s, "
                            f"quantized {summary['quantized_classes']}, "
                            f"weights {total / 2**20:.2f} MiB")
            for message, count in summary["warnings"].items():
                common.progress(f"  warning x{count}: {message[:200]}")
            if summary["error"]:
                common.progress(f"  quantize raised: {summary['error']}")
                details[variant]["error"] = summary["error"]
                continue
        translators[variant] = Translator(model, source_tokenizer,
                                          target_tokenizer=target_tokenizer)
    eos = target_tokenizer.eos_id

    def translate(variant, beam_size, alpha):
        start = time.perf_counter()
        results = translators[variant].translate(
            sources, beam_size=beam_size, alpha=alpha, batch_size=BATCH)
        return ([result.text for result in results],
                [strip_eos(result.ids, eos) for result in results], time.perf_counter() - start)

    rows = []
    for label, beam_size, alpha in SEARCHES:
        results = {}
        for variant in list(translators):
            try:
                # A first, untimed pass compiles every shape the set needs.
                translate(variant, beam_size, alpha)
                results[variant] = []
            except Exception as error:  # noqa: BLE001  (reported, not hidden)
                message = f"{type(error).__name__}: {error}"
                common.progress(f"{variant}, {label}: decoding raised {message[:500]}")
                details[variant].setdefault("decode_errors", {})[label] = message
        for _ in range(args.passes):  # the timed passes alternate between the models
            for variant in results:
                results[variant].append(translate(variant, beam_size, alpha))
        for variant, passes in results.items():
            texts, ids, _ = passes[-1]
            seconds = common.median([p[2] for p in passes])
            same = None
            if variant != "float32" and "float32" in results:
                reference_ids = results["float32"][-1][1]
                same = sum(a == b for a, b in zip(ids, reference_ids)) / len(ids)
            bleu, exact = score(texts)
            best = min(p[2] for p in passes)
            rows.append({"model": variant, "search": label, "bleu": bleu, "exact_match": exact,
                         "sentences_per_second": len(sources) / seconds, "seconds": seconds,
                         "best_sentences_per_second": len(sources) / best,
                         "pass_seconds": [p[2] for p in passes],
                         "ids_equal_to_float32": same})
            common.progress(f"{variant}, {label}: BLEU {bleu:.2f}, exact {exact:.1%}, "
                            f"{len(sources) / seconds:.1f} sentences/s (passes "
                            + ", ".join(f"{p[2]:.2f}" for p in passes) + " s)"
                            + ("" if same is None else f", ids equal to float32 {same:.1%}"))
    return {"run_dir": args.run_dir, "sentences": len(sources), "batch_size": BATCH,
            "rows": rows, "models": details}


def run_random_part(args, lengths):
    """Part 2: forced-length cached decoding of random default-size weights."""
    import keras

    from keras_transformer import Transformer
    from keras_transformer.inference import beam_search, greedy_search

    config = common.transformer_config(args.config, dropout_rate=0.0,
                                       max_length=max(512, max(lengths) + 1))
    keras.utils.set_random_seed(0)
    model = Transformer(config)
    bias = model.target_embedding.output_bias
    if bias is None:
        sys.exit("error: the model has no output bias to stop EOS with: quantize.py needs "
                 "tie_output_embedding=True and share_embeddings=True.")
    values = np.array(keras.ops.convert_to_numpy(bias))
    values[common.EOS_ID] = -1e9  # EOS is never the best token: the length is forced
    bias.assign(values)
    quantized = Transformer(config)
    quantized.set_weights(model.get_weights())
    summary = quantize(quantized, args.mode, args.filters)
    common.progress(f"random {args.config} model: quantize took {summary['seconds']:.2f} s, "
                    f"quantized {summary['quantized_classes']}")
    for message, count in summary["warnings"].items():
        common.progress(f"  warning x{count}: {message[:200]}")
    if summary["error"]:
        common.progress(f"  quantize raised: {summary['error']}")
    source = common.random_batch(args.batch_size, args.source_length, 2, config.vocab_size)[0]
    k = args.beam_size
    models = {"float32": model}
    if not summary["error"]:
        models[args.mode] = quantized
    searches = {
        "greedy": lambda m, n: greedy_search(m, source, common.BOS_ID, common.EOS_ID,
                                             max_output_length=n)[0],
        "beam": lambda m, n: beam_search(m, source, common.BOS_ID, common.EOS_ID,
                                         beam_size=k, alpha=0.6, max_output_length=n)[0],
    }
    seconds, best_seconds, outputs, errors = {}, {}, {}, {}
    for search, run in searches.items():
        for n in lengths:
            # Both models compile first, then their timed runs alternate, so
            # that a slow spell of the shared machine hits both alike.
            times, ready = {}, {}
            for variant, m in models.items():
                name = f"{search}_{variant}"
                seconds.setdefault(name, {})
                try:
                    ready[variant], _ = common.timed(run, m, n)  # compiles this shape
                    times[variant] = []
                except Exception as error:  # noqa: BLE001  (reported, not hidden)
                    errors[f"{name}_{n}"] = f"{type(error).__name__}: {error}"
                    common.progress(f"  {name} {n}: raised {errors[f'{name}_{n}'][:500]}")
            for _ in range(args.repeats):
                for variant in times:
                    elapsed, tokens = common.timed(run, models[variant], n)
                    times[variant].append(elapsed)
                    outputs[f"{search}_{variant}", n] = tokens
            for variant in times:
                name = f"{search}_{variant}"
                tokens = np.asarray(keras.ops.convert_to_numpy(outputs[name, n]))
                if tokens.shape[1] != n:
                    sys.exit(f"error: {name} produced {tokens.shape[1]} tokens, not {n}: "
                             "the forced length did not hold.")
                outputs[name, n] = tokens
                median = seconds[name][str(n)] = common.median(times[variant])
                best_seconds.setdefault(name, {})[str(n)] = min(times[variant])
                common.progress(f"  {name:<14} {n:>4} tokens: {median:8.3f} s, "
                                f"{median / n * 1e3:7.2f} ms/token "
                                f"(compilation run {ready[variant]:.2f} s; runs "
                                + ", ".join(f"{t:.3f}" for t in times[variant]) + ")")
    ratios, best_ratios, same = {}, {}, {}
    for search in ("greedy", "beam"):
        ours = seconds.get(f"{search}_float32", {})
        theirs = seconds.get(f"{search}_{args.mode}", {})
        ratios[search] = {n: theirs[n] / ours[n] for n in ours if n in theirs}
        best_ours = best_seconds.get(f"{search}_float32", {})
        best_theirs = best_seconds.get(f"{search}_{args.mode}", {})
        best_ratios[search] = {n: best_theirs[n] / best_ours[n] for n in best_ours
                               if n in best_theirs}
        if ratios[search]:
            common.progress(f"  {search}: {args.mode} / float32 time: " + ", ".join(
                f"{n}: {r:.2f}" for n, r in ratios[search].items()))
        same[search] = {str(n): float(np.mean(outputs[f"{search}_float32", n]
                                              == outputs[f"{search}_{args.mode}", n]))
                        for n in lengths
                        if (f"{search}_float32", n) in outputs
                        and (f"{search}_{args.mode}", n) in outputs}
        if same[search]:
            common.progress(f"  {search}: {args.mode} tokens equal to float32's: " + ", ".join(
                f"{n}: {s:.1%}" for n, s in same[search].items()))
    return {"config": args.config, "sizes": common.SIZES[args.config],
            "batch_size": args.batch_size, "source_length": args.source_length,
            "beam_size": k, "lengths": lengths, "repeats": args.repeats,
            "weight_bytes": {"float32": weight_bytes(model)[0],
                             args.mode: weight_bytes(quantized)[0]},
            "quantize": summary, "seconds": seconds, "best_seconds": best_seconds,
            "best_quantized_over_float32": best_ratios,
            "ms_per_token": {name: {n: s / int(n) * 1e3 for n, s in by_n.items()}
                             for name, by_n in seconds.items()},
            "quantized_over_float32": ratios, "tokens_equal_to_float32": same,
            "errors": errors}


def print_tables(result, mode):
    part = result.get("run_model")
    if part:
        print(f"\n{part['sentences']} sentences, run {part['run_dir']}, batch "
              f"{part['batch_size']}, backend {result['backend']}\n")
        print("| model | search | BLEU | exact match | sentences/s (median) | sentences/s "
              "(best pass) | ids equal to float32 |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for row in part["rows"]:
            same = row["ids_equal_to_float32"]
            print(f"| {row['model']} | {row['search']} | {row['bleu']:.2f} | "
                  f"{row['exact_match']:.1%} | {row['sentences_per_second']:.1f} | "
                  f"{row['best_sentences_per_second']:.1f} | "
                  f"{'' if same is None else f'{same:.1%}'} |")
    part = result.get("random")
    if part:
        print(f"\nrandom {part['config']} model, batch {part['batch_size']} x "
              f"{part['source_length']} source tokens, beam {part['beam_size']}, "
              f"backend {result['backend']}, median of {part['repeats']}\n")
        print(f"| search | tokens | float32 s | {mode} s | {mode} / float32 | "
              f"{mode} / float32 (best runs) | float32 ms/token | {mode} ms/token | "
              "tokens equal |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for search in ("greedy", "beam"):
            for n in map(str, part["lengths"]):
                ours = part["seconds"].get(f"{search}_float32", {}).get(n)
                theirs = part["seconds"].get(f"{search}_{mode}", {}).get(n)
                same = part["tokens_equal_to_float32"].get(search, {}).get(n)
                best = part["best_quantized_over_float32"].get(search, {}).get(n)

                def fmt(value, spec):
                    return "" if value is None else format(value, spec)

                print(f"| {search} | {n} | {fmt(ours, '.3f')} | {fmt(theirs, '.3f')} | "
                      f"{fmt(theirs / ours if ours and theirs else None, '.2f')} | "
                      f"{fmt(best, '.2f')} | "
                      f"{fmt(ours and ours / int(n) * 1e3, '.2f')} | "
                      f"{fmt(theirs and theirs / int(n) * 1e3, '.2f')} | "
                      f"{fmt(same, '.1%')} |")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n")[-1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", default="int8", help="Keras quantization mode (int8)")
    parser.add_argument("--filters", action="append",
                        help="quantize only layers whose name matches this regex (repeatable; "
                             "Keras's `filters=`)")
    parser.add_argument("--run-dir", default="runs/quickstart",
                        help="a finished run (its model.keras and tokenizer)")
    parser.add_argument("--sources", help="test sources, one per line (default: the "
                        "quickstart's test split, synthetic_translation(500, seed=3))")
    parser.add_argument("--references", help="test references, one per line")
    parser.add_argument("--limit", type=int, help="only the first N test sentences")
    parser.add_argument("--passes", type=int, default=1,
                        help="part 1: timed passes after the compiling one (median)")
    parser.add_argument("--no-run-model", action="store_true", help="skip part 1")
    parser.add_argument("--no-random", action="store_true", help="skip part 2")
    parser.add_argument("--config", choices=tuple(common.SIZES), default="default",
                        help="random model size for part 2 (default: d_model 256, N=3)")
    parser.add_argument("--lengths", default="32,128", help="part 2: new tokens per sentence")
    parser.add_argument("--batch-size", type=int, default=8, help="part 2: sentences per batch")
    parser.add_argument("--source-length", type=int, default=32, help="part 2: source tokens")
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5, help="part 2: timed runs (median)")
    parser.add_argument("--quick", action="store_true",
                        help="32 sentences and a tiny random model (figures meaningless)")
    args = parser.parse_args(argv)
    if bool(args.sources) != bool(args.references):
        parser.error("--sources and --references go together")
    if args.filters and len(args.filters) == 1:
        args.filters = args.filters[0]
    if args.quick:
        args.limit = min(args.limit or 32, 32)
        args.config, args.lengths, args.batch_size, args.source_length = "quick", "4,8", 2, 6
        args.repeats = 1
    try:
        lengths = sorted({int(value) for value in args.lengths.split(",")})
    except ValueError:
        parser.error(f"--lengths must be comma-separated integers, got {args.lengths!r}")
    if min(lengths) < 1 or min(args.batch_size, args.source_length, args.beam_size,
                               args.repeats, args.passes) < 1:
        parser.error("lengths, sizes and repeats must be positive")

    import keras

    backend = common.backend_name()
    common.progress(f"quantize: backend {backend}, keras {keras.__version__}, mode {args.mode}"
                    + (f", filters {args.filters!r}" if args.filters else ""))
    result = {"benchmark": "quantize", "backend": backend, "keras": keras.__version__,
              "mode": args.mode, "filters": args.filters, "machine": common.machine(),
              "quick": args.quick, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    if not args.no_run_model:
        result["run_model"] = run_model_part(args)
    if not args.no_random:
        result["random"] = run_random_part(args, lengths)
    print_tables(result, args.mode)
    result["peak_rss_mb"] = common.peak_rss_mb()
    common.emit(result)


if __name__ == "__main__":
    main()
