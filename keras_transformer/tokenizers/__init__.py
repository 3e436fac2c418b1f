"""§5.1 Training Data: subword vocabularies learned from the training corpus.

The paper encodes sentences with byte-pair encoding (a shared source-target
vocabulary of about 37000 tokens for En-De) or word pieces (32000 for En-Fr).
`SubwordTokenizer` learns either from text and tokenizes with keras-hub's layers:

- "sentencepiece": a SentencePiece BPE model (the model keras-hub's
  `compute_sentence_piece_proto` learns, learned in the caller's process as it does;
  `SentencePieceTokenizer`).
  Detokenization restores the text exactly (up to Unicode NFKC normalization). The
  default.
- "wordpiece": a WordPiece vocabulary (`compute_word_piece_vocabulary`,
  `WordPieceTokenizer`). Text is split on whitespace and punctuation first, so
  detokenization re-attaches punctuation with simple rules.

Every tokenizer has the same special ids: pad = 0, unknown = 1, begin = 2, end = 3.
They live on the tokenizer (`pad_id`, `unk_id`, `bos_id`, `eos_id`), and the data
pipeline, decoding and export read them from there. A tokenizer is saved as a
directory next to the model's `.keras` file, so that training, evaluation, export
and serving use one vocabulary.

Seed before you create tokenizers: under TensorFlow, `tf.random.set_seed` (and
so `keras.utils.set_random_seed`) frees the resources of tf-text ops created
earlier, and a SentencePiece tokenizer made before it fails inside tf.data.
"""

import hashlib
import json
import os
import re

from keras_transformer import compat
from keras_transformer.validation import check_choice, check_positive_int

