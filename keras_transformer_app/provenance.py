"""Where a figure comes from: the commit of the checkout that made it, the command, and the
machine (its CPU and the widest vector instructions it has, which can flip a ratio between
two machines). A training run writes this into its `results.json` (`training/run.py`), and
every benchmark into its results (`benchmarks/common.py`), so that a table made from them
names its commit, command and CPU class."""

import os
import platform
import shlex
import subprocess
import sys

CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def commit(checkout=CHECKOUT):
    """The checkout's short commit, with " (uncommitted changes)" after it when its tracked
    files differ from it; "unknown commit" where it is not a git checkout.

    `KERAS_TRANSFORMER_COMMIT`, when set, is returned as it is: a copy of the tree without
    its `.git` (the GPU machine's, benchmarks/gpu_all.sh) is told its commit by whoever
    copied it, since a stale `.git` there would name another."""
    given = os.environ.get("KERAS_TRANSFORMER_COMMIT", "").strip()
    if given:
        return given

    def git(*arguments):
        # --no-optional-locks: never take the index lock of a checkout in use.
        return subprocess.run(["git", "--no-optional-locks", "-C", checkout, *arguments],
                              capture_output=True, text=True, check=False).stdout.strip()

    try:
        short = git("rev-parse", "--short", "HEAD")
        changed = short and git("status", "--porcelain", "--untracked-files=no")
    except OSError:  # no git
        return "unknown commit"
    return (short + (" (uncommitted changes)" if changed else "")) if short else "unknown commit"


def instruction_set():
    """The widest x86 vector instructions the CPU has: "AVX-512", "AVX2", or "other"."""
    try:
        with open("/proc/cpuinfo") as file:
            flags = next((line.split(":", 1)[1].split() for line in file
                          if line.startswith("flags")), [])
    except OSError:
        return "other"
    return "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "other"


def cpu():
    """The CPU's model name, as /proc/cpuinfo gives it."""
    try:
        with open("/proc/cpuinfo") as file:
            for line in file:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def command(argv=None):
    """The command line that started this process, as typed (`python -m recipes.multi30k
    ...`), with the Keras backend it chose in front."""
    words = sys.orig_argv[1:] if argv is None else argv
    backend = os.environ.get("KERAS_BACKEND")
    return ((f"KERAS_BACKEND={backend} " if backend else "") + "python "
            + " ".join(shlex.quote(word) for word in words))


def record(argv=None):
    """{"commit", "command", "cpu", "isa", "cores"}: what a results file records."""
    return {"commit": commit(), "command": command(argv), "cpu": cpu(),
            "isa": instruction_set(), "cores": len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity") else os.cpu_count()}
