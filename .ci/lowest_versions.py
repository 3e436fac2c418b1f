"""The lowest versions pyproject.toml allows, installed and run: `python .ci/lowest_versions.py`.

Every `name>=X` of the project's dependencies and extras becomes `name==X` in a constraints
file; a fresh virtual environment in `--work-dir` installs the project with them (the extras
text, serving, test and those of the backends run), and on each backend a smoke path runs as
a user's would: the quickstart recipe for a few steps with its export (under JAX and PyTorch
through a TensorFlow-backend process), `keras-transformer translate` on the run, and one
request to `keras-transformer serve` on the export. It prints what it installed and one line
per step; a backend stops at its first failing step, and the script exits 1 if any failed.

PyTorch is the exception: PyPI's other torch wheels for Linux are CUDA builds of several GB,
so the one CPU build on this machine's disk, 2.13.0 for Python 3.11, is both the lowest and the
newest tested (`--torch` names another); with `--python` another interpreter makes the
environment, and a run without torch among `--backends` installs none. Too long for CI's
15 minutes beside the suite: docs/installation.md gives its last result, made from the record
that `--output` writes.

    python .ci/lowest_versions.py                       # every backend
    python .ci/lowest_versions.py --backends tensorflow,jax   # no torch installed
    python .ci/lowest_versions.py --output docs/results/lowest-versions.json
"""

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import tomllib
import urllib.request

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPOSITORY)
from keras_transformer_app import provenance  # noqa: E402  this checkout's, beside the script

TINY_MODEL = ["--preset", "tiny", "--d-model", "32", "--d-ff", "64", "--num-heads", "2",
              "--num-layers", "1", "--warmup-steps", "10", "--beam-size", "2", "--verbose", "0"]
LOWER_BOUND = re.compile(r"^([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*>=\s*([^,;\s]+)\s*$")


def lower_bounds(pyproject):
    """{name: version} of every `name>=version` among the dependencies and extras."""
    project = pyproject["project"]
    specs = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        specs += extra
    bounds = {}
    for spec in specs:
        match = LOWER_BOUND.match(spec.strip())
        if match:
            bounds[match.group(1).lower()] = match.group(3)
    return bounds


def run(command, environment, timeout=900, **kwargs):
    """Runs `command`; prints it with its time and status; returns the CompletedProcess."""
    start = time.monotonic()
    result = subprocess.run(command, env=environment, capture_output=True, text=True,
                            timeout=timeout, **kwargs)
    status = "ok" if result.returncode == 0 else f"FAILED (status {result.returncode})"
    print(f"  {' '.join(command[:6])}{' ...' if len(command) > 6 else ''}: {status}, "
          f"{time.monotonic() - start:.0f} s", flush=True)
    if result.returncode != 0:
        print(result.stdout[-2000:] + result.stderr[-4000:], file=sys.stderr)
    return result


def install(work_dir, bounds, torch_version, interpreter, extras):
    """A virtual environment under `work_dir`, made by `interpreter`, with the project
    and its `extras` at their lowest versions."""
    venv = os.path.join(work_dir, "venv")
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([interpreter, "-m", "venv", venv], check=True)
    python = os.path.join(venv, "bin", "python")
    constraints = os.path.join(work_dir, "constraints.txt")
    with open(constraints, "w") as f:
        f.writelines(f"{name}=={version}\n" for name, version in sorted(bounds.items())
                     if name != "torch")
    print(f"Lower bounds ({constraints}): " + ", ".join(
        f"{name}=={version}" for name, version in sorted(bounds.items()) if name != "torch")
        + f"; torch=={torch_version}", flush=True)
    environment = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1")
    torch = [f"torch=={torch_version}"] if "torch" in extras else []
    result = run([python, "-m", "pip", "install", "-c", constraints, *torch,
                  "-e", f"{REPOSITORY}[{','.join(extras)}]"], environment, timeout=1800)
    if result.returncode != 0:
        sys.exit(1)
    frozen = subprocess.run([python, "-m", "pip", "freeze"], capture_output=True, text=True,
                            check=True).stdout.splitlines()
    watched = ("keras==", "tensorflow==", "tensorflow-text==", "keras-hub==", "keras-nlp==",
               "jax==", "jaxlib==", "torch==", "numpy==", "httptools==",
               "ctranslate2==", "prometheus-client==", "prometheus_client==")
    installed = [line for line in frozen if line.lower().startswith(watched)]
    print("Installed: " + ", ".join(installed), flush=True)
    return python, dict(line.split("==", 1) for line in installed)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_request(python, base, environment):
    """`keras-transformer serve` on the export, one :predict once AVAILABLE; True if it answered."""
    port = free_port()
    server = subprocess.Popen([python, "-m", "keras_transformer_app", "serve", base, "--host",
                               "127.0.0.1", "--port", str(port)], env=environment,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}/v1/models/{os.path.basename(base)}"
    start = time.monotonic()
    try:
        while time.monotonic() - start < 300:
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    if "AVAILABLE" in response.read().decode():
                        break
            except OSError:
                pass
            if server.poll() is not None:
                print(server.stderr.read()[-4000:], file=sys.stderr)
                return False
            time.sleep(1)
        request = urllib.request.Request(url + ":predict", method="POST",
                                         data=json.dumps({"instances": ["kave tomi"]}).encode())
        with urllib.request.urlopen(request, timeout=60) as response:
            answer = json.loads(response.read())
        print(f"  serve, one request: ok, {time.monotonic() - start:.0f} s "
              f"({answer['predictions'][0]!r})", flush=True)
        return True
    except OSError as error:
        print(f"  serve, one request: FAILED ({error})", flush=True)
        return False
    finally:
        server.terminate()
        server.wait(timeout=60)


