"""The bounded set of input shapes an exported model compiles (§6.1 search, served).

XLA compiles the search of `keras_transformer.inference.search` once per input
shape. A server that met every batch size and sentence length of its traffic
would compile on the request path for minutes. The exported signatures
therefore pad every batch up to one of a few batch sizes and every source
width up to one of a few lengths, chosen at export: any request then runs on
one of `len(batch_sizes) × len(lengths)` shapes, all compiled by the warm-up
(`keras_transformer.export.warmup`) before the version is served.

A batch larger than the largest batch size runs as several chunks of that
size; a sentence longer than the largest length is truncated to it and
flagged (`truncated` in the outputs), never failing the others.
"""

import dataclasses

from keras_transformer.inference.limits import source_limit

#: TensorFlow Serving's usual allowed batch sizes: powers of two up to 64.
DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)
# Steps of 16 up to 64 tokens (where most sentences are), then about 1.5×
# apart, so padding never costs more than half the work.
_DEFAULT_LENGTH_STEPS = (16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048)


def _ascending_positive(name, values):
    try:
        values = tuple(values)
    except TypeError:
        raise ValueError(f"{name}={values!r} must be a list of positive integers.") from None
    if not values or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0
                         for v in values):
        raise ValueError(f"{name}={list(values)!r} must be a non-empty list of positive "
                         "integers.")
    if list(values) != sorted(set(values)):
        raise ValueError(f"{name}={list(values)!r} must be strictly ascending.")
    return values


@dataclasses.dataclass(frozen=True)
class ServingShapes:
    """The batch sizes and source widths (ids + EOS) an export compiles.

    Attributes:
        batch_sizes: Ascending batch sizes; a batch of n sentences runs at the
            smallest size >= n, in chunks of the largest when n is larger.
        lengths: Ascending source widths; a batch runs at the smallest width
            >= its longest input. The last one is the longest input served.
    """

    batch_sizes: tuple = DEFAULT_BATCH_SIZES
    lengths: tuple = (16, 32, 48, 64)

    def __post_init__(self):
        object.__setattr__(self, "batch_sizes",
                           _ascending_positive("batch_sizes", self.batch_sizes))
        lengths = _ascending_positive("lengths", self.lengths)
        if lengths[0] < 2:
            raise ValueError(f"lengths={list(lengths)!r}: a width holds at least one token "
                             "and EOS (2).")
        object.__setattr__(self, "lengths", lengths)

    @classmethod
    def for_model(cls, config, max_source_length=None, batch_sizes=None, lengths=None):
        """The shapes of an export of a model with `config`.

        Args:
            config: The model's `TransformerConfig`.
            max_source_length: The longest input served (ids + EOS); None
                means `config.max_length`, the length the model was trained
                for. With sinusoidal positions it may be larger
                (`keras_transformer.inference.limits.source_limit`).
            batch_sizes: Ascending batch sizes, default `DEFAULT_BATCH_SIZES`.
            lengths: Ascending widths; default steps of 16 up to 64, then
                about 1.5× apart, ending at `max_source_length`.

        Raises:
            ValueError: for bad lists, or widths past the model's limit.
        """
        limit = source_limit(config, config.max_length if max_source_length is None
                             else max_source_length)
        if lengths is None:
            lengths = tuple(step for step in _DEFAULT_LENGTH_STEPS if step < limit) + (limit,)
        shapes = cls(batch_sizes=DEFAULT_BATCH_SIZES if batch_sizes is None else batch_sizes,
                     lengths=lengths)
        if shapes.lengths[-1] > limit:
            raise ValueError(f"lengths={list(shapes.lengths)!r} go past the longest input "
                             f"this model takes ({limit}, see max_source_length).")
        if max_source_length is not None and shapes.lengths[-1] != limit:
            raise ValueError(f"lengths={list(shapes.lengths)!r} must end at "
                             f"max_source_length={limit}, the longest input served.")
        return shapes

    @property
    def max_batch_size(self):
        return self.batch_sizes[-1]

    @property
    def max_source_length(self):
        """The longest input served (ids + EOS); longer ones are truncated."""
        return self.lengths[-1]

    def shapes(self):
        """Every (batch size, width) pair the export compiles."""
        return [(batch, width) for batch in self.batch_sizes for width in self.lengths]

    def to_dict(self):
        return {"batch_sizes": list(self.batch_sizes), "lengths": list(self.lengths)}

    @classmethod
    def from_dict(cls, values):
        return cls(batch_sizes=tuple(values["batch_sizes"]), lengths=tuple(values["lengths"]))
