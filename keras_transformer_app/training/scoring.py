"""§6.1 Machine Translation and §6.2 Model Variations: scoring a run on its splits.

What a training run measures after `model.fit`, each with beam search on one split:

- `evaluate_split`: BLEU (cased and lower-cased), exact match and speed on the test
  split, the run's headline figures;
- `tune_alpha`: the length penalty α of highest validation BLEU among a few, so that
  the test split plays no part in choosing it (§6.1 set α on the development set);
- `validation_curve`: validation BLEU of every checkpoint against the training time up
  to it (`validation_curve.csv`), to see when more training stops paying;
- `perplexity`: per-token perplexity on a split, the dev figure of Table 3 (§6.2).

A source listed on several lines of a split (Tatoeba lists a sentence once per
translation) is translated once and scored against all its references
(`evaluation.group_references`).

With `run.py`, this is the outer layer of the training package: it translates with
`keras_transformer.inference` and scores with `keras_transformer.evaluation`, neither of
which imports training.
"""

import csv
import io
import math
import os

from keras_transformer import evaluation, saving
from keras_transformer.inference import Translator
from keras_transformer.training.losses import LabelSmoothedCrossEntropy, MaskedTokenAccuracy
from keras_transformer_app import run_files
from keras_transformer_app.training.fit import CHECKPOINT_PATTERN, list_checkpoints


def scored_pairs(corpus, limit=None):
    """The distinct sources of a split with their references, the first `limit`
    of them (all for None): `(sources, [[reference, ...], ...])`."""
    sources, references = evaluation.group_references(corpus.sources, corpus.targets)
    limit = limit or len(sources)
    return sources[:limit], references[:limit]


def evaluate_split(translator, corpus, *, beam_size=4, alpha=0.6, limit=None,
                   hypotheses_path=None, verbose=0, bleu_force=None):
    """Translates a split with beam search and scores it.

    Args:
        translator: A `keras_transformer.inference.Translator`.
        corpus: The split, a `ParallelCorpus`.
        beam_size, alpha: The beam search (§6.1).
        limit: Score only the first `limit` distinct sources.
        hypotheses_path: Where to write the translations, one per line.
        verbose: 1 shows the translation's progress.
        bleu_force: sacreBLEU's `force` (text that looks tokenized), as
            `evaluation.bleu_scores` takes it.

    Returns:
        A dict of figures: `bleu`, `bleu_lowercase`, `bleu_signature`, `exact_match`
        (the share of hypotheses equal to one of their references), `beam_size`,
        `alpha`, `test_sentences`, `test_references`, `sentences_per_second`, and for
        a split with repeated sources `per_pair` (BLEU with each line's hypothesis
        scored against that line's reference alone).
    """
    sources, references = scored_pairs(corpus, limit)
    result = evaluation.evaluate(
        translator, sources, references, hypotheses_path=hypotheses_path,
        beam_size=beam_size, alpha=alpha, verbose=verbose, bleu_force=bleu_force)
    exact = sum(h.strip() in {r.strip() for r in refs}
                for h, refs in zip(result.hypotheses, references))
    pairs = sum(len(refs) for refs in references)
    print(f"Test, {len(sources)} sentences ({pairs} reference translations), "
          f"beam {beam_size}, alpha {alpha}:")
    print(result.summary())
    print(f"Exact match (any reference) {exact / len(references):.2%}")
    for source, hypothesis, refs in list(zip(sources, result.hypotheses, references))[:5]:
        print(f"  source:     {source}\n  translated: {hypothesis}\n  reference:  "
              + "\n              ".join(refs))
    figures = {"bleu": result.bleu, "bleu_lowercase": result.bleu_lowercase,
               "bleu_signature": result.bleu_signature, "exact_match": exact / len(references),
               "beam_size": beam_size, "alpha": alpha,
               "test_sentences": len(sources), "test_references": pairs,
               "sentences_per_second": round(result.sentences_per_second, 2)}
    if pairs > len(sources):
        cased, lowercase = evaluation.bleu_scores(
            [h for h, refs in zip(result.hypotheses, references) for _ in refs],
            [r for refs in references for r in refs])
        figures["per_pair"] = {"bleu": cased.score, "bleu_lowercase": lowercase.score}
        print(f"Scored pair by pair ({pairs} pairs, one reference each): BLEU "
              f"{cased.score:.2f}, lower-cased {lowercase.score:.2f}")
    return figures


def tune_alpha(translator, corpus, alphas, *, beam_size=4, limit=None):
    """Translates a validation split once per length penalty α of `alphas`.

    Returns:
        `{"alpha": the α of highest lower-cased BLEU (the first on a tie),
        "bleu_lowercase": {str(α): BLEU}}`.
    """
    sources, references = scored_pairs(corpus, limit)
    scores = {}
    for alpha in alphas:
        result = evaluation.evaluate(translator, sources, references, beam_size=beam_size,
                                     alpha=alpha, verbose=0)
        scores[str(alpha)] = round(result.bleu_lowercase, 2)
        print(f"Tuning alpha on {len(sources)} validation sentences: alpha {alpha}, BLEU "
              f"lower-cased {result.bleu_lowercase:.2f}, cased {result.bleu:.2f}", flush=True)
    best = max(alphas, key=lambda alpha: scores[str(alpha)])
    print(f"Alpha {best} from the validation split (lower-cased BLEU {scores[str(best)]:.2f})")
    return {"alpha": best, "bleu_lowercase": scores}


