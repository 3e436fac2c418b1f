"""§6.1 decoding by CTranslate2 (OpenNMT's C++ engine), behind the same `Translator`.

A CTranslate2 export (`keras-transformer export --format ctranslate2`,
`keras_transformer.export.ctranslate2`) is a version folder (`ct2_models/NAME/1/`)
holding `model.bin`, `config.json`, the vocabularies as token strings, the
tokenizer(s) the model was trained with and `keras_transformer.json`, the
export's settings. `CTranslate2Model` loads one and decodes as our searches do,
so that `Translator(CTranslate2Model(path), tokenizer)` answers like
`Translator(model, tokenizer)`; `load_ctranslate2` loads the model and its
tokenizers from a version folder or from the export base (its highest version):

* the same limits: no minimum length, at most each source's tokens + EOS + 50
  output tokens (§6.1) or `max_output_length`; CTranslate2 takes one limit per
  call, so the sentences of a batch are decoded in groups of equal limits;
* greedy search (a beam of one, α = 0) gives our ids; beam search keeps
  CTranslate2's own beam, normalized by |Y|^α while it runs, and ranks the
  `beam_size` hypotheses it finishes by §6.1's log P(Y | X) / ((5 + |Y|) / 6)^α,
  the score our beam search ranks by (CTranslate2's score is log P(Y | X) /
  |Y|^α with |Y| counting EOS, checked against its `score_batch`). At α = 0 the
  two searches are the same search; at α > 0 a sentence can get another
  hypothesis when the best of ours is not among CTranslate2's finished ones;
* sampling (top-k, top-p, temperature) is CTranslate2's: its worker threads seed
  their random generators once, when the model loads, so neither `Sampling.seed`
  nor the stream ids reproduce a sentence's samples as they do ours; the first
  sampling call says so (`UnseededSamplesWarning`);
* scores are log P(Y | X) (divided by the length penalty in beam search), where
  CTranslate2 leaves padding and BOS out of the softmax and ours sets them to
  -inf after it: the same ids, scores that differ in the last digits.

What CTranslate2 cannot do is an error, not a silent difference: alignments
(CTranslate2 does not give our last block's encoder-decoder attention).
CTranslate2's compute type (`int8`, `int8_float32`, `float32`, ...; "default"
keeps the weights' own) and its threads are options.
"""

import json
import os
import warnings

from keras_transformer import validation
from keras_transformer.config import TransformerConfig
from keras_transformer.inference.limits import LENGTH_OFFSET

#: The export's settings, beside CTranslate2's own files.
SETTINGS_FILE = "keras_transformer.json"
#: The settings' format (version 2: a versioned export with its tokenizers).
SETTINGS_FORMAT = "keras_transformer.ctranslate2/2"
#: CTranslate2's compute types ("default": the type the weights were saved in).
COMPUTE_TYPES = ("default", "auto", "int8", "int8_float32", "int8_float16", "int8_bfloat16",
                 "int16", "float16", "bfloat16", "float32")
_FILES = ("model.bin", "config.json", SETTINGS_FILE)
#: What sampling by CTranslate2 cannot do.
UNSEEDED_SAMPLES = (
    "CTranslate2 draws its own samples: its threads seed their random generators when the "
    "model loads, so the seed and stream ids do not reproduce a sentence's samples (sample "
    "with the Keras model for reproducible draws).")


class UnseededSamplesWarning(UserWarning):
    """Samples drawn by CTranslate2 do not follow `Sampling.seed` (see the module)."""


def is_ctranslate2_export(path):
    """Whether `path` is a folder holding a CTranslate2 export of ours."""
    return all(os.path.isfile(os.path.join(path, name)) for name in _FILES)


def export_version(path):
    """The CTranslate2 version folder `path` names: itself, or the highest version
    of an export base; None when `path` holds no CTranslate2 export there."""
    if is_ctranslate2_export(path):
        return path
    if not os.path.isdir(path):
        return None
    numbered = sorted((int(name) for name in os.listdir(path)
                       if name.isdigit() and os.path.isdir(os.path.join(path, name))),
                      reverse=True)
    if numbered and is_ctranslate2_export(os.path.join(path, str(numbered[0]))):
        return os.path.join(path, str(numbered[0]))
    return None


