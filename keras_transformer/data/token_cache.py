"""§5.1 Training Data, tokenized once: a corpus's ids as compact arrays, cached on disk.

4.5 million pairs at about 30 subword ids a side are some 270 million ids: over 8 GB
as Python ints in lists, about 540 MB as `uint16`. `TokenizedPairs` holds a corpus's
ids that way, one flat array per side with the offsets of its rows, and is what the
§5.1 batches are cut from (`keras_transformer.data.pipeline.dataset_from_pairs`).

`tokenize_pairs` tokenizes a corpus chunk by chunk (SentencePiece on every core), with
a progress bar and its rate. `cached_pairs` keeps the result in a folder of the run
directory: the arrays, memory-mapped when read back, and `manifest.json`, which names
the tokenizers' and the corpus's fingerprints. A resumed run, a rerun and every
process of a cluster read the cache instead of tokenizing again; a cache made from
another tokenizer or another corpus is refused, never used. The folder is written
under a hidden name and renamed when complete, so a killed tokenization leaves
nothing a later run would trust.
"""

import dataclasses
import itertools
import json
import os
import time

import numpy as np

from keras_transformer import saving
from keras_transformer.data.corpus_files import corpus_size

MANIFEST = "manifest.json"
_FORMAT = "keras_transformer.token_cache/1"
_SIDES = ("source", "target")


@dataclasses.dataclass
class TokenizedPairs:
    """The ids of a corpus's pairs (no BOS or EOS), side by side.

    Attributes:
        source_ids, target_ids: The ids of every row, concatenated (uint16 when
            every id fits, else uint32; memory-mapped when read from a cache).
        source_offsets, target_offsets: int64, one more than the rows: row i is
            `ids[offsets[i]:offsets[i + 1]]`.
    """

    source_ids: np.ndarray
    source_offsets: np.ndarray
    target_ids: np.ndarray
    target_offsets: np.ndarray

    def __len__(self):
        return len(self.source_offsets) - 1

    def lengths(self, side):
        """The number of ids of every row of `side` ("source" or "target")."""
        return np.diff(getattr(self, f"{side}_offsets"))

    def row(self, side, index):
        """The ids of one row, as a list of ints."""
        offsets = getattr(self, f"{side}_offsets")
        ids = getattr(self, f"{side}_ids")
        return [int(i) for i in ids[offsets[index]:offsets[index + 1]]]

    @classmethod
    def from_lists(cls, source_rows, target_rows):
        """From two aligned lists of id lists (uint16 when every id fits it)."""
        return cls(*_flat(source_rows), *_flat(target_rows))

    @classmethod
    def concatenate(cls, parts):
        """One `TokenizedPairs` of several, in order."""
        values = {}
        for side in _SIDES:
            ids = [getattr(part, f"{side}_ids") for part in parts]
            lengths = [np.diff(getattr(part, f"{side}_offsets")) for part in parts]
            values[f"{side}_ids"] = np.concatenate(ids)
            values[f"{side}_offsets"] = _offsets(np.concatenate(lengths))
        return cls(**values)


def tokenize_pairs(corpus, source_tokenizer, target_tokenizer, verbose=False):
    """A corpus (`ParallelCorpus` or a streamed one, `data.corpus_files`) tokenized
    into `TokenizedPairs`, chunk by chunk, with a progress bar and its rate when
    `verbose`."""
    if not hasattr(corpus, "chunks"):  # a ParallelCorpus: in memory already
        return TokenizedPairs.from_lists(source_tokenizer.tokenize(list(corpus.sources)),
                                         target_tokenizer.tokenize(list(corpus.targets)))
    total = corpus_size(corpus)
    progress = None
    if verbose:
        import keras

        print(f"Data: tokenizing {total:,} pairs of {corpus.describe()}")
        progress = keras.utils.Progbar(total, unit_name="pair")
    parts, done, start = [], 0, time.perf_counter()
    for sources, targets in corpus.chunks():
        parts.append(TokenizedPairs.from_lists(source_tokenizer.tokenize(sources),
                                               target_tokenizer.tokenize(targets)))
        done += len(sources)
        if progress is not None:
            progress.update(done)
    if verbose:
        seconds = time.perf_counter() - start
        print(f"Data: tokenized {done:,} pairs in {seconds:.0f} s "
              f"({done / max(seconds, 1e-9):,.0f} pairs/s)")
    if not parts:
        return TokenizedPairs.from_lists([], [])
    return TokenizedPairs.concatenate(parts)


