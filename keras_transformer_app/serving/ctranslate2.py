"""A servable of a CTranslate2 export: the same signatures, answers and warm-up (§6.1 search).

`CTranslate2Servable` loads a version written by `keras-transformer export
--format ctranslate2` (`keras_transformer.export.ctranslate2`) and answers the
signatures of a SavedModel version (`servable.Servable`) with the same JSON:
`serving_default` and `translate_n_best` tokenize the sentences with the export's
tokenizer, truncate those over `max_source_tokens` (flagged `truncated`) and run
the export's search (beam size, α, n-best and length limits from its settings)
through `Translator` over `CTranslate2Model`; `translate_ids` runs the same
search on id lists. A client cannot tell the engines apart but by speed.

Warm-up replays the export's warm-up requests (`serving_default` at each of its
batch sizes up to the server's `max_batch_size`, then `translate_ids`, and
`translate_n_best` when the export has it) before the version is AVAILABLE:
CTranslate2 compiles nothing, but its first call of a size allocates what later
calls reuse.
"""

import concurrent.futures
import os
import threading
import time
import warnings

import numpy as np

from keras_transformer.inference.limits import truncate_source
from keras_transformer.inference.translator import SourceTruncatedWarning, Translator
from keras_transformer_app.serving.servable import N_BEST_SIGNATURE, SIGNATURES


class CTranslate2Servable:
    """One loaded version of a CTranslate2 export, with `Servable`'s attributes.

    Args:
        version_path: A version folder (`ct2_models/NAME/VERSION`).
        max_instances: Most instances per request.
        max_chars: Most characters per sentence (ids per id list).
        compute_type: CTranslate2's compute type ("default": the weights' own).
        intra_threads: CTranslate2's threads per call (0: its own choice).
        inter_threads: Calls CTranslate2 runs at once (the batch threads).
    """

    engine = "ctranslate2"

    def __init__(self, version_path, max_instances, max_chars, compute_type="default",
                 intra_threads=0, inter_threads=1):
        from keras_transformer.inference.ctranslate2 import load_ctranslate2

        model, source_tokenizer, target_tokenizer = load_ctranslate2(
            version_path, compute_type, intra_threads, inter_threads)
        self.version_path = version_path
        self.version = int(os.path.basename(os.path.normpath(version_path)))
        self.metadata = model.settings
        if "max_source_tokens" not in self.metadata:
            raise ValueError(f"{version_path!r} holds no search settings: export it with "
                             "`keras-transformer export MODEL BASE --format ctranslate2`.")
        self.signatures = SIGNATURES + ((N_BEST_SIGNATURE,) if "n_best" in self.metadata
                                        else ())
        self.max_instances = max_instances
        self.max_chars = max_chars
        self.vocab_size = self.metadata["config"]["vocab_size"]
        self.pad_id = self.metadata["pad_id"]
        self.shapes = None
        self.warmup_seconds = None
        self._model = model
        self._eos_id = source_tokenizer.eos_id
        self._target_tokenizer = target_tokenizer
        self._translator = Translator(model, source_tokenizer, target_tokenizer,
                                      max_source_length=self.metadata["max_source_tokens"] + 1)
        self._search = dict(beam_size=self.metadata["beam_size"], alpha=self.metadata["alpha"],
                            max_output_length=self.metadata["max_output_length"])

    def warm_up(self, threads=1, max_batch_size=None, on_progress=None):
        """Runs the export's warm-up requests (those of at most `max_batch_size`
        instances, when given); returns their number. `on_progress(done, total)`
        follows them."""
        requests = self.warmup_requests(max_batch_size)
        done, lock = [0], threading.Lock()
        start = time.perf_counter()

        def run(request):
            self.run(*request)
            if on_progress is not None:
                with lock:
                    done[0] += 1
                    on_progress(done[0], len(requests))

        with concurrent.futures.ThreadPoolExecutor(max(1, threads)) as pool:
            for _ in pool.map(run, requests):
                pass
        self.warmup_seconds = time.perf_counter() - start
        return len(requests)

    def warmup_requests(self, max_batch_size=None):
        """The warm-up requests, as (signature, instances), largest first."""
        warmup = self.metadata["warmup"]
        sizes = [size for size in sorted(warmup["batch_sizes"], reverse=True)
                 if max_batch_size is None or size <= max_batch_size]
        sentence = warmup["sentence"]
        requests = [("serving_default", [sentence] * size) for size in sizes]
        requests.append(("translate_ids", [self._translator.source_ids([sentence])[0]]))
        if N_BEST_SIGNATURE in self.signatures:
            requests.append((N_BEST_SIGNATURE, [sentence]))
        return requests

    def run(self, signature, instances):
        """Runs `signature` on a list of checked instances; returns one JSON-ready
        result per instance, as `Servable.run` does."""
        if signature == "translate_ids":
            return self._run_ids(instances)
        num_return = self.metadata["n_best"] if signature == N_BEST_SIGNATURE else 1
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SourceTruncatedWarning)  # flagged per sentence
            translations = self._translator.translate(
                instances, batch_size=len(instances), num_return=num_return, **self._search)
        if signature == N_BEST_SIGNATURE:
            return [{"translations": [hypothesis.text for hypothesis in result.hypotheses],
                     "scores": [_float32(hypothesis.score) for hypothesis in result.hypotheses],
                     "truncated": result.truncated} for result in translations]
        return [{"translations": result.text, "truncated": result.truncated}
                for result in translations]

    def _run_ids(self, instances):
        """translate_ids: padding left out, truncated as the text signatures do."""
        limit = self._translator.max_source_length
        cut = [truncate_source([t for t in row if t != self.pad_id], limit, self._eos_id)
               for row in instances]
        rows = [row for row, (ids, _) in enumerate(cut) if ids]
        results = [{"ids": [], "scores": 0.0, "truncated": flag} for _, flag in cut]
        if rows:
            found = self._model.search(
                [cut[row][0] for row in rows], self._target_tokenizer.bos_id,
                self._target_tokenizer.eos_id, **self._search)
            for row, [(ids, score)] in zip(rows, found):
                results[row] = {"ids": ids, "scores": _float32(score), "truncated": cut[row][1]}
        return results


def _float32(score):
    """A score as a SavedModel answers it: a float32, in JSON."""
    return float(np.float32(score))
