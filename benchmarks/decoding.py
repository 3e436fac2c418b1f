"""Decoding speed (§6.1: greedy and beam-4 search) with the key/value cache
against the uncached baseline, for 32, 64, 128 and 256 new tokens.

Cached: `keras_transformer.inference.greedy_search` and `beam_search`
(beam 4, α = 0.6), which run the encoder once and the decoder one position at a
time over a fixed-size self-attention cache, compiled as one loop (jax.jit,
tf.function with XLA; on torch, under torch.no_grad with the loop body traced by
torch.jit.trace once per shape and the cache written in place).

Uncached: the textbook decoder without a cache. At step t it re-runs
`model.decode` on the whole prefix (t + 1 positions, padded up to a multiple of
`--bucket` so that compiled backends see few shapes; padding is masked), keeps
the last position's log-probabilities and extends the hypotheses on the host.
The step function is compiled the same way as the cached loop (jax.jit with the
weights as arguments, tf.function(jit_compile=True), torch.no_grad eager: the
uncached step has no loop to trace), and the encoder output is computed once.
Beam search keeps the best 4 of each beam's 4 best extensions, the same
ranking as the cached search while no hypothesis ends.

The length is forced: the end-of-sentence id gets an output bias of -1e9, so
no hypothesis ever ends and every run produces exactly n tokens. The weights
are random (speed does not depend on them). Each (method, n) is run once to
compile; then the timed runs go round every (method, n) in turn, `--repeats`
rounds (median), so that the machine's drift from minute to minute falls on
all methods alike. Each timed run of a cached search follows an untimed one
of the same (method, n), so that it starts with its weights in the CPU's
caches. Reported: seconds per batch, sentences per second, milliseconds per
new token (per step, whole batch), the ratio time(256) / time(32) of the
cached search, and the uncached / cached time at 128.

With `--ctranslate2`, the same weights (with the same EOS bias) are also
decoded by CTranslate2 fp32 and int8, each in its fastest threading setting,
and the ratios ours / CTranslate2 are reported; with `--saved-model`, by the
exported SavedModel's `translate_ids` signature, the path TF Serving users run
(`decoding_peers.py` says how each peer is run).

    KERAS_BACKEND=jax python benchmarks/decoding.py
    KERAS_BACKEND=jax python benchmarks/decoding.py --no-uncached --ctranslate2
    KERAS_BACKEND=tensorflow python benchmarks/decoding.py --no-uncached --ctranslate2 --saved-model
    KERAS_BACKEND=torch python benchmarks/decoding.py --batch-size 1 --lengths 32,128
    KERAS_BACKEND=jax python benchmarks/decoding.py --config base --batch-size 64 \
        --lengths 32,64 --no-uncached
"""

if __name__ == "__main__":  # the process is this script's own: set up before Keras loads
    import checkout  # noqa: F401  this tree's library and program, installed or not

    from keras_transformer_app.logs import start

    start()

import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common
import decoding_peers


def compile_inference(model, function):
    """`function(*args)` compiled as the library compiles its decoding loops."""
    import weakref

    from keras_transformer.inference.compiled import compile_inference as compile_for_backend

    return compile_for_backend(weakref.ref(model), lambda _, *args: function(*args))


