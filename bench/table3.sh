#!/usr/bin/env bash
# Table 3 (§6.2) at a scale at which its models learn on this hardware: every row of specs/table3/ and the
# base model, trained on Multi30k EN->DE (../shared/data/multi30k-en-de) with one step budget, judged on its
# dev set (val, 1014 sentences) against the base model's noise band (3 seeds), by `xspec sweep`.
#
# Scale: --width-divisor 2 halves every model's widths (d_model, d_ff, d_k, d_v) and keeps everything else
# of its spec, so each row's change is applied in proportion: base becomes d_model 256, d_ff 1024, 8 heads
# of d_k = d_v = 32, 6 + 6 layers (the width of the Multi30k reference model of ../shared/BASELINES.md and
# bench/multi30k.sh, with the paper's depth and heads); row C's d_model 1024 becomes 512, N 8 stays 8.
# Recipe: the Multi30k reference's: joint BPE 8000 (every row, big_enfr's 32000 included), ~4000 target
# tokens per update, warmup 1000, label smoothing and dropout as each spec says. Budget: STEPS updates per
# run (default 2000: the reference model reached dev loss 1.89 (PPL 6.6) and test BLEU 35-38 in ~1900).
#
# Cost on this project's 2-core CPU: days, not hours. Training cost per token grows with a model's parameters
# (13.1M for base at this scale; C_dmodel1024 35.6M, big and big_enfr 48.2M, C_layers2 5.7M): the 23 runs
# (21 models, 2 extra base seeds) cost about 29 base runs. A base run is 2000 updates of ~4000 target tokens
# (8M tokens). Measured on a machine shared with other work (load 4-5): 430 target tokens/s with THREADS=1,
# 180 with 2 threads: ~5 and ~12 hours per base run, 150 hours or more for the sweep. On a quiet machine,
# expect ~1,500 tokens/s (an estimate, not measured: the reference model's 2,616 tokens/s, for ~57% of base's
# computation per token): ~1.5 hours per base run, about 45 hours for the sweep.
# The script is resumable: stop it (Ctrl-C writes a checkpoint) and run it again, in as many sittings as it
# takes; finished runs are read, not retrained, and an interrupted run resumes from its last checkpoint
# (every 5 minutes). The report, docs/table3/table3.md (+ .csv, curves.png), is rewritten after every run.
# If the base model's first run does not learn, the variants are not trained and the command fails.
#
# On a GPU machine, train every row at its full width (the paper's models) instead:
#   DIVISOR=1 DEVICE=cuda bench/table3.sh
#
#   bench/table3.sh                          # the whole sweep, or the next part of it
#   STEPS=3000 OUT=runs/table3-3k bench/table3.sh   # another budget needs another OUT (settings are recorded)
set -euo pipefail
cd "$(dirname "$0")/.."

DATA=${DATA:-../shared/data/multi30k-en-de}
STEPS=${STEPS:-2000}
WARMUP=${WARMUP:-1000}
DIVISOR=${DIVISOR:-2}
SEEDS=${SEEDS:-3}
OUT=${OUT:-runs/table3-multi30k}        # not dated: running the script again continues the same sweep
REPORT=${REPORT:-docs/table3}
DEVICE=${DEVICE:-}
THREADS=${THREADS:-}

# The xspec command re-executes itself with tcmalloc when it is installed (CPU training is several times
# faster with it); --threads 1 can be faster than 2 on a machine shared with other work.
python -m xspec sweep specs/table3/ --steps "$STEPS" --data "$DATA" --src-lang en --tgt-lang de \
  --width-divisor "$DIVISOR" --seeds "$SEEDS" \
  --set vocab=8000 --set max_len=256 --set train.batch_tokens=4000 --set train.warmup_steps="$WARMUP" \
  --set train.validate_every_steps=250 --set train.checkpoint_every_minutes=5 \
  --out "$OUT" --report "$REPORT" ${DEVICE:+--device "$DEVICE"} ${THREADS:+--threads "$THREADS"} "$@"
