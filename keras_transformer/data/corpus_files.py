"""§5.1 Training Data at the paper's scale: a training split read in chunks, never whole.

WMT14 English-German has about 4.5 million sentence pairs (1.3 GB of text). A
`ParallelCorpus` holds a split as two Python lists of strings, over a gigabyte for
this one; the corpora here stream it instead, and the run tokenizes it once into
compact arrays (`keras_transformer.data.token_cache`):

- `TextFilesCorpus`: two aligned UTF-8 text files, one sentence per line, plain or
  gzipped (the layout most WMT preparations write);
- `TfdsCorpus`: a split of a tensorflow-datasets translation dataset.

Both give their number of pairs (`len`), their pairs in chunks (`chunks`), a uniform,
seeded sample of them (`sample_pairs`, for learning the vocabulary) and a fingerprint
that changes when the data does (the token cache is checked against it).
"""

import gzip
import hashlib
import os

import numpy as np

from keras_transformer.data.corpora import (
    ParallelCorpus,
    find_file,
    load_wmt14,
    parse_direction,
    read_parallel,
)
from keras_transformer.validation import check_positive_int

#: Lines read per chunk.
CHUNK_PAIRS = 65536
_HASH_BLOCK = 1 << 20


class TextFilesCorpus:
    """Two aligned text files (plain, or gzipped when the name ends in .gz).

    Args:
        source_path, target_path: The files, one sentence per line.
        limit: Only the first `limit` pairs (None: all).

    Raises:
        FileNotFoundError: a file is missing.
        ValueError: the files have different numbers of lines, or one is not UTF-8
            text (named with its line), when they are first read.
    """

    def __init__(self, source_path, target_path, limit=None):
        for path in (source_path, target_path):
            if not os.path.isfile(path):
                raise FileNotFoundError(f"No such file: {path!r}.")
        if limit is not None:
            check_positive_int("limit", limit)
        self.paths = (source_path, target_path)
        self.limit = limit
        self._count = None
        self._fingerprint = None

    def __len__(self):
        if self._count is None:
            counts = [_count_lines(path) for path in self.paths]
            if counts[0] != counts[1]:
                raise ValueError(
                    f"{self.paths[0]!r} has {counts[0]:,} lines but {self.paths[1]!r} has "
                    f"{counts[1]:,}: parallel files need one sentence per line on both sides.")
            self._count = counts[0] if self.limit is None else min(counts[0], self.limit)
        return self._count

    def describe(self):
        return f"{self.paths[0]} and {self.paths[1]}"

    def fingerprint(self):
        """sha256 of both files' bytes and the limit: what made a token cache."""
        if self._fingerprint is None:
            digest = hashlib.sha256(f"limit={self.limit}".encode())
            for path in self.paths:
                with open(path, "rb") as file:
                    for block in iter(lambda: file.read(_HASH_BLOCK), b""):
                        digest.update(block)
            self._fingerprint = digest.hexdigest()
        return self._fingerprint

    def chunks(self, size=CHUNK_PAIRS):
        """Yields (sources, targets): lists of at most `size` stripped lines, in order."""
        count = len(self)  # checks that the files align
        readers = [_lines(path) for path in self.paths]
        done = 0
        while done < count:
            want = min(size, count - done)
            sources = [line for _, line in zip(range(want), readers[0])]
            targets = [line for _, line in zip(range(want), readers[1])]
            done += len(sources)
            yield sources, targets


class TfdsCorpus:
    """One split of tensorflow-datasets' WMT14 (or another translation dataset with
    the two languages as features), read in chunks.

    Args:
        split: "train", "validation" or "test".
        source, target: The feature names of the two languages ("en", "de").
        name: The dataset ("wmt14_translate/de-en").
        data_dir: tensorflow-datasets' data_dir (None: its default).
        limit: Only the first `limit` pairs (None: all).
    """

    def __init__(self, split, source, target, name="wmt14_translate/de-en", data_dir=None,
                 limit=None):
        self.split, self.source, self.target = split, source, target
        self.name, self.data_dir, self.limit = name, data_dir, limit
        self._count = None

    def _dataset(self):
        import tensorflow_datasets as tfds

        dataset = tfds.load(self.name, split=self.split, data_dir=self.data_dir)
        return dataset.take(self.limit) if self.limit else dataset

    def __len__(self):
        if self._count is None:
            self._count = sum(len(sources) for sources, _ in self.chunks())
        return self._count

    def describe(self):
        return f"tensorflow-datasets {self.name}, split {self.split}"

    def fingerprint(self):
        """The dataset, its version, the split, the direction and the limit."""
        import tensorflow_datasets as tfds

        version = tfds.builder(self.name, data_dir=self.data_dir).info.version
        return hashlib.sha256(f"tfds {self.name} {version} {self.split} {self.source}-"
                              f"{self.target} limit={self.limit}".encode()).hexdigest()

    def chunks(self, size=CHUNK_PAIRS):
        """Yields (sources, targets) lists of at most `size` pairs, in order."""
        for batch in self._dataset().batch(size).as_numpy_iterator():
            yield ([text.decode("utf-8").strip() for text in batch[self.source]],
                   [text.decode("utf-8").strip() for text in batch[self.target]])


