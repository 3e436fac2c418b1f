"""§3 Model Architecture and §6.2 Table 3: every knob of the Transformer in one dataclass.

The paper's base and big models are presets; the rows of Table 3 are configs built
with `dataclasses.replace`, not code:

    base = TransformerConfig.base(vocab_size=37000)
    one_head = dataclasses.replace(base, num_heads=1, key_dim=512, value_dim=512)
    learned = dataclasses.replace(base, position_encoding="learned")

`table3_variants(base)` builds the variants that `recipes/table3.py` trains, each
a config derived from `base` in one way.
"""

import dataclasses
import numbers
from typing import Optional

from keras_transformer.validation import (
    NORM_POSITIONS,
    POSITION_ENCODINGS,
    check_choice,
    check_non_negative_int,
    check_positive_int,
    check_rate,
    head_dims,
)


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Hyperparameters of an encoder-decoder Transformer.

    Defaults are the paper's base model (§3, Table 3 row "base"), except
    `vocab_size`, which depends on the data.

    Args:
        vocab_size: Size of the source vocabulary, and of the target vocabulary
            too when `target_vocab_size` is None (a shared vocabulary, §5.1).
        target_vocab_size: Size of a separate target vocabulary, or None to share
            `vocab_size`.
        num_layers: N, the number of blocks in each of the encoder and decoder
            stacks (§3.1).
        d_model: Width of every sublayer output and of the embeddings.
        num_heads: h, the number of attention heads (§3.2.2).
        d_ff: Inner width of the position-wise feed-forward network (§3.3).
        key_dim: d_k, the width of each head's queries and keys. None means
            `d_model // num_heads`, which requires divisibility.
        value_dim: d_v, the width of each head's values. None means `key_dim`.
        dropout_rate: P_drop, applied to every sublayer output before the residual
            add and to the embedding + position sums (§5.4).
        attention_dropout_rate: Dropout on the attention weights (not in the paper).
        activation_dropout_rate: Dropout on the FFN's inner ReLU activations (not in
            the paper).
        label_smoothing: ε_ls of §5.4, used by the loss.
        position_encoding: "sinusoidal" (§3.5) or "learned" (Table 3 row E).
        max_length: Longest sequence the model accepts with learned positions; for
            sinusoidal positions it is only a documented limit for data pipelines.
        share_embeddings: Tie source and target embeddings (requires a shared
            vocabulary).
        tie_output_embedding: Use the target embedding matrix as the pre-softmax
            projection (§3.4).
        norm_position: "post" for the paper's `LayerNorm(x + Sublayer(x))`, "pre" for
            `x + Sublayer(LayerNorm(x))` with a final LayerNorm on each stack.
        layer_norm_epsilon: Epsilon of every LayerNorm.
        pad_id: Token id of padding; positions holding it are masked.
        warmup_steps: Warmup of the learning-rate schedule (§5.3).
    """

    vocab_size: int
    target_vocab_size: Optional[int] = None
    num_layers: int = 6
    d_model: int = 512
    num_heads: int = 8
    d_ff: int = 2048
    key_dim: Optional[int] = None
    value_dim: Optional[int] = None
    dropout_rate: float = 0.1
    attention_dropout_rate: float = 0.0
    activation_dropout_rate: float = 0.0
    label_smoothing: float = 0.1
    position_encoding: str = "sinusoidal"
    max_length: int = 512
    share_embeddings: bool = True
    tie_output_embedding: bool = True
    norm_position: str = "post"
    layer_norm_epsilon: float = 1e-6
    pad_id: int = 0
    warmup_steps: int = 4000

    def __post_init__(self):
        # Checked values are stored back as plain ints and floats, so that a numpy
        # integer from a data pipeline still gives a config that saves as JSON.
        for name in ("vocab_size", "num_layers", "d_model", "num_heads", "d_ff",
                     "max_length", "warmup_steps"):
            self._store(name, check_positive_int(name, getattr(self, name)))
        for name in ("target_vocab_size", "key_dim", "value_dim"):
            if getattr(self, name) is not None:
                self._store(name, check_positive_int(name, getattr(self, name)))
        head_dims(self.d_model, self.num_heads, self.key_dim, self.value_dim)
        for name in ("dropout_rate", "attention_dropout_rate",
                     "activation_dropout_rate", "label_smoothing"):
            self._store(name, check_rate(name, getattr(self, name)))
        check_choice("position_encoding", self.position_encoding, POSITION_ENCODINGS)
        check_choice("norm_position", self.norm_position, NORM_POSITIONS)
        epsilon = self.layer_norm_epsilon
        if isinstance(epsilon, bool) or not isinstance(epsilon, numbers.Real) or not epsilon > 0:
            raise ValueError(f"layer_norm_epsilon={epsilon!r} must be a positive number.")
        pad_limit = min(self.vocab_size, self.resolved_target_vocab_size)
        pad_rule = f"an id inside both vocabularies (0 <= pad_id < {pad_limit})"
        self._store("pad_id", check_non_negative_int("pad_id", self.pad_id, pad_rule))
        if self.pad_id >= pad_limit:
            raise ValueError(f"pad_id={self.pad_id!r} must be {pad_rule}.")
        if self.share_embeddings and self.resolved_target_vocab_size != self.vocab_size:
            raise ValueError(
                f"share_embeddings=True needs one shared vocabulary, but vocab_size="
                f"{self.vocab_size} and target_vocab_size={self.target_vocab_size}: "
                "set share_embeddings=False or use a shared vocabulary."
            )

    def _store(self, name, value):
        object.__setattr__(self, name, value)  # the dataclass is frozen

    @property
    def resolved_target_vocab_size(self):
        """The target vocabulary size (the source one when shared)."""
        return self.target_vocab_size or self.vocab_size

    @property
    def resolved_key_dim(self):
        """d_k: `key_dim`, or `d_model // num_heads` when it is not set."""
        return head_dims(self.d_model, self.num_heads, self.key_dim, self.value_dim)[0]

    @property
    def resolved_value_dim(self):
        """d_v: `value_dim`, or d_k when it is not set."""
        return head_dims(self.d_model, self.num_heads, self.key_dim, self.value_dim)[1]

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values):
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(
                f"Unknown TransformerConfig fields {unknown}; known fields are {sorted(known)}."
            )
        return cls(**values)

    # Presets. The paper's values come from §3, §5.4 and Table 3.

    @classmethod
    def base(cls, vocab_size, **overrides):
        """The paper's base model: N=6, d_model=512, h=8, d_ff=2048, P_drop=0.1."""
        return cls(vocab_size=vocab_size, **overrides)

    @classmethod
    def big(cls, vocab_size, **overrides):
        """The paper's big model: N=6, d_model=1024, h=16, d_ff=4096, P_drop=0.3."""
        values = dict(d_model=1024, num_heads=16, d_ff=4096, dropout_rate=0.3)
        values.update(overrides)
        return cls(vocab_size=vocab_size, **values)

    @classmethod
    def small(cls, vocab_size, **overrides):
        """A model for CPU recipes and small corpora such as Multi30k."""
        values = dict(num_layers=3, d_model=256, num_heads=4, d_ff=1024,
                      max_length=256, warmup_steps=1000)
        values.update(overrides)
        return cls(vocab_size=vocab_size, **values)

    @classmethod
    def tiny(cls, vocab_size, **overrides):
        """A model for unit tests and toy tasks: trains in seconds on a CPU."""
        values = dict(num_layers=2, d_model=32, num_heads=4, d_ff=64,
                      dropout_rate=0.0, max_length=64, warmup_steps=100)
        values.update(overrides)
        return cls(vocab_size=vocab_size, **values)


