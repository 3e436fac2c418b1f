"""§5.1 Training Data: subword vocabularies learned from the training corpus.

The paper encodes sentences with byte-pair encoding (a shared source-target
vocabulary of about 37000 tokens for En-De) or word pieces (32000 for En-Fr).
`SubwordTokenizer` learns either from text with keras-hub's tools:

- "sentencepiece": a SentencePiece BPE model (`compute_sentence_piece_proto`,
  `SentencePieceTokenizer`). Detokenization restores the text exactly (up to
  Unicode NFKC normalization). The default.
- "wordpiece": a WordPiece vocabulary (`compute_word_piece_vocabulary`,
  `WordPieceTokenizer`). Text is split on whitespace and punctuation first, so
  detokenization re-attaches punctuation with simple rules.

Every tokenizer has the same special ids: pad = 0, unknown = 1, begin = 2, end = 3.
It is saved as a directory next to the model's `.keras` file, so that training,
evaluation, export and serving use one vocabulary.

Seed before you create tokenizers: under TensorFlow, `tf.random.set_seed` (and
so `keras.utils.set_random_seed`) frees the resources of tf-text ops created
earlier, and a SentencePiece tokenizer made before it fails inside tf.data.
"""

import contextlib
import json
import os
import re
import tempfile

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
KINDS = ("sentencepiece", "wordpiece")
WORDPIECE_SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[BOS]", "[EOS]"]
_CONFIG_FILE = "tokenizer.json"
_SENTENCEPIECE_FILE = "sentencepiece.model"
_WORDPIECE_FILE = "vocabulary.txt"


