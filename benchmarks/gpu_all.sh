#!/usr/bin/env bash
# Issue 21's GPU measurements in one go, most important first, within a time budget:
#   bash benchmarks/gpu_all.sh OUTDIR [BUDGET_SECONDS]
# Each run appends its JSON line to OUTDIR/results.jsonl and its output to
# OUTDIR/log.txt; OUTDIR/env.txt records the GPU, driver and library versions and
# a bf16 matrix-product ceiling. A run that would start with less than its
# expected time left in the budget is skipped (and says so), one that fails is
# recorded and the next one starts. PEAK_TFLOPS (default 989: dense bf16/fp16 of
# an H100 or H200 SXM, NVIDIA's datasheet) gives gpu.py its MFU; PYTHON (default
# python3) the interpreter, with the CUDA builds of JAX and torch. PLAN=attribution
# runs the variants that say where the base step's time goes instead, and
# PLAN=profile the profiles of a few steps (the kernels and their times). QUICK=1 runs
# every step at tiny sizes on whatever device there is, to check the script.
set -u
out=${1:?usage: bash benchmarks/gpu_all.sh OUTDIR [BUDGET_SECONDS]}
budget=${2:-540}
peak=${PEAK_TFLOPS:-989}
python=${PYTHON:-python3}
plan=${PLAN:-main}
case $plan in
  main|attribution|profile) ;;
  *) echo "gpu_all.sh: PLAN must be main, attribution or profile, not '$plan'" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
mkdir -p "$out"
start=$(date +%s)
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  nvidia-smi | head -4
  KERAS_BACKEND=jax $python - <<'EOF'
import importlib, platform, time
print("python", platform.python_version())
for name in ("keras", "jax", "jaxlib", "torch", "numpy"):
    try:
        print(name, importlib.import_module(name).__version__)
    except Exception as error:  # a missing backend is recorded, not fatal
        print(name, "not importable:", error)
try:
    import torch
    print("cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ a
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        a @ a
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - t) / 10
    print(f"bf16 8192^3 matmul (torch): {2 * 8192**3 / seconds / 1e12:.0f} TFLOP/s")
except Exception as error:
    print("torch matmul ceiling not measured:", error)
EOF
} > "$out/env.txt" 2>&1

# name, expected seconds, backend, script and arguments
run() {
  local name=$1 expected=$2 backend=$3; shift 3
  local left=$(( budget - ($(date +%s) - start) ))
  if (( left < expected )); then
    echo "== $name: skipped, ${left} s left of the budget, expected ${expected} s" | tee -a "$out/log.txt"
    return
  fi
  echo "== $name: KERAS_BACKEND=$backend python $* (limit ${left} s)" | tee -a "$out/log.txt"
  local t0=$(date +%s)
  KERAS_BACKEND=$backend timeout "$left" $python "$@" > "$out/run.tmp" 2>&1
  local rc=$?
  cat "$out/run.tmp" >> "$out/log.txt"
  local wall=$(( $(date +%s) - t0 )) last outcome
  last=$(tail -n 1 "$out/run.tmp")
  outcome="\"exit_status\": $rc"
  if [[ $rc -eq 0 && $last == "{"* ]]; then
    outcome="\"result\": $last"
  fi
  echo "{\"run\": \"$name\", \"wall_s\": $wall, $outcome}" >> "$out/results.jsonl"
  echo "== $name: exit $rc after $wall s" | tee -a "$out/log.txt"
}

fit="benchmarks/gpu.py --peak-tflops $peak"
decode="benchmarks/decoding.py --config base --batch-size 64 --source-length 32 --lengths 32 --no-uncached --repeats 3"
if [[ ${QUICK:-0} == 1 ]]; then
  fit="$fit --quick --allow-cpu"
  decode="benchmarks/decoding.py --quick --no-uncached"
fi
case $plan in
  profile)
    # The kernels of five steps of the base and big models (gpu.py --profile),
    # each after a short fit: the next question of the attribution runs.
    short="--steps 50"
    run jax-base-bf16-profile 40 jax $fit $short --profile 5
    run torch-base-bf16-profile 30 torch $fit $short --profile 5
    run jax-big-bf16-profile 45 jax $fit $short --profile 5 --config big
    ;;
  attribution)
    # Where the base step's time goes: the same step without dropout, with a
    # smaller vocabulary, and with 25 steps per device call, beside the default.
    short="--steps 100"
    run jax-base-bf16-short 40 jax $fit $short
    run jax-base-bf16-no-dropout 40 jax $fit $short --dropout 0
    run jax-base-bf16-vocab-8000 40 jax $fit $short --vocab-size 8000
    run jax-base-bf16-25-steps-per-call 40 jax $fit $short --steps-per-execution 25
    run torch-base-bf16-no-dropout 30 torch $fit $short --dropout 0
    run torch-base-bf16-vocab-8000 30 torch $fit $short --vocab-size 8000
    ;;
  main)
    run jax-base-bf16 60 jax $fit --check-attention
    run torch-base-bf16 60 torch $fit --check-attention
    run jax-big-bf16 90 jax $fit --config big
    run jax-decoding 40 jax $decode
    run torch-decoding 40 torch $decode
    run jax-base-fp16 60 jax $fit --precision mixed_float16
    run torch-base-fp16 60 torch $fit --precision mixed_float16 --check-attention
    run torch-big-bf16 90 torch $fit --config big
    run jax-base-bf16-xla-attention 60 jax $fit --flash-attention off
    ;;
esac
rm -f "$out/run.tmp"
echo "gpu_all.sh finished in $(( $(date +%s) - start )) s" | tee -a "$out/log.txt"
