"""§6.1 Machine Translation: from source text to translated text.

`Translator` joins a trained model and its tokenizer (or a source and a target
tokenizer for separate vocabularies): it tokenizes the sentences, appends the
end-of-sentence id (the encoder input, no BOS), sorts them by length so that
each batch holds sentences of similar length, searches batch by batch, and
detokenizes the best hypotheses (or the n best of each sentence) back into the
caller's order, one `Translation` per sentence. The model is a `Transformer`,
searched by `beam_search` and `sample_search`, or a CTranslate2 export
(`keras_transformer.inference.ctranslate2.CTranslate2Model`), searched by
CTranslate2 with the same settings and limits.

Tokenizers are duck-typed. They need the attributes `pad_id`, `bos_id`,
`eos_id` and `vocab_size`, `tokenize(list_of_str) -> list[list[int]]` (ids
without BOS or EOS) and `detokenize(list_of_id_lists) -> list[str]` (which
ignores special ids).
"""

import dataclasses
import warnings
from typing import Optional

import keras
import numpy as np

from keras_transformer import validation
from keras_transformer.inference.beam import beam_search
from keras_transformer.inference.limits import source_limit, source_width, truncate_source
from keras_transformer.inference.sampling import Sampling, sample_search
from keras_transformer.inference.search import check_model, check_search_options

__all__ = ["Hypothesis", "SourceTruncatedWarning", "Translation", "Translator"]

#: Why a CTranslate2 export gives no alignment.
NO_ALIGNMENT = ("CTranslate2 gives no alignment from our encoder-decoder attention: translate "
                "with the Keras model (its run directory or .keras file) for alignments.")
_TOKENIZER_ATTRIBUTES = ("pad_id", "bos_id", "eos_id", "vocab_size")
_TOKENIZER_METHODS = ("tokenize", "detokenize")


@dataclasses.dataclass(frozen=True)
class Hypothesis:
    """One output of the search for one sentence.

    Attributes:
        text: The detokenized translation.
        score: log P(Y | X) / lp(Y) for beam search (§6.1), log P(Y | X) for
            a sample.
        ids: The output ids, up to and including EOS when one was generated.
        alignment: With `return_alignment`, the source position of each
            output id (EOS left out); None otherwise.
    """

    text: str
    score: float
    ids: list
    alignment: Optional[list] = None


@dataclasses.dataclass(frozen=True)
class Translation:
    """What `Translator.translate` gives for one sentence.

    Attributes:
        hypotheses: `num_return` `Hypothesis`es, best first (in the order
            drawn when sampling).
        truncated: Whether the source was longer than `max_source_length`
            and was translated from its first tokens.

    The first hypothesis is "the" translation: `text`, `score`, `ids` and
    `alignment` are its own.
    """

    hypotheses: list
    truncated: bool = False

    @property
    def text(self):
        return self.hypotheses[0].text

    @property
    def score(self):
        return self.hypotheses[0].score

    @property
    def ids(self):
        return self.hypotheses[0].ids

    @property
    def alignment(self):
        return self.hypotheses[0].alignment


class SourceTruncatedWarning(UserWarning):
    """Some sentences were longer than `Translator.max_source_length` and were
    translated truncated to it (filter it with `warnings.simplefilter`)."""


