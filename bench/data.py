"""Prepared data against plain text files: prepare throughput, training memory by corpus size, time to the
first step, and the share of a step spent loading data.

    python bench/data.py [--sizes 10 100 1000] [--work DIR] [--steps 5]
    python bench/data.py --loading [--steps 40]       # only the loading share (tiny on Multi30k)

For each size (MB of synthetic text: Zipf-distributed words, lines of 5-60 words, the same every time),
it writes the text once into --work, prepares it (the smallest trains the vocabulary; the others reuse
it with --vocab, so the figures are the tokenizing alone), then runs `xspec train specs/lm.xspec --data DIR`
for --steps updates in a fresh process and reports its peak resident memory (the process's ru_maxrss)
and the seconds from the command's start to its first update's line. With --plain, the same training on
the text file itself (`--train FILE`), for the sizes up to --plain-max MB. Then the loading share: the
tiny spec on Multi30k prepared, the time `Trainer._prepare` (reading the window, collating the passes)
takes per update against the update's own time. It prints figures and checks nothing; docs/data.md has
them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "data" / "multi30k-en-de"
WORDS = 20_000


def synthetic_text(path: Path, megabytes: int) -> None:
    """Zipf-distributed words in lines of 5-60 words, written a block of lines at a time."""
    if path.exists() and path.stat().st_size >= megabytes * 10**6:
        return
    rng = np.random.default_rng(0)
    letters = np.array(list("etaoinshrdlucmfwypvbgkjqxz"))
    words = ["".join(letters[rng.integers(0, 26, rng.integers(2, 10))]) for _ in range(WORDS)]
    weights = 1.0 / np.arange(1, WORDS + 1)
    weights /= weights.sum()
    partial = path.with_suffix(".partial")
    written = 0
    with open(partial, "w", encoding="utf-8") as out:
        while written < megabytes * 10**6:
            lengths = rng.integers(5, 61, 2000)
            ids = rng.choice(WORDS, size=int(lengths.sum()), p=weights)
            lines, at = [], 0
            for n in lengths.tolist():
                lines.append(" ".join(words[i] for i in ids[at:at + n]))
                at += n
            block = "\n".join(lines) + "\n"
            out.write(block)
            written += len(block)
    partial.rename(path)


def xspec(*args: str) -> list[str]:
    return [sys.executable, "-m", "xspec", *args]


def timed(command: list[str], first_line: str | None = None) -> tuple[float, float | None, float, str]:
    """(seconds, seconds until a line containing `first_line` was printed, peak RSS in GiB, output)."""
    started = time.time()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    first, lines = None, []
    for line in process.stdout:
        lines.append(line)
        if first is None and first_line and first_line in line:
            first = time.time() - started
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    output = "".join(lines)
    if process.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{output[-3000:]}")
    return time.time() - started, first, usage.ru_maxrss / 2**20, output


def prepare(text: Path, out: Path, vocab: Path | None, workers: int) -> float:
    if out.exists():
        import shutil

        shutil.rmtree(out)
    args = ["data", "prepare", str(text), "-o", str(out), "--workers", str(workers), "--no-progress",
            "--vocab-size", "8000"]
    if vocab is not None:
        args += ["--vocab", str(vocab)]
    seconds, _, _, _ = timed(xspec(*args))
    return seconds


def train(data: list[str], run: Path, steps: int, valid: Path) -> tuple[float, float, float]:
    import shutil

    shutil.rmtree(run, ignore_errors=True)
    _, first, peak, output = timed(xspec("train", "specs/lm.xspec", *data, "--valid", str(valid), "--no-test",
                                         "--no-tensorboard", "--no-progress", "--set", f"train.max_steps={steps}",
                                         "--set", "data.vocab_size=8000", "--set", "vocab=8000",
                                         "--set", "train.validate_every_steps=1000", "-o", str(run)),
                                   first_line="step 1/")
    return first or float("nan"), peak, 0.0


def loading_share(steps: int, work: Path) -> None:
    """The tiny spec on Multi30k, prepared: time in Trainer._prepare against the updates' time."""
    prepared = work / "multi30k"
    if not prepared.exists():
        timed(xspec("data", "prepare", "--src", str(SHARED / "train.en"), "--tgt", str(SHARED / "train.de"),
                    "-o", str(prepared), "--vocab-size", "8000", "--no-progress"))
    code = f"""
import time, sys
from xspec.runtime import loop
from xspec.cli import main
spent = {{"prepare": 0.0, "update": 0.0, "n": 0}}
prepare, update = loop.Trainer._prepare, loop.Trainer._update
def timed_prepare(self, planned):
    t = time.perf_counter(); out = prepare(self, planned); spent["prepare"] += time.perf_counter() - t; return out
def timed_update(self, u):
    t = time.perf_counter(); out = update(self, u); spent["update"] += time.perf_counter() - t; spent["n"] += 1
    return out
loop.Trainer._prepare, loop.Trainer._update = timed_prepare, timed_update
main(["train", "specs/tiny.xspec", "--data", {str(prepared)!r}, "--no-test", "--no-tensorboard", "--no-progress",
      "--set", "train.max_steps={steps}", "--set", "train.validate_every_steps=100000", "--set", "data.vocab_size=8000",
      "--set", "vocab=8000", "-o", {str(work / 'runs' / 'loading')!r}])
print("LOADING", spent["prepare"] / spent["n"], spent["update"] / spent["n"])
"""
    import shutil

    shutil.rmtree(work / "runs" / "loading", ignore_errors=True)
    _, _, _, output = timed([sys.executable, "-c", code])
    line = next(line for line in output.splitlines() if line.startswith("LOADING"))
    load, step = map(float, line.split()[1:])
    print(f"loading share (tiny on Multi30k prepared, {steps} updates): {load * 1000:.1f} ms of data a step, "
          f"{step * 1000:.0f} ms of update: {load / (load + step):.2%}")


