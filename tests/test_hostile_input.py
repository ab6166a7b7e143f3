"""Hostile specs are data, never code.

Nothing in a spec's values, a `--set` value, a spec's file name or a checkpoint's embedded spec runs;
names that would shadow the generated module's own still build; files that are not regular spec files
are refused without blocking; and what a run directory keeps (the resolved spec) compiles again to the
same graph. The per-construct bounds have golden files in tests/diagnostics/.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

import pytest
import torch

import xspec
from xspec.cli import main

SPECS = sorted(Path("specs").glob("*.xspec")) + sorted(Path("specs/table3").glob("*.xspec"))
SMALL_LM = ("model {name} {{\n{members}\n"
            "  block decoder(tokens) {{ return linear(embedding(tokens, 10, 8) as embed, 10) as out }}\n}}\n")


def payload(marker: Path | str) -> str:
    """Text that runs Python (creating `marker`) if it ever escapes the string it is written in."""
    return f'"""; __import__("pathlib").Path({str(marker)!r}).touch(); _ = """'


def spec_quoting(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def build_and_run(spec: xspec.CompiledSpec) -> torch.Tensor:
    model = spec.build("cpu").eval()
    return model(torch.tensor([[1, 2, 3]]))


def test_a_string_value_stays_in_its_docstring(tmp_path: Path):
    marker = tmp_path / "ran"
    text = SMALL_LM.format(name="m", members=f"  param note = {spec_quoting(payload(marker))}")
    spec = xspec.compile_source(text, "hostile.xspec")
    assert build_and_run(spec).shape == (1, 3, 10)
    (tmp_path / "model.py").write_text(spec.python_source)
    runpy.run_path(str(tmp_path / "model.py"))  # importing the emitted file runs no more than building
    assert not marker.exists()
    assert spec.params["note"] == payload(marker)


def test_an_override_stays_data_from_the_api_and_the_command_line(tmp_path: Path):
    marker = tmp_path / "ran"
    text = SMALL_LM.format(name="m", members='  param note = "plain"')
    (tmp_path / "m.xspec").write_text(text)
    spec = xspec.compile(str(tmp_path / "m.xspec"), overrides={"note": payload(marker)})
    build_and_run(spec)
    status = main(["compile", str(tmp_path / "m.xspec"), "--set", f"note={payload(marker)}",
                   "-o", str(tmp_path / "out")])
    assert status == 0
    runpy.run_path(str(tmp_path / "out" / "model.py"))
    assert not marker.exists()


def test_a_file_name_is_escaped_in_comments_docstrings_and_the_resolved_spec(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    name = 'x"""\n__import__("pathlib").Path("ran").touch()\n#.xspec'
    Path(name).write_text(SMALL_LM.format(name="m", members=""))
    spec = xspec.compile(name)
    build_and_run(spec)
    again = xspec.compile_source(spec.resolved_source, "run/spec.xspec", allow_imports=False)
    build_and_run(again)
    assert not Path("ran").exists()
    assert "\n__import__" not in spec.python_source and "\n__import__" not in spec.resolved_source


def test_a_checkpoint_spec_is_compiled_like_any_spec_and_may_not_import(tmp_path: Path):
    marker = tmp_path / "ran"
    embedded = SMALL_LM.format(name="m", members=f"  param note = {spec_quoting(payload(marker))}")
    build_and_run(xspec.compile_source(embedded, "model.safetensors:spec.xspec", allow_imports=False))
    assert not marker.exists()
    with pytest.raises(xspec.SpecError) as error:
        xspec.compile_source('import "/etc/passwd"\n' + embedded, "model.safetensors:spec.xspec",
                             allow_imports=False)
    assert [d.code for d in error.value.diagnostics] == ["import-refused"]


@pytest.mark.parametrize("text, classes", [
    # A block `f` would be class F, shadowing torch.nn.functional; models named after library classes,
    # keywords or the generated module's own names get other class names.
    ("model m { block f(x) { return relu(x) }\n"
     "  block decoder(tokens) { return linear(f(embedding(tokens, 10, 8) as embed) as act, 10) as out } }", {"F2"}),
    (SMALL_LM.format(name="none", members=""), {"None2"}),
    (SMALL_LM.format(name="embedding", members=""), {"Embedding2"}),
    (SMALL_LM.format(name="model", members=""), {"Model2"}),
    (SMALL_LM.format(name="math", members=""), {"Math"}),
], ids=["block-f", "model-none", "model-embedding", "model-model", "model-math"])
def test_names_that_would_shadow_generated_code_still_build(text: str, classes: set[str]):
    spec = xspec.compile_source(text, "shadow.xspec")
    assert build_and_run(spec).shape == (1, 3, 10)
    assert all(f"class {name}(nn.Module)" in spec.python_source for name in classes)


