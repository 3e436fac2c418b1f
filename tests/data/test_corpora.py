"""Tests of the corpora: files, Multi30k, Tatoeba splits, WMT14, synthetic task."""

import gzip

import pytest
from helpers import shared_data

from keras_transformer.data.corpora import (
    ParallelCorpus,
    load_multi30k,
    load_tatoeba,
    load_wmt14,
    read_lines,
    read_parallel,
    split_by_source,
    synthetic_translation,
)

# What is tested here does not depend on the backend: it runs in one pass.
pytestmark = pytest.mark.once("torch")


def write(path, lines, gz=False):
    opener = gzip.open if gz else open
    with opener(path, "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return str(path)


def test_reads_plain_and_gzipped_files(tmp_path):
    assert read_lines(write(tmp_path / "a.txt", ["x ", " y"])) == ["x", "y"]
    assert read_lines(write(tmp_path / "a.txt.gz", ["ä"], gz=True)) == ["ä"]


def test_unaligned_parallel_files_are_an_error(tmp_path):
    with pytest.raises(ValueError, match="has 2 lines but"):
        read_parallel(write(tmp_path / "s", ["a", "b"]), write(tmp_path / "t", ["a"]))


def test_missing_and_broken_files_are_explained(tmp_path):
    with pytest.raises(FileNotFoundError, match="No such file"):
        read_lines(str(tmp_path / "missing.txt"))
    broken = tmp_path / "broken.gz"
    broken.write_bytes(b"not gzip at all")
    with pytest.raises(ValueError, match="Cannot read"):
        read_lines(str(broken))


def test_split_by_source_has_no_leakage():
    sources = [f"s{i % 50}" for i in range(400)]
    corpus = ParallelCorpus(sources, [f"t{i}" for i in range(400)])
    splits = split_by_source(corpus, validation_fraction=0.1, test_fraction=0.2, seed=3)
    seen = [set(splits[name].sources) for name in ("train", "validation", "test")]
    assert not (seen[0] & seen[1] or seen[0] & seen[2] or seen[1] & seen[2])
    assert sum(len(splits[n].sources) for n in splits) == 400
    assert len(seen[2]) == 10 and len(seen[1]) == 5


def test_tatoeba_file_is_split_by_english_sentence(tmp_path):
    lines = [f"Hello {i % 30}.\tHola {i}.\tCC-BY 2.0 (France)" for i in range(200)]
    path = write(tmp_path / "spa.txt", lines)
    for direction in ("en-es", "es-en"):
        splits = load_tatoeba(path, direction, test_fraction=0.2, validation_fraction=0.1)
        english = [set(splits[n].sources if direction == "en-es" else splits[n].targets)
                   for n in ("train", "validation", "test")]
        assert not (english[0] & english[2] or english[0] & english[1])
        assert splits["train"].sources[0].startswith("Hello" if direction == "en-es" else "Hola")


def test_tatoeba_line_without_tab_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="line 2 has no tab"):
        load_tatoeba(write(tmp_path / "bad.txt", ["a\tb", "no tab here"]))


def test_real_tatoeba_spa_eng_split_has_no_leakage():
    splits = load_tatoeba(shared_data("anki", "spa-eng", "spa.txt.gz"))
    assert sum(len(s.sources) for s in splits.values()) == 118964
    train, test = set(splits["train"].sources), set(splits["test"].sources)
    assert not train & test and len(test) > 4000


def test_real_multi30k_files_load_in_both_directions():
    directory = shared_data("multi30k")
    de_en = load_multi30k(directory, "de-en")
    assert [len(de_en[s].sources) for s in ("train", "validation", "test")] == [29000, 1014, 1000]
    en_de = load_multi30k(directory, "en-de")
    assert en_de["test"].sources == de_en["test"].targets
    assert de_en["train"].sources[0].startswith("Zwei junge weiße Männer")