def load_ctranslate2(path, compute_type="default", intra_threads=0, inter_threads=1):
    """(model, source tokenizer, target tokenizer) of a CTranslate2 export: a version
    folder, or an export base (its highest version). The model is a
    `CTranslate2Model` (arguments as there) for `Translator`.

    Raises:
        FileNotFoundError: when `path` holds no CTranslate2 export with its tokenizers.
    """
    from keras_transformer import saving

    version_path = export_version(path)
    if version_path is None:
        raise FileNotFoundError(
            f"{path!r} is not a CTranslate2 export: it needs {', '.join(_FILES)} (in itself "
            "or in its highest version folder), as `keras-transformer export MODEL BASE "
            "--format ctranslate2` writes them.")
    model = CTranslate2Model(version_path, compute_type, intra_threads, inter_threads)
    source_tokenizer, target_tokenizer = saving.load_tokenizers(version_path)
    return model, source_tokenizer, target_tokenizer


def read_settings(path):
    """The settings an export wrote beside CTranslate2's files."""
    settings_path = os.path.join(path, SETTINGS_FILE)
    if not os.path.isfile(settings_path):
        raise FileNotFoundError(f"{path!r} holds no {SETTINGS_FILE}: it is not a CTranslate2 "
                                "export of keras-transformer.")
    with open(settings_path, encoding="utf-8") as file:
        return json.load(file)


def import_ctranslate2():
    """The `ctranslate2` module, or an ImportError that says how to install it."""
    try:
        import ctranslate2
    except ImportError as error:
        raise ImportError(
            f"CTranslate2 models need the ctranslate2 package ({error}): install it with "
            "`pip install ctranslate2` or `pip install keras-transformer[serving]`."
        ) from error
    return ctranslate2