@contextlib.contextmanager
def _quiet_native_stderr():
    """Sends C++ logging (SentencePiece's trainer prints hundreds of lines) to a
    temporary file, and replays it only if training fails."""
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as log:
        os.dup2(log.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(saved, 2)
            log.seek(0)
            os.write(2, log.read()[-4000:])
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _text_dataset(texts):
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices(tf.constant(list(texts), dtype=tf.string))


class SubwordTokenizer:
    """A subword tokenizer with the project's special ids, savable with a model.

    Args:
        kind: "sentencepiece" or "wordpiece".
        vocabulary: For "sentencepiece", the serialized model proto (bytes); for
            "wordpiece", the list of tokens, the four special tokens first.
        lowercase: Whether text is lowercased before tokenization (for
            SentencePiece this is part of the model proto's normalizer).

    Example:

    >>> tokenizer = SubwordTokenizer.train(["a man rides a bike", ...], vocab_size=500)
    >>> ids = tokenizer.tokenize(["a man rides"])       # [[...]] without begin/end
    >>> tokenizer.detokenize(ids)
    ['a man rides']
    """

    pad_id, unk_id, bos_id, eos_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID

    def __init__(self, kind, vocabulary, lowercase=False):
        import keras_hub

        if kind not in KINDS:
            raise ValueError(f"kind={kind!r} must be one of {KINDS}.")
        self.kind = kind
        self.lowercase = lowercase
        self._vocabulary = vocabulary
        if kind == "sentencepiece":
            self.layer = keras_hub.tokenizers.SentencePieceTokenizer(proto=vocabulary)
            pieces = self.layer.get_vocabulary()
            if pieces[:4] != ["<pad>", "<unk>", "<s>", "</s>"]:
                raise ValueError(
                    "The SentencePiece model must have <pad>, <unk>, <s>, </s> as ids "
                    f"0-3, found {pieces[:4]}: train it with SubwordTokenizer.train."
                )
        else:
            vocabulary = list(vocabulary)
            if vocabulary[:4] != WORDPIECE_SPECIAL_TOKENS:
                raise ValueError(
                    f"A WordPiece vocabulary must start with {WORDPIECE_SPECIAL_TOKENS}, "
                    f"found {vocabulary[:4]}: train it with SubwordTokenizer.train."
                )
            self._vocabulary = vocabulary
            self.layer = keras_hub.tokenizers.WordPieceTokenizer(
                vocabulary=vocabulary, lowercase=lowercase, oov_token="[UNK]",
                special_tokens=WORDPIECE_SPECIAL_TOKENS,
            )

    @classmethod
    def train(cls, texts, vocab_size, kind="sentencepiece", lowercase=False):
        """Learns a vocabulary of about `vocab_size` tokens from `texts`.

        Args:
            texts: Iterable of training sentences (source and target sentences
                together for a shared vocabulary).
            vocab_size: Vocabulary size including the four special tokens.
                SentencePiece needs it to be reachable from the data; WordPiece
                may return fewer tokens on small corpora.
            kind: "sentencepiece" (BPE) or "wordpiece".
            lowercase: Whether to lowercase text first.

        Returns:
            A `SubwordTokenizer`.
        """
        import keras_hub

        texts = [text for text in texts if text.strip()]
        if not texts:
            raise ValueError("Cannot learn a vocabulary from no text: `texts` is empty.")
        if kind not in KINDS:
            raise ValueError(f"kind={kind!r} must be one of {KINDS}.")
        if not isinstance(vocab_size, int) or vocab_size <= len(WORDPIECE_SPECIAL_TOKENS):
            raise ValueError(f"vocab_size={vocab_size!r} must be an integer above 4.")
        if kind == "sentencepiece":
            with _quiet_native_stderr():
                proto = keras_hub.tokenizers.compute_sentence_piece_proto(
                    _text_dataset(texts), vocab_size, model_type="bpe", lowercase=lowercase
                )
            return cls("sentencepiece", proto, lowercase=lowercase)
        vocabulary = keras_hub.tokenizers.compute_word_piece_vocabulary(
            _text_dataset(texts), vocab_size, lowercase=lowercase,
            reserved_tokens=WORDPIECE_SPECIAL_TOKENS,
        )
        return cls("wordpiece", vocabulary, lowercase=lowercase)

    @property
    def vocab_size(self):
        return self.layer.vocabulary_size()

    def tokenize(self, texts):
        """Token ids of each text, without begin/end tokens.

        Args:
            texts: A list of strings.

        Returns:
            A list of lists of ints.
        """
        if isinstance(texts, str):
            raise TypeError("tokenize() takes a list of strings; wrap one string in a list.")
        texts = list(texts)
        if not texts:
            return []
        ids = self.layer.tokenize(texts)
        return [[int(i) for i in row] for row in _to_python(ids)]

    def tokenize_tf(self, texts):
        """In-graph tokenization of a tf.string tensor (for tf.data and export).

        Returns:
            An int32 `tf.RaggedTensor` of ids, without begin/end tokens.
        """
        return self.layer.tokenize(texts)

    def detokenize(self, ids):
        """Text of each id sequence; stops at the first end token and drops
        padding, begin and end tokens.

        Args:
            ids: A list of id sequences (lists or 1-D arrays).

        Returns:
            A list of strings.
        """
        cleaned = []
        for row in ids:
            row = [int(i) for i in row]
            if EOS_ID in row:
                row = row[: row.index(EOS_ID)]
            cleaned.append([i for i in row if i not in (PAD_ID, BOS_ID)])
        if not cleaned:
            return []
        # keras-hub needs a non-empty row to infer the ragged structure.
        texts = []
        for row in cleaned:
            if not row:
                texts.append("")
                continue
            text = _to_python(self.layer.detokenize([row]))[0]
            texts.append(text.decode("utf-8") if isinstance(text, bytes) else text)
        if self.kind == "wordpiece":
            texts = [_join_punctuation(text) for text in texts]
        return texts

    def id_to_token(self, token_id):
        return self.layer.id_to_token(int(token_id))

    def save(self, directory):
        """Writes the tokenizer to `directory` (created if needed)."""
        os.makedirs(directory, exist_ok=True)
        if self.kind == "sentencepiece":
            with open(os.path.join(directory, _SENTENCEPIECE_FILE), "wb") as f:
                f.write(self._vocabulary)
        else:
            with open(os.path.join(directory, _WORDPIECE_FILE), "w", encoding="utf-8") as f:
                f.write("\n".join(self._vocabulary) + "\n")
        with open(os.path.join(directory, _CONFIG_FILE), "w") as f:
            json.dump({"kind": self.kind, "lowercase": self.lowercase,
                       "vocab_size": self.vocab_size}, f, indent=2)

    @classmethod
    def load(cls, directory):
        """Reads a tokenizer written by `save`."""
        config_path = os.path.join(directory, _CONFIG_FILE)
        if not os.path.exists(config_path):
            raise FileNotFoundError(
                f"No tokenizer in {directory!r}: expected {_CONFIG_FILE} written by "
                "SubwordTokenizer.save (it sits next to the model's .keras file)."
            )
        try:
            with open(config_path) as f:
                config = json.load(f)
            kind = config["kind"]
            if kind == "sentencepiece":
                with open(os.path.join(directory, _SENTENCEPIECE_FILE), "rb") as f:
                    vocabulary = f.read()
            else:
                with open(os.path.join(directory, _WORDPIECE_FILE), encoding="utf-8") as f:
                    vocabulary = f.read().splitlines()
            tokenizer = cls(kind, vocabulary, lowercase=config.get("lowercase", False))
        except Exception as error:  # corrupt protos raise TensorFlow's own errors
            raise ValueError(
                f"The tokenizer in {directory!r} is missing or corrupted ({error}); "
                "save it again with SubwordTokenizer.save."
            ) from error
        if tokenizer.vocab_size != config.get("vocab_size", tokenizer.vocab_size):
            raise ValueError(
                f"The tokenizer in {directory!r} has {tokenizer.vocab_size} tokens but its "
                f"{_CONFIG_FILE} says {config['vocab_size']}: the files do not belong together."
            )
        return tokenizer


def _to_python(values):
    if hasattr(values, "to_list"):
        return values.to_list()
    if hasattr(values, "numpy"):
        return values.numpy().tolist()
    if hasattr(values, "tolist"):
        return values.tolist()
    return list(values)


_SPACE_BEFORE = re.compile(r"\s+([.,!?;:%)\]}»”])")
_SPACE_AFTER = re.compile(r"([(\[{«“¿¡])\s+")
_APOSTROPHE = re.compile(r"(\w) ' (\w)")
_HYPHEN = re.compile(r"(\w) - (\w)")


def _join_punctuation(text):
    """Undoes WordPiece's split on punctuation: "a bike ." -> "a bike."."""
    text = _SPACE_BEFORE.sub(r"\1", text)
    text = _SPACE_AFTER.sub(r"\1", text)
    text = _APOSTROPHE.sub(r"\1'\2", text)
    return _HYPHEN.sub(r"\1-\2", text)