class UncachedSearch:
    """Greedy and beam search that re-decode the whole prefix at every step."""

    def __init__(self, model, bucket):
        from keras import ops

        self.model, self.bucket = model, bucket
        vocab = model.config.resolved_target_vocab_size
        never = [model.config.pad_id, common.BOS_ID]  # as the library: never generated

        def encode(source):
            return model.encode(source, training=False)

        def top_k(k):
            def step(prefix, encoded, source_mask, index):
                logits = model.decode(prefix, encoded, source_mask, training=False)
                log_probs = ops.log_softmax(ops.take(logits, index, axis=1), axis=-1)
                banned = ops.any(ops.equal(ops.arange(vocab)[:, None],
                                           ops.convert_to_tensor(never)[None, :]), axis=1)
                return ops.top_k(ops.where(banned[None, :], float("-inf"), log_probs), k)
            return compile_inference(model, step)

        self.encode = compile_inference(model, encode)
        self.top_k = {}
        self.make_top_k = top_k

    def _width(self, positions, length):
        return min(-(-positions // self.bucket) * self.bucket, length)

    def _step(self, k, prefix, encoded, mask, index):
        from keras import ops

        if k not in self.top_k:
            self.top_k[k] = self.make_top_k(k)
        values, indices = self.top_k[k](prefix, encoded, mask, np.array(index, "int32"))
        return ops.convert_to_numpy(values), ops.convert_to_numpy(indices)

    def _encoded(self, source, k):
        """The encoder output once per sentence, repeated for its k hypotheses."""
        from keras import ops

        encoded, mask = self.encode(source)
        if k == 1:
            return encoded, mask
        return ops.repeat(encoded, k, axis=0), ops.repeat(mask, k, axis=0)

    def warm_up(self, source, length, k):
        """Compiles every prefix width a search of `length` tokens uses."""
        encoded, mask = self._encoded(source, k)
        rows = source.shape[0] * k
        for width in sorted({self._width(t + 1, length) for t in range(length)}):
            self._step(k, np.zeros((rows, width), "int32"), encoded, mask, width - 1)

    def greedy(self, source, length):
        encoded, mask = self._encoded(source, 1)
        tokens = np.zeros((source.shape[0], length + 1), "int32")
        tokens[:, 0] = common.BOS_ID
        for t in range(length):
            prefix = tokens[:, : self._width(t + 1, length)]
            _, indices = self._step(1, prefix, encoded, mask, t)
            tokens[:, t + 1] = indices[:, 0]
        return tokens[:, 1:]

    def beam(self, source, length, k):
        batch = source.shape[0]
        encoded, mask = self._encoded(source, k)
        alive = np.zeros((batch, k, length + 1), "int32")
        alive[:, :, 0] = common.BOS_ID
        scores = np.full((batch, k), -np.inf, "float32")
        scores[:, 0] = 0.0  # all beams start identical: only the first expands
        rows = np.arange(batch)[:, None]
        for t in range(length):
            prefix = alive.reshape(batch * k, -1)[:, : self._width(t + 1, length)]
            values, indices = self._step(k, prefix, encoded, mask, t)
            candidates = (scores[:, :, None] + values.reshape(batch, k, k)).reshape(batch, -1)
            best = np.argsort(-candidates, axis=1, kind="stable")[:, :k]
            parents = best // k
            alive = alive[rows, parents]
            alive[:, :, t + 1] = indices.reshape(batch, k * k)[rows, best]
            scores = candidates[rows, best]
        return alive[:, 0, 1:]


def self_timed(elapsed, result):
    """(seconds, ids) of a timed call: a method that times itself elsewhere
    (the CTranslate2 worker) returns (ids, its seconds), which replace ours."""
    if isinstance(result, tuple):
        return result[1], result[0]
    return elapsed, result


def build_parser():
    """The script's command-line options."""
    parser = common.argument_parser(__doc__)
    parser.add_argument("--config", choices=tuple(common.SIZES), default="default",
                        help="model size (default: d_model 256, 4 heads, d_ff 1024, N=3)")
    parser.add_argument("--lengths", default="32,64,128,256", help="new tokens per sentence")
    parser.add_argument("--batch-size", type=int, default=8, help="sentences per batch")
    parser.add_argument("--source-length", type=int, default=32, help="source tokens")
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs, cached (median)")
    parser.add_argument("--uncached-repeats", type=int, default=1,
                        help="timed runs, uncached (slow: quadratic in the length)")
    parser.add_argument("--bucket", type=int, default=16,
                        help="uncached prefixes are padded to a multiple of this")
    parser.add_argument("--no-uncached", action="store_true", help="cached searches only")
    parser.add_argument("--ctranslate2", action="store_true",
                        help="also CTranslate2 fp32 and int8 on the same weights")
    parser.add_argument("--saved-model", action="store_true",
                        help="also the exported SavedModel's translate_ids (exported per length)")
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes to check that the script runs (figures meaningless)")
    parser.add_argument("--output", help="also write the results to this JSON file (a "
                                         "folder of them makes RESULTS.md's table of the "
                                         "peers: benchmarks/tables.py)")
    return parser


def parse_args(argv=None):
    """The options (tiny sizes with --quick) and the lengths to decode, sorted."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.quick:
        args.config, args.lengths, args.batch_size, args.source_length = "quick", "4,8", 2, 6
        args.repeats, args.bucket = 1, 4
    try:
        lengths = sorted({int(value) for value in args.lengths.split(",")})
    except ValueError:
        parser.error(f"--lengths must be comma-separated integers, got {args.lengths!r}")
    if min(lengths) < 1 or min(args.batch_size, args.source_length, args.beam_size,
                               args.repeats, args.uncached_repeats, args.bucket) < 1:
        parser.error("lengths, sizes, repeats and --bucket must be positive")
    return args, lengths


def forced_length_model(size, lengths):
    """A `Transformer` of the named size with random weights whose end-of-sentence
    id never wins, so that every search produces as many tokens as it is asked."""
    import keras

    from keras_transformer import Transformer

    config = common.transformer_config(size, dropout_rate=0.0,
                                       max_length=max(512, max(lengths) + 1))
    model = Transformer(config)
    bias = model.target_embedding.output_bias
    if bias is None:
        sys.exit("error: the model has no output bias to stop EOS with: decoding.py needs "
                 "tie_output_embedding=True and share_embeddings=True.")
    values = np.array(keras.ops.convert_to_numpy(bias))
    values[common.EOS_ID] = -1e9  # EOS is never the best token: the length is forced
    bias.assign(values)
    return model


def search_methods(model, source, uncached, beam_size, with_uncached):
    """{method: run(n) -> ids of n tokens} of the cached greedy and beam search
    and, `with_uncached`, of the uncached ones."""
    from keras_transformer.inference import beam_search, greedy_search

    methods = {
        "greedy_cached": lambda n: greedy_search(model, source, common.BOS_ID, common.EOS_ID,
                                                 max_output_length=n)[0],
        "beam_cached": lambda n: beam_search(model, source, common.BOS_ID, common.EOS_ID,
                                             beam_size=beam_size, alpha=0.6,
                                             max_output_length=n)[0],
    }
    if with_uncached:
        methods["greedy_uncached"] = lambda n: uncached.greedy(source, n)
        methods["beam_uncached"] = lambda n: uncached.beam(source, n, beam_size)
    return methods


def add_ctranslate2(methods, model, source, directory, calibration_length, beam_size):
    """Adds greedy and beam search by CTranslate2 fp32 and int8 on the model's
    weights to `methods`, each in the threading setting that was fastest at
    `calibration_length` tokens; returns the peer, whose workers are to be closed."""
    peer = decoding_peers.CTranslate2Peer(model, source, directory, calibration_length,
                                          beam_size)
    for quantization, times in peer.calibration.items():
        common.progress(f"CTranslate2 {quantization}: greedy + beam {beam_size} at "
                        f"{calibration_length} tokens, "
                        + ", ".join(f"{name} {seconds:.3f} s" for name, seconds in times.items())
                        + f": kept {peer.chosen[quantization]}")
    for quantization in ("fp32", "int8"):
        # These return (ids, seconds): the worker's own time.
        methods[f"greedy_ct2_{quantization}"] = \
            lambda n, q=quantization: peer.translate(q, n, 1)
        methods[f"beam_ct2_{quantization}"] = \
            lambda n, q=quantization: peer.translate(q, n, beam_size)
    return peer


def compilation_runs(methods, lengths, uncached, source, beam_size):
    """Runs every (method, n) once, untimed, to compile it; returns the
    seconds of each of these runs."""
    first_s = {}
    for method, run in methods.items():
        for n in lengths:
            if "uncached" in method:  # compile each prefix width, not one whole slow run
                width_k = 1 if method.startswith("greedy") else beam_size
                first_s[method, n], _ = common.timed(uncached.warm_up, source, n, width_k)
            else:
                first_s[method, n], _ = self_timed(*common.timed(run, n))  # compiles this shape
            common.progress(f"  {method:<16} {n:>4} tokens: compilation run "
                            f"{first_s[method, n]:.2f} s")
    return first_s


def timed_rounds(args, methods, lengths):
    """The timed runs: rounds that each go round every (method, n) in turn,
    `--repeats` of them for a cached search, `--uncached-repeats` for an
    uncached one. Returns ({(method, n): seconds of each run},
    {(method, n): ids of its last run})."""
    times, outputs = {(method, n): [] for method in methods for n in lengths}, {}
    rounds = max(args.repeats, args.uncached_repeats if not args.no_uncached else 0)
    for repeat in range(rounds):
        for n in lengths:
            for method, run in methods.items():
                repeats = args.uncached_repeats if "uncached" in method else args.repeats
                if repeat < repeats:
                    if "uncached" not in method:  # far slower: the caches matter little
                        run(n)
                    elapsed, outputs[method, n] = self_timed(*common.timed(run, n))
                    times[method, n].append(elapsed)
        common.progress(f"  timed round {repeat + 1} of {rounds}")
    return times, outputs


def median_seconds(methods, lengths, times, outputs, first_s, batch_size):
    """{method: {str(n): median seconds per batch}}, printed with the rates;
    exits if a method produced other than n tokens."""
    seconds = {}
    for method in methods:
        seconds[method] = {}
        for n in lengths:
            if outputs[method, n].shape[1] != n:
                sys.exit(f"error: {method} produced {outputs[method, n].shape[1]} tokens, "
                         f"not {n}: the forced length did not hold.")
            median = common.median(times[method, n])
            seconds[method][str(n)] = median
            common.progress(f"  {method:<16} {n:>4} tokens: {median:8.3f} s, "
                            f"{median / n * 1e3:7.2f} ms/token, "
                            f"{batch_size / median:8.1f} sentences/s "
                            f"(compilation run {first_s[method, n]:.2f} s)")
    return seconds


def length_summary(seconds, lengths):
    """Per search, the cached time of the longest length over that of the
    shortest and, with the uncached search, uncached / cached time at 128
    tokens (or the longest length)."""
    first, last = str(lengths[0]), str(lengths[-1])
    middle = "128" if 128 in lengths else last
    summary = {}
    for search in ("greedy", "beam"):
        cached = seconds[f"{search}_cached"]
        summary[search] = {"cached_ratio": cached[last] / cached[first],
                           "cached_ratio_lengths": [int(last), int(first)]}
        common.progress(f"  {search}: cached time({last}) / time({first}) = "
                        f"{summary[search]['cached_ratio']:.2f}")
        if f"{search}_uncached" in seconds:
            speedup = seconds[f"{search}_uncached"][middle] / cached[middle]
            summary[search].update(speedup=speedup, speedup_length=int(middle))
            common.progress(f"  {search}: uncached / cached at {middle} tokens = {speedup:.2f}x")
    return summary


def matching(outputs, lengths, method):
    """The smallest share, over the lengths, of the cached greedy search's
    tokens that `method` produced too."""
    return min(float(np.mean(outputs["greedy_cached", n] == outputs[method, n]))
               for n in lengths)


def ctranslate2_summary(seconds, outputs, lengths, peer, with_saved_model):
    """Ours / CTranslate2 time per search, path of ours, quantization and
    length; the share of our greedy tokens that CTranslate2 fp32 produced too;
    and the peer's threading settings with their calibration times."""
    ours = ("cached", "saved_model") if with_saved_model else ("cached",)
    ratios = {
        f"{search}_{path}_{quantization}".replace("_cached", ""): {
            n: seconds[f"{search}_{path}"][n] / seconds[f"{search}_ct2_{quantization}"][n]
            for n in seconds[f"{search}_{path}"]}
        for path in ours for search in ("greedy", "beam") for quantization in ("fp32", "int8")}
    for name, by_length in ratios.items():
        common.progress(f"  ours / CTranslate2 {name}: " + ", ".join(
            f"{n}: {ratio:.2f}" for n, ratio in by_length.items()))
    same = matching(outputs, lengths, "greedy_ct2_fp32")
    common.progress(f"  greedy: CTranslate2 fp32 tokens equal to ours: {same:.1%}")
    return {"ours_over_ctranslate2": ratios, "greedy_ct2_fp32_matches_cached": same,
            "ctranslate2_settings": dict(peer.chosen),
            "ctranslate2_calibration_seconds": peer.calibration}


def summarize(args, seconds, outputs, lengths, peer):
    """The summary of the JSON line, printed: the ratios of `length_summary`,
    the comparison with the peers, and the share of our greedy tokens that each
    other path produced too."""
    summary = length_summary(seconds, lengths)
    if args.ctranslate2:
        summary.update(ctranslate2_summary(seconds, outputs, lengths, peer, args.saved_model))
    if args.saved_model:
        same = summary["greedy_saved_model_matches_cached"] = matching(
            outputs, lengths, "greedy_saved_model")
        common.progress(f"  greedy: SavedModel tokens equal to ours: {same:.1%}")
    if not args.no_uncached:
        same = summary["greedy_uncached_matches_cached"] = matching(
            outputs, lengths, "greedy_uncached")
        common.progress(f"  greedy: uncached tokens equal to cached ones: {same:.1%} "
                        "(below 100% only from float rounding between the two paths)")
    return summary


def main(argv=None):
    args, lengths = parse_args(argv)
    model = forced_length_model(args.config, lengths)
    source = common.random_batch(args.batch_size, args.source_length, 2,
                                 model.config.vocab_size)[0]
    uncached = UncachedSearch(model, args.bucket)
    k = args.beam_size
    methods = search_methods(model, source, uncached, k, not args.no_uncached)
    peer = None
    if args.ctranslate2:
        peers_dir = tempfile.TemporaryDirectory(prefix="decoding-ctranslate2-")
        peer = add_ctranslate2(methods, model, source, peers_dir.name, min(lengths), k)
    if args.saved_model:
        exports_dir = tempfile.TemporaryDirectory(prefix="decoding-saved-model-")
        for search, beam_size, alpha in (("greedy", 1, 0.0), ("beam", k, 0.6)):
            methods[f"{search}_saved_model"] = decoding_peers.saved_model_peer(
                model, source, exports_dir.name, beam_size, alpha)

    backend = common.backend_name()
    common.progress(f"decoding: backend {backend}, config {args.config}, batch "
                    f"{args.batch_size} x {args.source_length} source tokens, beam {k}")
    # Every (method, n) is compiled first; then the timed runs go round all of
    # them in turn, so that a slow minute of the machine (its speed drifts
    # from minute to minute) falls on every method alike, not on whichever
    # was being timed then, and the ratios of a run compare like with like.
    # Each timed run follows an untimed one of the same method and length, so
    # that it finds its weights in the CPU's caches as a run of a method
    # timed alone would, not where the previous method left them.
    first_s = compilation_runs(methods, lengths, uncached, source, k)
    times, outputs = timed_rounds(args, methods, lengths)
    seconds = median_seconds(methods, lengths, times, outputs, first_s, args.batch_size)
    summary = summarize(args, seconds, outputs, lengths, peer)
    if args.ctranslate2:
        peer.close()
    common.write_results({
        "benchmark": "decoding", "backend": backend, "config": args.config,
        "sizes": common.SIZES[args.config], "batch_size": args.batch_size,
        "source_length": args.source_length, "beam_size": k, "lengths": lengths,
        "repeats": args.repeats, "uncached_repeats": args.uncached_repeats,
        "bucket": args.bucket, "seconds": seconds,
        "ms_per_token": {method: {n: s / int(n) * 1e3 for n, s in by_length.items()}
                         for method, by_length in seconds.items()},
        "sentences_per_s": {method: {n: args.batch_size / s for n, s in by_length.items()}
                            for method, by_length in seconds.items()},
        "summary": summary, "quick": args.quick,
    }, args.output)


if __name__ == "__main__":
    common.run_script(main)
