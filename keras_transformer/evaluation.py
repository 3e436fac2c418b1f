"""§6.1 Machine Translation results: BLEU of translated test sets, and decoding speed.

The paper reports BLEU on newstest2014 (Table 2). This module translates a test
set with a `Translator`, writes the hypotheses one per line, and scores them
with sacreBLEU twice:

* `bleu`: sacreBLEU's default, detokenized and cased with the 13a tokenizer. It
  is the comparable, reproducible figure; its signature says exactly how it was
  computed.
* `bleu_lowercase`: lower-cased BLEU on 13a-tokenized text, the figure most
  Multi30k papers report. They run `multi-bleu.perl` on lower-cased,
  Moses-tokenized text; sacreBLEU's 13a tokenizer (the mteval-v13a rules)
  splits punctuation from words much as the Moses tokenizer does, so
  `lowercase=True, tokenize="13a"` on our detokenized output and the raw
  references gives a comparable figure. The two tokenizers differ in a few
  rules (apostrophes, hyphens), so expect close, not identical, numbers.

A sentence may have several references (Tatoeba lists each English sentence
once per translation): pass a list of strings for it, and BLEU counts an n-gram
as matched when any of its references has it, as multi-bleu.perl and
sacreBLEU do (the signature's `nrefs` is `var` when the count varies). `group_references` turns
repeated sources of a test set into that form, so each is translated once.

It also times the translation: sentences per second and output tokens (ids,
EOS included) per second, wall clock, including compilation on JAX and
TensorFlow for each new batch shape.
"""

import dataclasses
import os
import time
from typing import Optional

import numpy as np

from keras_transformer import saving


@dataclasses.dataclass(frozen=True)
class EvaluationResult:
    """Scores and speed of one `evaluate` run.

    Attributes:
        bleu: Cased sacreBLEU (13a tokenization), 0-100.
        bleu_lowercase: Lower-cased sacreBLEU on 13a-tokenized text, 0-100: the
            tokenized lower-case BLEU of Multi30k papers.
        bleu_signature: sacreBLEU's signature of `bleu`.
        bleu_lowercase_signature: sacreBLEU's signature of `bleu_lowercase`.
        num_sentences: Sentences translated.
        num_tokens: Output ids generated (EOS included).
        seconds: Wall-clock time of the translation.
        sentences_per_second: `num_sentences / seconds`.
        tokens_per_second: `num_tokens / seconds`.
        hypotheses: The translations, in input order.
        hypotheses_path: Where they were written, or None.
        num_truncated: Sources longer than the translator's
            `max_source_length`, translated from their first tokens.
    """

    bleu: float
    bleu_lowercase: float
    bleu_signature: str
    bleu_lowercase_signature: str
    num_sentences: int
    num_tokens: int
    seconds: float
    sentences_per_second: float
    tokens_per_second: float
    hypotheses: list = dataclasses.field(repr=False)
    hypotheses_path: Optional[str] = None
    num_truncated: int = 0

    def summary(self):
        """A few lines for a log or a terminal."""
        lines = [
            f"BLEU {self.bleu:.2f} ({self.bleu_signature})",
            (f"BLEU lower-cased, tokenized {self.bleu_lowercase:.2f} "
             f"({self.bleu_lowercase_signature})"),
            (f"{self.num_sentences} sentences in {self.seconds:.1f} s: "
             f"{self.sentences_per_second:.1f} sentences/s, "
             f"{self.tokens_per_second:.0f} tokens/s"),
        ]
        if self.num_truncated:
            lines.append(f"{self.num_truncated} source(s) truncated to the translator's "
                         "max_source_length before translating")
        if self.hypotheses_path:
            lines.append(f"Hypotheses: {self.hypotheses_path}")
        return "\n".join(lines)


def bleu_scores(hypotheses, references, force=None):
    """Cased 13a sacreBLEU and lower-cased 13a sacreBLEU of a corpus.

    Args:
        hypotheses: List of translated strings.
        references: One item per hypothesis: its reference string, or a
            non-empty list of reference strings.
        force: sacreBLEU's `force`: True scores text that looks tokenized
            (lines ending in " .") without warning that it may be, False
            lets sacreBLEU warn when 100 hypotheses or more do. None (the
            default) warns only when the hypotheses end in " ." more often
            than the references: where the references do it as often, " ."
            is a word of the data (as in the synthetic task), not a sign of
            a detokenization step left out.

    Returns:
        `(cased, lowercase)`: two `sacrebleu` BLEU results (`.score` in 0-100),
        each with the signature of its metric as `.signature`.

    Example:

    >>> cased, lowercase = bleu_scores(["A man rides."], ["a man rides ."])
    >>> round(lowercase.score)
    100
    """
    from sacrebleu.metrics import BLEU

    _check_parallel(hypotheses, references, "hypotheses")
    per_sentence = [[r] if isinstance(r, str) else list(r) for r in references]
    if force is None:
        force = (sum(any(r.endswith(" .") for r in refs) for refs in per_sentence)
                 >= sum(h.endswith(" .") for h in hypotheses))
    # sacreBLEU takes one stream per reference; None fills the streams of
    # sentences with fewer references.
    streams = [[refs[k] if k < len(refs) else None for refs in per_sentence]
               for k in range(max(len(refs) for refs in per_sentence))]
    results = []
    for metric in (BLEU(tokenize="13a", force=force),
                   BLEU(tokenize="13a", lowercase=True, force=force)):
        result = metric.corpus_score(list(hypotheses), streams)
        result.signature = str(metric.get_signature())
        results.append(result)
    return tuple(results)


