"""The model as its validated graph says it computes: every op node evaluated in graph order, with the
built model's own modules (so weights are the same). The generated forward must give the same outputs;
a difference is lowering that wires values other than the graph does."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


# Ops without a module, in eval mode (dropout is the identity there).
FUNCTIONS = {
    "relu": lambda inputs, attrs: F.relu(inputs["x"]),
    "gelu": lambda inputs, attrs: F.gelu(inputs["x"]),
    "silu": lambda inputs, attrs: F.silu(inputs["x"]),
    "sigmoid": lambda inputs, attrs: torch.sigmoid(inputs["x"]),
    "tanh": lambda inputs, attrs: torch.tanh(inputs["x"]),
    "gelu_tanh": lambda inputs, attrs: F.gelu(inputs["x"], approximate="tanh"),
    "softcap": lambda inputs, attrs: attrs.cap * torch.tanh(inputs["x"] / attrs.cap),
    "sub": lambda inputs, attrs: inputs["a"] - inputs["b"],
    "mul": lambda inputs, attrs: inputs["a"] * inputs["b"],
    "dropout": lambda inputs, attrs: inputs["x"],
    "add": lambda inputs, attrs: inputs["a"] + inputs["b"],
    "scale": lambda inputs, attrs: inputs["x"] * attrs.factor,
}


def graph_outputs(spec: Any, model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Output name ("memory", "logits") -> the value the graph computes from `inputs` (by input name)."""
    import networkx as nx

    graph = spec.graph
    values: dict[str, torch.Tensor] = {}
    outputs: dict[str, torch.Tensor] = {}
    for node in nx.topological_sort(graph):
        data = graph.nodes[node]
        op, attrs = data["node"].op, data["node"].attrs
        arguments = {port: values[source] for port, source in data["node"].inputs.items()}
        if op == "input":
            values[node] = inputs[attrs.name]
        elif op == "output":
            outputs[attrs.name] = arguments["x"]
        elif op in FUNCTIONS:
            values[node] = FUNCTIONS[op](arguments, attrs)
        elif op == "attention":
            module = model.get_submodule(data["node"].module)
            values[node] = module(arguments["query"], arguments["key"], arguments["value"],
                                  padding_mask=arguments.get("mask"))
        else:  # embedding, positions, linear, the norms, a mixture of experts: a module of one input
            (argument,) = arguments.values()
            values[node] = model.get_submodule(data["node"].module)(argument)
    return outputs