def smoke(python, backend, work_dir):
    """The quickstart with its export, a translation and one request, under `backend`."""
    print(f"{backend}:", flush=True)
    root = os.path.join(work_dir, backend)
    shutil.rmtree(root, ignore_errors=True)
    run_dir, base = os.path.join(root, "run"), os.path.join(root, "saved_models", "quickstart")
    environment = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
    steps = [
        [python, "-m", "recipes.quickstart", "--run-dir", run_dir, "--steps", "6",
         "--checkpoint-every", "3", "--train-pairs", "200", "--test-pairs", "4", *TINY_MODEL,
         "--export-dir", base],
        [python, "-m", "keras_transformer_app", "translate", run_dir, "kave tomi tozu"],
    ]
    for command in steps:
        if run(command, environment, cwd=REPOSITORY).returncode != 0:
            return False
    return one_request(python, base, environment)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="tensorflow,jax,torch")
    parser.add_argument("--work-dir", default=os.path.join("/tmp", "keras-transformer-lowest"))
    parser.add_argument("--torch", default="2.13.0", help="the torch version installed")
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter of the environment (default: this one)")
    parser.add_argument("--instead", action="append", default=[], metavar="NAME==VERSION",
                        help="pin NAME to VERSION instead of its lower bound (a bound that "
                             "has no release for --python); repeatable")
    parser.add_argument("--output", help="also write the run's record to this JSON file: "
                        "its commit, machine, the versions installed, each backend's result "
                        "and seconds")
    args = parser.parse_args()
    backends = args.backends.split(",")
    # Every extra but the backends not run (torch's wheel is the one to avoid).
    extras = ["text", "serving", "test", *backends]
    with open(os.path.join(REPOSITORY, "pyproject.toml"), "rb") as f:
        bounds = lower_bounds(tomllib.load(f))
    for pin in args.instead:
        name, _, version = pin.partition("==")
        if name.lower() not in bounds or not version:
            parser.error(f"--instead {pin}: give NAME==VERSION for one of {sorted(bounds)}")
        bounds[name.lower()] = version
    os.makedirs(args.work_dir, exist_ok=True)
    began = time.monotonic()
    python, installed = install(args.work_dir, bounds, args.torch, args.python, extras)
    record = provenance.record()
    version = subprocess.run([python, "--version"], capture_output=True, text=True).stdout
    print(f"Commit {record['commit']}, {version.strip()}", flush=True)
    runs = []
    for backend in backends:
        start = time.monotonic()
        runs.append({"backend": backend, "passed": smoke(python, backend, args.work_dir),
                     "seconds": round(time.monotonic() - start, 1)})
    failed = [run["backend"] for run in runs if not run["passed"]]
    print("passed" if not failed else f"failed under {', '.join(failed)}")
    if args.output:  # docs/installation.md's line is made of it (benchmarks/tables.py)
        with open(args.output, "w", encoding="utf-8") as file:
            json.dump({**record, "python": version.split()[-1], "installed": installed,
                       "backends": runs, "seconds": round(time.monotonic() - began)},
                      file, indent=1)
            file.write("\n")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
