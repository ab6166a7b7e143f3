"""Statistics of a compiled spec, read off its graph: the Table 3 hyperparameters, parameter counts,
forward FLOPs, training memory, and the paper's Table 1 view (`xspec stats`; docs/stats.md). Beside them:
training cost against Table 2 (train_cost.py) and parameters by component (parameters.py)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from xspec.stats.architecture import Architecture, architecture
from xspec.stats.complexity import Table1Row, table1
from xspec.compiler.cost import Flops, Memory, flops, memory

if TYPE_CHECKING:
    from xspec.compiler.spec import CompiledSpec


@dataclass(frozen=True)
class BlockCount:
    path: str
    label: str
    kind: str
    depth: int
    parameters: int
    tied: bool                          # every tensor here is shared with another block's


@dataclass(frozen=True)
class DecodingCache:
    """What a decoder's cache keeps for one sequence (runtime/cache.py), from the spec's self-attention
    layers: each keeps, per position, its keys and values (or a latent attention's latent and rotary key);
    and from its recurrent layers (Gated DeltaNet, Mamba-2): each keeps a state of fixed size."""

    layers: int                     # the self-attention layers that keep a cache
    per_position: int               # numbers each position adds in the layers that keep every position
    windowed: int                   # numbers per position in sliding-window layers, which keep `window` at most
    length: int
    at_length: int                  # numbers kept for a sequence of `length` positions, the states included
    recurrent_layers: int = 0       # layers that keep a state instead
    state: int = 0                  # the numbers of their states together, at any length

    def as_dict(self) -> dict[str, int]:
        return {"layers": self.layers, "numbers_per_position": self.per_position,
                "windowed_numbers_per_position": self.windowed, "recurrent_layers": self.recurrent_layers,
                "state_numbers": self.state, "length": self.length,
                "numbers_at_length": self.at_length, "float32_bytes_at_length": 4 * self.at_length,
                "bf16_bytes_at_length": 2 * self.at_length}


def decoding_cache(spec: CompiledSpec, length: int) -> DecodingCache:
    from xspec.compiler.ops import OPS

    layers = per_position = windowed = at_length = recurrent = state = 0
    for node in spec.ops:
        kept = OPS[node.op].recurrent_state(node.attrs, node.inferred)
        if kept and node.scope.split(".")[0] == "decoder":
            recurrent, state, at_length = recurrent + 1, state + kept, at_length + kept
        if node.inferred.get("kv_cache") != "append":
            continue
        (heads, key_dim, value_dim), window = OPS[node.op].cache(node.attrs, node.inferred)
        numbers = heads * (key_dim + value_dim)
        layers += 1
        per_position += numbers if window is None else 0
        windowed += numbers if window is not None else 0
        at_length += numbers * min(length, window or length)
    return DecodingCache(layers, per_position, windowed, length, at_length, recurrent, state)


@dataclass(frozen=True)
class SpecStats:
    name: str
    file: str
    architecture: Architecture
    parameters: int
    active_parameters: int              # used for one token: a mixture of experts' unchosen experts left out
    blocks: list[BlockCount]
    flops: Flops
    memory: Memory
    table1: list[Table1Row]
    d: int                              # the width Table 1 is evaluated at (d_model)
    cache: DecodingCache

    def to_json(self) -> dict[str, Any]:
        memory = {**asdict(self.memory), "total": self.memory.total}
        return {
            "name": self.name, "file": self.file, "architecture": self.architecture.as_dict(),
            "parameters": {"total": self.parameters, "active_per_token": self.active_parameters,
                           "blocks": {b.path: b.parameters for b in self.blocks},
                           "tied": [b.path for b in self.blocks if b.tied]},
            "flops": {"convention": "2 per multiply-add; matrix products only; src_len = tgt_len = length",
                      "length": self.flops.length, "forward_per_sequence_pair": self.flops.total,
                      "forward_per_token": self.flops.per_token, "per_token_by_category": self.flops.by_category,
                      "per_token_by_stack": self.flops.by_stack},
            "memory_bytes": memory,
            "decoding_cache": self.cache.as_dict(),
            "table1": {"n": self.flops.length, "d": self.d,
                       "rows": [{**asdict(r), "formula": list(r.formula)} for r in self.table1]},
        }


def active_parameters(spec: CompiledSpec) -> int:
    """The parameters one token's forward uses: all, less the weights of the experts a mixture of experts
    does not choose for it (each op entry says how many of its weights a token leaves unused)."""
    from xspec.compiler.ops import OPS

    unused = sum(OPS[node.op].inactive(node.attrs, node.inferred) for node in spec.ops)
    return spec.parameters - unused


def default_length(spec: CompiledSpec) -> int:
    """The longest sequence the spec trains on: data.max_tokens, within the positional encodings."""
    return min(spec.data.max_tokens, spec.max_positions or spec.data.max_tokens)


def default_batch(spec: CompiledSpec, length: int) -> int:
    """Sentences in one forward pass of `length` tokens: train.max_batch_tokens when the spec gives a number,
    else the whole update (§5.1), which "auto" may cut into passes on a machine with less memory."""
    tokens = spec.train.max_batch_tokens
    return max(1, (tokens if isinstance(tokens, int) else spec.train.batch_tokens) // length)


def compute(spec: CompiledSpec, length: int | None = None, batch: int | None = None,
            kernel: int = 3, neighbourhood: int = 16) -> SpecStats:
    from xspec.compiler.summary import summarize

    n = length or default_length(spec)
    b = batch or default_batch(spec, n)
    blocks = [BlockCount(r["path"], r["label"], r["kind"], r["depth"], r["parameters"], r["tied"])
              for r in summarize(spec)["rows"]]
    return SpecStats(name=spec.name, file=spec.path, architecture=architecture(spec), parameters=spec.parameters,
                     active_parameters=active_parameters(spec), blocks=blocks, flops=flops(spec, n),
                     memory=memory(spec, b, n),
                     table1=table1(spec, n, spec.model_dim, kernel, neighbourhood), d=spec.model_dim,
                     cache=decoding_cache(spec, n))