def padding(work: Path) -> None:
    """Multi30k's first epoch planned from plain files and from the prepared directory: target tokens per
    update and the useful share of the padded tokens (what bench/scaling.py calls useful)."""
    from types import SimpleNamespace

    import xspec
    from xspec.runtime.corpus import encode_pairs, read_parallel
    from xspec.runtime.loop import Progress, Trainer
    from xspec.runtime.prepared import examples as prepared_examples
    from xspec.runtime.prepared.examples import PreparedPairs
    from xspec.runtime.prepared.format import open_prepared
    from xspec.runtime.vocab import Vocab

    prepared = open_prepared(work / "multi30k")
    spec = xspec.compile(str(ROOT / "specs" / "tiny.xspec"))
    limit = min(spec.data.max_tokens, spec.max_positions or spec.data.max_tokens)
    plain = encode_pairs(read_parallel(SHARED / "train.en", SHARED / "train.de"), Vocab(prepared.vocab_proto), limit,
                         truncate=False)
    streamed = PreparedPairs(prepared, limit, truncate=False)
    for name, examples, window in (("plain files", plain, None), ("prepared", streamed, 65_536),
                                   ("prepared, windows of 8,192", streamed, 8_192),
                                   ("prepared, windows of 2,048", streamed, 2_048)):
        if window is not None:
            prepared_examples.WINDOW = window
        trainer = SimpleNamespace(spec=spec, context=SimpleNamespace(world_size=1), progress=Progress(),
                                  examples=examples)
        tokens, useful, padded, seen = [], 0, 0, 0
        for window, _, _, update in Trainer.planned_updates(trainer):
            if seen >= len(examples):                   # an epoch's worth of sentence pairs
                break
            tokens.append(sum(window.tgt_lens[i] + 1 for b in update for i in b))
            for b in update:
                useful += sum(window.tgt_lens[i] + 1 + window.src_lens[i] for i in b)
                padded += len(b) * (max(window.tgt_lens[i] + 1 for i in b) + max(window.src_lens[i] for i in b))
            seen += sum(len(b) for b in update)
        print(f"multi30k {name}: {len(tokens)} updates of {np.mean(tokens):,.0f} target tokens "
              f"(sd {np.std(tokens):,.0f}), {seen:,} sentence pairs, "
              f"useful share of padded tokens {useful / padded:.1%}")