def test_multi30k_errors(tmp_path):
    with pytest.raises(ValueError, match="direction='de-fr'"):
        load_multi30k(str(tmp_path), "de-fr")
    with pytest.raises(FileNotFoundError, match="train.de"):
        load_multi30k(str(tmp_path), "de-en")


def test_synthetic_task_is_deterministic_and_needs_reordering():
    a, b = synthetic_translation(300, seed=5), synthetic_translation(300, seed=5)
    assert a == b and a != synthetic_translation(300, seed=6)
    words = {w for s in a.sources for w in s.split()}
    assert len(words) >= 100
    lengths = {len(s.split()) for s in a.sources}
    assert min(lengths) == 3 and max(lengths) == 10
    # A fixed dictionary, applied in reverse order.
    dictionary = {}
    for source, target in zip(a.sources, a.targets):
        translated = target.split()[:-1][::-1]
        for s, t in zip(source.split(), translated):
            assert dictionary.setdefault(s, t) == t
        assert target.endswith(" .")


def test_synthetic_sentence_lengths_are_bounded():
    corpus = synthetic_translation(200, seed=1, min_sentence_length=2, max_sentence_length=4)
    assert {len(s.split()) for s in corpus.sources} == {2, 3, 4}


@pytest.mark.parametrize("kwargs, message", [
    (dict(min_sentence_length=5, max_sentence_length=4),
     "min_sentence_length=5 is above max_sentence_length=4"),
    (dict(min_sentence_length=0), "min_sentence_length=0 must be a positive integer"),
    (dict(max_sentence_length=2.5), "max_sentence_length=2.5 must be a positive integer"),
    (dict(num_words=0), "num_words=0 must be a positive integer"),
    (dict(num_words=1000), "num_words=1000 must be at most 132"),
])
def test_bad_synthetic_arguments_are_explained(kwargs, message):
    with pytest.raises(ValueError, match=message):
        synthetic_translation(10, **kwargs)


@pytest.mark.parametrize("kwargs, message", [
    (dict(validation_fraction=1.0), r"validation_fraction=1.0 must be a number in \[0, 1\)"),
    (dict(test_fraction=-0.1), r"test_fraction=-0.1 must be a number in \[0, 1\)"),
    (dict(validation_fraction=0.5, test_fraction=0.5), "leaves no pairs for training"),
])
def test_bad_split_fractions_are_explained(kwargs, message):
    corpus = ParallelCorpus(["a", "b"], ["x", "y"])
    with pytest.raises(ValueError, match=message):
        split_by_source(corpus, **kwargs)


def test_wmt14_loader_with_mocked_tensorflow_datasets():
    tfds = pytest.importorskip("tensorflow_datasets")
    with tfds.testing.mock_data(num_examples=6):
        corpus = load_wmt14("train", "en-de")
        reverse = load_wmt14("train", "de-en")
    assert len(corpus.sources) == 6 and all(isinstance(s, str) for s in corpus.sources)
    assert corpus.sources == reverse.targets


# Files: missing or corrupted data, vocabularies and models.
def test_non_utf8_data_names_the_file(tmp_path):
    path = tmp_path / "train.de"
    path.write_bytes(b"gut\n\xff\xfe kaputt\n")
    with pytest.raises(ValueError, match=r"Cannot read .*train.de.* as UTF-8 text"):
        read_lines(str(path))


def test_corrupted_gzip_data_names_the_file(tmp_path):
    path = tmp_path / "train.en.gz"
    path.write_bytes(gzip.compress(b"one line\n")[:12])
    with pytest.raises(ValueError, match=r"Cannot read .*train.en.gz"):
        read_lines(str(path))


def test_misaligned_parallel_files_give_both_line_counts(tmp_path):
    (tmp_path / "a.txt").write_text("one\ntwo\n")
    (tmp_path / "b.txt").write_text("eins\n")
    with pytest.raises(ValueError, match="has 2 lines but .* has 1"):
        read_parallel(str(tmp_path / "a.txt"), str(tmp_path / "b.txt"))