class Translator:
    """Translates sentences with a trained Transformer and beam search (§6.1).

    Defined results at the edges, one result per sentence: a sentence that
    tokenizes to no ids (e.g. an empty string) translates to "" with score 0.0
    and no ids, without running the model. A sentence longer than
    `max_source_length` (ids + EOS) is truncated to its first tokens and EOS,
    translated, flagged (`Translation.truncated`) and named in a
    `SourceTruncatedWarning`; it never fails the other sentences. The
    exported SavedModel applies the same rule at its own limit, its longest
    compiled width (by default `config.max_length`; see
    `keras_transformer.export.shapes`).

    Args:
        model: A trained `keras_transformer.Transformer`, or a CTranslate2 export
            of one (`keras_transformer.inference.ctranslate2.CTranslate2Model`).
        tokenizer: The tokenizer the model was trained with (see the module
            docstring for the protocol); with `target_tokenizer`, the source
            side's. Its `pad_id` must be the model's `config.pad_id`.
        target_tokenizer: The target side's tokenizer for a model with
            separate vocabularies, or None when `tokenizer` serves both. It
            gives BOS and EOS to the decoder and detokenizes the output.
        max_source_length: The longest input (ids + EOS) before truncation;
            None means `model.config.max_length` for learned positions (the
            table has no more rows) and at least `SINUSOIDAL_SOURCE_LIMIT`
            (1024) for sinusoidal ones, which extend past the training length
            (§3.5). See `keras_transformer.inference.limits.source_limit`.

    Example, with an untrained model (its translations are noise):

    >>> import keras_transformer as kt
    >>> from keras_transformer.data.corpora import synthetic_translation
    >>> from keras_transformer.tokenizers import SubwordTokenizer
    >>> pairs = synthetic_translation(200)
    >>> tokenizer = SubwordTokenizer.train(pairs.sources + pairs.targets, vocab_size=120)
    >>> model = kt.Transformer(kt.TransformerConfig.tiny(vocab_size=tokenizer.vocab_size))
    >>> translator = Translator(model, tokenizer)
    >>> [result] = translator.translate(["kave tomi tozu"], max_output_length=6)
    >>> isinstance(result.text, str), len(result.ids) <= 6, result.truncated
    (True, True, False)
    >>> [len(t.hypotheses) for t in translator.translate(["kave tomi", ""], num_return=2,
    ...                                                  max_output_length=6)]  # n-best
    [2, 2]
    >>> translator.translate([""])[0].text, translator.translate([""])[0].score
    ('', 0.0)
    """

    def __init__(self, model, tokenizer, target_tokenizer=None, max_source_length=None):
        self._search = _search_of(model)
        config = model.config
        self._max_source_length = source_limit(config, max_source_length)
        self._search.max_source_length = self._max_source_length
        _check_tokenizer(tokenizer, config, "tokenizer", config.vocab_size)
        name = "tokenizer" if target_tokenizer is None else "target_tokenizer"
        if target_tokenizer is None:
            target_tokenizer = tokenizer
        _check_tokenizer(target_tokenizer, config, name, config.resolved_target_vocab_size)
        self._model = model
        self._tokenizer = tokenizer
        self._target_tokenizer = target_tokenizer

    @property
    def model(self):
        return self._model

    @property
    def engine(self):
        """The engine that searches: "keras" (`beam_search`, `sample_search`) or
        "ctranslate2" (a `CTranslate2Model`)."""
        return "ctranslate2" if isinstance(self._search, _CTranslate2Search) else "keras"

    @property
    def tokenizer(self):
        """The source side's tokenizer."""
        return self._tokenizer

    @property
    def target_tokenizer(self):
        """The target side's tokenizer (`tokenizer` for a shared vocabulary)."""
        return self._target_tokenizer

    @property
    def max_source_length(self):
        """Most tokens of a sentence (its ids plus EOS) decoded; longer
        sentences are truncated."""
        return self._max_source_length

    def source_ids(self, sentences, return_truncated=False):
        """Tokenizes sentences into encoder inputs: ids + [eos_id] each.

        An input longer than `max_source_length` keeps its first
        `max_source_length - 1` ids, then EOS, with a warning.

        Args:
            sentences: A list of strings.
            return_truncated: Whether to also return a list of bools, true
                for each truncated sentence.

        Returns:
            A list of int id lists, [] for a sentence without tokens (and the
            flags with `return_truncated`).
        """
        sentences = _check_sentences(sentences)
        tokenized = self._tokenizer.tokenize(sentences)
        if len(tokenized) != len(sentences):
            raise ValueError(
                f"tokenizer.tokenize returned {len(tokenized)} id lists for "
                f"{len(sentences)} sentences: it must return one list per sentence."
            )
        eos_id = self._tokenizer.eos_id
        sources = [[int(i) for i in ids] + [eos_id] if len(ids) else [] for ids in tokenized]
        cut = [truncate_source(ids, self.max_source_length, eos_id) for ids in sources]
        sources = [ids for ids, _ in cut]
        truncated = [flag for _, flag in cut]
        if any(truncated):
            first = truncated.index(True)
            warnings.warn(
                f"{sum(truncated)} of {len(sources)} sentence(s) are longer than "
                f"max_source_length={self.max_source_length} (tokens + EOS) and were truncated "
                f"to it, the first being sentence {first} "
                f"({len(tokenized[first])} tokens + EOS). Split long sentences, or give "
                "Translator a larger max_source_length where the model's positions allow.",
                SourceTruncatedWarning,
                stacklevel=3,
            )
        return (sources, truncated) if return_truncated else sources

    def translate(
        self,
        sentences,
        beam_size=4,
        alpha=0.6,
        max_output_length=None,
        batch_size=32,
        num_return=1,
        sampling=None,
        stream_ids=None,
        return_alignment=False,
        verbose=0,
    ):
        """Translates a list of sentences.

        Args:
            sentences: A list of source strings.
            beam_size: Beam size (4 in §6.1). `beam_size=1, alpha=0` is greedy
                decoding.
            alpha: Length penalty α (0.6 in §6.1).
            max_output_length: Most output tokens per sentence; None means its
                source length + 50 (§6.1).
            batch_size: Sentences decoded together.
            num_return: Hypotheses per sentence (an n-best list), from 1 to
                `beam_size`; with `sampling`, samples per sentence.
            sampling: None for beam search, or a `Sampling` to draw each
                token instead (`sample_search`; `beam_size` and `alpha` are
                then unused, and scores are log P(Y | X)).
            stream_ids: With `sampling`, one int per sentence naming its
                random stream; None numbers the sentences 0, 1, ... as
                given. A sentence's samples depend on its seed and stream id
                alone, not on `batch_size` or the other sentences.
            return_alignment: Whether to fill each hypothesis's `alignment`:
                the source position of each of its output ids (EOS left
                out), the source token, counted from 0 in
                `tokenizer.tokenize`'s ids, of highest encoder-decoder
                attention in the last decoder block, averaged over heads
                (fairseq's `--print-alignment`).
            verbose: 1 shows a progress bar, 0 is silent.

        Returns:
            A list of `Translation`s, one per sentence, in the order of
            `sentences`: each holds `num_return` `Hypothesis`es (best first,
            or in the order drawn with `sampling`) and whether the source
            was truncated; `translation.text` is the first hypothesis's text.
            An empty sentence gives hypotheses `("", 0.0)` without ids; a
            hypothesis the search could not fill (only with a vocabulary of
            very few tokens) is `("", -inf)`.
        """
        validation.check_positive_int("batch_size", batch_size)
        _check_search(sampling, beam_size, alpha, max_output_length, num_return)
        sources, truncated = self.source_ids(sentences, return_truncated=True)
        count = len(sources)
        if stream_ids is None:
            stream_ids = range(count)
        elif len(stream_ids) != count:
            raise ValueError(f"stream_ids has {len(stream_ids)} ids for {count} sentences: "
                             "give one per sentence.")
        options = dict(beam_size=beam_size, alpha=alpha, max_output_length=max_output_length,
                       num_return=num_return, sampling=sampling,
                       return_alignment=return_alignment)
        # num_return hypotheses per sentence: (ids, score, alignment) each; an empty
        # sentence needs no search.
        found = [[([], 0.0, [] if return_alignment else None)] * num_return
                 for _ in range(count)]
        # Longest first, so a batch holds similar lengths and little padding.
        order = sorted((i for i in range(count) if sources[i]), key=lambda i: -len(sources[i]))
        progress = keras.utils.Progbar(count, unit_name="sentence") if verbose and count else None
        done = count - len(order)
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            hypotheses = self._search([sources[i] for i in rows], self._target_tokenizer,
                                      stream_ids=[stream_ids[i] for i in rows], **options)
            for row, row_hypotheses in zip(rows, hypotheses):
                found[row] = row_hypotheses
            done += len(rows)
            if progress is not None:
                progress.update(done)
        if progress is not None and not order:
            progress.update(count)
        return self._translations(found, truncated)

    def _translations(self, found, truncated):
        """One `Translation` per sentence, its hypotheses detokenized."""
        eos_id = self._target_tokenizer.eos_id
        texts = iter(self._target_tokenizer.detokenize(
            [[t for t in ids if t != eos_id] for row in found for ids, _, _ in row]))
        return [Translation([Hypothesis(str(next(texts)), score, ids, alignment)
                             for ids, score, alignment in row], cut)
                for row, cut in zip(found, truncated)]


