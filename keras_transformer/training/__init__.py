"""§5 Training: the learning-rate schedule, label-smoothed loss and metrics."""

from keras_transformer.training.losses import LabelSmoothedCrossEntropy, MaskedTokenAccuracy
from keras_transformer.training.schedule import NoamSchedule, paper_adam

__all__ = ["LabelSmoothedCrossEntropy", "MaskedTokenAccuracy", "NoamSchedule", "paper_adam"]
