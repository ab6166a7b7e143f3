"""How export reads a run an older xspec wrote, whose spec computes a family's model in an older form: its op
graph and parameters put in the form the families' specs write now, so the run still matches its family.

- The one-op mixture of experts (`moe`), as the families' specs were before they wrote a router and an
  experts op: compared as those two ops, its experts' tensors packed as theirs.
- An activation chosen by `if`s over the parameter's value (`gelu(h)` where hidden_act is "gelu"), as the
  specs were before the `activation` op: the op is compared as the function it applies, on both sides. The
  encoder-decoders' parameter was `activation`, and transformers' "gelu_new" was kept as it is.
- A layer's input passed on as it is (`h = x`), where the specs now write `identity(x)`: identities are
  compared as the value they pass on.
"""

from __future__ import annotations

from xspec.compiler.op_experts import BankAttrs, RouterAttrs

ONE_OP_MIXTURE = "moe"
# Parameters an older spec named otherwise -> their names now.
OLDER_NAMES = {"activation": "activation_function"}
# The parameters that name an activation, and the values older imports kept for them -> the activation op's.
ACTIVATION_PARAMS = frozenset({"hidden_act", "dense_act_fn", "activation_function", "classifier_activation"})
OLDER_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "swish": "silu"}


def current_params(params: dict[str, object]) -> dict[str, object]:
    """A spec's parameters as the families' specs name them now."""
    current = {}
    for name, value in params.items():
        name = OLDER_NAMES.get(name, name) if OLDER_NAMES.get(name) not in params else name
        if name in ACTIVATION_PARAMS and isinstance(value, str):
            value = OLDER_ACTIVATIONS.get(value, value)
        current[name] = value
    return current


def current_graph(nodes: list[dict], edges: list[dict]) -> tuple[list[dict], list[dict]]:
    """A graph's nodes and edges (graph.json's) in the form export compares: a one-op mixture as a router and
    an experts op, an activation op as the op of its function, identities and dropouts of p = 0 gone (their
    readers read what they pass on), and the attention masks a stack makes gone (an attention reads one of its
    own causality and window, which is what it computes without: a run written before stacks made them)."""
    listed: list[dict] = []
    passed: dict[str, str] = {}  # an identity's id -> the id of what it passes on
    masks = {node["id"] for node in nodes if node["op"] == "attention_mask"}
    edges = [edge for edge in edges if edge["from"] not in masks and edge["to"] not in masks]
    for node in (node for node in nodes if node["id"] not in masks):
        if node["op"] == ONE_OP_MIXTURE:
            router, experts = _as_two_ops(node)
            listed += [router, experts]
            edges = [{**edge, "to": router["id"]} for edge in edges if edge["to"] == node["id"]] + edges
            edges.append({"from": router["id"], "to": experts["id"], "ports": ["routing"]})
        elif node["op"] == "activation":
            listed.append({**node, "op": node["attrs"]["function"], "attrs": {}, "module": None})
        elif node["op"] == "identity" or node["op"] == "dropout" and node["attrs"].get("p") == 0:
            passed[node["id"]] = next(edge["from"] for edge in edges if edge["to"] == node["id"])
        else:
            listed.append(node)

    def source(node_id: str) -> str:
        while node_id in passed:
            node_id = passed[node_id]
        return node_id

    edges = [{**edge, "from": source(edge["from"])} for edge in edges if edge["to"] not in passed]
    return listed, edges


def _as_two_ops(node: dict) -> tuple[dict, dict]:
    """A one-op mixture's node as the router's and the experts' nodes the families' specs make: the router
    holds its module's `router`, the experts the rest."""
    attrs = node["attrs"]
    router = {name: attrs[name] for name in RouterAttrs.model_fields if name != "bias"}
    dims = node["shape"].strip("[]").split(", ")
    return ({**node, "id": f"{node['id']}.router", "op": "router", "attrs": {**router, "bias": attrs["router_bias"]},
             "shape": "[" + ", ".join([*dims[:-1], str(attrs["experts"])]) + "]", "module": f"{node['module']}.router"},
            {**node, "op": "experts", "attrs": {name: attrs[name] for name in BankAttrs.model_fields}, "one_op": True})


def packed_as_two_ops(state: dict, experts: str) -> None:
    """The one-op mixture's experts' tensors, renamed to the family's `experts` module, packed as its:
    gate and up (and their biases) as gate_up_proj, down as down_proj."""
    import torch

    for gate, up, packed in (("gate", "up", "gate_up_proj"), ("gate_bias", "up_bias", "gate_up_proj_bias")):
        if f"{experts}.{gate}" in state:
            state[f"{experts}.{packed}"] = torch.cat([state.pop(f"{experts}.{gate}"), state.pop(f"{experts}.{up}")],
                                                     dim=1)
    for down, renamed in (("down", "down_proj"), ("down_bias", "down_proj_bias")):
        if f"{experts}.{down}" in state:
            state[f"{experts}.{renamed}"] = state.pop(f"{experts}.{down}")