def test_tied_weights_count_once_even_when_ties_form_a_cycle():
    text = ("model m {\n  block decoder(tokens) {\n"
            "    return linear(linear(embedding(tokens, 10, 10) as e, 10) as a, 10) as out\n  }\n"
            "  tie decoder.a.weight, decoder.out.weight\n  tie decoder.out.weight, decoder.a.weight\n"
            "  tie decoder.e.weight, decoder.a.weight\n}\n")
    spec = xspec.compile_source(text, "ties.xspec")
    model = spec.build("cpu")
    assert spec.parameters == sum(p.numel() for p in model.parameters()) == 100 + 10 + 10
    assert model.decoder.out.weight is model.decoder.a.weight is model.decoder.e.weight
    assert spec.ties == {"decoder.a.weight": "decoder.e.weight", "decoder.out.weight": "decoder.e.weight"}


def test_buffers_count_toward_the_allocation_check(monkeypatch):
    spec = xspec.compile_source(
        "model m { block decoder(tokens) { e = embedding(tokens, 10, 8) as embed\n"
        "  return linear(e + sinusoidal_positions(e, 100000) as positions, 10) as out } }", "buffers.xspec")
    table_bytes = 100000 * 8 * 4
    monkeypatch.setattr("xspec.compiler.spec._available_host_memory", lambda: table_bytes)
    with pytest.raises(xspec.UserError, match=r"needs 3\.1 MiB as float32 \(170 parameters and its buffers\)"):
        spec.build("cpu")


# --- files that are not spec files ---------------------------------------------------------------

def _importing(tmp_path: Path, target: str) -> str:
    (tmp_path / "main.xspec").write_text(f'import "{target}"\n' + SMALL_LM.format(name="m", members=""))
    with pytest.raises(xspec.SpecError) as error:
        xspec.compile(str(tmp_path / "main.xspec"))
    (record,) = error.value.diagnostics
    assert (record.code, record.span.line, record.span.col) == ("missing-import", 1, 1)
    return record.message


def test_a_fifo_is_refused_without_blocking(tmp_path: Path):
    os.mkfifo(tmp_path / "pipe.xspec")
    assert _importing(tmp_path, "pipe.xspec") == 'cannot import "pipe.xspec": is a FIFO; only regular files are read'
    with pytest.raises(xspec.UserError, match="pipe.xspec: is a FIFO"):
        xspec.compile(str(tmp_path / "pipe.xspec"))


def test_a_symlink_loop_and_a_device_are_refused(tmp_path: Path):
    (tmp_path / "a.xspec").symlink_to(tmp_path / "b.xspec")
    (tmp_path / "b.xspec").symlink_to(tmp_path / "a.xspec")
    assert _importing(tmp_path, "a.xspec") == 'cannot import "a.xspec": cannot read: Too many levels of symbolic links'
    assert _importing(tmp_path, "/dev/zero") == \
        'cannot import "/dev/zero": is a character device; only regular files are read'


def test_a_huge_file_is_refused_without_reading_it(tmp_path: Path):
    with open(tmp_path / "huge.xspec", "wb") as f:
        f.truncate(2**30)  # sparse: 1 GiB of zeros that take no disk
    assert _importing(tmp_path, "huge.xspec") == 'cannot import "huge.xspec": larger than 81,920 bytes'


def test_a_nul_byte_in_a_path_is_a_message(tmp_path: Path):
    with pytest.raises(xspec.UserError, match="a path cannot contain a NUL byte"):
        xspec.compile(str(tmp_path / "a\0b.xspec"))
    assert main(["compile", str(tmp_path / "a\0b.xspec")]) == 1


def test_a_spec_and_its_imports_share_one_size_limit(tmp_path: Path):
    padding = "# " + "x" * 78 + "\n"
    (tmp_path / "big.xspec").write_text(padding * 500 + "model big {}\n")  # 40 KB: fine alone
    (tmp_path / "main.xspec").write_text('import "big.xspec"\n' + padding * 400 + SMALL_LM.format(name="m", members=""))
    with pytest.raises(xspec.SpecError) as error:
        xspec.compile(str(tmp_path / "main.xspec"))
    (record,) = error.value.diagnostics
    assert record.code == "too-large" and "more than 64 KiB or 20,000 tokens together" in record.message
    with pytest.raises(xspec.SpecError, match="more than 64 KiB or 20,000 tokens"):
        xspec.compile_source(padding * 900 + SMALL_LM.format(name="m", members=""), "memory.xspec")


def test_dense_tokens_are_bounded_like_bytes(tmp_path: Path):
    ones = ", ".join(["1"] * 12000)  # 35 KiB, but 24,000 tokens: parsing them would take a second
    with pytest.raises(xspec.SpecError, match="more than 64 KiB or 20,000 tokens"):
        xspec.compile_source(SMALL_LM.format(name="m", members=f"  param p = [{ones}]"), "dense.xspec")


def test_a_long_list_is_refused():
    items = ", ".join(["1"] * 1100)
    with pytest.raises(xspec.SpecError, match="a list of 1,100 items exceeds the limit of 1,024"):
        xspec.compile_source(SMALL_LM.format(name="m", members=f"  param p = [{items}]"), "list.xspec")


