#!/usr/bin/env bash
# Real-data check: a small Transformer on Multi30k EN->DE (../shared/data/multi30k-en-de), trained for a
# fixed time budget on this machine, then scored with sacreBLEU on test_2016_flickr: the final weights
# (printed by `xspec train`) and the average of the last 5 checkpoints (§6.1), plus tokens/s and wall time.
#
# The model and recipe follow the hand-written reference in ../shared/BASELINES.md: d_model 256, 3+3
# layers, 4 heads, d_ff 1024, dropout 0.1, tied embeddings, joint BPE 8000, ~4000 target tokens per
# batch, Adam (0.9, 0.98, 1e-9), the paper's schedule, label smoothing 0.1, beam 4, alpha 0.6. The
# warmup is shortened to fit the budget (the reference notes the same).
#
#   bench/multi30k.sh                        # 20 minutes of training
#   MINUTES=45 WARMUP=1000 bench/multi30k.sh # the reference's budget
set -euo pipefail
cd "$(dirname "$0")/.."

DATA=${DATA:-../shared/data/multi30k-en-de}
MINUTES=${MINUTES:-20}
WARMUP=${WARMUP:-600}
OUT=${OUT:-runs/multi30k-$(date +%Y%m%d-%H%M%S)}
# Checkpoints every MINUTES/20, so the last 5 averaged cover the last quarter of training.
EVERY=$(python -c "print($MINUTES / 20)")

# glibc malloc makes CPU training several times slower here; use tcmalloc when it is installed.
TCMALLOC=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
if [[ -e $TCMALLOC && ${LD_PRELOAD:-} != *tcmalloc* ]]; then
  export LD_PRELOAD=$TCMALLOC${LD_PRELOAD:+:$LD_PRELOAD}
fi

python -m xspec train specs/base.xspec --out "$OUT" --no-progress \
  --set vocab=8000 --set d_model=256 --set d_ff=1024 --set heads=4 --set layers=3 --set max_len=256 \
  --set train.batch_tokens=4000 --set train.warmup_steps="$WARMUP" \
  --set train.max_steps=1000000 --set train.max_minutes="$MINUTES" \
  --set train.checkpoint_every_minutes="$EVERY" --set train.validate_every_steps=250 \
  --train-src "$DATA/train.en" --train-tgt "$DATA/train.de" \
  --valid-src "$DATA/val.en" --valid-tgt "$DATA/val.de" \
  --test-src "$DATA/test_2016_flickr.en" --test-tgt "$DATA/test_2016_flickr.de"

python -m xspec average "$OUT" --last 5 -o "$OUT/averaged.safetensors"
python -m xspec eval "$OUT/averaged.safetensors" --src "$DATA/test_2016_flickr.en" --ref "$DATA/test_2016_flickr.de" \
  --output "$OUT/test.averaged.hyp" | tee "$OUT/averaged.scores"

python - "$OUT" <<'PY'
import json, sys
run = sys.argv[1]
m = json.load(open(f"{run}/metrics.json"))
averaged = open(f"{run}/averaged.scores").read().splitlines()[-1]
print(f"Multi30k test_2016_flickr, {m['steps']} steps, {m['train_tokens_per_s']:.0f} target tokens/s, "
      f"training wall time {m['wall_s']:.0f} s")
print(f"  final weights:       BLEU {m['bleu']:.2f}  chrF {m['chrf']:.2f}")
print(f"  average of last 5:   BLEU {averaged.split(' = ')[1].split()[0]}")
print(f"  {averaged}")
PY
