"""Adding an op is one entry in the op table: an op registered here, and nowhere else, compiles,
lowers, runs, counts its parameters and FLOPs, and draws with its own title. Lowering writes code (Python
syntax trees, compiler/python_code.py) from the op table, the graph and the programs alone."""

import ast
from pathlib import Path

import pytest
import torch

import xspec
from xspec.compiler.ops import OPS, Attrs, Input, OpDef
from xspec.compiler.python_code import binary, call, constant
from xspec.stats import compute
from xspec.compiler.cost import flops
from xspec.viz.labels import op_label


class ScaledLinearAttrs(Attrs):
    out: int
    factor: float = 1.0


def _shape(shapes, a):
    x = shapes["x"]
    return x.with_last(a.out), {"in_features": x.last}


SCALED_LINEAR = OpDef(
    name="scaled_linear", doc="x W * factor (a test op)", family="feed_forward", inputs=(Input("x"),),
    attrs=ScaledLinearAttrs, infer=_shape,
    params=lambda a, i: {"weight": (a.out, i["in_features"])},
    module=lambda a, i, w: call("nn.Linear", w.width("x"), w.attr("out"), bias=constant(False)), width="out",
    call=lambda target, inputs, a, cache: binary(call(f"self.{target}", inputs["x"]), ast.Mult(), constant(a.factor)),
    title="Scaled Linear", details=lambda a, i: [f"× {a.factor:g}"],
    flops=lambda a, i, n, n_in: {"feed_forward": 2 * n * i["in_features"] * a.out},
)

SPEC = """
import "specs/base.xspec"
model scaled extends transformer_base {
  block feed_forward(x) {
    return scaled_linear(relu(linear(x, d_ff) as w_1), d_model, factor = 0.5) as w_2
  }
}
"""


@pytest.fixture
def scaled_linear(monkeypatch):
    monkeypatch.setitem(OPS, "scaled_linear", SCALED_LINEAR)


def test_an_op_added_to_the_table_compiles_runs_counts_and_draws(scaled_linear):
    sizes = {"vocab": 100, "d_model": 16, "d_ff": 32, "heads": 2, "layers": 1}
    spec = xspec.compile_source(SPEC, name="scaled.xspec", overrides=sizes)
    base = xspec.compile("specs/base.xspec", overrides=sizes)
    # Parameters: w_2 has no bias now (16 per FFN, 2 FFNs); FLOPs: the same matrix products as the base.
    assert base.parameters - spec.parameters == 2 * 16
    assert flops(spec, 7).total == flops(base, 7).total
    assert compute(spec).architecture.d_ff == 32
    model = spec.build(device="cpu").eval()
    assert spec.parameters == sum(p.numel() for p in model.parameters())
    ffn = model.encoder.layers[0].ffn
    x = torch.randn(2, 3, 16)
    torch.testing.assert_close(ffn(x), ffn.w_2(torch.relu(ffn.w_1(x))) * 0.5)
    label = op_label(spec.graph, "encoder.layers.0.ffn.w_2")
    assert (label.title, label.details) == ("Scaled Linear", ["× 0.5"])


def test_without_its_entry_the_op_is_unknown():
    with pytest.raises(xspec.SpecError, match="unknown op or block 'scaled_linear'"):
        xspec.compile_source(SPEC, name="scaled.xspec")


def test_lowering_reads_the_graph_and_the_programs_not_the_syntax_tree():
    for path in ("compiler/lower.py", "compiler/forward.py"):
        tree = ast.parse(Path(path).read_text())
        imported = {alias.name if node.module is None else node.module
                    for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names}
        assert not imported & {"ast", "body", "evaluate", "graph", "parse"}, (path, imported)