def fingerprint(tokenizer):
    """A tokenizer's identity: its own `fingerprint()`, or None when it has none
    (such a tokenizer's ids are never cached)."""
    method = getattr(tokenizer, "fingerprint", None)
    return method() if callable(method) else None


def cached_pairs(folder, corpus, source_tokenizer, target_tokenizer, verbose=False):
    """The corpus's `TokenizedPairs`, read from `folder` when it holds them, else
    tokenized and written there (atomically).

    Raises:
        ValueError: `folder` holds the ids of another corpus or tokenizer.
    """
    expected = {"format": _FORMAT, "corpus": corpus.fingerprint(),
                "tokenizers": [fingerprint(source_tokenizer), fingerprint(target_tokenizer)]}
    manifest = saving.read_json(os.path.join(folder, MANIFEST))
    if manifest is not None:
        _check_manifest(folder, manifest, expected)
        if verbose:
            print(f"Data: reading the {manifest['pairs']:,} tokenized pairs cached in {folder}")
        return read_pairs(folder, manifest)
    write_pairs(folder, tokenize_pairs(corpus, source_tokenizer, target_tokenizer, verbose),
                expected)
    if verbose:
        print(f"Data: cached the ids in {folder}")
    # Read back memory-mapped: the arrays made in memory are freed.
    return read_pairs(folder, saving.read_json(os.path.join(folder, MANIFEST)))


def write_pairs(folder, pairs, manifest):
    """Writes `pairs` and `manifest` (with the arrays' layout added) to `folder`,
    under a hidden name renamed when complete."""
    os.makedirs(os.path.dirname(os.path.abspath(folder)), exist_ok=True)
    saving.remove_partials(os.path.dirname(os.path.abspath(folder)))
    with saving.atomic_path(folder) as partial:
        os.makedirs(partial)
        for side in _SIDES:
            for kind in ("ids", "offsets"):
                np.save(os.path.join(partial, f"{side}_{kind}.npy"),
                        getattr(pairs, f"{side}_{kind}"))
        layout = dict(manifest, pairs=len(pairs), dtype=np.dtype(pairs.source_ids.dtype).name,
                      ids={side: int(len(getattr(pairs, f"{side}_ids"))) for side in _SIDES})
        with open(os.path.join(partial, MANIFEST), "w") as file:
            json.dump(layout, file, indent=2)


def read_pairs(folder, manifest):
    """The `TokenizedPairs` of a cache folder, memory-mapped read-only (the batches'
    tensors read the same file's pages: `keras_transformer.data.batches.id_table`)."""
    arrays = {f"{side}_{kind}": np.load(os.path.join(folder, f"{side}_{kind}.npy"),
                                        mmap_mode="r")
              for side in _SIDES for kind in ("ids", "offsets")}
    pairs = TokenizedPairs(**arrays)
    if len(pairs) != manifest["pairs"]:
        raise ValueError(f"The token cache in {folder} holds {len(pairs):,} pairs but its "
                         f"{MANIFEST} says {manifest['pairs']:,}: remove the folder.")
    return pairs


def _check_manifest(folder, manifest, expected):
    for key, what in (("format", "an older format"), ("corpus", "another corpus"),
                      ("tokenizers", "another tokenizer")):
        if manifest.get(key) != expected[key]:
            raise ValueError(
                f"The token cache in {folder} was made from {what}: remove it (rm -r "
                f"{folder}) to tokenize this one, or give a new run directory.")


def _flat(rows):
    """(ids, offsets) of a list of id lists: ids as uint16 when they fit, else uint32."""
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    ids = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64,
                      count=int(lengths.sum()))
    if ids.size and (ids.min() < 0 or ids.max() >= 1 << 32):
        raise ValueError(f"A tokenizer gave the id {ids.min() if ids.min() < 0 else ids.max()}: "
                         "ids must be integers from 0 to 2**32 - 1.")
    dtype = np.uint16 if not ids.size or ids.max() < 1 << 16 else np.uint32
    return ids.astype(dtype), _offsets(lengths)


def _offsets(lengths):
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets

