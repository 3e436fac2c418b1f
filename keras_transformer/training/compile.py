"""§5.3 Optimizer and §5.4 Regularization: the paper's training setup in one `compile`.

Adam(β1 = 0.9, β2 = 0.98, ε = 1e-9) on the learning rate of eq. (3)
(`keras_transformer.training.schedule`), cross-entropy against label-smoothed
targets with ε_ls (`keras_transformer.training.losses`), and the masked token
accuracy as the metric: what every recipe, the Table 3 variants and the
tests train with.
"""

from keras_transformer.training.losses import LabelSmoothedCrossEntropy, MaskedTokenAccuracy
from keras_transformer.training.schedule import paper_adam


def compile_model(model, config, lr_scale=1.0, total_steps=None, cooldown=0, fused_loss=False,
                  loss_chunk_size=None):
    """The paper's training setup: Adam(0.9, 0.98, 1e-9) on the eq. (3) schedule (×
    `lr_scale`, with an optional linear cooldown over the last `cooldown` of
    `total_steps`), label smoothing ε_ls (§5.4), in one fused pass when `fused_loss`
    or with the projection in chunks of `loss_chunk_size` positions (`LabelSmoothedCrossEntropy`),
    and masked token accuracy; it also builds a built model's optimizer."""
    model.compile(
        optimizer=paper_adam(config.d_model, config.warmup_steps, lr_scale, total_steps,
                             cooldown),
        loss=LabelSmoothedCrossEntropy(config.label_smoothing, pad_id=config.pad_id,
                                       fused=fused_loss, chunk_size=loss_chunk_size),
        metrics=[MaskedTokenAccuracy(pad_id=config.pad_id)],
    )
    if model.built:
        # Adam's slots now, not in the first trace of the train step: under TensorFlow
        # a tf.function that creates variables is traced twice (5 to 7 s more here).
        model.optimizer.build(model.trainable_variables)
