# The GPU report in one go, most important first, within a time budget:
#   bash benchmarks/gpu_all.sh OUTDIR [BUDGET_SECONDS]
# Each run appends its JSON line to OUTDIR/results.jsonl and its output to
# OUTDIR/log.txt; OUTDIR/env.txt records the GPU, driver and library versions and
# a bf16 matrix-product ceiling. A run that would start with less than its
# expected time left in the budget is skipped (and says so), one that fails is
# recorded and the next one starts. PEAK_TFLOPS (default 989: dense bf16/fp16 of
# an H100 or H200 SXM, NVIDIA's datasheet) gives gpu.py its MFU; PYTHON (default
# python3) the interpreter, with the CUDA builds of JAX and torch. IDS names a
# .npy of real id frequencies (benchmarks/id_frequencies.py) for one run on real
# ids; BEFORE names a copy of the repository at an earlier commit whose
# benchmarks/gpu.py runs first, as the baseline of the same invocation. QUICK=1
# runs every step at tiny sizes on whatever device there is, to check the script.
# A copy without its .git (the GPU machine's) names its commit by
# KERAS_TRANSFORMER_COMMIT, and BEFORE's by BEFORE_COMMIT, for the results to record;
# each script reads the library of its own tree (benchmarks/checkout.py), so neither
# tree needs installing.
set -u
out=${1:?usage: bash benchmarks/gpu_all.sh OUTDIR [BUDGET_SECONDS]}
budget=${2:-540}
peak=${PEAK_TFLOPS:-989}
python=${PYTHON:-python3}
ids=${IDS:-}
before=${BEFORE:-}
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
long="--steps 80 --window 20"   # four windows: the first compiles, the median of three
short="--steps 40 --window 20"  # two windows: the first compiles
compiled="--jit-compile on"     # torch.compile of Keras's torch train step
if [[ ${QUICK:-0} == 1 ]]; then
  # torch.compile takes minutes on a CPU: the quick check runs those rows eager.
  fit="benchmarks/gpu.py --quick --allow-cpu" long="" short="" compiled=""
fi
# Ours against torch.nn.Transformer on the same batches (eager, torch.compile).
run jax-base-bf16 170 jax $fit $long --peers eager,compile
run jax-big-bf16 170 jax $fit $long --config big --peers compile
# The code before the change under test, on the same machine in the same call.
if [[ -n $before ]]; then
  KERAS_TRANSFORMER_COMMIT=${BEFORE_COMMIT:-} run before-jax-base-bf16 40 jax $before/$fit $short
fi
run torch-base-bf16 50 torch $fit $long --peers eager
# Keras's torch trainer with the train step under torch.compile (issue 53).
run torch-base-bf16-compiled 120 torch $fit $long $compiled
run torch-big-bf16 60 torch $fit $short --config big
run torch-big-bf16-compiled 120 torch $fit $short --config big $compiled
# The fused label-smoothed loss against its log-softmax form (the default).
run jax-big-bf16-fused-loss 45 jax $fit $short --config big --loss fused
run jax-base-bf16-profile 40 jax $fit $short --profile 5
run jax-base-fp16 40 jax $fit $short --precision mixed_float16
if [[ -n $before ]]; then
  KERAS_TRANSFORMER_COMMIT=${BEFORE_COMMIT:-} run before-jax-base-fp16 40 jax $before/$fit $short --precision mixed_float16
fi
run jax-big-bf16-20-steps-per-call 45 jax $fit $short --config big --steps-per-execution 20
if [[ -n $ids ]]; then
  run jax-base-bf16-real-ids 35 jax $fit $short --id-frequencies $ids
fi
rm -f "$out/run.tmp"
echo "gpu_all.sh finished in $(( $(date +%s) - start )) s" | tee -a "$out/log.txt"
