"""Tests of §5.1 subword tokenization: training, round trips, saving."""

import os
import subprocess
import sys
import time

import pytest
from helpers import REPOSITORY

from keras_transformer import tokenizers
from keras_transformer.data.corpora import synthetic_translation
from keras_transformer.tokenizers import SubwordTokenizer
from keras_transformer_app.training import sentencepiece_trainer

# What is tested here does not depend on the backend: it runs in one pass.
pytestmark = pytest.mark.once("torch")

TEXTS = [
    "A man rides a bike.", "Two dogs play in the snow!", "Ein Mann fährt Fahrrad.",
    "Zwei Hunde spielen im Schnee.", "A girl, wearing a red hat, smiles.",
    "Eine Frau (in Blau) liest ein Buch.", "Don't stop the music.",
] * 20


# Tokenizers are learned once per module and loaded fresh for each test:
# the per-test seeding (tf.random.set_seed) frees the tf-text resources of
# tokenizers created before it.
@pytest.fixture(scope="module")
def saved_tokenizers(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tokenizers")
    SubwordTokenizer.train(TEXTS, vocab_size=120).save(str(directory / "sentencepiece"))
    wordpiece = SubwordTokenizer.train(TEXTS, vocab_size=150, kind="wordpiece")
    wordpiece.save(str(directory / "wordpiece"))
    return directory


@pytest.fixture
def sentencepiece(saved_tokenizers):
    return SubwordTokenizer.load(str(saved_tokenizers / "sentencepiece"))


@pytest.fixture
def wordpiece(saved_tokenizers):
    return SubwordTokenizer.load(str(saved_tokenizers / "wordpiece"))


def test_special_ids_are_fixed_and_live_on_the_tokenizer(sentencepiece, wordpiece):
    for tokenizer in (sentencepiece, wordpiece):
        special = (tokenizer.pad_id, tokenizer.unk_id, tokenizer.bos_id, tokenizer.eos_id)
        assert special == (0, 1, 2, 3)
        assert [tokenizer.id_to_token(i) for i in special] == (
            ["<pad>", "<unk>", "<s>", "</s>"] if tokenizer.kind == "sentencepiece"
            else tokenizers.WORDPIECE_SPECIAL_TOKENS
        )
        ids = tokenizer.tokenize(["A man rides a bike."])[0]
        assert ids and not set(special) & set(ids)
    # No module constant to import: code reads the ids of the tokenizer it holds.
    assert not {"PAD_ID", "UNK_ID", "BOS_ID", "EOS_ID"} & set(vars(tokenizers))


def test_sentencepiece_round_trip_is_exact(sentencepiece):
    texts = ["A man rides a bike.", "Zwei Hunde spielen im Schnee.",
             "Eine Frau (in Blau) liest ein Buch."]
    assert sentencepiece.detokenize(sentencepiece.tokenize(texts)) == texts
    assert sentencepiece.vocab_size == 120


def test_wordpiece_round_trip_reattaches_punctuation(wordpiece):
    texts = ["A man rides a bike.", "A girl, wearing a red hat, smiles.",
             "Eine Frau (in Blau) liest ein Buch.", "Don't stop the music."]
    assert wordpiece.detokenize(wordpiece.tokenize(texts)) == texts


def test_detokenize_stops_at_end_and_skips_specials(sentencepiece):
    ids = sentencepiece.tokenize(["A man rides a bike."])[0]
    bos, eos, pad = sentencepiece.bos_id, sentencepiece.eos_id, sentencepiece.pad_id
    noisy = [bos] + ids + [eos] + ids + [pad, pad]
    assert sentencepiece.detokenize([noisy, [eos], []]) == ["A man rides a bike.", "", ""]


def test_save_and_load_give_the_same_ids(tmp_path, sentencepiece, wordpiece):
    for tokenizer in (sentencepiece, wordpiece):
        directory = tmp_path / tokenizer.kind
        tokenizer.save(str(directory))
        revived = SubwordTokenizer.load(str(directory))
        assert revived.kind == tokenizer.kind and revived.vocab_size == tokenizer.vocab_size
        assert revived.tokenize(TEXTS[:7]) == tokenizer.tokenize(TEXTS[:7])


def test_in_graph_tokenization_matches_python(sentencepiece):
    import tensorflow as tf

    dataset = tf.data.Dataset.from_tensor_slices(TEXTS[:3]).batch(3).map(sentencepiece.tokenize_tf)
    ragged = next(iter(dataset))
    assert ragged.to_list() == sentencepiece.tokenize(TEXTS[:3])


@pytest.mark.parametrize("lowercase", [False, True])
def test_python_sentencepiece_gives_the_in_graph_ids_and_text(lowercase):
    """`tokenize` and `detokenize` call SentencePiece's library directly (fast on
    lists); the keras-hub layer (tf-text, the graphs' path) must agree with them,
    edge cases included."""
    from keras_transformer.tokenizers import _to_python

    tokenizer = SubwordTokenizer.train(TEXTS, vocab_size=120, lowercase=lowercase)
    texts = TEXTS[:7] + ["", "  two  spaces ", "Ünïcödé ßtraße 東京 ⁇", "a\tb\nc", "ＡＢＣ ①"]
    ids = tokenizer.tokenize(texts)
    assert ids == [[int(i) for i in row] for row in _to_python(tokenizer.layer.tokenize(texts))]
    rows = ids + [[1, 5, 1], [tokenizer.vocab_size - 1]]
    in_graph = [_to_python(tokenizer.layer.detokenize([row]))[0] if row else "" for row in rows]
    assert tokenizer.detokenize(rows) == [
        text.decode("utf-8") if isinstance(text, bytes) else text for text in in_graph]


def test_learns_whole_words_of_the_synthetic_task():
    corpus = synthetic_translation(2000, seed=0)
    tokenizer = SubwordTokenizer.train(corpus.sources + corpus.targets, vocab_size=320)
    ids = tokenizer.tokenize(corpus.sources[:50])
    words = [s.split() for s in corpus.sources[:50]]
    assert all(len(i) == len(w) for i, w in zip(ids, words))


def test_missing_and_corrupted_tokenizers_are_explained(tmp_path, sentencepiece):
    with pytest.raises(FileNotFoundError, match="No tokenizer"):
        SubwordTokenizer.load(str(tmp_path / "nowhere"))
    directory = tmp_path / "broken"
    sentencepiece.save(str(directory))
    with open(os.path.join(directory, "sentencepiece.model"), "wb") as f:
        f.write(b"not a model")
    with pytest.raises(ValueError, match="corrupted"):
        SubwordTokenizer.load(str(directory))


@pytest.mark.parametrize("kwargs, message", [
    (dict(texts=[], vocab_size=100), "empty"),
    (dict(texts=["a b"], vocab_size=3), "vocab_size=3 must be above 4: it counts the 4"),
    (dict(texts=["a b"], vocab_size=100.0), "vocab_size=100.0 must be a positive integer"),
    (dict(texts=["a b"], vocab_size=100, kind="bpe"), "kind='bpe'"),
])
def test_bad_training_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SubwordTokenizer.train(**kwargs)


def test_tokenize_rejects_a_bare_string(sentencepiece):
    with pytest.raises(TypeError, match="list of strings"):
        sentencepiece.tokenize("A man")


def test_missing_vocabulary_says_where_it_should_be(tmp_path):
    with pytest.raises(FileNotFoundError, match="expected tokenizer.json"):
        SubwordTokenizer.load(str(tmp_path))


def test_corrupted_vocabulary_is_reported_as_such(tmp_path):
    (tmp_path / "tokenizer.json").write_text('{"kind": "sentencepiece", "vocab_size": 300}')
    (tmp_path / "sentencepiece.model").write_bytes(b"not a protobuf")
    with pytest.raises(ValueError, match="missing or corrupted"):
        SubwordTokenizer.load(str(tmp_path))


def test_a_vocabulary_too_large_for_the_text_names_the_size_that_works(capfd, monkeypatch):
    """The size the message names trains, the one above it is refused, and none of
    SentencePiece's log lines is shown where a command line quiets them, as a training
    run learns (the library leaves the host's stderr alone: tests/test_logs.py)."""
    from keras_transformer_app import logs

    monkeypatch.setattr(logs, "_QUIET", True)
    corpus = synthetic_translation(60, seed=0)
    in_a_child = sentencepiece_trainer.sentence_piece_proto  # as a training run learns
    with pytest.raises(ValueError, match=r"at most (\d+) tokens") as error:
        SubwordTokenizer.train(corpus.sources, 5000, sentence_piece_trainer=in_a_child)
    largest = int(error.value.args[0].split("at most ")[1].split()[0])
    assert "--vocab-size" in str(error.value)
    assert SubwordTokenizer.train(corpus.sources, largest,
                                  sentence_piece_trainer=in_a_child).vocab_size == largest
    with pytest.raises(ValueError, match=f"at most {largest} tokens"):
        SubwordTokenizer.train(corpus.sources, largest + 1, sentence_piece_trainer=in_a_child)
    assert "trainer_interface" not in capfd.readouterr().err
    with pytest.raises(ValueError, match=f"at most {largest} tokens"):  # the library's own
        SubwordTokenizer.train(corpus.sources, largest + 1)


def test_a_vocabulary_too_small_for_the_characters_names_the_size_that_works(capfd,
                                                                             monkeypatch):
    """`--vocab-size 5` was an 86-line traceback under SentencePiece's log: now one
    ValueError names the smallest size that works, which trains, and the log stays
    hidden."""
    from keras_transformer_app import logs

    monkeypatch.setattr(logs, "_QUIET", True)
    corpus = synthetic_translation(60, seed=0)
    in_a_child = sentencepiece_trainer.sentence_piece_proto
    with pytest.raises(ValueError, match=r"at least (\d+) tokens") as error:
        SubwordTokenizer.train(corpus.sources, 5, sentence_piece_trainer=in_a_child)
    smallest = int(error.value.args[0].split("at least ")[1].split()[0])
    assert "--vocab-size" in str(error.value) and error.value.__context__ is None
    assert SubwordTokenizer.train(corpus.sources, smallest,
                                  sentence_piece_trainer=in_a_child).vocab_size == smallest
    with pytest.raises(ValueError, match=f"at least {smallest} tokens"):
        SubwordTokenizer.train(corpus.sources, smallest - 1, sentence_piece_trainer=in_a_child)
    assert "trainer_interface" not in capfd.readouterr().err
    with pytest.raises(ValueError, match=f"at least {smallest} tokens"):  # the library's own
        SubwordTokenizer.train(corpus.sources, smallest - 1)


@pytest.mark.parametrize("lowercase", [False, True])
def test_sentencepiece_learns_keras_hubs_model_here_and_in_the_programs_child(lowercase,
                                                                         monkeypatch):
    """The library learns in its caller's process, as keras-hub's
    compute_sentence_piece_proto does, and the same model byte for byte: sentences
    with a newline and outside ASCII included. The program's trainer learns it again
    in a child process (what it allocates goes back to the system when that ends)."""
    import keras_hub

    texts = TEXTS + ["a line\nwith a newline", "ünïcödé ✓ 漢字", "tab\tseparated"]
    children = []
    popen = subprocess.Popen
    monkeypatch.setattr(subprocess, "Popen",
                        lambda *a, **k: children.append(a) or popen(*a, **k))
    ours = SubwordTokenizer.train(texts, 120, lowercase=lowercase)
    assert children == []
    theirs = keras_hub.tokenizers.compute_sentence_piece_proto(
        tokenizers._text_dataset(texts), 120, model_type="bpe", lowercase=lowercase)
    assert ours._vocabulary == theirs
    in_a_child = SubwordTokenizer.train(
        texts, 120, lowercase=lowercase,
        sentence_piece_trainer=sentencepiece_trainer.sentence_piece_proto)
    assert len(children) == 1 and in_a_child._vocabulary == theirs


def test_a_trainer_that_ends_without_a_model_is_an_error(monkeypatch):
    monkeypatch.setattr(sentencepiece_trainer, "_TRAINER", "import sys; sys.exit(3)")
    with pytest.raises(RuntimeError, match="ended with status 3 and no model"):
        SubwordTokenizer.train(TEXTS, 120,
                               sentence_piece_trainer=sentencepiece_trainer.sentence_piece_proto)


def alive(pid):
    """Whether process `pid` runs (a zombie, ended but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            return not any(line.startswith("State:") and "Z" in line.split()[1]
                           for line in status)
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="the trainer ends with its parent through Linux's PR_SET_PDEATHSIG")
def test_the_trainer_ends_when_its_parent_is_killed(tmp_path):
    """A run killed (SIGKILL: the out-of-memory killer, kill -9) while it learns its
    vocabulary leaves no trainer working on, holding its memory."""
    pid_file = tmp_path / "trainer.pid"
    waiting = f"open({str(pid_file)!r}, 'w').write(str(os.getpid())); import time; time.sleep(300)"
    code = ("from keras_transformer_app.training import sentencepiece_trainer as trainer\n"
            f"trainer._TRAINER = trainer._TRAINER.replace('import sentencepiece', "
            f"{waiting!r})\n"
            "trainer.sentence_piece_proto(['a b c'], {'vocab_size': 10})\n")
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=REPOSITORY)
    try:
        deadline = time.monotonic() + 120
        while not (pid_file.exists() and pid_file.read_text().strip()):
            assert parent.poll() is None and time.monotonic() < deadline, "no trainer started"
            time.sleep(0.1)
        trainer = int(pid_file.read_text())
        assert alive(trainer)
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 10
    while alive(trainer) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(trainer)