#: WMT14's splits in a `--data-dir` folder, each `STEM.LANGUAGE[.gz]`.
WMT14_FILES = {"train": "train", "validation": "newstest2013", "test": "newstest2014"}
_WMT14_LAYOUT = ("WMT14", "train.{en,de}, newstest2013.{en,de} and newstest2014.{en,de}")


def wmt14_splits(direction="en-de", data_dir=None, tfds_dir=None, train_limit=None):
    """WMT14 English-German: {"train": a streamed corpus, "validation" (newstest2013)
    and "test" (newstest2014): `ParallelCorpus`}, from the text files of `data_dir`
    (`WMT14_FILES`, plain or gzipped) or, without it, from tensorflow-datasets
    (`tfds_dir` its data_dir). `train_limit` keeps the first pairs of train."""
    source, target = parse_direction(direction, ("en", "de"))
    if data_dir is None:
        return {"train": TfdsCorpus("train", source, target, data_dir=tfds_dir,
                                    limit=train_limit),
                **{split: load_wmt14(split, direction, tfds_dir)
                   for split in ("validation", "test")}}
    if not os.path.isdir(data_dir):
        raise FileNotFoundError(f"WMT14 folder {data_dir!r} does not exist.")
    paths = {split: [find_file(data_dir, f"{stem}.{language}", _WMT14_LAYOUT)
                     for language in (source, target)]
             for split, stem in WMT14_FILES.items()}
    train = TextFilesCorpus(*paths["train"], limit=train_limit)
    len(train)  # the two files align, or one line says they do not
    return {"train": train, "validation": read_parallel(*paths["validation"]),
            "test": read_parallel(*paths["test"])}


def corpus_size(corpus):
    """The number of pairs of a `ParallelCorpus` or a streamed corpus."""
    return len(corpus.sources) if isinstance(corpus, ParallelCorpus) else len(corpus)


def sample_pairs(corpus, count, seed=0):
    """`count` pairs drawn uniformly without replacement, seeded, in corpus order, as
    a `ParallelCorpus` (all of them when the corpus has no more): what the vocabulary
    is learned from. Reads a streamed corpus once (after counting it)."""
    total = corpus_size(corpus)
    if count is None or count >= total:
        if isinstance(corpus, ParallelCorpus):
            return corpus
        chosen = None
    else:
        chosen = np.sort(np.random.default_rng(seed).choice(total, count, replace=False))
    if isinstance(corpus, ParallelCorpus):
        return ParallelCorpus([corpus.sources[i] for i in chosen],
                              [corpus.targets[i] for i in chosen])
    sources, targets, start = [], [], 0
    for chunk_sources, chunk_targets in corpus.chunks():
        end = start + len(chunk_sources)
        rows = (range(len(chunk_sources)) if chosen is None else
                chosen[np.searchsorted(chosen, start):np.searchsorted(chosen, end)] - start)
        sources += [chunk_sources[i] for i in rows]
        targets += [chunk_targets[i] for i in rows]
        start = end
    return ParallelCorpus(sources, targets)


def _count_lines(path):
    """Lines of a text file (a last line without a newline counts)."""
    opener = gzip.open if path.endswith(".gz") else open
    count, last = 0, b"\n"
    try:
        with opener(path, "rb") as file:
            for block in iter(lambda: file.read(_HASH_BLOCK), b""):
                count += block.count(b"\n")
                last = block[-1:]
    except (OSError, EOFError) as error:
        raise ValueError(f"Cannot read {path!r}: {error}.") from error
    return count + (last != b"\n")


def _lines(path):
    """The stripped lines of a UTF-8 text file; a bad one names its line."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as file:
        for number, line in enumerate(file, 1):
            try:
                yield line.decode("utf-8").strip()
            except UnicodeDecodeError as error:
                raise ValueError(f"Cannot read {path!r} as UTF-8 text: line {number}: "
                                 f"{error}.") from None
