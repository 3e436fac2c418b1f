"""Quality and speed of the CTranslate2 export against our own decoding (issue 18).

Exports a run's `model.keras` with `export_ctranslate2` (fp32 and int8), then
translates one test set with each: ours (`Translator`, beam search §6.1) and
CTranslate2's `translate_batch`, greedy and beam 4. Reported per system: BLEU
(sacreBLEU 13a, cased and lower-cased), exact match, sentences/s (batch 32, the
test set's order, the second of two passes, so that neither pays compilation or
start-up; CTranslate2 with `--threads` intra-op threads, 1 by default) and, for
CTranslate2, how many of its output ids equal ours.

Both search with the same limits (no minimum length, at most the source's
tokens + EOS + 50 output tokens, §6.1). Beam search with a length penalty
cannot match by construction: ours divides by ((5 + |Y|) / 6)^α (Wu et al.,
the paper's α = 0.6), CTranslate2 by |Y|^α. So beam 4 is run at α = 0 on both
sides (where ids should match) and with each engine's own α = 0.6.

    KERAS_BACKEND=jax python benchmarks/experiments/ctranslate2_quality.py  # the quickstart run
    KERAS_BACKEND=jax python benchmarks/experiments/ctranslate2_quality.py --threads 2
    python benchmarks/experiments/ctranslate2_quality.py --run-dir RUN \
        --sources S.txt --references R.txt
"""

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
import common  # noqa: E402  (also puts the repository on sys.path)

BATCH = 32


def ctranslate2_translate(model_dir, source_tokenizer, target_tokenizer, sentences, beam_size,
                          length_penalty, threads=1):
    """(texts, ids, seconds): CTranslate2's translations, its ids without EOS."""
    import json

    import ctranslate2

    from keras_transformer.inference.limits import LENGTH_OFFSET

    names = ("shared_vocabulary.json",) * 2
    if not os.path.exists(os.path.join(model_dir, names[0])):
        names = ("source_vocabulary.json", "target_vocabulary.json")
    vocabularies = []
    for name in names:
        with open(os.path.join(model_dir, name)) as f:
            vocabularies.append(json.load(f))
    to_id = {token: i for i, token in enumerate(vocabularies[1])}
    translator = ctranslate2.Translator(model_dir, device="cpu", intra_threads=threads)
    pieces = [[vocabularies[0][i] for i in ids] for ids in source_tokenizer.tokenize(sentences)]
    ids = [None] * len(pieces)
    start = time.perf_counter()
    for begin in range(0, len(pieces), BATCH):
        rows = range(begin, min(begin + BATCH, len(pieces)))
        # One length limit per call, as ours: the longest source of the batch + EOS + 50.
        longest = max(len(pieces[row]) for row in rows)
        outputs = translator.translate_batch(
            [pieces[row] for row in rows], beam_size=beam_size, length_penalty=length_penalty,
            min_decoding_length=0, max_decoding_length=longest + 1 + LENGTH_OFFSET)
        for row, output in zip(rows, outputs):
            ids[row] = [to_id[token] for token in output.hypotheses[0]]
    seconds = time.perf_counter() - start
    return target_tokenizer.detokenize(ids), ids, seconds


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", default="runs/quickstart",
                        help="a finished run (its model.keras and tokenizer)")
    parser.add_argument("--sources", help="test sources, one per line (default: the "
                        "quickstart's test split, synthetic_translation(500, seed=3))")
    parser.add_argument("--references", help="test references, one per line")
    parser.add_argument("--limit", type=int, help="only the first N sentences")
    parser.add_argument("--threads", type=int, default=1,
                        help="CTranslate2's intra_threads (default 1: on this 2-core machine, "
                        "in this process, 2 threads decoded several times slower)")
    args = parser.parse_args(argv)
    if bool(args.sources) != bool(args.references):
        parser.error("--sources and --references go together")
    if args.threads < 1:
        parser.error("--threads must be positive")

    from keras_transformer import run_files
    from keras_transformer.evaluation import bleu_scores
    from keras_transformer.export.ctranslate2 import export_ctranslate2
    from keras_transformer.inference import Translator

    sources, references = common.test_set(args.sources, args.references, args.limit)
    model, source_tokenizer, target_tokenizer = run_files.load_translation_model(args.run_dir)
    translator = Translator(model, source_tokenizer, target_tokenizer=target_tokenizer)

    def score(texts):
        cased, lowercase = bleu_scores(texts, references, force=True)
        exact = sum(h.strip() == r.strip() for h, r in zip(texts, references)) / len(references)
        return cased.score, lowercase.score, exact

    rows, ours = [], {}
    for label, beam_size, alpha in (("greedy", 1, 0.0), ("beam 4, α 0", 4, 0.0),
                                    ("beam 4, α 0.6", 4, 0.6)):
        # A first, untimed pass compiles every shape the set needs.
        translator.translate(sources, beam_size=beam_size, alpha=alpha, batch_size=BATCH)
        start = time.perf_counter()
        results = translator.translate(sources, beam_size=beam_size, alpha=alpha,
                                       batch_size=BATCH)
        texts, ids = [result.text for result in results], [result.ids for result in results]
        seconds = time.perf_counter() - start
        ours[label] = [list(row)[:-1] if list(row)[-1:] == [target_tokenizer.eos_id]
                       else list(row) for row in ids]
        rows.append(("ours (" + os.environ.get("KERAS_BACKEND", "tensorflow") + ")", label,
                     *score(texts), len(sources) / seconds, ""))
        common.progress(f"ours, {label}: {rows[-1][2]:.2f} BLEU")
    with tempfile.TemporaryDirectory() as directory:
        for quantization in (None, "int8"):
            model_dir = os.path.join(directory, quantization or "fp32")
            export_ctranslate2(args.run_dir, model_dir, quantization=quantization,
                               verbose=False)
            for label, beam_size, penalty in (("greedy", 1, 0.0), ("beam 4, α 0", 4, 0.0),
                                              ("beam 4, α 0.6", 4, 0.6)):
                for _ in range(2):  # the second pass is timed, as ours
                    texts, ids, seconds = ctranslate2_translate(
                        model_dir, source_tokenizer, target_tokenizer, sources, beam_size,
                        penalty, args.threads)
                same = sum(a == b for a, b in zip(ids, ours[label])) / len(ids)
                rows.append((f"CTranslate2 {quantization or 'fp32'}", label, *score(texts),
                             len(sources) / seconds, f"{same:.1%}"))
                common.progress(f"CTranslate2 {quantization or 'fp32'}, {label}: "
                                f"{rows[-1][2]:.2f} BLEU")
    threads = f"{args.threads} thread" + "s" * (args.threads != 1)
    print(f"\n{len(sources)} sentences, run {args.run_dir}, batch {BATCH}, CTranslate2 with "
          f"{threads}\n")
    print("| system | search | BLEU | lower-cased BLEU | exact match | sentences/s | "
          "ids equal to ours |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for system, label, bleu, lowercase, exact, rate, same in rows:
        print(f"| {system} | {label} | {bleu:.2f} | {lowercase:.2f} | {exact:.1%} | {rate:.1f} "
              f"| {same} |")


if __name__ == "__main__":
    main()
