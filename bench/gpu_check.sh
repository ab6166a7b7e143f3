#!/usr/bin/env bash
# What only a GPU shows, in one command, each stage bounded in time (about 12 minutes on one H100):
#   1. the training speed of base and big, bf16 and compiled (bench/gpu.py: tokens/s, MFU, peak memory,
#      compile time, graphs compiled while timed);
#   2. decoding on the GPU against the CPU (bench/cuda_decode.py) for the runs given, or for the demo
#      task's translation and language models, trained on the GPU first (`--compile off`, to keep it short).
#
#   bench/gpu_check.sh                      # both stages; the demo models trained here
#   bench/gpu_check.sh runs/tiny runs/lm    # stage 2 on these runs
#   SPECS=base STEPS=10 bench/gpu_check.sh  # a shorter stage 1
#
# Logs and the demo runs go to OUT (default runs/gpu-check-DATE). LIMIT_TRAIN and LIMIT_DECODE bound the
# stages in seconds (default 420 and 300): a stage cut short says so and the next one runs.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu-check-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}

stage() {  # stage NAME LIMIT CMD...: output to the terminal and OUT/NAME.log
  local name=$1 limit=$2 started=$SECONDS; shift 2
  echo "== $name (at most ${limit} s)"
  timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
  local status=${PIPESTATUS[0]}
  [[ $status -eq 124 ]] && echo "== $name: cut short at ${limit} s"
  [[ $status -ne 0 && $status -ne 124 ]] && echo "== $name: failed (exit status $status)"
  echo "== $name: $((SECONDS - started)) s"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
python -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda)"

# shellcheck disable=SC2086
stage train "${LIMIT_TRAIN:-420}" python bench/gpu.py --specs ${SPECS:-base big} --steps "${STEPS:-20}" \
  --warmup "${WARMUP:-3}"

runs=("$@")
if [[ ${#runs[@]} -eq 0 ]]; then
  runs=("$OUT/tiny" "$OUT/lm")
  stage demo-runs "${LIMIT_DECODE:-300}" bash -c "
    python -m xspec train specs/tiny.xspec --out '$OUT/tiny' --no-progress --compile off &&
    python -m xspec train specs/lm.xspec --out '$OUT/lm' --no-progress --compile off"
fi
stage decode "${LIMIT_DECODE:-300}" python bench/cuda_decode.py "${runs[@]}"