def _check_search(sampling, beam_size, alpha, max_output_length, num_return):
    if sampling is None:
        check_search_options(beam_size, alpha, max_output_length, num_return)
    elif not isinstance(sampling, Sampling):
        raise TypeError(f"sampling must be a Sampling (e.g. Sampling(top_p=0.9, seed=1)) "
                        f"or None for beam search, got {type(sampling).__name__}.")
    else:
        check_search_options(max_output_length=max_output_length)
        validation.check_positive_int("num_return", num_return)


def _search_of(model):
    """The search of `Translator`'s model: `search(sources, target_tokenizer,
    stream_ids, beam_size, alpha, max_output_length, num_return, sampling,
    return_alignment)`, giving each source's `num_return` (ids, score,
    alignment) hypotheses."""
    # A CTranslate2 model says so (the program's `CTranslate2Model`, which this
    # library does not import: its loader reads run directories).
    if getattr(model, "engine", None) == "ctranslate2":
        return _CTranslate2Search(model)
    check_model(model)
    return _KerasSearch(model)


class _KerasSearch:
    """`beam_search` and `sample_search` of a `Transformer`, on batches padded to a
    width of `source_width` (no more than `max_source_length`, the translator's)."""

    def __init__(self, model):
        self.model = model
        self.max_source_length = source_limit(model.config)

    def __call__(self, sources, target_tokenizer, stream_ids, beam_size, alpha,
                 max_output_length, num_return, sampling, return_alignment):
        options = dict(max_output_length=max_output_length, num_return=num_return,
                       return_alignment=return_alignment)
        if sampling is None:
            search = beam_search
            options.update(beam_size=beam_size, alpha=alpha)
        else:
            search = sample_search
            options.update(dataclasses.asdict(sampling), stream_ids=stream_ids)
        pad_id, eos_id = self.model.config.pad_id, target_tokenizer.eos_id
        ids, scores, *positions = search(self.model, self._pad(sources, pad_id),
                                         target_tokenizer.bos_id, eos_id, **options)
        ids = ids.reshape(len(sources), num_return, ids.shape[-1])
        scores = scores.reshape(len(sources), num_return)
        positions = positions[0].reshape(ids.shape) if return_alignment else None
        return [[([int(t) for t in ids[row, k] if t != pad_id], float(scores[row, k]),
                  None if positions is None else
                  [int(p) for t, p in zip(ids[row, k], positions[row, k])
                   if t not in (pad_id, eos_id)])
                 for k in range(num_return)]
                for row in range(len(sources))]

    def _pad(self, sources, pad_id):
        """(batch, width) int32 matrix, of the width `source_width` gives."""
        width = source_width(max(len(ids) for ids in sources), self.max_source_length)
        matrix = np.full((len(sources), width), pad_id, "int32")
        for row, ids in enumerate(sources):
            matrix[row, : len(ids)] = ids
        return matrix