KINDS = ("sentencepiece", "wordpiece")
WORDPIECE_SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[BOS]", "[EOS]"]
_CONFIG_FILE = "tokenizer.json"
_SENTENCEPIECE_FILE = "sentencepiece.model"
_WORDPIECE_FILE = "vocabulary.txt"


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

    Attributes:
        pad_id, unk_id, bos_id, eos_id: The special ids, 0, 1, 2 and 3.
        vocab_size: Number of ids, the special ones included.

    Example:

    >>> texts = ["a man rides a bike", "a woman rides a horse", "two men ride bikes"] * 20
    >>> tokenizer = SubwordTokenizer.train(texts, vocab_size=40)
    >>> ids = tokenizer.tokenize(["a man rides"])       # ids without begin or end
    >>> tokenizer.detokenize(ids)
    ['a man rides']
    >>> tokenizer.pad_id, tokenizer.unk_id, tokenizer.bos_id, tokenizer.eos_id
    (0, 1, 2, 3)
    """

    # The order of the pieces every vocabulary starts with (<pad> <unk> <s> </s>,
    # or WORDPIECE_SPECIAL_TOKENS). Callers read the ids from the tokenizer they
    # hold, so any object with these attributes can stand in for this class.
    pad_id, unk_id, bos_id, eos_id = 0, 1, 2, 3

    def __init__(self, kind, vocabulary, lowercase=False):
        import keras_hub

        self.kind = check_choice("kind", kind, KINDS)
        self.lowercase = lowercase
        self._vocabulary = vocabulary
        self._sentencepiece = None
        if kind == "sentencepiece":
            self.layer = keras_hub.tokenizers.SentencePieceTokenizer(proto=vocabulary)
            compat.name_sentencepiece_resource(self.layer)
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
    def train(cls, texts, vocab_size, kind="sentencepiece", lowercase=False,
              sentence_piece_trainer=None):
        """Learns a vocabulary of about `vocab_size` tokens from `texts`.

        Args:
            texts: Iterable of training sentences (source and target sentences
                together for a shared vocabulary).
            vocab_size: Vocabulary size including the four special tokens.
                SentencePiece needs it to be reachable from the data (a
                ValueError names the largest size that is); WordPiece may
                return fewer tokens on small corpora.
            kind: "sentencepiece" (BPE) or "wordpiece".
            lowercase: Whether to lowercase text first.
            sentence_piece_trainer: For "sentencepiece", a function `(texts,
                options) -> bytes` that runs SentencePiece's trainer with these
                options (`sentence_piece_options`) and returns the serialized
                model, raising SentencePiece's `RuntimeError`. None runs it in
                this process (`learn_sentence_piece`), which keeps what the trainer
                allocated; a program that wants it back runs the trainer in a child
                process (the recipes' runs do).

        Returns:
            A `SubwordTokenizer`.

        Raises:
            ValueError: No text, a `vocab_size` of 4 or less, or, for
                SentencePiece, a `vocab_size` above what `texts` can give: the
                message names the largest size that works.
        """
        import keras_hub

        texts = [text for text in texts if text.strip()]
        if not texts:
            raise ValueError("Cannot learn a vocabulary from no text: `texts` is empty.")
        check_choice("kind", kind, KINDS)
        special = len(WORDPIECE_SPECIAL_TOKENS)
        if check_positive_int("vocab_size", vocab_size) <= special:
            raise ValueError(
                f"vocab_size={vocab_size!r} must be above {special}: it counts the "
                f"{special} special tokens."
            )
        if kind == "sentencepiece":
            learn = sentence_piece_trainer or learn_sentence_piece
            size_error = None
            try:
                proto = learn(texts, sentence_piece_options(vocab_size, lowercase))
            except RuntimeError as error:
                size_error = vocabulary_size_error(error, vocab_size, len(texts))
                if size_error is None:
                    raise
            if size_error is not None:
                raise size_error  # outside the except: SentencePiece's error is not its cause
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
        if self.kind == "sentencepiece":
            # SentencePiece's own threads: every core for a large list.
            threads = (os.cpu_count() or 1) if len(texts) >= 4096 else 1
            return self._processor().encode(texts, num_threads=threads)
        ids = self.layer.tokenize(texts)
        return [[int(i) for i in row] for row in _to_python(ids)]

    def _processor(self):
        """SentencePiece's own processor: the library the in-graph tokenizer wraps,
        with the same model and options (no sampling, no BOS or EOS), so the same
        ids and text, without a TensorFlow call per sentence."""
        if self._sentencepiece is None:
            import sentencepiece

            processor = sentencepiece.SentencePieceProcessor()
            processor.LoadFromSerializedProto(self._vocabulary)
            self._sentencepiece = processor
        return self._sentencepiece

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
            if self.eos_id in row:
                row = row[: row.index(self.eos_id)]
            cleaned.append([i for i in row if i not in (self.pad_id, self.bos_id)])
        if not cleaned:
            return []
        if self.kind == "sentencepiece":
            return self._processor().decode(cleaned)
        # keras-hub needs a non-empty row to infer the ragged structure.
        texts = []
        for row in cleaned:
            if not row:
                texts.append("")
                continue
            text = _to_python(self.layer.detokenize([row]))[0]
            texts.append(text.decode("utf-8") if isinstance(text, bytes) else text)
        if self.kind == "wordpiece":
            import tensorflow as tf

            joined = _join_punctuation(tf.constant(texts, tf.string)).numpy()
            texts = [text.decode("utf-8") for text in joined]
        return texts

    def detokenize_tf(self, ids):
        """In-graph detokenization (for export): the graph twin of `detokenize`.

        Args:
            ids: An int32 `tf.RaggedTensor` of ids without special ids.

        Returns:
            A tf.string tensor, one text per row; WordPiece's punctuation is
            re-attached by the same rules `detokenize` applies.
        """
        texts = self.layer.detokenize(ids)
        if self.kind == "wordpiece":
            texts = _join_punctuation(texts)
        return texts

    def fingerprint(self):
        """sha256 of what decides the ids: the kind, the lowercasing and the
        vocabulary (what a cache of tokenized ids is checked against)."""
        digest = hashlib.sha256(f"{self.kind} lowercase={self.lowercase}\n".encode())
        if self.kind == "sentencepiece":
            digest.update(self._vocabulary)
        else:
            digest.update("\n".join(self._vocabulary).encode("utf-8"))
        return digest.hexdigest()

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


def sentence_piece_options(vocab_size, lowercase):
    """SentencePiece's trainer options for a BPE vocabulary of `vocab_size` pieces with
    the project's special ids: those keras-hub's `compute_sentence_piece_proto` passes.
    The trainer logs to file descriptor 2 as it works, as it does under keras-hub:
    quieting it is the program's choice."""
    return dict(vocab_size=vocab_size, model_type="bpe",
                normalization_rule_name="nmt_nfkc_cf" if lowercase else "nmt_nfkc",
                pad_id=0, unk_id=1, bos_id=2, eos_id=3)


def learn_sentence_piece(texts, options):
    """SentencePiece's model learned from the list `texts` with `options`
    (`sentence_piece_options`) in this process, serialized.

    Raises:
        RuntimeError: SentencePiece's error (a vocabulary size too high names the
            largest that works).
    """
    import io

    import sentencepiece

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_writer=model,
                                             **options)
    return model.getvalue()


