#!/usr/bin/env bash
# Does bf16 autocast on the CPU train as float32 does? bench/multi30k.sh's model and recipe on Multi30k
# EN->DE (../shared/data/multi30k-en-de), 1000 updates with validation every 250, in float32 with three
# seeds and in bf16 with the first two: the bf16 validation losses, step by step, against the float32
# seeds' spread. About 30 minutes a run on two quiet cores; finished runs are read, not trained again.
#
#   bench/bf16_curve.sh                      # all five runs, then the table
#   RUNS="fp32:1 bf16:1" bench/bf16_curve.sh # some of them
set -euo pipefail
cd "$(dirname "$0")/.."

DATA=${DATA:-../shared/data/multi30k-en-de}
OUT=${OUT:-runs/bf16-curve}
RUNS=${RUNS:-fp32:1 bf16:1 fp32:2 fp32:3 bf16:2}
mkdir -p "$OUT"

for run in $RUNS; do
  precision=${run%%:*} seed=${run##*:}
  dir="$OUT/$precision-seed$seed"
  [[ -f $dir/metrics.json ]] && continue
  python -m xspec train specs/base.xspec --out "$dir" --no-progress --no-test \
    --set vocab=8000 --set d_model=256 --set d_ff=1024 --set heads=4 --set layers=3 --set max_len=256 \
    --set train.batch_tokens=4000 --set train.warmup_steps=600 --set train.max_steps=1000 \
    --set train.validate_every_steps=250 --set train.checkpoint_every_steps=500 \
    --set train.precision="$precision" --set train.seed="$seed" \
    --train-src "$DATA/train.en" --train-tgt "$DATA/train.de" \
    --valid-src "$DATA/val.en" --valid-tgt "$DATA/val.de"
done

python - "$OUT" <<'PY'
import json, sys
from pathlib import Path
curves = {}
for run in sorted(Path(sys.argv[1]).glob("*-seed*")):
    log = run / "metrics.jsonl"
    if log.is_file():
        rows = [json.loads(line) for line in log.read_text().splitlines() if '"valid_loss"' in line]
        curves[run.name] = {row["step"]: row["valid_loss"] for row in rows}
steps = sorted({step for curve in curves.values() for step in curve})
print("validation loss (nats per target token) by update")
print(f"{'run':<12}" + "".join(f"{step:>9}" for step in steps))
for name, curve in curves.items():
    print(f"{name:<12}" + "".join(f"{curve[s]:>9.4f}" if s in curve else f"{'-':>9}" for s in steps))
fp32 = [curve for name, curve in curves.items() if name.startswith("fp32")]
if len(fp32) > 1:
    print(f"{'fp32 spread':<12}" + "".join(
        f"{max(c[s] for c in fp32 if s in c) - min(c[s] for c in fp32 if s in c):>9.4f}" for s in steps))
PY
