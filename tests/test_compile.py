"""The public API and `xspec compile`: counts, generated code, overrides, variants."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import xspec
from float32 import assert_close


def paper_parameter_count(vocab, d_model, d_ff, heads, d_k, d_v, layers):
    """Counted from the paper's formulas (§3.2.2, §3.3, §3.4), independently of the compiler."""
    weights = 2 * d_model * heads * d_k + d_model * heads * d_v + heads * d_v * d_model  # W^Q, W^K; W^V; W^O
    biases = 2 * heads * d_k + heads * d_v + d_model
    attention = weights + biases
    ffn = d_model * d_ff + d_ff + d_ff * d_model + d_model
    norm = 2 * d_model
    encoder_layer = attention + ffn + 2 * norm
    decoder_layer = 2 * attention + ffn + 3 * norm
    return vocab * d_model + layers * (encoder_layer + decoder_layer)  # one tied embedding matrix


def test_base_parameter_count_matches_the_paper_formulas():
    spec = xspec.compile("specs/base.xspec")
    assert spec.parameters == paper_parameter_count(37000, 512, 2048, 8, 64, 64, 6) == 63_082_496


def test_big_parameter_count_matches_the_paper_formulas():
    spec = xspec.compile("specs/big.xspec")
    assert spec.params["dropout"] == 0.3
    assert spec.parameters == paper_parameter_count(37000, 1024, 4096, 16, 64, 64, 6)


def test_built_model_has_as_many_parameters_as_reported():
    spec = xspec.compile("specs/tiny.xspec")
    model = spec.build(device="cpu")
    assert sum(p.numel() for p in model.parameters()) == spec.parameters
    state = model.state_dict()
    assert {k: tuple(v.shape) for k, v in state.items()} == spec.param_shapes
    assert "encoder.layers.1.self_attn.q_proj.weight" in state
    assert model.decoder.generator.weight is model.encoder.embedding.embed.weight


def test_overrides_propagate_to_derived_parameters():
    spec = xspec.compile("specs/base.xspec", overrides={"heads": 16, "train.warmup_steps": 8000})
    assert (spec.params["heads"], spec.params["d_k"], spec.params["d_v"]) == (16, 32, 32)
    assert spec.train.warmup_steps == 8000
    attention = spec.graph.nodes["encoder.layers.0.self_attn"]["node"].attrs
    assert (attention.heads, attention.d_k) == (16, 32)


def test_graph_nodes_are_typed_records_checked_when_made():
    import dataclasses

    import pydantic

    from xspec.compiler.op_attention import AttentionAttrs

    spec = xspec.compile("specs/base.xspec")
    node = spec.graph.nodes["encoder.layers.0.self_attn"]["node"]
    assert isinstance(node.attrs, AttentionAttrs) and node.shape is not None and node.shape.dims[-1] == 512
    for wrong in ({"id": 3}, {"inputs": {"query": 1}}, {"attrs": {"heads": "eight"}}, {"repeat": [("x", "0", 1)]}):
        with pytest.raises(pydantic.ValidationError):
            dataclasses.replace(node, **wrong)


def test_sections_are_read_from_the_spec():
    spec = xspec.compile("specs/base.xspec")
    assert spec.train.label_smoothing == 0.1
    assert spec.train.adam_betas == (0.9, 0.98) and spec.train.adam_eps == 1e-9
    assert spec.data.vocab_size == spec.vocab_size == 37000
    assert (spec.decode.beam, spec.decode.length_penalty, spec.decode.max_len_b) == (4, 0.6, 50)


@pytest.mark.parametrize("change, check", [
    ('set positions = "learned"', lambda s: "encoder.embedding.positions.weight" in s.param_shapes),
    ("set heads = 16", lambda s: s.graph.nodes["decoder.layers.5.cross_attn"]["node"].attrs.heads == 16),
    ("set norm_first = true", lambda s: "encoder.norm" in s.graph),
    ("set tie_embeddings = false", lambda s: not s.ties),
])
def test_one_line_variant_of_base_compiles(tmp_path: Path, change, check):
    base = Path("specs/base.xspec").resolve()
    variant = tmp_path / "variant.xspec"
    variant.write_text(f'import "{os.path.relpath(base, tmp_path)}"\n'
                       f"model variant extends transformer_base {{ {change} }}\n")
    spec = xspec.compile(str(variant), overrides={"vocab": 1000})
    assert check(spec)