def test_values_repeated_into_a_huge_resolved_spec_are_refused():
    members = ['  param s = "' + "a" * 4000 + '"', "  param l = [" + ", ".join(["s"] * 1000) + "]"]
    members += [f"  param q{i} = l" for i in range(500)]  # 4 MB each if written out
    with pytest.raises(xspec.SpecError) as error:
        xspec.compile_source(SMALL_LM.format(name="m", members="\n".join(members)), "repeated.xspec")
    assert [d.code for d in error.value.diagnostics] == ["too-large"]
    assert "the resolved spec" in error.value.diagnostics[0].message


def test_an_import_chain_is_bounded(tmp_path: Path):
    for i in range(70):
        (tmp_path / f"f{i}.xspec").write_text(f'import "f{i + 1}.xspec"\nmodel f{i} {{}}\n')
    (tmp_path / "f70.xspec").write_text("model f70 {}\n")
    with pytest.raises(xspec.SpecError) as error:
        xspec.compile(str(tmp_path / "f0.xspec"))
    assert [d.message for d in error.value.diagnostics] == ["a spec may import at most 64 files"]


# --- what a run directory keeps compiles again ---------------------------------------------------

def graph_signature(spec: xspec.CompiledSpec) -> tuple:
    """The graph without source positions: ops, attributes, shapes, module paths, edges, parameters, ties."""
    nodes = sorted((node, d["node"].op, repr(d["node"].attrs), str(d["node"].shape), d["node"].module, d["node"].repeat)
                   for node, d in spec.graph.nodes(data=True))
    edges = sorted((a, b, ports) for a, b, ports in spec.graph.edges(data="ports"))
    return nodes, edges, spec.param_shapes, spec.ties, spec.train, spec.data, spec.decode


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_the_resolved_spec_compiles_to_the_same_graph(path: Path):
    spec = xspec.compile(str(path))
    again = xspec.compile_source(spec.resolved_source, "run/spec.xspec", allow_imports=False)
    assert graph_signature(again) == graph_signature(spec)
    assert again.resolved_source.split("\n", 1)[1] == spec.resolved_source.split("\n", 1)[1]


def test_awkward_values_survive_the_round_trip():
    members = "\n".join([
        '  param quoted = "a \\"quoted\\" \\\\ backslash"', "  param tiny = 1e-09", "  param negative = -3",
        "  param betas = [0.9, 0.98]", "  param third = 1 / 3", "  param big = 2 ** 62",
        "  train { adam_betas = betas; adam_eps = tiny }"])
    spec = xspec.compile_source(SMALL_LM.format(name="m", members=members), "awkward.xspec")
    again = xspec.compile_source(spec.resolved_source, "run/spec.xspec", allow_imports=False)
    assert again.params == spec.params
    assert spec.params["quoted"] == 'a "quoted" \\ backslash' and spec.params["third"] == 1 / 3
    assert again.train.adam_eps == 1e-09


# --- the deepest legal specs compile, build, run and draw without a RecursionError -------------------

def _block_chain(depth: int) -> str:
    chain = "\n".join(f"  block k{i}(x) {{ return k{i + 1}(x) }}" for i in range(depth))
    return (f"model m {{\n{chain}\n  block k{depth}(x) {{ return relu(linear(x, 8) as lin) }}\n"
            "  block decoder(tokens) { return linear(k0(embedding(tokens, 10, 8) as embed), 10) as out }\n}\n")


@pytest.fixture
def default_recursion_limit():
    """Python's default limit, whatever an earlier test left (torch.compile raises it to 2000)."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    yield
    sys.setrecursionlimit(limit)


def test_the_deepest_legal_nesting_works_end_to_end(tmp_path: Path, default_recursion_limit):
    from xspec.stats import compute
    from xspec.viz import architecture_dot

    deepest = max(d for d in range(40, 120, 5) if _compiles(_block_chain(d)))
    spec = xspec.compile_source(_block_chain(deepest), "chain.xspec")
    assert deepest >= 60, "a chain of 60 blocks is legal"
    build_and_run(spec)
    compute(spec)
    architecture_dot(spec, "full", None)
    xspec.compile_source(spec.resolved_source, "run/spec.xspec", allow_imports=False)
    negations = [SMALL_LM.format(name="m", members=f"  param p = {'-(' * n}1{')' * n}") for n in range(70)]
    legal = [n for n, text in enumerate(negations) if _compiles(text)]
    assert legal == list(range(len(legal))) and 55 <= len(legal) < 64  # the syntax depth limit, less the model's
    assert sys.getrecursionlimit() <= 1000  # all of the above ran within Python's default limit


def _compiles(text: str) -> bool:
    try:
        xspec.compile_source(text, "chain.xspec")
        return True
    except xspec.SpecError:
        return False