def vocabulary_size_error(error, vocab_size, sentences):
    """The `ValueError` to raise for SentencePiece's `error` when `vocab_size` is out
    of the range that `sentences` texts allow, naming the bound; None for another error.

    SentencePiece refuses a size above what the texts can give ("Vocabulary size too
    high (N). Please set it to a value <= M.") and one below their characters and the
    special tokens ("Vocabulary size is smaller than required_chars. N vs M.").
    """
    text = str(error)
    largest = re.search(r"Vocabulary size too high \(\d+\)\. Please set it to a value <= (\d+)",
                        text)
    if largest:
        return ValueError(
            f"vocab_size={vocab_size} is more than SentencePiece can learn from these "
            f"{sentences:,} sentences: at most {largest.group(1)} tokens, the special ones "
            f"included. Lower it (a recipe's --vocab-size) to {largest.group(1)} or less, "
            "or train on more text.")
    smallest = re.search(r"Vocabulary size is smaller than required_chars\. \d+ vs (\d+)", text)
    if smallest:
        return ValueError(
            f"vocab_size={vocab_size} is fewer than SentencePiece needs for these "
            f"{sentences:,} sentences: at least {smallest.group(1)} tokens, one for each "
            "character they use and the special ones. Raise it (a recipe's --vocab-size) "
            f"to {smallest.group(1)} or more.")
    return None


def _to_python(values):
    if hasattr(values, "to_list"):
        return values.to_list()
    if hasattr(values, "numpy"):
        return values.numpy().tolist()
    if hasattr(values, "tolist"):
        return values.tolist()
    return list(values)


# WordPiece splits punctuation off words; detokenizing joins it back with these
# rules (RE2 syntax, for tf.strings.regex_replace), in Python and in the
# exported graph alike.
_WORD = r"[\pL\pN_]"
_PUNCTUATION_RULES = (
    (r"\s+([.,!?;:%)\]}»”])", r"\1"),  # no space before closing marks
    (r"([(\[{«“¿¡])\s+", r"\1"),  # nor after opening ones
    (f"({_WORD}) ' ({_WORD})", r"\1'\2"),  # don't
    (f"({_WORD}) - ({_WORD})", r"\1-\2"),  # well-known
)


def _join_punctuation(texts):
    """Undoes WordPiece's split on punctuation in a tf.string tensor:
    "a bike ." -> "a bike."."""
    import tensorflow as tf

    for pattern, replacement in _PUNCTUATION_RULES:
        texts = tf.strings.regex_replace(texts, pattern, replacement)
    return texts