def quality(work: Path, steps: int) -> None:
    """(With steps > 0.) The tiny spec on Multi30k for `steps` updates: three seeds from plain files, one from the
    prepared directory; the validation loss at the end of each."""
    import json
    import shutil

    if steps <= 0:
        return
    for name, data, seed in [("plain", ["--train-src", str(SHARED / "train.en"),
                                        "--train-tgt", str(SHARED / "train.de"),
                                        "--vocab", str(work / "multi30k" / "sentencepiece.model")], s)
                             for s in (1, 2, 3)] + [("prepared", ["--data", str(work / "multi30k")], 1)]:
        run = work / "runs" / f"quality-{name}-{seed}"
        shutil.rmtree(run, ignore_errors=True)
        timed(xspec("train", "specs/tiny.xspec", *data, "--valid-src", str(SHARED / "val.en"), "--valid-tgt",
                    str(SHARED / "val.de"), "--no-test", "--no-tensorboard", "--no-progress",
                    "--set", f"train.max_steps={steps}", "--set", f"train.validate_every_steps={steps}",
                    "--set", f"train.seed={seed}", "--set", "data.vocab_size=8000", "--set", "vocab=8000",
                    "-o", str(run)))
        metrics = json.loads((run / "metrics.json").read_text())
        print(f"multi30k {name} seed {seed}: validation loss {metrics['valid_loss']:.4f} after {steps} updates",
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", type=int, default=[10, 100, 1000], metavar="MB")
    parser.add_argument("--work", type=Path, default=Path("/tmp/xspec-data-bench"))
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--plain", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--plain-max", type=int, default=100, metavar="MB")
    parser.add_argument("--loading", action="store_true", help="only the loading share")
    parser.add_argument("--multi30k", type=int, default=None, metavar="STEPS",
                        help="only Multi30k: padding of plain and prepared plans, and the validation loss after "
                             "STEPS updates (three seeds plain, one prepared)")
    args = parser.parse_args()
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    if args.loading:
        loading_share(max(args.steps, 40), work)
        return
    if args.multi30k is not None:
        if not (work / "multi30k").exists():
            loading_share(40, work)             # prepares Multi30k
        padding(work)
        quality(work, args.multi30k)
        return
    valid = work / "valid.txt"
    synthetic_text(work / "valid-source.txt", 1)
    valid.write_text("".join((work / "valid-source.txt").read_text().splitlines(keepends=True)[:200]))
    sizes = sorted(args.sizes)
    vocab = None
    print(f"{'MB':>6} {'prepare s':>10} {'MB/s':>6} {'workers':>7} {'train peak GiB':>15} {'first step s':>13}  data")
    for size in sizes:
        text = work / f"text-{size}MB.txt"
        synthetic_text(text, size)
        megabytes = text.stat().st_size / 1e6
        out = work / f"prepared-{size}MB"
        workers = os.cpu_count() or 1
        seconds = prepare(text, out, vocab, workers)
        if vocab is None:
            vocab = work / "vocab.model"
            vocab.write_bytes((out / "sentencepiece.model").read_bytes())
            seconds = prepare(text, out, vocab, workers)         # the tokenizing alone, as for the others
            one = prepare(text, work / "prepared-one-worker", vocab, 1)
            print(f"{megabytes:6.0f} {one:10.1f} {megabytes / one:6.2f} {1:>7}")
        first, peak, _ = train(["--data", str(out)], work / "runs" / f"prepared-{size}", args.steps, valid)
        print(f"{megabytes:6.0f} {seconds:10.1f} {megabytes / seconds:6.2f} {workers:>7} {peak:15.2f} {first:13.1f}  "
              "prepared", flush=True)
        if args.plain and size <= args.plain_max:
            first, peak, _ = train(["--train", str(text)], work / "runs" / f"plain-{size}", args.steps, valid)
            print(f"{megabytes:6.0f} {'':>10} {'':>6} {'':>7} {peak:15.2f} {first:13.1f}  plain --train FILE",
                  flush=True)
    loading_share(max(args.steps, 40), work)


if __name__ == "__main__":
    main()
