"""Forward FLOPs and training memory, counted from the graph's ops and shapes. In the compiler because both
`xspec stats` (xspec/stats/) and the runtime's memory plan (`CompiledSpec.training_memory`) read them.

Conventions (docs/stats.md):
- A FLOP is one multiply or one add; a multiply-add counts 2. Only matrix products are counted
  (linear layers, the attention projections, QK^T, AV): they are nearly all of the work. Softmax,
  layer normalization, biases, residual additions, dropout and embedding lookups are not counted.
- Attention computes the full n_q x n_k score matrix, also where a causal mask discards half of it
  (that is what the implementation runs), and the decoder's cross-attention projects keys and values
  of the n_k encoder positions.
- Sequences are evaluated at one length n for every symbolic length (src_len = tgt_len = n), so
  "per token" means per target token with its matching source token (the paper's training pair).
- Memory: float32 weights, gradients and Adam's two moments (§5.3), each divided among the ranks
  that shard them; activations are what autograd keeps for the backward pass, estimated as every
  op's output plus what each op keeps besides (an attention: what SDPA keeps); the loss adds its
  float32 log-probabilities and, at the start of backward, their gradient and the logits'. An
  estimate, checked against measured peaks by bench/memory.py (docs/runtime.md).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Union

from .ops import OPS
from .shapes import BATCH, TensorType
from .opdef import Family
from .ir import node_of

if TYPE_CHECKING:
    from .spec import CompiledSpec

BYTES_FLOAT32 = 4
ADAM_MOMENTS = 2            # §5.3: Adam keeps a first and a second moment per parameter

# FLOP categories, in the order of the paper's description of a layer.
CATEGORIES = ("attention_qkv", "attention_scores", "attention_values", "attention_out", "recurrent",
              "feed_forward", "moe_router", "moe_experts", "generator")


@dataclass(frozen=True)
class Flops:
    length: int
    total: int                          # one sequence pair (n source and n target tokens), forward
    by_category: dict[str, int]         # per token
    by_stack: dict[str, int]            # per token of that stack's own sequence (encoder, decoder)

    @property
    def per_token(self) -> float:
        return self.total / self.length


@dataclass(frozen=True)
class Memory:
    """Bytes one training pass of `batch` sequences of `length` tokens holds at its peak."""

    batch: int
    length: int
    weights: int
    gradients: int
    adam: int
    activations: int                    # kept by autograd for the backward pass
    loss: int                           # the loss's [tokens x vocab] float32 tensors besides the logits

    @property
    def fixed(self) -> int:
        """What the run holds whatever its passes: weights, gradients and optimizer state."""
        return self.weights + self.gradients + self.adam

    @property
    def per_pass(self) -> int:
        """What a pass adds, in proportion to its sequences."""
        return self.activations + self.loss

    @property
    def total(self) -> int:
        return self.fixed + self.per_pass


def _size(shape: TensorType, batch: int, length: int) -> int:
    """Elements of `shape` with the batch dimension = `batch` and every sequence length = `length`."""
    count = 1
    for dim in shape.dims:
        count *= dim if isinstance(dim, int) else batch if dim == BATCH else length
    return count


Lengths = Union[int, Mapping[str, int]]  # one length for every sequence, or one per dimension name


def _positions(shape: TensorType, length: Lengths) -> int:
    """Sequence positions in one example: `length` per symbolic length dimension (src_len, tgt_len), or
    that dimension's own length when `length` names them."""
    count = 1
    for dim in shape.dims:
        if isinstance(dim, str) and dim != BATCH:
            count *= length if isinstance(length, int) else length[dim]
    return count


def is_generator(graph, node: str) -> bool:
    """§3.4: the pre-softmax projection is the linear that produces the model's logits (through functions
    that keep their shape, such as Gemma 2's soft cap)."""
    pending = list(graph.successors(node))
    while pending:
        op = OPS[node_of(graph, pending[-1]).op]
        successor = pending.pop()
        if op.family == Family.IO:
            return True
        if op.elementwise and graph.in_degree(successor) == 1:
            pending += graph.successors(successor)
    return False


def _node_positions(graph, node: str, length: Lengths) -> tuple[int, dict[str, int]]:
    """Positions of one example in the node's output and in each of its inputs."""
    inputs = {port: _positions(node_of(graph, source).checked_shape(), length)
              for port, source in node_of(graph, node).inputs.items()}
    return _positions(node_of(graph, node).checked_shape(), length), inputs


def node_flops(graph, node: str, length: Lengths) -> dict[str, int]:
    data = graph.nodes[node]
    counts = OPS[data["node"].op].flops(data["node"].attrs, data["node"].inferred,
                                        *_node_positions(graph, node, length))
    if is_generator(graph, node):
        return {"generator" if category == "feed_forward" else category: n for category, n in counts.items()}
    return counts