def _table3_changes(base):
    """name -> (Table 3 row, the fields in which the variant differs from `base`).

    Sizes in rows (B) and (C) are relative to the base, so the rows apply at any
    scale; head and layer counts are the values the variants are named after.
    key_dim=None and value_dim=None let d_k = d_v follow d_model / h.
    """
    def heads(num_heads):  # h · d_k = d_model: constant compute
        return dict(num_heads=num_heads, key_dim=None, value_dim=None)

    def width(d_model):
        return dict(d_model=d_model, key_dim=None, value_dim=None)

    return {
        "base": ("", {}),
        "heads1": ("A", heads(1)),
        "heads8": ("A", heads(8)),
        "heads16": ("A", heads(16)),
        # The paper shrinks d_k alone and keeps d_v = d_model / h.
        "key_dim_half": ("B", dict(key_dim=base.resolved_key_dim // 2,
                                   value_dim=base.resolved_value_dim)),
        "layers2": ("C", dict(num_layers=2)),
        "layers4": ("C", dict(num_layers=4)),
        "d_model_half": ("C", width(base.d_model // 2)),
        "d_model_double": ("C", width(base.d_model * 2)),
        "d_ff_half": ("C", dict(d_ff=base.d_ff // 2)),
        "d_ff_double": ("C", dict(d_ff=base.d_ff * 2)),
        "dropout0": ("D", dict(dropout_rate=0.0)),
        "dropout0.2": ("D", dict(dropout_rate=0.2)),
        "no_label_smoothing": ("D", dict(label_smoothing=0.0)),
        "learned_positions": ("E", dict(position_encoding="learned")),
    }


# The names and their order do not depend on the base row.
TABLE3_VARIANT_NAMES = tuple(_table3_changes(TransformerConfig.base(vocab_size=1)))


def table3_variants(base, names=None):
    """The variations of Table 3 (§6.2) on a base config.

    (A) h = 1, 8, 16 heads at constant compute, h · d_k = h · d_v = d_model;
    (B) d_k halved, d_v kept; (C) N = 2, 4 layers, d_model halved or doubled
    (with d_k = d_v = d_model / h), d_ff halved or doubled; (D) P_drop = 0 and
    0.2, ε_ls = 0; (E) learned instead of sinusoidal positions. Every other
    field keeps the base's value.

    Args:
        base: The base row, a `TransformerConfig` (the recipes use `small`).
        names: The variants to build, in order; None for all of
            `TABLE3_VARIANT_NAMES`.

    Returns:
        A dict, in the order of `names`: name -> (Table 3 row letter, "" for the
        base row; `TransformerConfig`).

    Example:

    >>> variants = table3_variants(TransformerConfig.small(vocab_size=8000))
    >>> row, config = variants["key_dim_half"]
    >>> row, config.resolved_key_dim, config.resolved_value_dim
    ('B', 32, 64)
    """
    names = TABLE3_VARIANT_NAMES if names is None else tuple(names)
    unknown = [name for name in names if name not in TABLE3_VARIANT_NAMES]
    if unknown:
        raise ValueError(
            f"Unknown Table 3 variant(s) {unknown}: choose from {', '.join(TABLE3_VARIANT_NAMES)}."
        )
    changes = _table3_changes(base)
    variants = {}
    for name in names:
        row, fields = changes[name]
        try:
            variants[name] = (row, dataclasses.replace(base, **fields))
        except ValueError as error:
            raise ValueError(f"Table 3 variant {name!r} does not fit this base config: {error}") \
                from error
    return variants
