"""Table 3 as an experiment: train every variant spec with the same budget, then tabulate and judge them.

The paper's Table 3 (EN-DE dev set, newstest2013; beam search, no checkpoint averaging) compares
each model variation with the base model at 100K steps, and §6.2 reads a direction of effect off each
row. `run_sweep` does the same for a folder of variant specs on whatever corpus is given, at whatever
scale fits the machine:

- every variant (and the base model) gets the same `--set` overrides and the same step budget;
- `width_divisor` divides each model's widths (d_model, d_ff, d_k, d_v) by the same factor, so a
  row keeps its ratio to the base model (row A still holds h * d_k constant; row C's d_model 256
  is still half of base) while the model becomes small enough for a CPU;
- variants share the base run's sentencepiece vocabulary (trained once, §5.1), so their
  perplexities count the same subwords;
- dev perplexity is exp(cross entropy per target subword, no label smoothing); dev BLEU is sacreBLEU
  on beam-search output of the last checkpoint (the runtime averages nothing during training).

A difference from base means something only beside the spread of base itself, and a table means
something only when its models learned. So:

- the base row trains with `seeds` seeds (train.seed s, s+1, ...; the first run in OUT/runs/base, the
  k-th in OUT/runs/base-seedK); its **noise band** is mean ± 2 sample standard deviations over them
  (`noise_band`), for dev PPL and dev BLEU apart. `seeds_all` gives every row that many seeds.
- a run **learned** when its dev cross entropy is at most half that of the unigram model of the
  training targets (PPL <= sqrt(unigram PPL) of the dev targets, in the run's own subwords: context
  explains at least half of what subword frequencies leave open) and its dev BLEU is at least
  `MIN_BLEU` (`learned`). A row learned when all its runs did; rows that did not are marked and
  judged no further, and when base did not, nothing is judged (`judge`; the command then fails). After a
  base run that did not learn, the variants are not trained (hours each at a real scale), unless `keep_going`.
- a row's difference from base (the mean over base's seeds) is **above noise** when it exceeds the
  band's half width; its direction is then set beside the paper's (`PAPER_DIRECTIONS`): agrees,
  disagrees, or cannot tell (within noise).

Each run trains through the runtime (`xspec.runtime.train.train`) in its own run directory. A run
with `metrics.json` is finished and is not retrained; one with checkpoints but no `metrics.json`
resumes from its last checkpoint. The report (table3.md, table3.csv and curves.png, the runs'
training curves) is rewritten after every run, so an interrupted sweep leaves a partial but valid table.

The modules: `rows` (settings, corpus, rows and runs, the learning bar), `paper` (Table 3's figures and
directions), `verdicts` (noise band and judgement), `runner` (variants, data, training, `run_sweep`) and
`report` (table3.md, table3.csv, curves.png).
"""
