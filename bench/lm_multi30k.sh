#!/usr/bin/env bash
# Real-data check of the language-model path: a small decoder-only Transformer (specs/lm.xspec, resized)
# trained on the German side of Multi30k (../shared/data/multi30k-en-de) for a fixed time budget on this
# machine, then scored on test_2016_flickr.de: perplexity, bits per token and per byte (printed by
# `xspec train` and `xspec eval --text`), and a few sampled continuations.
#
#   bench/lm_multi30k.sh                 # 15 minutes of training
#   MINUTES=45 bench/lm_multi30k.sh
set -euo pipefail
cd "$(dirname "$0")/.."

DATA=${DATA:-../shared/data/multi30k-en-de}
MINUTES=${MINUTES:-15}
OUT=${OUT:-runs/lm-multi30k-$(date +%Y%m%d-%H%M%S)}

# glibc malloc makes CPU training several times slower here; use tcmalloc when it is installed.
TCMALLOC=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
if [[ -e $TCMALLOC && ${LD_PRELOAD:-} != *tcmalloc* ]]; then
  export LD_PRELOAD=$TCMALLOC${LD_PRELOAD:+:$LD_PRELOAD}
fi

python -m xspec train specs/lm.xspec --out "$OUT" --no-progress \
  --set vocab=8000 --set d_model=256 --set d_ff=1024 --set heads=4 --set layers=3 \
  --set data.vocab_size=8000 --set data.block_size=128 --set train.batch_tokens=4096 \
  --set train.warmup_steps=600 --set train.max_steps=100000 --set train.max_minutes="$MINUTES" \
  --set train.validate_every_steps=500 --set train.checkpoint_every_minutes=5 \
  --train "$DATA/train.de" --valid "$DATA/val.de" --test "$DATA/test_2016_flickr.de"
python -m xspec eval "$OUT" --text "$DATA/test_2016_flickr.de"
printf 'Ein Mann\nZwei Hunde\nEine Frau in einem roten\n' | python -m xspec generate "$OUT" --seed 1
