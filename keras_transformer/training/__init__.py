"""§5.3-§5.4 Training's pieces that a model needs, whoever runs the training.

- `schedule.py`: §5.3 the optimizer and the eq. (3) learning rate;
- `losses.py`: §5.4 label smoothing and the masked metrics;
- `compile.py`: §5.3-§5.4 the paper's training setup in one `compile_model`.

The runs themselves (vocabulary, checkpointed windows, resuming, several processes,
checkpoint averaging, scoring) are the program's: `keras_transformer_app.training`.
The package exports the schedule, the loss and the metrics.
"""

from keras_transformer.training.losses import LabelSmoothedCrossEntropy, MaskedTokenAccuracy
from keras_transformer.training.schedule import NoamSchedule, paper_adam

__all__ = ["LabelSmoothedCrossEntropy", "MaskedTokenAccuracy", "NoamSchedule", "paper_adam"]