def stack_of(data: dict) -> str:
    """The top-level block an op belongs to (encoder, decoder)."""
    return (data["node"].module or data["node"].scope or "model").split(".")[0]


def example_flops(spec: CompiledSpec, lengths: Mapping[str, int]) -> int:
    """Forward FLOPs of one example whose sequences have these lengths (e.g. a padded batch's row:
    {"src_len": 31, "tgt_len": 27}); every symbolic length dimension of the spec must be named."""
    return sum(sum(node_flops(spec.graph, node, lengths).values()) for node in spec.graph)


def flops(spec: CompiledSpec, length: int) -> Flops:
    by_category: dict[str, int] = defaultdict(int)
    by_stack: dict[str, int] = defaultdict(int)
    for node, data in spec.graph.nodes(data=True):
        for category, count in node_flops(spec.graph, node, length).items():
            by_category[category] += count
            by_stack[stack_of(data)] += count
    total = sum(by_category.values())
    return Flops(length=length, total=total,
                 by_category={c: by_category[c] // length for c in CATEGORIES if by_category[c]},
                 by_stack={s: count // length for s, count in by_stack.items()})


def activation_elements(spec: CompiledSpec, batch: int, length: int, recomputed: bool = False) -> int:
    """Float values autograd keeps for the backward pass (see the module docstring). `recomputed`: each layer of
    the repeated stacks keeps its input alone and makes the rest again in the backward, one layer at a time
    (train.activation_checkpointing), so the layers count their inputs and the largest layer's own."""
    graph = spec.graph
    layers = spec.layer_paths() if recomputed else []
    outside, within = 0, dict.fromkeys(layers, 0)
    for node, data in graph.nodes(data=True):
        if OPS[data["node"].op].family == Family.IO or data["node"].shape.dtype != "float":
            continue
        kept = _size(data["node"].shape, batch, length) + batch * OPS[data["node"].op].saved(
            data["node"].attrs, data["node"].inferred, *_node_positions(graph, node, length))
        path = data["node"].module or data["node"].scope or ""
        layer = next((p for p in layers if path == p or path.startswith(f"{p}.")), None)
        if layer is None:
            outside += kept
        else:
            within[layer] += kept
    if not within:
        return outside
    return outside + len(within) * batch * length * spec.model_dim + max(within.values())


LOSS_TENSORS = 2     # float32 [tokens x vocab]: log-probabilities kept for backward, then their gradient
                     # beside the logits' (the logits themselves count among the activations)


def memory(spec: CompiledSpec, batch: int, length: int, *, activation_bytes: int = BYTES_FLOAT32,
           shards: int = 1, replicas: int = 1, trained: int | None = None, weight_bytes: int | None = None,
           recomputed: bool = False) -> Memory:
    """Training memory of one pass (see the module docstring). `activation_bytes`: 2 under bf16/fp16
    autocast; `shards`: ranks that share weights, gradients and Adam's moments (FSDP), each of which
    also gathers whole the largest unit it shards, twice (one prefetched); `replicas`: ranks that each
    hold the whole model (DDP, whose gradient buckets are a second copy of the gradients). `trained`: the
    parameters that train, with gradients and moments (None: all; LoRA's adapters), and `weight_bytes`
    what the weights take (None: float32; LoRA's frozen base kept smaller); `recomputed`: layers remake
    their activations in the backward (activation_elements)."""
    weights = (weight_bytes if weight_bytes is not None else spec.parameters * BYTES_FLOAT32) // shards
    gathered = 2 * _largest_shard_unit(spec) * BYTES_FLOAT32 if shards > 1 else 0
    state = (trained if trained is not None else spec.parameters) * BYTES_FLOAT32 // shards
    gradients = state * (2 if replicas > 1 and shards == 1 else 1)
    tokens = batch * length
    return Memory(batch=batch, length=length, weights=weights + gathered, gradients=gradients,
                  adam=ADAM_MOMENTS * state,
                  activations=activation_elements(spec, batch, length, recomputed) * activation_bytes,
                  loss=LOSS_TENSORS * tokens * spec.vocab_size * BYTES_FLOAT32)


def _largest_shard_unit(spec: CompiledSpec) -> int:
    """Parameters of the largest unit FSDP shards (runtime/step.py): one layer of a repeated stack, or what
    lies outside the stacks (embeddings, output projection). Layers tied to others count with the rest."""
    layers: list[int] = []

    def visit(instance) -> None:
        for child in instance.children.values():
            if child.kind == "stack" and not spec.all_tied_under(child.path):
                layers.extend(spec.count_under(layer.path) for layer in child.children.values())
            else:
                visit(child)

    visit(spec.instances)
    return max([spec.parameters - sum(layers), *layers])