def validation_curve(run_dir, corpus, source_tokenizer, target_tokenizer=None, *,
                     beam_size=4, alpha=0.6, limit=None, translator=None):
    """Scores every checkpoint of a run on a validation split and writes
    `RUN_DIR/validation_curve.csv`, one row per checkpoint: its step, the training
    time up to it (`training_seconds_by_step`), cased and lower-cased BLEU, and the
    search that scored it (beam size, α, sentences).

    The checkpoints' weights are loaded in turn into one model (the first checkpoint's,
    or that of `translator`, one of the same config and tokenizers), so the search is
    compiled once for the whole curve, not once per checkpoint.

    The file is rewritten after every checkpoint, so a curve that is stopped keeps
    what it scored: a second call reuses the rows of checkpoints that are still there
    and were scored with the same beam size, α and sentences, and scores the rest.

    Returns:
        The rows, as dicts, in the order of the steps.
    """
    checkpoints = list_checkpoints(run_files.path(run_dir, run_files.CHECKPOINTS))
    elapsed = training_seconds_by_step(run_files.path(run_dir, run_files.TRAINING_LOG))
    sources, references = scored_pairs(corpus, limit)
    search = {"beam_size": beam_size, "alpha": alpha, "sentences": len(sources)}
    curve_path = run_files.path(run_dir, run_files.VALIDATION_CURVE)
    steps = [int(CHECKPOINT_PATTERN.search(path).group(1)) for path in checkpoints]
    scored = {row["step"]: row for row in _read_curve(curve_path, search) if row["step"] in steps}
    if scored:
        print(f"Validation curve: {len(scored)} of {len(checkpoints)} checkpoints already "
              f"scored in {curve_path}, with the same search; scoring the rest", flush=True)
    for index, (step, path) in enumerate(zip(steps, checkpoints), 1):
        if step in scored:
            continue
        checkpoint = saving.load_model(path)
        if translator is None:
            translator = Translator(checkpoint, source_tokenizer,
                                    target_tokenizer=target_tokenizer)
        else:  # one model for every checkpoint: its compiled searches serve them all
            translator.model.set_weights(checkpoint.get_weights())
        result = evaluation.evaluate(translator, sources, references, beam_size=beam_size,
                                     alpha=alpha, verbose=0)
        scored[step] = {"step": step, "training_seconds": elapsed.get(step),
                        "bleu": round(result.bleu, 2),
                        "bleu_lowercase": round(result.bleu_lowercase, 2), **search}
        _write_curve(curve_path, [scored[step] for step in sorted(scored)])
        print(f"Validation curve {index}/{len(checkpoints)}: step {step}, BLEU "
              f"{result.bleu:.2f}, lower-cased {result.bleu_lowercase:.2f} "
              f"({len(sources)} sentences in {result.seconds:.0f} s)", flush=True)
    rows = [scored[step] for step in sorted(scored)]
    _write_curve(curve_path, rows)
    print(f"Wrote {curve_path}")
    return rows


_CURVE_COLUMNS = ["step", "training_seconds", "bleu", "bleu_lowercase", "beam_size", "alpha",
                  "sentences"]


def _write_curve(curve_path, rows):
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=_CURVE_COLUMNS)
    writer.writeheader()
    writer.writerows(rows)
    saving.write_text(curve_path, text.getvalue())


def _read_curve(curve_path, search):
    """The rows of a `validation_curve.csv` scored with `search` (beam size, α and
    sentences), parsed; none for a missing file or one written without them."""
    if not os.path.exists(curve_path):
        return []
    with open(curve_path, newline="") as f:
        rows = list(csv.DictReader(f))
    parsed = []
    for row in rows:
        if not all(row.get(key) for key in search):
            continue
        if (int(row["beam_size"]), float(row["alpha"]), int(row["sentences"])) != (
                search["beam_size"], float(search["alpha"]), search["sentences"]):
            continue
        seconds = row.get("training_seconds")
        parsed.append({"step": int(row["step"]),
                       "training_seconds": float(seconds) if seconds else None,
                       "bleu": float(row["bleu"]), "bleu_lowercase": float(row["bleu_lowercase"]),
                       **search})
    return parsed


def training_seconds_by_step(log_path):
    """`{step at the end of a window: training seconds up to it}` from a run's
    `training_log.csv` (the `step` and `seconds` columns of `fit.WindowClock`; a log
    without them gives {})."""
    if not os.path.exists(log_path):
        return {}
    with open(log_path) as f:
        rows = [row for row in csv.DictReader(f) if row.get("seconds") and row.get("step")]
    total, elapsed = 0.0, {}
    for row in sorted(rows, key=lambda row: float(row["step"])):
        total += float(row["seconds"])
        elapsed[int(float(row["step"]))] = round(total, 1)
    return elapsed


def perplexity(model, dataset, pad_id=0):
    """Perplexity per target token of `model` on a finite dataset of `make_dataset`:
    exp of the plain cross-entropy (no label smoothing, whatever ε_ls the model trained
    with). Recompiles `model` for the evaluation, so call it after training."""
    model.compile(loss=LabelSmoothedCrossEntropy(0.0, pad_id=pad_id),
                  metrics=[MaskedTokenAccuracy(pad_id=pad_id)])
    return math.exp(float(model.evaluate(dataset, verbose=0, return_dict=True)["loss"]))
