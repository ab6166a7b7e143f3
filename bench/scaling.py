"""How much forward/backward work is useful when W ranks share each update (§5.1: ~25000 target tokens per
update, sentences batched by approximate length), and what turning sentences into tensors costs.

    python bench/scaling.py [--pairs 100000] [--news-share 0.5] [--epochs 3] [--batch-tokens 25000]

The lengths are WMT-like: sentence pairs drawn (fixed seed, with replacement) half from WMT newstest2013
EN-DE (news, the paper's development set: long sentences with a tail past 200 subword tokens) and half
from Multi30k's training captions (short), both read in place from ../shared/data, and encoded with an
8000-piece BPE vocabulary trained on both corpora in a temporary directory, as `xspec train` does (the
source ends with EOS; a target counts one more token, its EOS). The mix has mean lengths near 28.

For W = 1, 2, 4, 8 and each way of planning the updates, every update of `--epochs` epochs is sharded
as the trainer shards it (`shard`), and:
- useful: real source + target tokens over what the W synchronised ranks process. Per pass every rank
  waits for the largest padded micro-batch (sentences x (longest source + longest target)), so a pass
  costs W times that; a filler pass is all waste. (DDP synchronises on an update's last pass only, so
  this is the stricter count.)
- balance: per update, the fewest real tokens a rank gets over the most (1.0: even), mean and worst.
- filler: zero-weight passes; tokens/update: target tokens (with EOS) per update; length std: the
  standard deviation of target lengths within an update (how mixed an update is; corpus: printed above).

The plans: "old" is the behaviour before updates were split (micro-batches of up to batch_tokens padded
tokens, so an update is usually one, which rank 0 runs alone); "cap only" caps micro-batches at
batch_tokens / W but plans as before; "random passes" cuts randomly ordered micro-batches into passes of
W; "new" is `plan_epoch(..., parts=W)` (passes of similar padded target size); "new + src_lens" also
gives it the source lengths. Then the time to collate one 25000-token update: the per-row padding that
collate used before (reimplemented here) against `collate`, median of --runs runs.

It prints figures and checks nothing.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from xspec.runtime.batching import Batch, collate, micro_batch_cap, micro_batches, plan_epoch, shard
from xspec.runtime.corpus import encode_pairs, read_parallel
from xspec.runtime.vocab import BOS, EOS, PAD, train_vocab

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
NEWS = ("newstest2013-en-de-tok/newstest2013.tok.en", "newstest2013-en-de-tok/newstest2013.tok.de")
CAPTIONS = ("multi30k-en-de/train.en", "multi30k-en-de/train.de")
WORLD_SIZES = (1, 2, 4, 8)


@dataclass
class Corpus:
    sources: list[list[int]]        # ids ending with EOS, as the trainer batches them
    targets: list[list[int]]

    @property
    def src_lens(self) -> list[int]:
        return [len(s) for s in self.sources]

    @property
    def tgt_lens(self) -> list[int]:
        return [len(t) for t in self.targets]


def wmt_like(data: Path, pairs: int, news_share: float, vocab_size: int) -> Corpus:
    """`pairs` sentence pairs, each from newstest2013 with probability `news_share`, else from Multi30k."""
    news = read_parallel(*(data / p for p in NEWS))
    captions = read_parallel(*(data / p for p in CAPTIONS))
    with tempfile.TemporaryDirectory() as scratch:
        lines = [*news.source, *news.target, *captions.source, *captions.target]
        vocab = train_vocab(lines, vocab_size, "bpe", Path(scratch))
    encoded = [encode_pairs(text, vocab, max_tokens=1024, truncate=False) for text in (news, captions)]
    rng = random.Random(0)
    corpus = Corpus([], [])
    for _ in range(pairs):
        source = encoded[0] if rng.random() < news_share else encoded[1]
        i = rng.randrange(len(source))
        corpus.sources.append(source.source[i])
        corpus.targets.append(source.target[i])
    return corpus


def describe(name: str, lengths: list[int]) -> str:
    q = statistics.quantiles(lengths, n=20)
    return (f"{name} mean {statistics.mean(lengths):.1f} (median {statistics.median(lengths):.0f}, "
            f"p95 {q[-1]:.0f}, max {max(lengths)}, std {statistics.pstdev(lengths):.1f})")


# --- the plans compared ----------------------------------------------------------------------

def old_plan(corpus: Corpus, batch_tokens: int, world_size: int, seed: int, epoch: int) -> list:
    batches = micro_batches(corpus.src_lens, corpus.tgt_lens, batch_tokens)
    return plan_epoch(batches, corpus.tgt_lens, batch_tokens, seed, epoch)


def cap_only_plan(corpus: Corpus, batch_tokens: int, world_size: int, seed: int, epoch: int) -> list:
    batches = micro_batches(corpus.src_lens, corpus.tgt_lens, micro_batch_cap(batch_tokens, world_size))
    return plan_epoch(batches, corpus.tgt_lens, batch_tokens, seed, epoch)


def random_passes_plan(corpus: Corpus, batch_tokens: int, world_size: int, seed: int, epoch: int) -> list:
    """Micro-batches in random order, cut into passes of W, passes taken while they bring an update
    closer to batch_tokens."""
    tgt_lens = corpus.tgt_lens
    batches = micro_batches(corpus.src_lens, tgt_lens, micro_batch_cap(batch_tokens, world_size))
    random.Random(seed * 100_003 + epoch).shuffle(batches)
    updates, current, tokens = [], [], 0
    for start in range(0, len(batches), world_size):
        group = batches[start:start + world_size]
        size = sum(tgt_lens[i] + 1 for b in group for i in b)
        if current and abs(tokens + size - batch_tokens) >= abs(tokens - batch_tokens):
            updates.append(current)
            current, tokens = [], 0
        current += group
        tokens += size
    return updates + [current] if current else updates


def new_plan(corpus: Corpus, batch_tokens: int, world_size: int, seed: int, epoch: int) -> list:
    batches = micro_batches(corpus.src_lens, corpus.tgt_lens, micro_batch_cap(batch_tokens, world_size))
    return plan_epoch(batches, corpus.tgt_lens, batch_tokens, seed, epoch, parts=world_size)


def new_plan_with_sources(corpus: Corpus, batch_tokens: int, world_size: int, seed: int, epoch: int) -> list:
    batches = micro_batches(corpus.src_lens, corpus.tgt_lens, micro_batch_cap(batch_tokens, world_size))
    return plan_epoch(batches, corpus.tgt_lens, batch_tokens, seed, epoch, parts=world_size,
                      src_lens=corpus.src_lens)


PLANS = {"old": old_plan, "cap only": cap_only_plan, "random passes": random_passes_plan, "new": new_plan,
         "new + src_lens": new_plan_with_sources}


# --- what the ranks do ---------------------------------------------------------------------------

@dataclass
class Work:
    useful: int = 0
    processed: int = 0
    filler: int = 0

    def fraction(self) -> float:
        return self.useful / self.processed


@dataclass
class Figures:
    useful: float
    balance_mean: float
    balance_worst: float
    filler: int
    updates_per_epoch: float
    tokens_per_update: float
    length_std: float


def measure(updates: list[list[list[int]]], corpus: Corpus, world_size: int, work: Work) -> list[float]:
    """Adds the epoch's work to `work`; returns each update's balance (fewest / most real tokens on a rank)."""
    src, tgt = corpus.src_lens, corpus.tgt_lens

    def padded(b: list[int]) -> int:
        return len(b) * (max(src[i] for i in b) + max(tgt[i] for i in b) + 1)

    def real(b: list[int]) -> int:
        return sum(src[i] + tgt[i] + 1 for i in b)

    balance = []
    for update in updates:
        ranks = [shard(update, rank, world_size) for rank in range(world_size)]
        for passes in zip(*ranks):
            work.processed += world_size * max(padded(b) for b, _ in passes)
            work.useful += sum(real(b) for b, counts in passes if counts)
            work.filler += sum(not counts for _, counts in passes)
        per_rank = [sum(real(b) for b, counts in mine if counts) for mine in ranks]
        balance.append(min(per_rank) / max(per_rank))
    return balance


def figures(plan, corpus: Corpus, batch_tokens: int, world_size: int, seed: int, epochs: int) -> Figures:
    work, balance, tokens, spread, count = Work(), [], [], [], 0
    for epoch in range(epochs):
        updates = plan(corpus, batch_tokens, world_size, seed, epoch)
        balance += measure(updates, corpus, world_size, work)
        for update in updates:
            lengths = [len(corpus.targets[i]) for b in update for i in b]
            tokens.append(sum(lengths) + len(lengths))
            spread.append(statistics.pstdev(lengths))
        count += len(updates)
    return Figures(work.fraction(), statistics.mean(balance), min(balance), work.filler, count / epochs,
                   statistics.mean(tokens), statistics.mean(spread))


def print_table(corpus: Corpus, batch_tokens: int, seed: int, epochs: int) -> None:
    print(f"{'W':>2}  {'plan':<15} {'cap':>6} {'useful':>7} {'balance':>8} {'worst':>6} {'filler':>7} "
          f"{'updates':>8} {'tokens/update':>14} {'length std':>11}")
    headline = {}
    for world_size in WORLD_SIZES:
        for name, plan in PLANS.items():
            if world_size == 1 and name != "old":
                continue                     # with one rank every plan is the old one
            cap = batch_tokens if name == "old" else micro_batch_cap(batch_tokens, world_size)
            f = figures(plan, corpus, batch_tokens, world_size, seed, epochs)
            headline[world_size, name] = f.useful
            print(f"{world_size:>2}  {name:<15} {cap:>6} {f.useful:>7.1%} {f.balance_mean:>8.2f} "
                  f"{f.balance_worst:>6.2f} {f.filler:>7} {f.updates_per_epoch:>8.1f} {f.tokens_per_update:>14,.0f} "
                  f"{f.length_std:>11.1f}")
    print(f"useful tokens at W=8 sorting by target lengths alone: {headline[8, 'new']:.1%}")
    print(f"useful tokens at W=8: {headline[8, 'new + src_lens']:.1%}")  # the plan the trainer uses


# --- collating -----------------------------------------------------------------------------------

def per_row_pad(rows: list[list[int]]) -> torch.Tensor:
    """The padding collate used before: one tensor per row, copied into place."""
    out = torch.full((len(rows), max(len(r) for r in rows)), PAD, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    return out


def per_row_collate(indices: list[int], sources: list[list[int]], targets: list[list[int]]) -> Batch:
    src = per_row_pad([sources[i] for i in indices])
    tgt_in = per_row_pad([[BOS] + targets[i] for i in indices])
    labels = per_row_pad([targets[i] + [EOS] for i in indices])
    return Batch((src, tgt_in, src == PAD), labels, int((labels != PAD).sum()))


def same(a: Batch, b: Batch) -> bool:
    return all(torch.equal(x, y) for x, y in zip((*a.inputs, a.labels), (*b.inputs, b.labels))) \
        and a.target_tokens == b.target_tokens


def collate_times(corpus: Corpus, batch_tokens: int, seed: int, runs: int, updates: int = 10) -> None:
    """Seconds per update to collate every micro-batch of it, median over `runs` runs of `updates` updates."""
    plan = new_plan(corpus, batch_tokens, 1, seed, 0)[:updates]
    micro = [b for update in plan for b in update]
    rows = sum(len(b) for b in micro) / len(plan)
    tokens = sum(len(corpus.targets[i]) + 1 for b in micro for i in b) / len(plan)
    identical = all(same(collate(b, corpus.sources, corpus.targets),
                         per_row_collate(b, corpus.sources, corpus.targets)) for b in micro)
    print(f"\ncollate, one update of {tokens:,.0f} target tokens ({rows:,.0f} sentences, "
          f"{len(micro) / len(plan):.1f} micro-batches), median of {runs} runs over {len(plan)} updates:")
    for name, function in (("per-row pad (before)", per_row_collate), ("collate (now)", collate)):
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            for b in micro:
                function(b, corpus.sources, corpus.targets)
            times.append((time.perf_counter() - start) / len(plan))
        print(f"  {name:<22} {statistics.median(times) * 1e3:7.2f} ms per update")
    print(f"  outputs identical: {'yes' if identical else 'NO'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA, help="the shared data folder (default: %(default)s)")
    parser.add_argument("--pairs", type=int, default=100_000, help="sentence pairs drawn (default: %(default)s)")
    parser.add_argument("--news-share", type=float, default=0.5,
                        help="share drawn from newstest2013, the rest from Multi30k (default: %(default)s)")
    parser.add_argument("--vocab", type=int, default=8000, help="BPE vocabulary size (default: %(default)s)")
    parser.add_argument("--batch-tokens", type=int, default=25_000, help="target tokens per update (§5.1)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs planned per figure (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=1, help="train.seed of the plans (default: %(default)s)")
    parser.add_argument("--runs", type=int, default=7, help="collate timing runs (default: %(default)s)")
    args = parser.parse_args()

    corpus = wmt_like(args.data, args.pairs, args.news_share, args.vocab)
    print(f"{args.pairs:,} pairs ({args.news_share:.0%} newstest2013, the rest Multi30k train), "
          f"BPE {args.vocab}, in subword tokens:")
    print("  " + describe("source (+EOS)", corpus.src_lens))
    print("  " + describe("target", corpus.tgt_lens))
    print(f"updates of {args.batch_tokens:,} target tokens, {args.epochs} epochs, seed {args.seed}\n")
    print_table(corpus, args.batch_tokens, args.seed, args.epochs)
    collate_times(corpus, args.batch_tokens, args.seed, args.runs)


if __name__ == "__main__":
    main()
