"""Training cost in FLOPs (Table 2), counted for a spec's schedule, beside the paper's own estimate.

Our count: steps x the FLOPs of one update of `train.batch_tokens` target tokens and as many source
tokens (§5.1: about 25000 each), as sentence pairs of n tokens each side. The forward pass is
`cost.flops` (matrix products only, 2 FLOPs per multiply-add); the backward pass of a matrix product is
two products of the same size (the gradients of both operands), so an update is 3 x forward. Softmax,
layer normalization, elementwise ops, the loss, embedding gradients and the optimizer step are not
counted (together under 1% of the matrix products for base and big), nor is padding.

The paper's estimate (Table 2, footnote 5): training time x number of GPUs x the sustained
single-precision throughput of one GPU. That is GPU time at peak rate, so it also counts the time the
GPUs were not doing arithmetic at that rate; our count is the arithmetic itself, and the ratio of the two
is the fraction of peak the paper's training would have sustained.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Optional

from xspec.stats.architecture import architecture
from xspec.compiler.cost import flops

if TYPE_CHECKING:
    from xspec.compiler.spec import CompiledSpec

BACKWARD_PER_FORWARD = 2     # d(loss)/d(input) and d(loss)/d(weight): one product each
TYPICAL_SENTENCE = 25        # tokens: about a WMT sentence in subwords (the attention term grows with it)
SECONDS_PER_HOUR = 3600

# Footnote 5: sustained single-precision TFLOPS the paper assumed per GPU.
GPU_TFLOPS = {"K80": 2.8, "K40": 3.7, "M40": 6.0, "P100": 9.5}


@dataclass(frozen=True)
class PaperRun:
    """One of Table 2's Transformer rows: its schedule (§5.2) and training cost (EN-DE)."""

    model: str
    layers: int
    d_model: int
    d_ff: int
    heads: int
    steps: int
    hours: float
    gpus: int
    gpu: str
    table2: float               # FLOPs as printed in Table 2

    @property
    def estimate(self) -> float:
        """The paper's method: hours x GPUs x sustained FLOPS per GPU."""
        return self.hours * SECONDS_PER_HOUR * self.gpus * GPU_TFLOPS[self.gpu] * 1e12


# §5.2: base 100K steps in 12 hours, big 300K steps in 3.5 days, both on 8 P100 GPUs.
PAPER_RUNS = (
    PaperRun("base", layers=6, d_model=512, d_ff=2048, heads=8, steps=100_000, hours=12, gpus=8, gpu="P100",
             table2=3.3e18),
    PaperRun("big", layers=6, d_model=1024, d_ff=4096, heads=16, steps=300_000, hours=3.5 * 24, gpus=8,
             gpu="P100", table2=2.3e19),
)


@dataclass(frozen=True)
class TrainCost:
    steps: int
    batch_tokens: int                   # target tokens per update; as many source tokens
    length: int                         # n: tokens per sentence, source and target
    forward_per_token: float            # one target token with its source token, forward
    per_token_fixed: Optional[int]      # forward_per_token = per_token_fixed + per_token_slope * n,
    per_token_slope: Optional[int]      # when the model's count is of that form (None otherwise)
    forward_per_step: int
    paper: Optional[PaperRun]           # the paper's model with this spec's architecture, if any

    @property
    def per_step(self) -> int:
        return (1 + BACKWARD_PER_FORWARD) * self.forward_per_step

    @property
    def total(self) -> int:
        return self.steps * self.per_step

    def to_json(self) -> dict[str, Any]:
        return {
            "convention": "matrix products only, 2 FLOPs per multiply-add; backward = 2 x forward; "
                          "batch_tokens target and as many source tokens per step, in sentences of `length`",
            "steps": self.steps, "batch_tokens": self.batch_tokens, "length": self.length,
            "forward_per_token": self.forward_per_token,
            "forward_per_token_formula": {"fixed": self.per_token_fixed, "per_length": self.per_token_slope},
            "forward_per_step": self.forward_per_step, "train_per_step": self.per_step, "total": self.total,
            "paper": [{**asdict(run), "estimate": run.estimate, "tflops_per_gpu": GPU_TFLOPS[run.gpu]}
                      for run in PAPER_RUNS],
            "paper_model": self.paper.model if self.paper else None,
            "ratio_to_table2": self.total / self.paper.table2 if self.paper else None,
        }


def train_cost(spec: CompiledSpec, steps: int | None = None, length: int | None = None) -> TrainCost:
    """Training FLOPs of `steps` updates (default: train.max_steps) on sentences of `length` tokens."""
    n = length or TYPICAL_SENTENCE
    tokens = spec.train.batch_tokens
    forward = flops(spec, n)
    fixed, slope = _per_token_terms(spec, n, forward.total)
    return TrainCost(steps=steps or spec.train.max_steps, batch_tokens=tokens, length=n,
                     forward_per_token=forward.per_token, per_token_fixed=fixed, per_token_slope=slope,
                     # tokens / n sentence pairs of n tokens, rounded once at the end
                     forward_per_step=round(Fraction(forward.total * tokens, n)), paper=paper_run(spec))


def _per_token_terms(spec: CompiledSpec, n: int, total_at_n: int) -> tuple[Optional[int], Optional[int]]:
    """A sentence pair costs a·n (every linear layer, once per position) + b·n² (QK^T and AV), so a
    token costs a + b·n. Solved from n = 1 and 2, and kept only if it reproduces the count at n."""
    one, two = flops(spec, 1).total, flops(spec, 2).total
    slope = (two - 2 * one) // 2
    fixed = one - slope
    return (fixed, slope) if fixed * n + slope * n * n == total_at_n else (None, None)


def paper_run(spec: CompiledSpec) -> Optional[PaperRun]:
    """The paper's model whose layers this spec has. Dropout, positions and the vocabulary may differ:
    Table 2 gives one figure per model for EN-DE and EN-FR, whose vocabularies differ (§5.1)."""
    arch = architecture(spec)
    for run in PAPER_RUNS:
        d_k = run.d_model // run.heads          # §3.2.2: d_k = d_v = d_model / h
        if (arch.layers, arch.d_model, arch.d_ff, arch.heads, arch.kv_heads, arch.d_k, arch.d_v) == (
                run.layers, run.d_model, run.d_ff, run.heads, run.heads, d_k, d_k):
            return run
    return None
