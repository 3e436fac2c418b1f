"""§5 Training runs, from the data (`keras_transformer.data`) to a scored model: the
program's side of training, over the library's loss, schedule and `compile_model`
(`keras_transformer.training`).

- `vocabulary.py`: §5.1 a run's subword vocabulary, learned once and then reused;
  `sentencepiece_trainer.py`: SentencePiece's trainer in a child process;
- `fit.py`: §5.2-§5.4 the training regime (`model.fit` in checkpointed windows);
  `interruptions.py`: a Ctrl-C or SIGTERM during it, handled between steps;
- `distribution.py`: §5.2 several devices and several processes; `clusters.py`: the
  cluster a process finds itself in;
- `averaging.py`: §6.1 checkpoint averaging;
- `run.py`: the resumable run behind every recipe, from a script: `run(splits, config,
  RunOptions(...))`, on one process or a cluster; `run_options.py`: its `RunOptions`;
- `scoring.py`: §6.1 BLEU of a split, α tuning, the validation curve, perplexity;
- `variants.py`: §6.2 Table 3's variants under one time budget.
"""