def evaluate(
    translator,
    sources,
    references,
    hypotheses_path=None,
    beam_size=4,
    alpha=0.6,
    batch_size=32,
    max_output_length=None,
    verbose=1,
    bleu_force=None,
):
    """Translates a test set, writes the hypotheses and scores them with BLEU.

    Args:
        translator: A `keras_transformer.inference.Translator`.
        sources: List of source sentences.
        references: One item per source: its reference translation, or a
            non-empty list of them (see `group_references`).
        hypotheses_path: File to write the translations to, one per line
            (UTF-8), or None not to write them. Parent folders are created.
        beam_size: Beam size (4 in §6.1).
        alpha: Length penalty α (0.6 in §6.1).
        batch_size: Sentences decoded together.
        max_output_length: Most output tokens per sentence; None means its source
            length + 50 (§6.1).
        verbose: 1 shows a progress bar while translating, 0 is silent.
        bleu_force: `force` of `bleu_scores` (text that looks tokenized; None
            warns only where the references do not look so too).

    Returns:
        An `EvaluationResult`; `print(result.summary())` shows it.

    docs/translation.md ("Evaluating") runs it on a translator of its own.
    """
    _check_parallel(sources, references, "sources")
    start = time.perf_counter()
    translations = translator.translate(
        list(sources), beam_size=beam_size, alpha=alpha, max_output_length=max_output_length,
        batch_size=batch_size, verbose=verbose,
    )
    seconds = time.perf_counter() - start
    # One hypothesis per line, whatever the detokenizer produced.
    hypotheses = [" ".join(result.text.splitlines()) for result in translations]

    if hypotheses_path is not None:
        # Written whole or not at all: a kill never leaves half a file.
        hypotheses_path = os.fspath(hypotheses_path)
        saving.write_text(hypotheses_path, "".join(text + "\n" for text in hypotheses))

    cased, lowercase = bleu_scores(hypotheses, references, force=bleu_force)
    num_tokens = int(sum(len(result.ids) for result in translations))
    per_second = 1.0 / max(seconds, 1e-9)
    return EvaluationResult(
        bleu=float(cased.score),
        bleu_lowercase=float(lowercase.score),
        bleu_signature=cased.signature,
        bleu_lowercase_signature=lowercase.signature,
        num_sentences=len(hypotheses),
        num_tokens=num_tokens,
        seconds=seconds,
        sentences_per_second=len(hypotheses) * per_second,
        tokens_per_second=num_tokens * per_second,
        hypotheses=hypotheses,
        hypotheses_path=hypotheses_path,
        num_truncated=sum(result.truncated for result in translations),
    )


def _check_parallel(first, references, name):
    for label, values in ((name, first), ("references", references)):
        if isinstance(values, str) or isinstance(values, np.ndarray) and values.ndim != 1:
            raise TypeError(
                f"{label} must be a list of strings (one sentence each), got "
                f"{type(values).__name__}: read a file with f.read().splitlines()."
            )
    if len(first) != len(references):
        raise ValueError(
            f"{len(first)} {name} but {len(references)} references: a test set needs "
            "exactly one reference per source sentence; check that both files have "
            "the same number of lines."
        )
    if not len(first):
        raise ValueError(f"{name} is empty: BLEU needs at least one sentence.")
    for i, reference in enumerate(references):
        if isinstance(reference, str):
            continue
        if not isinstance(reference, (list, tuple)):
            raise TypeError(
                f"references[{i}] is a {type(reference).__name__}: pass one reference "
                "string per sentence, or a list of reference strings."
            )
        if not reference:
            raise ValueError(f"references[{i}] is an empty list: a sentence needs at least "
                             "one reference.")
        for j, text in enumerate(reference):
            if not isinstance(text, str):
                raise TypeError(
                    f"references[{i}][{j}] is a {type(text).__name__}, not a str."
                )


def group_references(sources, references):
    """Merges test pairs that share a source into one source with all its references.

    Corpora such as Tatoeba list a sentence once per translation. Scored pair
    by pair, a translation that matches one reference counts as wrong against
    the others; grouped, each source is translated once and scored against all
    of its references.

    Args:
        sources: List of source sentences, possibly repeated.
        references: List of reference strings, one per source.

    Returns:
        `(unique_sources, grouped)`: the distinct sources in order of first
        appearance, and for each a list of its references (in order, repeats
        kept out).

    Example:

    >>> group_references(["Help!", "Run.", "Help!"], ["¡Ayuda!", "Corre.", "¡Auxilio!"])
    (['Help!', 'Run.'], [['¡Ayuda!', '¡Auxilio!'], ['Corre.']])
    """
    _check_parallel(sources, references, "sources")
    grouped = {}
    for source, reference in zip(sources, references):
        refs = grouped.setdefault(source, [])
        if reference not in refs:
            refs.append(reference)
    return list(grouped), list(grouped.values())
