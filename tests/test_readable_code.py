"""Generated code as one would write it by hand, for every shipped spec: short lines that each point
back to the spec, only the library classes the spec uses (imported, or copied in a standalone file), and
the shape a line makes where it changes."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import xspec
from xspec.compiler.codecheck import compile_checked
from xspec.compiler.config import ConfigNames, config_fields
from xspec.compiler.python_print import LINE_LIMIT
from xspec.compiler.op_attention import AttentionAttrs
from xspec.compiler.library import MODULE, library_classes, library_files, with_bases

SPECS = sorted(Path("specs").rglob("*.xspec"))
POINTER = re.compile(r"  # .*(\S+\.xspec|<spec>):\d+$")
SHAPE = re.compile(r"  # (\w*\[[^\]]*\])  ")


@pytest.fixture(scope="module", params=SPECS, ids=lambda p: str(p.relative_to("specs")))
def compiled(request):
    spec = xspec.compile(str(request.param))
    return spec, spec.python_source


def _generated_classes(tree: ast.Module) -> list[ast.ClassDef]:
    """The classes written for the spec's blocks (not the library's, nor the config)."""
    return [node for node in tree.body if isinstance(node, ast.ClassDef) and not node.decorator_list
            and node.name not in library_classes()]


def test_every_line_is_shorter_than_the_limit(compiled):
    spec, source = compiled
    for text in (source, spec.standalone_source):
        long = [line for line in text.split("\n") if len(line) >= LINE_LIMIT]
        assert not long, long


def test_every_statement_of_a_block_points_to_its_spec_line(compiled):
    _, source = compiled
    lines = source.split("\n")
    tree = ast.parse(source)
    model = next(n.value.id for n in tree.body if isinstance(n, ast.Assign))
    for cls in _generated_classes(tree):
        assert POINTER.search(lines[cls.lineno - 1]) or cls.name == model, lines[cls.lineno - 1]
        if cls.name == model:
            continue  # the entry points around the blocks: encode, decode, forward
        for method in cls.body:
            for statement in ast.walk(method):
                if not isinstance(statement, ast.stmt) or statement is method:
                    continue
                text = lines[statement.lineno - 1]
                if text.strip() in ("super().__init__()",) or isinstance(statement, ast.Raise) or (
                        isinstance(statement, ast.Return) and isinstance(statement.value, (ast.Name, ast.Tuple))):
                    continue  # a refusal points through its `if`
                assert POINTER.search(text), f"{cls.name}: {text!r} has no pointer to the spec"


def test_the_file_imports_only_the_library_classes_the_spec_uses(compiled):
    """Every library class imported is one the generated code constructs (`RMSNorm(`, not `nn.RMSNorm(`): an
    attention is Attention, with the weights written out exactly where it has soft caps or sinks. A
    standalone file copies exactly those classes and the ones they extend, and imports none."""
    spec, source = compiled
    tree = ast.parse(source)
    imported = {alias.name for node in tree.body if isinstance(node, ast.ImportFrom) and node.module == MODULE
                for alias in node.names}
    assert not {node.name for node in tree.body if isinstance(node, ast.ClassDef)} & set(library_classes())
    named = {name for name in library_classes() if re.search(rf"(?<![\w.]){name}\(", source)}
    assert imported == named
    attentions = [node.attrs_as(AttentionAttrs) for node in spec.ops if node.op == "attention"]
    assert ("Attention" in imported) == bool(attentions)
    assert ("WrittenOutAttention" in imported) == any(a.softcap is not None or a.sinks for a in attentions)
    standalone = ast.parse(spec.standalone_source)
    copied = {node.name for node in standalone.body
              if isinstance(node, ast.ClassDef) and node.name in library_classes()}
    assert copied == set(with_bases(imported))
    assert not any(isinstance(node, ast.ImportFrom) and node.module == MODULE for node in standalone.body)


def test_the_library_exports_every_class_the_compiler_reads():
    import xspec.nn

    assert set(xspec.nn.__all__) == set(library_classes())
    for name, entry in library_classes().items():
        assert getattr(xspec.nn, name).__name__ == name and entry.source.startswith(f"class {name}(")


def test_every_library_line_fits_the_limit():
    long = [(path.name, number) for path in library_files()
            for number, line in enumerate(path.read_text().split("\n"), 1) if len(line) >= LINE_LIMIT]
    assert not long


def test_lines_that_change_the_shape_say_so_in_the_spec_names(compiled):
    spec, source = compiled
    names = ConfigNames(config_fields(spec.params))
    logits = next(node for node in spec.ops if node.op == "output" and node.attrs.name in ("logits", "memory"))
    made = spec.ops[logits.inputs["x"]]  # the node that computes the model's output
    dims, dtype = names.shape(made.shape)
    wanted = ("" if dtype == "float" else dtype) + "[" + ", ".join(dims) + "]"
    shapes = SHAPE.findall(source)
    values = config_fields(spec.params)
    assert any(_merged(shape, wanted, values) for shape in shapes), (wanted, shapes)
    fields = set(values)
    for shape in shapes:
        for dim in shape.split("[", 1)[1].rstrip("]").split(", "):
            for part in dim.split("|"):
                assert part in fields or part.isdigit() or part in ("batch", "src_len", "tgt_len"), shape


def _merged(shape: str, wanted: str, values: dict) -> bool:
    """`[batch, src_len|tgt_len, d_model]` stands for each of its lengths; a size two parameters share
    (`512`) is named by the one the op that made it reads (`d_model`, beside `max_len`)."""
    ours, theirs = shape.strip("[]").split(", "), wanted.strip("[]").split(", ")
    return len(ours) == len(theirs) and all(
        b in a.split("|") or (b.isdigit() and values.get(a) == int(b)) for a, b in zip(ours, theirs))


def test_sizes_come_from_the_config_by_the_spec_names():
    source = xspec.compile("specs/modern/llama.xspec").python_source
    assert ("self.gate_proj = nn.Linear(  # llama.xspec:25\n"
            "            config.d_model, config.d_ff, bias=config.mlp_bias)") in source
    assert "nn.RMSNorm(config.d_model, eps=config.rms_norm_eps)" in source
    assert "config.d_model, config.heads, config.kv_heads, config.d_k, config.d_v," in source
    assert "self.rotary_emb = RotaryEmbedding(config.d_k, config.rope_theta)" in source
    # An argument the spec computes from parameters is written so (exactly the same value), a power too.
    assert "scale=config.query_pre_attn_scalar ** -0.5" in xspec.compile("specs/modern/gemma2.xspec").python_source
    assert ("        self.embed = ScaledEmbedding(  # base.xspec:33\n"
            "            config.vocab, config.d_model, math.sqrt(config.d_model))\n") in \
        xspec.compile("specs/base.xspec").python_source


def test_a_power_reads_the_config_only_by_a_small_literal_exponent():
    text = Path("specs/modern/gemma2.xspec").read_text()
    assert "query_pre_attn_scalar ** -0.5" in text
    computed = xspec.compile_source(text.replace("query_pre_attn_scalar ** -0.5", "query_pre_attn_scalar ** (1 - 1.5)"),
                                    "specs/modern/gemma2.xspec").python_source
    assert "scale=0.1767766952966369" in computed and "** (" not in computed


def test_a_model_built_from_another_config_has_its_sizes(tmp_path: Path):
    spec = xspec.compile("specs/tiny.xspec")
    namespace: dict = {}
    exec(compile_checked(spec.python_source, "model.py"), namespace)
    config = namespace["TransformerTinyConfig"](d_ff=64)
    model = namespace["Model"](config)
    assert model.encoder.layers[0].ffn.w_1.weight.shape == (64, 128)
    default = namespace["Model"]()
    assert set(default.state_dict()) == set(spec.build("cpu").state_dict())


FAMILIES = ["base", "big", "lm", *(f"modern/{path.stem}" for path in sorted(Path("specs/modern").glob("*.xspec")))]


def _edits(params: dict) -> list[dict]:
    """Edits of the parameters a config holds whose result --set can also build: the depth, the width (with
    what the spec computes from it left to the config), the feed-forward's width, the head count."""
    if "encoder_layers" in params:     # an encoder and a decoder sized apart (Marian's)
        return [{"encoder_layers": 3, "decoder_layers": 1}, {"d_model": 2 * params["d_model"]},
                {"encoder_ffn_dim": params["encoder_ffn_dim"] + 8}, {"decoder_attention_heads": 2}]
    if "num_decoder_layers" in params:  # T5's names
        return [{"num_layers": 3, "num_decoder_layers": 1}, {"d_model": 2 * params["d_model"]},
                {"d_ff": params["d_ff"] + 8}, {"num_heads": 2, "d_kv": 8}, {"relative_attention_num_buckets": 16}]
    edits = [{"layers": 3}, {"d_model": 2 * params["d_model"]}]
    if isinstance(params.get("d_ff"), int):
        edits.append({"d_ff": params["d_ff"] + 8})
    edits.append({"heads": params["heads"] // 2, **({"kv_heads": 1} if "kv_heads" in params else {})})
    return edits


@pytest.mark.parametrize("name", FAMILIES)
def test_an_edited_config_builds_the_model_set_builds(name: str):
    """Every family: building the generated file from an edited config gives the model that compiling with
    the same --set gives, also where the spec computes other parameters from the edited one (base's d_k
    from d_model and heads, gemma3's layer_types from layers) and where two parameters share a value
    (llama's layers and kv_heads, 2; big's d_model and max_len, 1024)."""
    path = f"specs/{name}.xspec"
    spec = xspec.compile(path)
    namespace: dict = {}
    exec(compile_checked(spec.python_source, "model.py"), namespace)
    config_class = next(v for k, v in namespace.items() if k.endswith("Config") and isinstance(v, type))
    fields = set(config_class.__dataclass_fields__)
    tried = 0
    for edit in _edits(spec.params):
        if not set(edit) <= fields:
            continue
        try:
            expected_spec = xspec.compile(path, overrides=edit)
        except xspec.SpecError:
            continue  # not a valid model of this family
        with torch.device("meta"):  # shapes without the time of initializing big's weights
            expected, edited = expected_spec.build("meta"), namespace["Model"](config_class(**edit))
        assert {k: v.shape for k, v in edited.state_dict().items()} == \
            {k: v.shape for k, v in expected.state_dict().items()}, edit
        tried += 1
    assert tried >= 2


def test_an_option_the_spec_reads_from_a_parameter_is_a_config_field_even_at_its_default():
    """llama's rope_theta is the rotary default, 10000: still written, so a config edit reaches the model."""
    spec = xspec.compile("specs/modern/llama.xspec")
    assert spec.params["rope_theta"] == 10000.0 and "(config.d_k, config.rope_theta)" in spec.python_source
    namespace: dict = {}
    exec(compile_checked(spec.python_source, "model.py"), namespace)
    edited = namespace["Model"](namespace["LlamaConfig"](rope_theta=500000.0))
    built = xspec.compile("specs/modern/llama.xspec", overrides={"rope_theta": 500000.0}).build("cpu")
    name = "decoder.rotary_emb.inverse_frequency"
    assert dict(edited.named_buffers())[name].tolist() == dict(built.named_buffers())[name].tolist()


def test_the_model_class_names_the_methods_it_has():
    assert "class TransformerLm(nn.Module):  # the whole model: decode, forward\n" in \
        xspec.compile("specs/lm.xspec").python_source
    assert "class TransformerBase(nn.Module):  # the whole model: encode, decode, forward\n" in \
        xspec.compile("specs/base.xspec").python_source


def test_a_spec_function_called_once_is_written_where_it_is_called():
    """gemma2's `attend = h => attention(h, h, h)`, bound in each branch of the layer's `if` and called
    once: its steps in place of the call, the argument named after the parameter; no nested def."""
    source = xspec.compile("specs/modern/gemma2.xspec").python_source
    assert ("        h = self.input_layernorm(x)  # gemma2.xspec:37\n"
            "        h = self.self_attn(  # gemma2.xspec:37\n"
            "            h, h, h, cache=cache, position_embeddings=rope,\n"
            "            attention_mask=sliding_mask if self.layer_type == 'sliding_attention' else mask)\n") in source
    assert "attend" not in source and " = lambda " not in source


def test_no_shipped_spec_writes_a_nested_def(compiled):
    """Every function a shipped spec defines is called once or passed to a block: a forward holds no def."""
    _, source = compiled
    forwards = [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.FunctionDef)
                and node.name == "forward"]
    assert forwards and not any(isinstance(inner, ast.FunctionDef) for forward in forwards
                                for inner in ast.walk(forward) if inner is not forward)


def test_a_literal_repeat_count_is_written_as_a_number_even_where_a_parameter_has_its_value():
    text = Path("specs/lm.xspec").read_text()
    assert "repeat layers {" in text
    source = xspec.compile_source(text.replace("repeat layers {", "repeat 4 {"), "specs/lm.xspec",
                                  overrides={"heads": 4}).python_source
    assert "for _ in range(4)])" in source and "range(config" not in source


# The generated file's length (`wc -l`) at most, at the spec's sizes and at a real depth: shorter than
# transformers' modeling files, as torchtitan's models are over their shared modules.
LENGTHS = [("base", None, 220), ("modern/llama", None, 150), ("modern/qwen3", None, 160),
           ("modern/gemma3", None, 200), ("modern/gemma3", 62, 200), ("modern/mixtral", None, 200),
           ("modern/gpt_oss", None, 230), ("modern/qwen3_moe", None, 200), ("modern/qwen3_moe", 48, 200)]


@pytest.mark.parametrize("name, layers, most", LENGTHS)
def test_a_generated_file_reads_in_few_lines(name: str, layers: int | None, most: int):
    source = xspec.compile(f"specs/{name}.xspec", overrides={"layers": layers} if layers else None).python_source
    assert source.count("\n") <= most


@pytest.mark.parametrize("name", ["base", "llama", "gemma3", "mixtral", "qwen3_next"])
def test_the_examples_in_the_docs_are_what_the_compiler_writes(name: str):
    path = next(Path("specs").rglob(f"{name}.xspec"))
    example = Path(f"docs/examples/{name}/model.py")
    assert example.read_text() == xspec.compile(str(path)).python_source, f"regenerate {example}"


def test_every_generated_file_passes_the_projects_linter(tmp_path: Path):
    """The project's own ruff rules (pyproject.toml), over every shipped spec's file at its default depth and
    the deep ones, as imported and as standalone."""
    variants = [(path, {}) for path in SPECS] + [(Path("specs/modern/gemma3.xspec"), {"layers": 62}),
                                                 (Path("specs/modern/qwen3_moe.xspec"), {"layers": 48})]
    for number, (path, overrides) in enumerate(variants):
        spec = xspec.compile(str(path), overrides=overrides)
        (tmp_path / f"{path.stem}_{number}.py").write_text(spec.python_source)
        (tmp_path / f"{path.stem}_{number}_standalone.py").write_text(spec.standalone_source)
    found = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--config", "pyproject.toml",
                            str(tmp_path)], capture_output=True, text=True)
    assert found.returncode == 0, found.stdout + found.stderr


@pytest.mark.parametrize("spec, holder", [
    ("modern/t5", "        self.dropout = nn.Dropout(config.dropout_rate)"),
    ("modern/bert", "        self.hidden_dropout = nn.Dropout(config.hidden_dropout_prob)"),
    ("base", "        self.dropout = nn.Dropout(config.dropout)")])
def test_a_parameter_free_module_is_named_for_what_it_is_not_for_its_rate(spec: str, holder: str):
    """transformers' `self.dropout = nn.Dropout(config.dropout_rate)`: a module named after the parameter
    it reads, less a rate's suffix."""
    source = xspec.compile(f"specs/{spec}.xspec").python_source
    assert holder in source
    assert "_rate = nn." not in source and "_prob = nn." not in source


def test_a_size_two_parameters_share_is_named_by_the_one_its_op_reads():
    """T5's d_ff and relative_attention_max_distance are both 128: the feed-forward's line says d_ff."""
    source = xspec.compile("specs/modern/t5.xspec").python_source
    assert "h = self.act(self.wi(x))  # [batch, src_len|tgt_len, d_ff]  t5.xspec:32" in source
    assert ", 128]" not in source
