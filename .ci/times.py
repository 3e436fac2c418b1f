"""CI's record of where its time went: .ci/run adds a line of JSON to .ci/times.jsonl as each
stage ends (its seconds), and each pytest run one before it (where its tests' time went, and
its slowest tests' seconds: tests/cpu_time.py); this writes them, with the commit, the
command and the machine (keras_transformer_app.provenance), to .ci/times.json. Copied into
docs/results/ci/, a file per machine (a new run replaces its machine's), it is what
docs/installation.md's tables of CI's time are made from, a column per file
(benchmarks/tables.py, kind "ci").

    python .ci/times.py .ci/times.jsonl .ci/times.json

With `--time`, one command (a line of bash, as a page gives it) is run as the one stage of a
record of the same shape, its seconds to 0.1 s: how docs/installation.md's quick loop is
timed (a pytest command given `--durations` adds where its tests' time went). Its status is
this one's; a failed command writes no record.

    python .ci/times.py --time OUTPUT 'KERAS_BACKEND=tensorflow python -m pytest ...'
"""

import json
import os
import subprocess
import sys
import tempfile
import time

from keras_transformer_app import provenance

COMMAND_STAGE = "command"  # the stage's name in a --time record


def _stages(lines_path):
    stages = {}
    with open(lines_path, encoding="utf-8") as file:
        for line in file:
            entry = json.loads(line)
            stages.setdefault(entry.pop("stage"), {}).update(entry)
    return [{"stage": name, **figures} for name, figures in stages.items()]


def _write(record, output):
    with open(output, "w", encoding="utf-8") as file:
        json.dump(record, file, indent=1)
        file.write("\n")


def main(lines_path, output):
    _write({**provenance.record(),
            "command": ("CI=true " if os.environ.get("CI") == "true" else "") + "bash .ci/run",
            "stages": _stages(lines_path)}, output)


def time_command(output, command):
    """Runs `command` with bash, and writes its record to `output` if it succeeds; returns
    its exit status."""
    with tempfile.TemporaryDirectory() as folder:
        lines = os.path.join(folder, "times.jsonl")
        began = time.monotonic()
        status = subprocess.run(["bash", "-c", command], check=False, env={
            **os.environ, "CI_TIMES": lines, "CI_STAGE": COMMAND_STAGE}).returncode
        seconds = round(time.monotonic() - began, 1)
        if status:
            print(f"times.py: the command ended with status {status}; no record written",
                  file=sys.stderr)
            return status
        with open(lines, "a", encoding="utf-8") as file:
            file.write(json.dumps({"stage": COMMAND_STAGE, "seconds": seconds}) + "\n")
        _write({**provenance.record(), "command": command, "stages": _stages(lines)}, output)
    print(f"{command}: {seconds} s (the record: {output})")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--time"] and len(sys.argv) == 4:
        sys.exit(time_command(*sys.argv[2:]))
    if len(sys.argv) != 3 or sys.argv[1].startswith("-"):
        sys.exit("usage: python .ci/times.py LINES OUTPUT, or "
                 "python .ci/times.py --time OUTPUT COMMAND")
    main(*sys.argv[1:])
