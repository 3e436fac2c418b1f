"""§3 Model Architecture and §6.2 Table 3: every knob of the Transformer in one dataclass.

The paper's base and big models are presets; the rows of Table 3 are configs built
with `dataclasses.replace`, not code:

    base = TransformerConfig.base(vocab_size=37000)
    one_head = dataclasses.replace(base, num_heads=1, key_dim=512, value_dim=512)
    learned = dataclasses.replace(base, position_encoding="learned")
"""

import dataclasses
from typing import Optional

POSITION_ENCODINGS = ("sinusoidal", "learned")
NORM_POSITIONS = ("post", "pre")


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
        for name in ("vocab_size", "num_layers", "d_model", "num_heads", "d_ff",
                     "max_length", "warmup_steps"):
            _check_positive_int(name, getattr(self, name))
        for name in ("target_vocab_size", "key_dim", "value_dim"):
            if getattr(self, name) is not None:
                _check_positive_int(name, getattr(self, name))
        if self.key_dim is None and self.d_model % self.num_heads:
            raise ValueError(
                f"d_model={self.d_model} is not divisible by "
                f"num_heads={self.num_heads}: choose d_model as a multiple of "
                "num_heads, or set key_dim (d_k) explicitly."
            )
        for name in ("dropout_rate", "attention_dropout_rate",
                     "activation_dropout_rate", "label_smoothing"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
                raise ValueError(f"{name}={value!r} must be a number in [0, 1).")
        if self.position_encoding not in POSITION_ENCODINGS:
            raise ValueError(
                f"position_encoding={self.position_encoding!r} must be one of "
                f"{POSITION_ENCODINGS}."
            )
        if self.norm_position not in NORM_POSITIONS:
            raise ValueError(
                f"norm_position={self.norm_position!r} must be one of {NORM_POSITIONS}."
            )
        if not isinstance(self.layer_norm_epsilon, (int, float)) or self.layer_norm_epsilon <= 0:
            raise ValueError(
                f"layer_norm_epsilon={self.layer_norm_epsilon!r} must be a positive number."
            )
        if isinstance(self.pad_id, bool) or not isinstance(self.pad_id, int) or not (
            0 <= self.pad_id < min(self.vocab_size, self.resolved_target_vocab_size)
        ):
            raise ValueError(
                f"pad_id={self.pad_id!r} must be an integer id inside both vocabularies "
                f"(0 <= pad_id < {min(self.vocab_size, self.resolved_target_vocab_size)})."
            )
        if self.share_embeddings and self.resolved_target_vocab_size != self.vocab_size:
            raise ValueError(
                f"share_embeddings=True needs one shared vocabulary, but vocab_size="
                f"{self.vocab_size} and target_vocab_size={self.target_vocab_size}: "
                "set share_embeddings=False or use a shared vocabulary."
            )

    @property
    def resolved_target_vocab_size(self):
        """The target vocabulary size (the source one when shared)."""
        return self.target_vocab_size or self.vocab_size

    @property
    def resolved_key_dim(self):
        """d_k: `key_dim`, or `d_model // num_heads` when it is not set."""
        return self.key_dim or self.d_model // self.num_heads

    @property
    def resolved_value_dim(self):
        """d_v: `value_dim`, or d_k when it is not set."""
        return self.value_dim or self.resolved_key_dim

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


def _check_positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name}={value!r} must be a positive integer.")