class _CTranslate2Search:
    """The same search by CTranslate2 (`CTranslate2Model.search`)."""

    def __init__(self, model):
        self.model = model
        self.max_source_length = source_limit(model.config)

    def __call__(self, sources, target_tokenizer, stream_ids, beam_size, alpha,
                 max_output_length, num_return, sampling, return_alignment):
        if return_alignment:
            raise ValueError(NO_ALIGNMENT)
        if sampling is not None:
            sampling = (sampling.temperature, sampling.top_k, sampling.top_p, sampling.seed)
        found = self.model.search(sources, target_tokenizer.bos_id, target_tokenizer.eos_id,
                                  beam_size=beam_size, alpha=alpha,
                                  max_output_length=max_output_length, num_return=num_return,
                                  sampling=sampling, stream_ids=stream_ids)
        return [[(ids, score, None) for ids, score in row] for row in found]


def _check_sentences(sentences):
    if isinstance(sentences, str):
        raise TypeError(
            "translate() takes a list of strings, got one str: wrap it in a list, "
            "e.g. translator.translate([sentence])."
        )
    try:
        sentences = list(sentences)
    except TypeError:
        raise TypeError(
            f"sentences must be a list of strings, got {type(sentences).__name__}."
        ) from None
    for i, sentence in enumerate(sentences):
        if not isinstance(sentence, str):
            raise TypeError(
                f"sentences[{i}] is a {type(sentence).__name__}, not a str: pass text, "
                "not token ids (use beam_search for ids)."
            )
    return sentences


def _check_tokenizer(tokenizer, config, name, model_vocab_size):
    missing = [name for name in _TOKENIZER_ATTRIBUTES if not hasattr(tokenizer, name)]
    missing += [name + "()" for name in _TOKENIZER_METHODS
                if not callable(getattr(tokenizer, name, None))]
    if missing:
        raise TypeError(
            f"{name} ({type(tokenizer).__name__}) is not a tokenizer Translator can use: it lacks "
            f"{', '.join(missing)}. A tokenizer needs {', '.join(_TOKENIZER_ATTRIBUTES)}, "
            "tokenize(list_of_str) -> list of id lists and detokenize(list of id lists) "
            "-> list_of_str."
        )
    if tokenizer.pad_id != config.pad_id:
        raise ValueError(
            f"{name}.pad_id={tokenizer.pad_id} but the model pads with "
            f"config.pad_id={config.pad_id}: use the tokenizer the model was trained with."
        )
    if tokenizer.vocab_size > model_vocab_size:
        raise ValueError(
            f"{name}.vocab_size={tokenizer.vocab_size} exceeds the model's vocabulary "
            f"({model_vocab_size} ids): use the tokenizer the model was trained with."
        )
    for special in ("bos_id", "eos_id"):
        value = getattr(tokenizer, special)
        if not 0 <= value < tokenizer.vocab_size:
            raise ValueError(
                f"{name}.{special}={value} is outside its vocabulary "
                f"(0 <= id < {tokenizer.vocab_size})."
            )
