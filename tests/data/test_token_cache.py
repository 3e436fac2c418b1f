"""A large training split streamed from files (`data.corpus_files`), its ids tokenized
once into the run's token cache (`data.token_cache`), and batched from the arrays
(`data.pipeline.dataset_from_pairs`): written then reused, refused when the corpus or
the tokenizer changed, the same batches as from lists, and nothing trusted after a
killed tokenization. The WMT14 recipe runs on a folder of text files."""

import gzip
import os

import numpy as np
import pytest

from keras_transformer.data import batches
from keras_transformer.data.corpora import ParallelCorpus, synthetic_translation
from keras_transformer.data.corpus_files import (
    TextFilesCorpus,
    sample_pairs,
    wmt14_splits,
)
from keras_transformer.data.pipeline import dataset_from_pairs, make_dataset
from keras_transformer.data.token_cache import MANIFEST, cached_pairs, tokenize_pairs
from keras_transformer.tokenizers import SubwordTokenizer

pytestmark = pytest.mark.once("torch")  # tf.data and NumPy: the same under every backend

PAIRS = 3000


@pytest.fixture(scope="module")
def corpus():
    return synthetic_translation(PAIRS, seed=4, max_sentence_length=14)


@pytest.fixture(scope="module")
def files(corpus, tmp_path_factory):
    """The corpus as WMT14's folder layout: train gzipped, the test sets plain."""
    folder = tmp_path_factory.mktemp("wmt14")
    for language, lines in (("en", corpus.sources), ("de", corpus.targets)):
        with gzip.open(folder / f"train.{language}.gz", "wt", encoding="utf-8") as file:
            file.write("\n".join(lines) + "\n")
        for stem in ("newstest2013", "newstest2014"):
            (folder / f"{stem}.{language}").write_text("\n".join(lines[:20]) + "\n")
    return folder


@pytest.fixture(scope="module")
def tokenizer(corpus):
    return SubwordTokenizer.train(corpus.sources + corpus.targets, vocab_size=300)


class CountingTokenizer:
    """A tokenizer that counts the sentences it tokenizes (and can fail on a call)."""

    def __init__(self, tokenizer, fail_on_call=None):
        self.tokenizer, self.sentences, self.calls = tokenizer, 0, 0
        self.fail_on_call = fail_on_call
        for name in ("pad_id", "bos_id", "eos_id", "vocab_size", "fingerprint"):
            setattr(self, name, getattr(tokenizer, name))

    def tokenize(self, texts):
        self.calls += 1
        if self.calls == self.fail_on_call:
            raise KeyboardInterrupt  # as a Ctrl-C in the middle of tokenizing
        self.sentences += len(texts)
        return self.tokenizer.tokenize(texts)


def test_files_stream_in_chunks_and_align(files, corpus):
    train = TextFilesCorpus(str(files / "train.en.gz"), str(files / "train.de.gz"))
    assert len(train) == PAIRS
    chunks = list(train.chunks(size=1000))
    assert [len(sources) for sources, _ in chunks] == [1000, 1000, 1000]
    assert sum((sources for sources, _ in chunks), []) == corpus.sources
    assert TextFilesCorpus(*train.paths, limit=10).fingerprint() != train.fingerprint()


def test_a_missing_or_unequal_file_is_one_error(files, tmp_path):
    (tmp_path / "train.en").write_text("one\ntwo\n")
    (tmp_path / "train.de").write_text("eins\n")
    with pytest.raises(ValueError, match="has 2 lines but .* has 1"):
        len(TextFilesCorpus(str(tmp_path / "train.en"), str(tmp_path / "train.de")))
    with pytest.raises(FileNotFoundError, match=r"WMT14 file newstest2013.en\[.gz\] is missing"):
        wmt14_splits("en-de", str(tmp_path))
    splits = wmt14_splits("de-en", str(files), train_limit=100)
    assert len(splits["train"]) == 100 and len(splits["test"].sources) == 20
    assert splits["train"].paths[0].endswith("train.de.gz")


