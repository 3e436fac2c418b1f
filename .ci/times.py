"""CI's record of where its time went: .ci/run adds a line of JSON to .ci/times.jsonl as each
stage ends (its seconds), and each pytest run one before it (where its tests' time went, and
its slowest tests' seconds: tests/cpu_time.py); this writes them, with the commit, the
command and the machine (keras_transformer_app.provenance), to .ci/times.json. Copied into
docs/results/ci/, a file per machine (a new run replaces its machine's), it is what
docs/installation.md's tables of CI's time are made from, a column per file
(benchmarks/tables.py, kind "ci").

    python .ci/times.py .ci/times.jsonl .ci/times.json
"""

import json
import os
import sys

from keras_transformer_app import provenance


def main(lines_path, output):
    stages = {}
    with open(lines_path, encoding="utf-8") as file:
        for line in file:
            entry = json.loads(line)
            stages.setdefault(entry.pop("stage"), {}).update(entry)
    record = {**provenance.record(),
              "command": ("CI=true " if os.environ.get("CI") == "true" else "") + "bash .ci/run",
              "stages": [{"stage": name, **figures} for name, figures in stages.items()]}
    with open(output, "w", encoding="utf-8") as file:
        json.dump(record, file, indent=1)
        file.write("\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
