"""`xspec train --init` as a user runs it: the fine-tuning recipe's defaults, and LoRA against a full fine-tune.

    python bench/fine_tune_recipe.py [--lines 2000] [--rank 8] [--rounds 2] [--corpus FILE] [--size 30m]
                                     [--bases float32,bfloat16,int8] [--checkpointing] [--no-recipe]

A Llama of bench/decode_lm.py's sizes (default ~30M) written by transformers, with a BPE tokenizer.json trained on the
corpus (default: ../shared/data/multi30k-en-de/train.en), is imported by `xspec import`. Then, on --lines
lines of the corpus (validation: the next 500):
- the recipe: `xspec train --init RUN --train T --valid V` with no --set, timed, and the validation loss
  of the import and of the fine-tune (`xspec eval --text V`);
- LoRA (`--set train.lora_rank=R`) against the full fine-tune, each a fresh `xspec train --init` process, the
  two alternating for --rounds rounds: the share of parameters that train (the run's log), the process's
  peak resident memory (from wait4), and training tokens per second (metrics.json; medians);
- LoRA with its frozen weights kept in each of --bases (train.lora_base), in the same rounds; with
  --checkpointing, each also with train.activation_checkpointing.
It prints the figures and the ratios; it checks nothing (transformers and tokenizers are needed).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from decode_lm import SIZES, write_checkpoint

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT.parent / "shared" / "data" / "multi30k-en-de" / "train.en"
VALID_LINES = 500


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=2000)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--size", choices=sorted(SIZES), default="30m")
    parser.add_argument("--bases", default="float32", help="train.lora_base values, comma-separated")
    parser.add_argument("--checkpointing", action="store_true", help="LoRA also with activation checkpointing")
    parser.add_argument("--no-recipe", action="store_true", help="skip the run with the recipe's defaults")
    args = parser.parse_args()
    bases = args.bases.split(",")
    with tempfile.TemporaryDirectory() as temporary:
        work = Path(temporary)
        lines = args.corpus.read_text(encoding="utf-8").splitlines()
        train, valid = work / "train.txt", work / "valid.txt"
        train.write_text("\n".join(lines[:args.lines]) + "\n")
        valid.write_text("\n".join(lines[args.lines:args.lines + VALID_LINES]) + "\n")
        run = _imported(work, lines, args.size)

        if not args.no_recipe:
            started = time.perf_counter()
            recipe = _train(run, train, valid, work / "recipe", [])
            minutes = (time.perf_counter() - started) / 60
            before, after = _valid_loss(run, valid), _valid_loss(work / "recipe", valid)
            print(f"train --init, defaults, {args.lines} lines: {recipe['steps']} steps (one epoch) in {minutes:.1f} "
                  f"min wall; validation loss {before:.3f} (import) -> {after:.3f}")

        kinds = {"full": [], **{f"lora, {base} base": ["--set", f"train.lora_rank={args.rank}", "--set",
                                                      f"train.lora_base={base}"] for base in bases}}
        if args.checkpointing:
            kinds |= {f"{kind} + checkpointing": [*extra, "--set", "train.activation_checkpointing=true"]
                      for kind, extra in list(kinds.items())[1:]}
        figures: dict[str, list[dict]] = {kind: [] for kind in kinds}
        for round_ in range(args.rounds):
            for number, (kind, extra) in enumerate(kinds.items()):
                figures[kind].append(_train(run, train, valid, work / f"{number}-{round_}", extra))
        medians = {kind: {key: statistics.median(f[key] for f in runs) for key in ("rss", "tokens_per_s")}
                   for kind, runs in figures.items()}
        full = medians["full"]
        print(f"{args.size} Llama, {args.rounds} rounds, medians; the full fine-tune: peak memory "
              f"{full['rss'] / 2**20:,.0f} MiB, {full['tokens_per_s']:,.0f} tokens/s")
        for kind in list(kinds)[1:]:
            lora = medians[kind]
            print(f"LoRA rank {args.rank}, {kind.split(', ', 1)[1]}: trainable {figures[kind][0]['share']:.2%}; peak "
                  f"memory {lora['rss'] / 2**20:,.0f} MiB ({lora['rss'] / full['rss']:.0%} of the full); "
                  f"{lora['tokens_per_s']:,.0f} tokens/s ({lora['tokens_per_s'] / full['tokens_per_s']:.2f}x)")


def _imported(work: Path, lines: list[str], size: str) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    source, run = work / "hf", work / "run"
    write_checkpoint(source, size)
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=SIZES[size]["vocab_size"], special_tokens=["<unk>", "<s>", "</s>"])
    tokenizer.train_from_iterator(lines, trainer)
    tokenizer.save(str(source / "tokenizer.json"))
    subprocess.run([sys.executable, "-m", "xspec", "import", str(source), "-o", str(run), "--no-verify"],
                   check=True, stdout=subprocess.DEVNULL)
    return run


def _train(run: Path, train: Path, valid: Path, output: Path, extra: list[str]) -> dict:
    """One `xspec train --init` process: its steps, tokens/s, peak resident bytes and trainable share."""
    command = [sys.executable, "-m", "xspec", "train", "--init", str(run), "--train", str(train), "--valid",
               str(valid), "-o", str(output), "--no-test", "--no-tensorboard", "--no-progress", *extra]
    with open(output.with_suffix(".log"), "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(process.pid, 0)
    text = output.with_suffix(".log").read_text()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{text}")
    metrics = json.loads((output / "metrics.json").read_text())
    found = re.search(r"LoRA: .*; ([\d,]+) of ([\d,]+) parameters train", text)
    share = int(found.group(1).replace(",", "")) / int(found.group(2).replace(",", "")) if found else 1.0
    return {"steps": metrics["steps"], "tokens_per_s": metrics["train_tokens_per_s"], "rss": usage.ru_maxrss * 1024,
            "share": share}


def _valid_loss(run: Path, valid: Path) -> float:
    """Cross entropy per token (nats) of the validation text, from the perplexity `xspec eval --text` prints."""
    out = subprocess.run([sys.executable, "-m", "xspec", "eval", str(run), "--text", str(valid), "--weights", "fp32"],
                         check=True, capture_output=True, text=True).stdout
    return math.log(float(re.search(r"perplexity ([\d.]+)", out).group(1)))


if __name__ == "__main__":
    main()
