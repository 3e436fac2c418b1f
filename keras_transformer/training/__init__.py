"""§5 Training, from the data (`keras_transformer.data`) to a scored model.

- `vocabulary.py`: §5.1 a run's subword vocabulary, learned once and then reused;
- `fit.py`: §5.2-§5.4 the training regime (`model.fit` in checkpointed windows);
  `interruptions.py`: a Ctrl-C or SIGTERM during it, handled between steps;
- `distribution.py`: §5.2 several devices and several processes;
- `schedule.py`: §5.3 the optimizer and the eq. (3) learning rate;
- `losses.py`: §5.4 label smoothing and the masked metrics;
- `compile.py`: §5.3-§5.4 the paper's training setup in one `compile_model`;
- `averaging.py`: §6.1 checkpoint averaging;
- `run.py`: the resumable run behind every recipe, from a script: `run(splits, config,
  RunOptions(...))`, on one process or a cluster; `run_options.py`: its `RunOptions`;
- `scoring.py`: §6.1 BLEU of a split, α tuning, the validation curve, perplexity;
- `variants.py`: §6.2 Table 3's variants under one time budget.

The package exports the schedule, the loss and the metrics.
"""

from keras_transformer.training.losses import LabelSmoothedCrossEntropy, MaskedTokenAccuracy
from keras_transformer.training.schedule import NoamSchedule, paper_adam

__all__ = ["LabelSmoothedCrossEntropy", "MaskedTokenAccuracy", "NoamSchedule", "paper_adam"]
