"""Parameters by component (§3): embeddings, attention, feed-forward, layer norms, weights apart from biases.

Each learned tensor is classified by the op that owns it in the graph (its family in the op table), not by
its name, and counted once, where the compiler counts it: a tied tensor (§3.4: both embeddings and the
pre-softmax projection share one matrix) counts at its owner. The components of every stack add up to
the compiled spec's parameter count. docs/stats.md uses this to compare with the paper's 65M and 213M.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from xspec.compiler.ops import OPS
from xspec.compiler.cost import is_generator, stack_of
from xspec.compiler.opdef import Family
from xspec.compiler.ir import node_of

if TYPE_CHECKING:
    from xspec.compiler.spec import CompiledSpec

# Component names, in the order the paper introduces them.
COMPONENTS = ("token embeddings", "positional embeddings", "attention weights", "attention biases",
              "feed-forward weights", "feed-forward biases", "layer norms", "pre-softmax weights",
              "pre-softmax biases")

_BY_FAMILY = {"embedding": "token embeddings", "position": "positional embeddings", "norm": "layer norms"}


def component(graph, node: str, tensor: str) -> str:
    """The component a tensor of `node` (e.g. "q_proj.bias") belongs to."""
    family = OPS[node_of(graph, node).op].family
    if family in _BY_FAMILY:
        return _BY_FAMILY[family]
    part = "biases" if tensor.rsplit(".", 1)[-1] == "bias" else "weights"
    if family == Family.ATTENTION:
        return f"attention {part}"
    if family == Family.FEED_FORWARD:
        return f"pre-softmax {part}" if is_generator(graph, node) else f"feed-forward {part}"
    return f"other {family} {part}"         # an op family the paper's model does not have


def breakdown(spec: CompiledSpec) -> dict[str, dict[str, int]]:
    """Untied parameters per stack (encoder, decoder) and component; tied tensors count at their owner."""
    shapes, ties = spec.param_shapes, spec.ties
    counts: dict[str, dict[str, int]] = {}
    for node, data in spec.graph.nodes(data=True):
        for tensor in OPS[data["node"].op].params(data["node"].attrs, data["node"].inferred):
            name = f"{data['node'].module}.{tensor}"
            if name in ties:
                continue
            stack = counts.setdefault(stack_of(data), {})
            part = component(spec.graph, node, tensor)
            stack[part] = stack.get(part, 0) + math.prod(shapes[name])
    order = {name: i for i, name in enumerate(COMPONENTS)}
    return {stack: dict(sorted(parts.items(), key=lambda item: order.get(item[0], len(order))))
            for stack, parts in counts.items()}
