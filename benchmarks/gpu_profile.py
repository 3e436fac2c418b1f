"""What runs on the GPU during gpu.py's training steps: which kernel computed
eq. (1) (§3.2.1), and where the time of a few steps goes.

`attention_kernels` says which kernel ran the attention: under JAX it lowers
the gradient of the training loss and counts cuDNN's fused-attention custom
calls (`__cudnn$fmha*`) in it; under torch it profiles one training step and
lists the attention kernels that ran. Under TensorFlow it says that Keras has
no fused kernel for that backend.

`profile_steps` profiles a few `train_on_batch` steps with the backend's
profiler (jax.profiler, torch.profiler) and summarises each timeline: the
number of events, their busy time and the costliest kernels.
"""

import os
import re
import time

# cuDNN's fused attention in an XLA graph: a custom call named __cudnn$fmha...
JAX_FUSED_ATTENTION = re.compile(r"__cudnn\$fmha\w*")
# The names torch gives its fused attention kernels (flash, memory-efficient, cuDNN).
TORCH_ATTENTION_KERNEL = re.compile(r"flash|fmha|efficient_attention|cudnn.*attention|"
                                    r"attention.*cudnn|sdpa", re.IGNORECASE)



def attention_kernels(backend, model, inputs, labels):
    """What ran eq. (1): a dict saying how it was checked and what was found."""
    if backend == "jax":
        import jax

        loss_fn = model.loss

        def training_loss(trainable, non_trainable, x, y):
            predictions, _ = model.stateless_call(trainable, non_trainable, x, training=True)
            return loss_fn(y, predictions)

        trainable = [v.value for v in model.trainable_variables]
        non_trainable = [v.value for v in model.non_trainable_variables]
        lowered = jax.jit(jax.grad(training_loss)).lower(trainable, non_trainable, inputs, labels)
        calls = JAX_FUSED_ATTENTION.findall(lowered.as_text())
        counts = {name: calls.count(name) for name in sorted(set(calls))}
        return {"method": "custom calls in the lowered gradient of the training loss",
                "fused_calls": counts, "fused": bool(calls)}
    if backend == "torch":
        profiler, _ = _torch_profiled(model, inputs, labels, 1)
        names = {}
        for event in profiler.key_averages():
            if TORCH_ATTENTION_KERNEL.search(event.key):
                names[event.key[:120]] = event.count
        return {"method": "torch.profiler operators and kernels of one train_on_batch",
                "fused_calls": names, "fused": bool(names)}
    return {"method": "none", "fused": False,
            "fused_calls": {}, "note": "Keras's TensorFlow backend has no fused attention kernel"}


def _torch_profiled(model, inputs, labels, steps):
    """(torch.profiler, wall seconds) of `steps` calls of `train_on_batch`: the
    aten:: operators, and on a GPU the kernels they launched."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    gpu = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    start = time.perf_counter()
    with profile(activities=activities) as profiler:
        for _ in range(steps):
            model.train_on_batch(inputs, labels)
        if gpu:
            torch.cuda.synchronize()
    return profiler, time.perf_counter() - start


def _timeline(events, most):
    """The summary of one timeline's (name, nanoseconds) events: their number,
    busy time, and [[name, calls, ms], ...] of the `most` names with the most time."""
    totals, counts = {}, {}
    for name, duration in events:
        totals[name] = totals.get(name, 0) + duration
        counts[name] = counts.get(name, 0) + 1
    ranked = sorted(totals, key=totals.get, reverse=True)[:most]
    return {"events": sum(counts.values()), "busy_ms": round(sum(totals.values()) / 1e6, 3),
            "top": [[name[:160], counts[name], round(totals[name] / 1e6, 3)]
                    for name in ranked]}


def profile_steps(backend, model, inputs, labels, steps, most=25):
    """Where `steps` calls of `train_on_batch` spend their time, from the backend's
    profiler: the wall time, and per timeline (JAX: each line of the device's
    planes, the host's where no device shows; torch: the GPU kernels, else the
    CPU operators) the events, their busy time and the `most` costliest names."""
    import tempfile

    model.train_on_batch(inputs, labels)  # compiled and warm before the trace
    if backend == "jax":
        import glob

        import jax
        from jax.profiler import ProfileData

        with tempfile.TemporaryDirectory(prefix="gpu-profile-") as directory:
            start = time.perf_counter()
            with jax.profiler.trace(directory):
                for _ in range(steps):
                    model.train_on_batch(inputs, labels)  # returns the loss on the host
            wall = time.perf_counter() - start
            path = glob.glob(os.path.join(directory, "**", "*.xplane.pb"), recursive=True)[0]
            planes = list(ProfileData.from_file(path).planes)
        device = [p for p in planes if p.name.startswith("/device:")]
        timelines = {}
        for plane in device or [p for p in planes if p.name.startswith("/host:CPU")]:
            for line in plane.lines:
                timeline = _timeline(((e.name, e.duration_ns) for e in line.events), most)
                if timeline["events"]:
                    timelines[f"{plane.name} {line.name}"] = timeline
        return {"steps": steps, "wall_ms": round(wall * 1e3, 3), "tool": "jax.profiler",
                "device_planes": bool(device), "timelines": timelines}
    if backend == "torch":
        import torch

        gpu = torch.cuda.is_available()
        profiler, wall = _torch_profiled(model, inputs, labels, steps)
        events = ((event.name, (event.time_range.end - event.time_range.start) * 1000)  # ns
                  for event in profiler.events()
                  if str(event.device_type).endswith("CUDA") is gpu
                  and (gpu or event.cpu_parent is None))
        name = "GPU kernels" if gpu else "top-level CPU operators"
        return {"steps": steps, "wall_ms": round(wall * 1e3, 3), "tool": "torch.profiler",
                "device_planes": gpu, "timelines": {name: _timeline(events, most)}}
    return {"steps": steps, "tool": "none", "note": "profiling is implemented for JAX and torch"}