def test_the_vocabulary_sample_is_uniform_and_seeded(files, corpus):
    train = TextFilesCorpus(str(files / "train.en.gz"), str(files / "train.de.gz"))
    sample = sample_pairs(train, 500, seed=1)
    assert len(sample.sources) == 500 and sample == sample_pairs(train, 500, seed=1)
    assert sample != sample_pairs(train, 500, seed=2)
    rows = [corpus.sources.index(source) for source in sample.sources]
    assert rows == sorted(rows)  # in corpus order
    # Drawn from the whole corpus, not its first 500 pairs: about a third of the
    # draws fall in each third of it.
    thirds = np.bincount(np.array(rows) * 3 // PAIRS, minlength=3)
    assert all(120 <= count <= 215 for count in thirds), thirds
    in_memory = sample_pairs(ParallelCorpus(corpus.sources, corpus.targets), 500, seed=1)
    assert in_memory == sample


def test_the_cache_is_written_once_then_read(files, tokenizer, tmp_path):
    train = TextFilesCorpus(str(files / "train.en.gz"), str(files / "train.de.gz"))
    counting = CountingTokenizer(tokenizer)
    folder = str(tmp_path / "token_cache")
    first = cached_pairs(folder, train, counting, counting)
    assert counting.sentences == 2 * PAIRS
    assert first.source_ids.dtype == np.uint16 and len(first) == PAIRS
    again = cached_pairs(folder, TextFilesCorpus(*train.paths), counting, counting)
    assert counting.sentences == 2 * PAIRS  # nothing tokenized again
    assert isinstance(again.source_ids, np.memmap)
    for side in ("source", "target"):
        for kind in ("ids", "offsets"):
            np.testing.assert_array_equal(getattr(first, f"{side}_{kind}"),
                                          getattr(again, f"{side}_{kind}"))
    assert again.row("source", 7) == tokenizer.tokenize([train_line(files, 7)])[0]


def train_line(files, index):
    with gzip.open(files / "train.en.gz", "rt", encoding="utf-8") as file:
        return file.read().splitlines()[index]


@pytest.mark.backs("docs/wmt14.md",
                   "another tokenizer is refused with one line that says to remove it")
def test_another_corpus_or_tokenizer_is_refused(files, corpus, tokenizer, tmp_path):
    train = TextFilesCorpus(str(files / "train.en.gz"), str(files / "train.de.gz"))
    folder = str(tmp_path / "token_cache")
    cached_pairs(folder, train, tokenizer, tokenizer)
    changed = tmp_path / "train.en"
    changed.write_text("\n".join(["changed"] + corpus.sources[1:]) + "\n")
    with pytest.raises(ValueError, match="was made from another corpus: remove it"):
        cached_pairs(folder, TextFilesCorpus(str(changed), train.paths[1]), tokenizer,
                     tokenizer)
    other = SubwordTokenizer.train(corpus.sources + corpus.targets, vocab_size=280)
    with pytest.raises(ValueError, match="was made from another tokenizer: remove it"):
        cached_pairs(folder, train, other, other)


def test_batches_are_the_same_with_and_without_the_cache(files, corpus, tokenizer, tmp_path):
    train = TextFilesCorpus(str(files / "train.en.gz"), str(files / "train.de.gz"))
    cached_pairs(str(tmp_path / "cache"), train, tokenizer, tokenizer)
    pairs = cached_pairs(str(tmp_path / "cache"), train, tokenizer, tokenizer)
    options = dict(max_sentence_length=16, tokens_per_batch=512, bucket_width=4, repeat=True,
                   seed=3, overlong="truncate", source_vocab_size=300, target_vocab_size=300,
                   verbose=False)
    from_lists, list_stats = make_dataset(corpus.sources, corpus.targets, tokenizer, **options)
    from_cache, cache_stats = dataset_from_pairs(pairs, tokenizer, **options)
    assert list_stats == cache_stats and cache_stats.truncated > 0
    for (inputs, labels), (cached_inputs, cached_labels) in zip(from_lists.take(40),
                                                              from_cache.take(40)):
        for name in ("source", "target"):
            np.testing.assert_array_equal(inputs[name], cached_inputs[name])
        np.testing.assert_array_equal(labels, cached_labels)


def mapped_file(array):
    """The file whose mapping holds `array`'s data (from /proc/self/maps), else None."""
    address = array.ctypes.data
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            start, end = (int(bound, 16) for bound in fields[0].split("-"))
            if start <= address < end:
                return fields[5] if len(fields) > 5 and fields[5].startswith("/") else None
    return None


@pytest.mark.backs("docs/wmt14.md", "memory-mapped cache in place (no copy of the ids is made)")
def test_the_batches_read_the_cached_ids_in_place(files, tokenizer, tmp_path, monkeypatch):
    """The pipeline's id tables are mappings of the cache's files, not copies, and
    tf.data's graph rewrites, which would copy them, are off: a second run holds the
    ids once, as the files' pages. The arrays the cache gives stay read-only."""
    train = TextFilesCorpus(str(files / "train.en.gz"), str(files / "train.de.gz"))
    folder = os.path.realpath(tmp_path / "cache")
    cached_pairs(folder, train, tokenizer, tokenizer)
    pairs = cached_pairs(folder, train, tokenizer, tokenizer)
    assert not pairs.source_ids.flags.writeable
    tables, id_table = [], batches.id_table
    monkeypatch.setattr(batches, "id_table", lambda values: tables.append(id_table(values))
                        or tables[-1])
    dataset, _ = dataset_from_pairs(pairs, tokenizer, verbose=False)
    read = [mapped_file(np.from_dlpack(table)) for table in tables]
    assert read[:2] == [os.path.join(folder, f"{side}_ids.npy") for side in ("source", "target")]
    assert not any(read[2:])  # the kept rows' starts and lengths: made in memory
    np.testing.assert_array_equal(tables[1].numpy(), pairs.target_ids)
    assert dataset.options().experimental_optimization.apply_default_optimizations is False


def test_row_starts_past_int32_batch_as_the_others(files, corpus, tokenizer, tmp_path,
                                                   monkeypatch):
    """A corpus of more than 2**31 ids a side keeps its row starts as int64 beside
    int32 lengths; the graph cuts the rows the same."""
    train = TextFilesCorpus(str(files / "train.en.gz"), str(files / "train.de.gz"))
    pairs = cached_pairs(str(tmp_path / "cache"), train, tokenizer, tokenizer)
    options = dict(tokens_per_batch=512, seed=3, shuffle=False, verbose=False)
    expected, _ = dataset_from_pairs(pairs, tokenizer, **options)
    compact = batches._compact
    monkeypatch.setattr(batches, "_compact",
                        lambda values: compact(values) if values.max() < 1000 else values)
    wide, _ = dataset_from_pairs(pairs, tokenizer, **options)
    for (inputs, labels), (wide_inputs, wide_labels) in zip(expected.take(10), wide.take(10)):
        np.testing.assert_array_equal(inputs["source"], wide_inputs["source"])
        np.testing.assert_array_equal(labels, wide_labels)


def test_a_killed_tokenization_leaves_nothing_trusted(files, tokenizer, tmp_path, monkeypatch):
    train = TextFilesCorpus(str(files / "train.en.gz"), str(files / "train.de.gz"))
    folder = tmp_path / "token_cache"
    with pytest.raises(KeyboardInterrupt):  # while tokenizing
        cached_pairs(str(folder), train, CountingTokenizer(tokenizer, fail_on_call=1),
                     tokenizer)
    assert os.listdir(tmp_path) == []
    saves, save = [], np.save

    def interrupted_save(*args, **kwargs):  # while writing the third array
        saves.append(args[0])
        if len(saves) == 3:
            raise KeyboardInterrupt
        save(*args, **kwargs)

    monkeypatch.setattr(np, "save", interrupted_save)
    with pytest.raises(KeyboardInterrupt):
        cached_pairs(str(folder), train, tokenizer, tokenizer)
    monkeypatch.undo()
    assert len(saves) == 3 and os.listdir(tmp_path) == []
    # A writer killed outright (SIGKILL) leaves its hidden folder, complete or not:
    # never read, and removed by the next writer.
    partial = tmp_path / f".partial-{2**22 + 1}-token_cache"
    partial.mkdir()
    (partial / MANIFEST).write_text("{}")
    counting = CountingTokenizer(tokenizer)
    cached_pairs(str(folder), train, counting, counting)
    assert counting.sentences == 2 * PAIRS
    assert sorted(os.listdir(tmp_path)) == ["token_cache"]


def test_tokenizing_in_chunks_gives_the_ids_of_one_call(files, corpus, tokenizer):
    train = TextFilesCorpus(str(files / "train.en.gz"), str(files / "train.de.gz"))
    streamed = tokenize_pairs(train, tokenizer, tokenizer, verbose=True)
    whole = tokenize_pairs(ParallelCorpus(corpus.sources, corpus.targets), tokenizer, tokenizer)
    np.testing.assert_array_equal(streamed.source_ids, whole.source_ids)
    np.testing.assert_array_equal(streamed.target_offsets, whole.target_offsets)


TINY_MODEL = ["--preset", "tiny", "--d-model", "32", "--d-ff", "64", "--num-heads", "2",
              "--num-layers", "1", "--warmup-steps", "10", "--beam-size", "2", "--verbose", "0"]


def test_the_wmt14_recipe_trains_on_a_folder_and_reuses_its_cache(files, tmp_path, capsys):
    from recipes import wmt14

    arguments = ["--data-dir", str(files), "--run-dir", str(tmp_path / "run"), "--steps", "2",
                 "--checkpoint-every", "2", "--vocab-size", "200", "--eval-limit", "2",
                 "--tokenizer-sample", "1000", "--max-sentence-length", "32",
                 "--tokens-per-batch", "512", "--no-export", *TINY_MODEL]
    results = wmt14.main(arguments)
    assert results["steps"] == 2
    output = capsys.readouterr().out
    assert "Tokenizer: drawing 1,000 of 3,000 pairs" in output
    assert "Data: cached the ids in" in output
    assert os.path.exists(tmp_path / "run" / "token_cache" / MANIFEST)
    wmt14.main([*arguments[:-len(TINY_MODEL)], "--steps", "4", *TINY_MODEL])
    output = capsys.readouterr().out
    assert "Data: reading the 3,000 tokenized pairs cached in" in output
    assert "Data: tokenizing" not in output
