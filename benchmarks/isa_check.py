"""What `--max-isa AVX2` changes: each engine's own report of the kernels it picked, without
the cap and with it, side by side.

Each engine runs a small matrix product in a fresh process, once as the machine is and once
under `common.ISA_CAPS["AVX2"]`, and reports what it selected:

    torch        `torch.backends.cpu.get_cpu_capability()` (ATen's kernels)
    oneDNN       the ISA of the kernels in oneDNN's verbose log, through PyTorch
                 (`ONEDNN_VERBOSE=1`, a float32 convolution)
    TensorFlow   the same through TensorFlow, or the ISA oneDNN announces when no kernel of
                 it ran
    XLA (JAX)    the widest float vector in the optimized LLVM IR XLA writes for a jitted
                 elementwise function (`--xla_dump_to`) when asked for 512-bit vectors
                 (`--xla_cpu_prefer_vector_width=512`; XLA's default is 256 even on AVX-512):
                 <16 x float> is AVX-512, <8 x float> AVX2
    CTranslate2  the ISA it logs when it loads a model (`CT2_VERBOSE=1`)

On a CPU with AVX-512 the two columns differ for every engine if the cap holds; on an AVX2
CPU they are the same.

    python benchmarks/isa_check.py
    python benchmarks/isa_check.py --output benchmarks/results/isa-check.json
"""

if __name__ == "__main__":  # the process is this script's own: set up before Keras loads
    import checkout  # noqa: F401  this tree's library and program, installed or not

    from keras_transformer_app.logs import start

    start()

import glob
import json
import os
import re
import subprocess
import sys
import tempfile

import common

PROBES = {
    "torch": r'''
import torch
print(torch.backends.cpu.get_cpu_capability())
''',
    "oneDNN (PyTorch)": r'''
import torch
with torch.no_grad():  # a float32 convolution: PyTorch runs it on oneDNN
    print(float(torch.nn.functional.conv2d(torch.randn(8, 16, 32, 32),
                                           torch.randn(32, 16, 3, 3)).sum()))
''',
    "oneDNN (TensorFlow)": r'''
import tensorflow as tf
a = tf.random.normal((256, 256))
print(float(tf.reduce_sum(tf.matmul(a, a))))
''',
    "XLA (JAX)": r'''
import jax, jax.numpy as jnp
f = jax.jit(lambda a, b: jnp.tanh(a * b + 1.0))
print(float(f(jnp.ones((1024,)), jnp.ones((1024,))).sum()))
''',
    "CTranslate2": r'''
import ctranslate2, sys
ctranslate2.Translator(sys.argv[1], device="cpu")
''',
}


def _ctranslate2_model(folder):
    """A tiny CTranslate2 model to load (the quickstart-sized tiny config, random weights)."""
    import keras

    import keras_transformer as kt
    from keras_transformer.data.corpora import synthetic_translation
    from keras_transformer.export.ctranslate2 import convert_model
    from keras_transformer.tokenizers import SubwordTokenizer

    keras.utils.set_random_seed(0)
    pairs = synthetic_translation(200)
    tokenizer = SubwordTokenizer.train(pairs.sources + pairs.targets, vocab_size=100)
    model = kt.Transformer(kt.TransformerConfig.tiny(vocab_size=tokenizer.vocab_size))
    path = os.path.join(folder, "ct2")
    convert_model(model, tokenizer, tokenizer, path)
    return path


def _verdict(name, output, dump):
    if name == "torch":
        return output.strip().splitlines()[-1] if output.strip() else "?"
    if name.startswith("oneDNN"):
        kinds = sorted(set(re.findall(r"\b(?:jit|brg|brgemm|gemm)\w*:(avx512\w*|avx2\w*)",
                                      output)))
        if kinds:
            return "kernels " + ", ".join(kinds)
        # No primitive ran through oneDNN (TensorFlow's MatMul here runs on Eigen): the ISA
        # oneDNN would use, from its start-up line.
        match = re.search(r"info,cpu,isa:([^\n]*)", output)
        return f"ISA {match.group(1).strip()}" if match else "nothing logged"
    if name == "XLA (JAX)":
        widths = set()
        for path in glob.glob(os.path.join(dump, "*ir-with-opt*.ll")):
            with open(path) as file:
                widths.update(int(w) for w in re.findall(r"<(\d+) x float>", file.read()))
        return f"widest vector <{max(widths)} x float>" if widths else "no IR dumped"
    match = re.search(r"(?:Selected|selected)[^\n]*ISA[^\n]*?:\s*(\S+)", output) or re.search(
        r"ISA[^\n]*?(AVX512|AVX2|AVX|SSE4\.1)", output)
    return match.group(1) if match else "no ISA logged"


def probe(name, capped, folder, model_path):
    environment = common.capped_environment("AVX2") if capped else {
        name: value for name, value in os.environ.items()
        if name not in common.ISA_CAPS["AVX2"] and name != common.ISA_CAP_VARIABLE}
    dump = tempfile.mkdtemp(dir=folder)
    environment.update(ONEDNN_VERBOSE="1", CT2_VERBOSE="1", TF_CPP_MIN_LOG_LEVEL="0",
                       JAX_PLATFORMS="cpu")
    environment["XLA_FLAGS"] = " ".join(filter(None, [
        environment.get("XLA_FLAGS"), f"--xla_dump_to={dump}",
        "--xla_cpu_prefer_vector_width=512"]))
    result = subprocess.run([sys.executable, "-c", PROBES[name], model_path or ""],
                            env=environment, capture_output=True, text=True, timeout=300)
    return _verdict(name, result.stdout + result.stderr, dump)


# How the tables name each engine's report.
LABELS = {"torch": "PyTorch's ATen kernels",
          "oneDNN (PyTorch)": "oneDNN through PyTorch (a convolution's kernels)",
          "oneDNN (TensorFlow)": "oneDNN through TensorFlow (its kernels, or the ISA it announces)",
          "XLA (JAX)": "XLA, JAX (the widest vector of its optimized IR, 512-bit asked for)",
          "CTranslate2": "CTranslate2 (its log)"}


def table(result):
    """The Markdown of a run's findings (`--output`; benchmarks/tables.py's kind
    `isa_check`): the command, commit and machine, then a row per engine, what it picked
    as the machine is and capped at AVX2."""
    import records
    import run_all

    made = result["machine"]
    rows = [(LABELS.get(name, name), row["as the machine is"], row["capped at AVX2"])
            for name, row in result["engines"].items()]
    return "\n".join([f"`{result['command']}` at commit `{result['commit']}`, on "
                      f"{made['usable_cores']} cores of {records._machine(made)}:", "",
                      run_all.table(("engine", "as the machine is", "capped at AVX2"), rows)])


def build_parser():
    """The script's command-line options."""
    parser = common.argument_parser(__doc__)
    parser.add_argument("--output", help="also write the findings to this JSON file")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    results = {"machine": common.machine(), "cap": common.ISA_CAPS["AVX2"], "engines": {}}
    with tempfile.TemporaryDirectory() as folder:
        model_path = _ctranslate2_model(folder)
        for name in PROBES:
            results["engines"][name] = {
                "as the machine is": probe(name, False, folder, model_path),
                "capped at AVX2": probe(name, True, folder, model_path)}
            row = results["engines"][name]
            common.progress(f"{name:20s} {row['as the machine is']:40s} {row['capped at AVX2']}")
    print(json.dumps(results, indent=1))
    common.write_results(results, args.output)


if __name__ == "__main__":
    common.run_script(main)
