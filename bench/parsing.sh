#!/usr/bin/env bash
# The paper's §6.3 English constituency parsing experiment (Table 4), CPU-sized, on the Penn Treebank
# sample in ../shared/data/ptb-sample-nltk (NLTK's WSJ files wsj_0001-0199: sections 00-01 only, about a
# tenth of the paper's WSJ training data; docs/parsing.md). Prepares the splits (train wsj_0001-0159,
# valid 0160-0179, test 0180-0199), trains specs/parsing.xspec resized for two CPU cores for a fixed time
# budget, averages the last 5 checkpoints (as for the base models, §6.1), parses the test split with the
# paper's decoding settings (beam 21, alpha 0.3, output up to input length + 300) and prints labelled
# bracket F1 with EVALB's COLLINS.prm conventions.
#
# The model keeps the parsing model's shape in spirit, 4 layers that are wide for their depth, at a size
# that learns something on a CPU in minutes: d_model 256, d_ff 1024, 4 heads, 4 layers, a joint BPE
# vocabulary of 4000 written by `treebank prepare`, every tree symbol one piece (the paper: 16K for ~40K
# sentences; we have 3396), ~1000 target tokens per update (more updates in the time: with 4000 the model
# still ignored the sentence after 2 hours, docs/parsing.md), warmup 4000 steps. Sentences whose
# linearised tree is over 256 pieces (2 of the 3396) are skipped in training, as `xspec train` reports.
#
#   bench/parsing.sh                        # 30 minutes of training
#   MINUTES=2 BEAM=1 bench/parsing.sh       # a smoke test of the whole pipeline, ~5 minutes (F1 near 0)
#   OUT=runs/parsing MINUTES=60 bench/parsing.sh; OUT=runs/parsing MINUTES=240 bench/parsing.sh
#                                           # the same run, trained on in a second sitting
#   THREADS=1 bench/parsing.sh              # on a machine busy with other work (see below)
#
# Training resumes (`--resume auto`): run the script again with the same OUT and a larger MINUTES (the
# training time counted over all sittings) to train on; a stopped run (Ctrl-C) continues the same way.
# docs/parsing.md has the figures measured so far: after 45-90 minutes here the model has learned the
# trees' language and writes trees whose size follows the sentence, but does not parse yet (F1 11-13).
#
# THREADS sets torch's CPU threads (`--threads`). With two threads competing with another process for two
# cores, decoding here ran several times slower than with one (beam 21 on the 245 test sentences: stopped
# after 50 minutes with 2 threads; ~17 minutes with 1, for an untrained model that never stops early).
set -euo pipefail
cd "$(dirname "$0")/.."

DATA=${DATA:-../shared/data/ptb-sample-nltk}
MINUTES=${MINUTES:-30}
BATCH=${BATCH:-1000}        # target tokens per update
WARMUP=${WARMUP:-4000}     # a peak rate of 1e-3 (eq. 3 with d_model 256)
BEAM=${BEAM:-21}
THREADS=${THREADS:-}
OUT=${OUT:-runs/parsing-$(date +%Y%m%d-%H%M%S)}
# Checkpoints every MINUTES/20, so the last 5 averaged cover the last quarter of training.
EVERY=$(python -c "print($MINUTES / 20)")

# glibc malloc makes CPU training several times slower here; use tcmalloc when it is installed.
TCMALLOC=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
if [[ -e $TCMALLOC && ${LD_PRELOAD:-} != *tcmalloc* ]]; then
  export LD_PRELOAD=$TCMALLOC${LD_PRELOAD:+:$LD_PRELOAD}
fi

# The splits go under the run's folder (runs/ is not tracked): the treebank's terms allow no copies in
# the project.
python -m xspec treebank prepare "$DATA/wsj_0001-0199.trees.oneline.txt" \
  --fileids "$DATA/wsj_0001-0199.trees.fileids.txt" --vocab-size 4000 -o "$OUT/data"

# --no-test: the test split is parsed below, once, with the averaged weights (BLEU means nothing here).
python -m xspec train specs/parsing.xspec --out "$OUT/run" --resume auto --no-progress --no-test \
  ${THREADS:+--threads "$THREADS"} \
  --set vocab=4000 --set data.vocab_size=4000 --set d_model=256 --set d_ff=1024 --set heads=4 --set layers=4 \
  --set train.batch_tokens="$BATCH" --set train.warmup_steps="$WARMUP" \
  --set train.max_steps=1000000 --set train.max_minutes="$MINUTES" \
  --set train.checkpoint_every_minutes="$EVERY" --set train.validate_every_steps=400 \
  --vocab "$OUT/data/sentencepiece.model" \
  --train-src "$OUT/data/train.words" --train-tgt "$OUT/data/train.trees" \
  --valid-src "$OUT/data/valid.words" --valid-tgt "$OUT/data/valid.trees"

python -m xspec average "$OUT/run" --last 5 -o "$OUT/run/averaged.safetensors"
# Beam 21 keeps 21 key/value caches per sentence: decoding batches of 1000 source tokens (not the default
# 4000, which took ~15 GB here) keep memory to a few GB.
start=$(date +%s)
python -m xspec translate "$OUT/run/averaged.safetensors" --beam "$BEAM" --alpha 0.3 --max-len-b 300 \
  --batch-tokens 1000 ${THREADS:+--threads "$THREADS"} -i "$OUT/data/test.words" -o "$OUT/test.hyp"
echo "parsed the test split ($(wc -l < "$OUT/data/test.words") sentences) in $(( $(date +%s) - start )) s" \
  "with beam $BEAM"
python -m xspec treebank score --gold "$OUT/data/test.gold" --hyp "$OUT/test.hyp" -o "$OUT/test.parsed" \
  | tee "$OUT/test.scores"