class CTranslate2Model:
    """A CTranslate2 export, searched as our searches search (see the module).

    Args:
        path: The export's folder (a version folder of `ct2_models/NAME/`).
        compute_type: One of `COMPUTE_TYPES`; "default" keeps the type the
            weights were exported in (`export --quantization`).
        intra_threads: Threads of one translation (0: CTranslate2's choice).
        inter_threads: Translations run at once (callers from several threads,
            a server's batch threads).

    Attributes:
        engine: "ctranslate2", by which `Translator` knows it.
        config: The model's `TransformerConfig` (its limits and special ids).
        settings: The export's settings (`keras_transformer.json`).
    """

    engine = "ctranslate2"

    def __init__(self, path, compute_type="default", intra_threads=0, inter_threads=1):
        validation.check_choice("compute_type", compute_type, COMPUTE_TYPES)
        validation.check_non_negative_int("intra_threads", intra_threads)
        validation.check_positive_int("inter_threads", inter_threads)
        if not is_ctranslate2_export(path):
            raise FileNotFoundError(
                f"{path!r} is not a CTranslate2 export: it needs {', '.join(_FILES)} "
                "(keras-transformer export MODEL BASE --format ctranslate2 writes them).")
        ctranslate2 = import_ctranslate2()
        self.path = path
        self.settings = read_settings(path)
        self.config = TransformerConfig.from_dict(self.settings["config"])
        self.compute_type = compute_type
        self._translator = ctranslate2.Translator(
            path, device="cpu", compute_type=compute_type, intra_threads=intra_threads,
            inter_threads=inter_threads)
        self._ctranslate2 = ctranslate2
        self._source_tokens, self._target_tokens = _vocabularies(path)
        self._target_ids = {token: i for i, token in enumerate(self._target_tokens)}
        with open(os.path.join(path, "config.json"), encoding="utf-8") as file:
            self._eos_token = json.load(file).get("eos_token")
        self._warned_unseeded = False

    def search(self, sources, bos_id, eos_id, beam_size=4, alpha=0.6, max_output_length=None,
               num_return=1, sampling=None, stream_ids=None):
        """The hypotheses of each source, as our searches give them.

        Args:
            sources: A list of encoder inputs, each a list of ids ending in EOS.
            bos_id, eos_id: The target's special ids (the export's own).
            beam_size, alpha, max_output_length, num_return: As in `beam_search`.
            sampling: None, or `(temperature, top_k, top_p, seed)` to sample.
            stream_ids: Unused: CTranslate2 draws from its own streams (the module).

        Returns:
            For each source, `num_return` `(ids, score)` pairs, best first (in the
            order drawn when sampling): ids after BOS up to and including EOS.
        """
        # CTranslate2 appends EOS itself (the export's add_source_eos).
        tokens = [[self._source_tokens[i] for i in ids] for ids in sources]
        tokens = [sentence[:-1] if sentence and sentence[-1] == self._eos_token else sentence
                  for sentence in tokens]
        limits = [max_output_length or len(ids) + LENGTH_OFFSET for ids in sources]
        if sampling is not None:
            return self._sample(tokens, limits, num_return, sampling)
        # CTranslate2's beam search normalizes by |Y|^α while it runs, which steers it
        # to the lengths ours prefers; a beam of one is greedy search either way.
        normalization = alpha if beam_size > 1 else 0.0
        found = [None] * len(sources)
        for rows, results in self._calls(tokens, limits, beam_size=beam_size,
                                         num_hypotheses=beam_size,
                                         length_penalty=normalization):
            for row, result in zip(rows, results):
                found[row] = self._ranked(result, alpha, num_return, normalization)
        return found

    def _calls(self, tokens, limits, **options):
        """`translate_batch` of every row in one call, at the longest of their output
        limits (CTranslate2 takes one limit per call; §6.1's is each input's length +
        `LENGTH_OFFSET`). A row whose hypotheses reach its own limit in that call is
        searched again alone at its limit, so that a sentence translates as it does by
        itself (a search that ends before a row's limit never meets it). Yields
        (rows, results)."""
        longest = max(limits)
        results = self._translator.translate_batch(tokens, **options, **self._limits(longest))
        again = {row for row, result in enumerate(results) if limits[row] < longest and (
            not result.hypotheses
            or max(len(hypothesis) for hypothesis in result.hypotheses) >= limits[row])}
        kept = [row for row in range(len(tokens)) if row not in again]
        yield kept, [results[row] for row in kept]
        for row in sorted(again):
            yield [row], self._translator.translate_batch(
                [tokens[row]], **options, **self._limits(limits[row]))

    def _limits(self, limit):
        return dict(max_decoding_length=limit, min_decoding_length=0, max_input_length=0,
                    return_end_token=True, return_scores=True)

    def _ranked(self, result, alpha, num_return, normalization=0.0):
        """The `num_return` best of CTranslate2's hypotheses by §6.1's score, log P(Y | X)
        / ((5 + |Y|) / 6)^α; CTranslate2's scores are log P / |Y|^`normalization`."""
        hypotheses = []
        for tokens, score in zip(result.hypotheses, result.scores):
            ids = [self._target_ids[token] for token in tokens]
            log_prob = score * len(ids) ** normalization
            hypotheses.append((ids, log_prob / ((5 + len(ids)) / 6) ** alpha))  # §6.1
        hypotheses.sort(key=lambda hypothesis: -hypothesis[1])
        while len(hypotheses) < num_return:  # a vocabulary of very few tokens
            hypotheses.append(([], float("-inf")))
        return hypotheses[:num_return]

    def _sample(self, tokens, limits, num_return, sampling):
        """`num_return` samples of each sentence, drawn by CTranslate2 in one call per
        output limit (each sentence repeated `num_return` times)."""
        temperature, top_k, top_p, _ = sampling
        if not self._warned_unseeded:
            self._warned_unseeded = True
            warnings.warn(UNSEEDED_SAMPLES, UnseededSamplesWarning, stacklevel=4)
        count = len(tokens)
        found = [[] for _ in range(count)]
        repeated = [row for row in range(count) for _ in range(num_return)]
        for rows, results in self._calls(
                [tokens[row] for row in repeated], [limits[row] for row in repeated],
                beam_size=1, sampling_temperature=temperature,
                sampling_topk=top_k or len(self._target_tokens), sampling_topp=top_p):
            for row, result in zip(rows, results):
                found[repeated[row]].append(self._ranked(result, 0.0, 1)[0])
        return found


def _vocabularies(path):
    """(source tokens, target tokens): the token string of each id, as the export
    wrote them (one shared vocabulary, or one per side)."""
    def tokens(name):
        with open(os.path.join(path, name), encoding="utf-8") as file:
            return json.load(file)

    if os.path.isfile(os.path.join(path, "shared_vocabulary.json")):
        shared = tokens("shared_vocabulary.json")
        return shared, shared
    return tokens("source_vocabulary.json"), tokens("target_vocabulary.json")