@pytest.mark.parametrize("standalone", [False, True], ids=["importing", "standalone"])
def test_generated_module_runs_on_its_own(tmp_path: Path, standalone: bool):
    """model.py imports the op library from xspec.nn; with --standalone it copies the classes it uses and
    imports torch alone."""
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, "-m", "xspec", "compile", "specs/tiny.xspec", "-o", str(out),
                             *["--standalone"] * standalone], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "total" in result.stdout and "1,053,696" in result.stdout
    source = (out / "model.py").read_text()
    assert ("from xspec" not in source) == standalone and "import xspec" not in source
    assert ("class Attention(nn.Module):" in source) == standalone
    script = ("import torch, model\n"
              "m = model.Model().eval()\n"
              "src = torch.randint(0, 1000, (2, 7)); tgt = torch.randint(0, 1000, (2, 5))\n"
              "print(tuple(m(src, tgt).shape))\n")
    run = subprocess.run([sys.executable, "-c", script], cwd=out, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "(2, 5, 1000)"
    graph = json.loads((out / "graph.json").read_text())
    assert {"input.src", "output.logits", "encoder.layers.0.self_attn"} <= {n["id"] for n in graph["nodes"]}


def test_generated_code_is_one_class_per_block_with_loops():
    source = xspec.compile("specs/base.xspec").python_source
    for name in ("class Sublayer(", "class FeedForward(", "class EncoderLayer(", "class DecoderLayer(",
                 "class Embed(", "class Encoder(", "class Decoder(", "class TransformerBase("):
        assert source.count(name) == 1, name
    assert ("nn.ModuleList(  # base.xspec:57\n"
            "            [EncoderLayer(config) for _ in range(config.layers)])") in source
    assert "for layer in self.layers:" in source
    assert "from xspec.nn import Attention, LearnedPositions, ScaledEmbedding, SinusoidalPositions\n" in source
    # Sizes from the typed config, under the spec's parameter names (nanoGPT's GPTConfig).
    assert "@dataclass\nclass TransformerBaseConfig:\n" in source and "    d_ff: int = 2048\n" in source
    assert "        self.w_1 = nn.Linear(config.d_model, config.d_ff)  # base.xspec:28\n" in source
    # A block that takes a function is a class whose forward calls it (the Annotated Transformer's
    # SublayerConnection); the function is passed as the module it calls, or a lambda: no ModuleDict. Its
    # norm_first is kept as nn.TransformerEncoderLayer keeps it (compiler/flag_choice.py).
    assert ("class Sublayer(nn.Module):  # block sublayer, base.xspec:19\n"
            "    def __init__(self, config):\n"
            "        super().__init__()\n"
            "        self.norm_first = config.norm_first  # base.xspec:20\n"
            "        self.norm = nn.LayerNorm(config.d_model)  # base.xspec:23\n"
            "        self.dropout = nn.Dropout(config.dropout)  # base.xspec:23\n\n"
            "    def forward(self, x, f):\n"
            "        if self.norm_first:  # base.xspec:20\n"
            "            return x + self.dropout(f(self.norm(x)))  # base.xspec:21\n"
            "        return self.norm(x + self.dropout(f(x)))  # base.xspec:23\n") in source
    assert "ModuleDict" not in source
    assert ("    def forward(self, x, mask):\n"
            "        x = self.self_attn_sublayer(x, lambda h: self.self_attn(h, h, h, mask))  # base.xspec:42\n"
            "        return self.ffn_sublayer(x, self.ffn)  # base.xspec:43\n") in source
    # One line per loop step, and a shape comment where a line changes the shape it reads.
    assert ("        x = self.embedding(src)  # [batch, src_len, d_model]  base.xspec:56\n"
            "        for layer in self.layers:  # base.xspec:57\n"
            "            x = layer(x, src_mask)  # base.xspec:57\n"
            "        if self.norm_first:  # base.xspec:58\n"
            "            return self.norm(x)  # base.xspec:59\n"
            "        return x\n") in source
    assert "        return self.generator(x)  # [batch, tgt_len, vocab]  base.xspec:70\n" in source


def test_json_summary_for_scripts(tmp_path: Path):
    result = subprocess.run([sys.executable, "-m", "xspec", "compile", "specs/base.xspec", "--set", "heads=16",
                             "--json", "-o", str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["name"] == "transformer_base"
    assert summary["parameters"] == 63_082_496  # heads change the split, not the count
    assert summary["blocks"]["encoder.layers"] == 6 * 3_152_384
    assert summary["outputs"] == {"memory": "[batch, src_len, 512]", "logits": "[batch, tgt_len, 37000]"}


def test_resolved_source_compiles_to_the_same_model():
    spec = xspec.compile("specs/tiny.xspec", overrides={"heads": 8})
    again = xspec.compile_source(spec.resolved_source, name="run/spec.xspec")
    assert again.params == spec.params and again.param_shapes == spec.param_shapes
    assert again.train == spec.train and again.decode == spec.decode


def test_model_too_large_to_allocate_is_refused(monkeypatch):
    spec = xspec.compile("specs/tiny.xspec")
    monkeypatch.setattr("xspec.compiler.spec._available_host_memory", lambda: 1024)
    refusal = r"needs 4\.\d MiB as float32 \(1,053,696 parameters and its buffers\); only 1\.0 KiB is free on cpu"
    with pytest.raises(xspec.UserError, match=refusal):
        spec.build(device="cpu")


def test_encoder_only_model_from_the_same_blocks():
    text = ('import "base.xspec"\n'
            "model encoder_only extends transformer_base {\n"
            "  set vocab = 100\n  set tie_embeddings = false\n  remove decoder\n}\n")
    spec = xspec.compile_source(text, name="specs/encoder_only.xspec")
    assert spec.has_encoder and "output.logits" not in spec.graph
    model = spec.build(device="cpu").eval()
    assert not hasattr(model, "decode")
    tokens = torch.randint(0, 100, (2, 5))
    assert model(tokens).shape == (2, 5, 512)


def test_inline_repeat_body_is_the_same_model_as_a_layer_block():
    """`repeat N { two statements }` makes a layer class of its own, with the same parameter names."""
    text = ('import "base.xspec"\n'
            "model inline extends transformer_base {\n"
            "  block encoder(src, src_mask) {\n"
            "    x = embed(src) as embedding\n"
            "    repeat layers {\n"
            "      x = sublayer(x, h => attention(h, h, h, src_mask, heads, d_k, d_v) as self_attn)\n"
            "        as self_attn_sublayer\n"
            "      x = sublayer(x, h => feed_forward(h) as ffn) as ffn_sublayer\n"
            "    }\n"
            "    return x\n"
            "  }\n"
            "}\n")
    overrides = {"vocab": 100, "layers": 2}
    inline = xspec.compile_source(text, name="specs/inline.xspec", overrides=overrides)
    base = xspec.compile("specs/base.xspec", overrides=overrides)
    assert "class EncoderLayer(" in inline.python_source
    assert "for layer in self.layers:" in inline.python_source
    assert inline.param_shapes == base.param_shapes
    torch.manual_seed(0)
    reference = base.build(device="cpu").eval()
    model = inline.build(device="cpu").eval()
    model.load_state_dict(reference.state_dict())
    src, tgt = torch.randint(0, 100, (2, 6)), torch.randint(0, 100, (2, 4))
    with torch.no_grad():
        assert_close(model(src, tgt), reference(src, tgt))


def test_generated_class_names_never_clash():
    """a block named like a library class, or like the model, gets a class name of its own."""
    text = ('import "base.xspec"\n'
            "model feed_forward extends transformer_base {\n"
            "  set vocab = 100\n"
            "  block rotary_embedding(h, mask) { return attention(h, h, h, mask, heads, d_k, d_v) as attn }\n"
            "  block encoder_layer(x, mask) {\n"
            "    x = sublayer(x, h => rotary_embedding(h, mask) as self_attn)\n"
            "    return sublayer(x, h => feed_forward(h) as ffn)\n"
            "  }\n"
            "}\n")
    spec = xspec.compile_source(text, name="specs/clash.xspec")
    classes = [line.split("(")[0] for line in spec.python_source.splitlines() if line.startswith("class ")]
    assert len(classes) == len(set(classes))
    assert {"class RotaryEmbedding2", "class FeedForward2", "class FeedForward"} <= set(classes)
    model = spec.build(device="cpu").eval()
    assert model(torch.randint(0, 100, (2, 5)), torch.randint(0, 100, (2, 3))).shape == (2, 3, 100)


@pytest.mark.parametrize("path, name, value, allowed", [
    ("specs/base.xspec", "positions", "rotary", '"sinusoidal" or "learned"'),
    ("specs/modern/modernbert.xspec", "classifier_pooling", "max", '"cls" or "mean"')])
def test_a_parameter_takes_only_the_values_its_spec_lists_and_a_run_keeps_the_list(path, name, value, allowed):
    """Where an `if` chooses by a string (`if positions == "learned" { ... } else { ... }`), any other value would
    silently take the `else`: the parameter lists its values, a --set outside them is refused, and the resolved
    spec a run keeps lists them too."""
    with pytest.raises(xspec.SpecError, match=f'--set {name} is "{value}"; it may be {allowed}'):
        xspec.compile(path, overrides={name: value})
    resolved = xspec.compile(path).resolved_source
    assert f" in [{allowed.replace(' or ', ', ')}]" in resolved
    with pytest.raises(xspec.SpecError, match=f"it may be {allowed}"):
        xspec.compile_source(resolved, name="run/spec.xspec", overrides={name: value})


@pytest.mark.parametrize("betas, message", [
    ([0.9, 1.0], "train.adam_betas: Input should be less than 1"),
    ([-0.5, 0.9], "train.adam_betas: Input should be greater than or equal to 0")])
def test_adams_betas_are_rates_below_one_checked_when_the_spec_compiles(betas, message):
    """torch.optim.Adam refuses them only once training starts (after the vocabulary is trained)."""
    with pytest.raises(xspec.SpecError, match=message):
        xspec.compile("specs/tiny.xspec", overrides={"train.adam_betas": betas})


def test_beam_sampling_without_sampling_is_refused_when_the_spec_compiles():
    with pytest.raises(xspec.SpecError, match="decode: beam_sampling draws the beams' candidates: it needs "
                                              "sample = true"):
        xspec.compile("specs/lm.xspec", overrides={"decode.sample": False, "decode.beam_sampling": True})
    assert xspec.compile("specs/lm.xspec", overrides={"decode.beam_sampling": True}).decode.searched_beams == 4


@pytest.mark.parametrize("path, name, value, message", [
    ("specs/base.xspec", "heads", "(((", '--set heads: "(((" is not a number, as heads is (8)'),
    ("specs/base.xspec", "heads", "eight", '--set heads: "eight" is not a number, as heads is (8)'),
    ("specs/modern/llama.xspec", "tie_word_embeddings", "maybe",
     '--set tie_word_embeddings: "maybe" is not true or false, as tie_word_embeddings is')])
def test_text_that_is_no_expression_is_refused_at_the_command_line_where_the_spec_writes_a_number(
        path, name, value, message):
    """The command line reads such text as a string (`--set positions=learned`); where the parameter is a
    number or a truth value, the error is the command line's, not the spec line that first computes with it."""
    with pytest.raises(xspec.SpecError) as raised:
        xspec.compile(path, overrides={name: value})
    assert str(raised.value).splitlines()[0] == f"<command line>: error: {message} [type]"
    assert xspec.compile("specs/base.xspec", overrides={"positions": "learned"}).params["positions"] == "learned"
