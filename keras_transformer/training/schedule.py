"""§5.3 Optimizer: Adam with the warmup / inverse-square-root learning rate.

    lrate = d_model^-0.5 · min(step_num^-0.5, step_num · warmup_steps^-1.5)      (3)

The rate rises linearly for the first `warmup_steps` steps and then decays with the
inverse square root of the step number. Keras counts optimizer iterations from 0,
the paper counts steps from 1, so iteration i uses step_num = i + 1.

Not in the paper: a linear cooldown. Given `total_steps` and `cooldown_steps`,
the rate of eq. (3) is multiplied by (total_steps - i) / cooldown_steps over the
last `cooldown_steps` iterations, so it falls linearly to 1/cooldown_steps of
eq. (3) at the last step. A run whose length is known in advance ends at a low
rate instead of the 1/√step of eq. (3) (the "budgeted training" of Li et al.
2020; the cooldown of Hägele et al. 2024).
"""

import numbers

import keras
from keras import ops

from keras_transformer.backend import dense_gradients
from keras_transformer.validation import check_positive_int


@keras.saving.register_keras_serializable(package="keras_transformer")
class NoamSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """The learning-rate schedule of eq. (3) ("Noam" after its author).

    Args:
        d_model: Model width; the peak rate scales with d_model^-0.5.
        warmup_steps: Steps of linear warmup (4000 in the paper).
        scale: A constant factor on the whole schedule (1.0 in the paper).
        total_steps: The run's length in steps, for the cooldown.
        cooldown_steps: Steps at the end of `total_steps` over which the rate
            falls linearly towards 0 (0: none, the paper's schedule).

    Call arguments:
        step: The optimizer's 0-based iteration count.

    Returns:
        The float32 learning rate at iteration `step`.

    Example:

    >>> schedule = NoamSchedule(d_model=512)
    >>> round(float(schedule(3999)), 6)  # the peak, at step_num = warmup_steps
    0.000699
    """

    def __init__(self, d_model, warmup_steps=4000, scale=1.0, total_steps=None,
                 cooldown_steps=0):
        self.d_model = check_positive_int("d_model", d_model)
        self.warmup_steps = check_positive_int("warmup_steps", warmup_steps)
        if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not scale > 0:
            raise ValueError(
                f"scale={scale!r} must be a number > 0: a factor on the whole schedule, "
                "1.0 in the paper."
            )
        self.scale = float(scale)
        self.total_steps = None if total_steps is None else check_positive_int(
            "total_steps", total_steps, "the run's length, for the cooldown")
        self.cooldown_steps = 0
        if cooldown_steps != 0:
            self.cooldown_steps = check_positive_int("cooldown_steps", cooldown_steps,
                                                     "or 0 for no cooldown")
            if self.total_steps is None:
                raise ValueError(f"cooldown_steps={cooldown_steps} needs total_steps, the "
                                 "run's length.")
            if self.cooldown_steps > self.total_steps:
                raise ValueError(
                    f"cooldown_steps={cooldown_steps} is more than total_steps={total_steps}.")

    def __call__(self, step):
        step_num = ops.cast(step, "float32") + 1.0
        warmup = ops.cast(self.warmup_steps, "float32")
        rate = ops.minimum(ops.rsqrt(step_num), step_num * warmup**-1.5)
        if self.cooldown_steps:
            left = float(self.total_steps) - ops.cast(step, "float32")
            rate = rate * ops.clip(left / float(self.cooldown_steps), 0.0, 1.0)
        return self.scale * self.d_model**-0.5 * rate

    def get_config(self):
        return {
            "d_model": self.d_model,
            "warmup_steps": self.warmup_steps,
            "scale": self.scale,
            "total_steps": self.total_steps,
            "cooldown_steps": self.cooldown_steps,
        }


def paper_adam(d_model, warmup_steps=4000, scale=1.0, total_steps=None, cooldown_steps=0,
               **kwargs):
    """The paper's optimizer: Adam(β1=0.9, β2=0.98, ε=1e-9) on `NoamSchedule`.

    Args:
        d_model: Model width.
        warmup_steps: Warmup steps of the schedule.
        scale: Constant factor on the schedule.
        total_steps, cooldown_steps: The optional linear cooldown of
            `NoamSchedule` (not in the paper).
        **kwargs: More `keras.optimizers.Adam` arguments (e.g. `clipnorm`).

    Returns:
        Under TensorFlow a `DenseGradientAdam`, whose gradients are dense before
        its update. Under JAX and PyTorch, whose gradients are dense already,
        Keras's own `keras.optimizers.Adam`: Keras runs that class under PyTorch
        as its multi-tensor Adam (one `torch._foreach_*` call per step for all
        variables), which a subclass does not get, and whose per-variable loop
        made a small model's eager step several milliseconds slower
        (docs/performance.md, "The torch backend's host overhead").
    """
    adam = DenseGradientAdam if keras.backend.backend() == "tensorflow" \
        else keras.optimizers.Adam
    return adam(
        learning_rate=NoamSchedule(d_model, warmup_steps, scale, total_steps, cooldown_steps),
        beta_1=0.9,
        beta_2=0.98,
        epsilon=1e-9,
        **kwargs,
    )


@keras.saving.register_keras_serializable(package="keras_transformer")
class DenseGradientAdam(keras.optimizers.Adam):
    """`keras.optimizers.Adam` on dense gradients, the same update on every backend.

    Under TensorFlow an embedding's gradient is sparse (`tf.IndexedSlices`, one
    slice per token occurrence), and Keras's Adam squares it slice by slice: a
    token seen k times in a batch adds the sum of its k gradients' squares to the
    second moment v, not the square of their sum as Adam (and JAX and PyTorch)
    do. Its embedding rows then took other steps than under the other backends,
    and the Multi30k recipe trained slower under TensorFlow around the peak of the
    rate (docs/results.md). Each gradient is made dense first
    (`keras_transformer.backend.dense_gradients`); Adam's updates of m and v are
    dense already, so this costs no more than the sum of the slices.
    """

    def apply(self, grads, trainable_variables=None):
        return super().apply(dense_gradients(list(grads)), trainable_variables)
