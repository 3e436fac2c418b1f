"""Figures of the paper as PNG files: attention (Appendix, Figures 3-5), the §3.5
positional encodings, the §5.3 learning-rate schedule (eq. 3), training and
validation-BLEU curves and the Table 3 chart (§6.2).

Each plotting function writes PNG files and returns their paths.
"""

from keras_transformer_app.plots.attention import (
    ATTENTION_KINDS,
    attention_weights,
    plot_attention,
    plot_translation_attention,
    token_labels,
)
from keras_transformer_app.plots.curves import (
    plot_learning_rate,
    plot_position_encoding,
    plot_training_log,
    plot_validation_curve,
    plot_variants,
)

__all__ = ["ATTENTION_KINDS", "attention_weights", "plot_attention", "plot_learning_rate",
           "plot_position_encoding", "plot_training_log", "plot_translation_attention",
           "plot_validation_curve", "plot_variants", "token_labels"]
