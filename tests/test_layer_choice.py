"""Layers a block makes differently by their index (`if layer_types[i] == "sliding_attention" { ... }`) are one
generated class whose constructor takes the index and chooses its modules by the spec's condition, over the
config: never a class or a constructor call per layer, at any depth; the config edited builds the model the
same `--set` compiles."""

from __future__ import annotations

import dataclasses
import re
import sys

import pytest
import torch

import xspec
from generated_config import module_and_config
from xspec.compiler.python_print import LINE_LIMIT


def test_gemma3_at_62_layers_is_one_layer_class_that_chooses_its_attention():
    spec = xspec.compile("specs/modern/gemma3.xspec", overrides={"layers": 62})
    source = spec.python_source
    assert not [line for line in source.split("\n") if len(line) >= LINE_LIMIT]
    assert re.findall(r"^class (LmLayer\w*)\(", source, re.M) == ["LmLayer"]
    assert "[LmLayer(config, i) for i in range(config.layers)]" in source
    # One attention call, its window chosen; the stack's angles chosen by the layer's kind, as transformers'
    # Gemma 3 layer reads `position_embeddings_local` where its attention slides.
    assert "window=config.sliding_window if config.layer_types[i] == 'sliding_attention' else None)" in source
    assert "        self.layer_type = config.layer_types[i]  # gemma3.xspec:21\n" in source
    # Two arguments chosen by the kind: the call in each branch (transformers' Gemma 3 reads its layer's
    # `position_embeddings_local` and its kind's mask).
    assert ("        if self.layer_type == 'sliding_attention':  # gemma3.xspec:21\n"
            "            h = self.self_attn(  # gemma3.xspec:32\n"
            "                h, h, h, cache=cache, position_embeddings=rope_local, attention_mask=sliding_mask)\n"
            "        else:\n"
            "            h = self.self_attn(  # gemma3.xspec:32\n"
            "                h, h, h, cache=cache, position_embeddings=rope, attention_mask=mask)\n") in source
    model = spec.build("cpu")
    windows = [getattr(layer.self_attn, "window", None) for layer in model.decoder.layers]
    assert windows == [None if (i + 1) % 6 == 0 else 8 for i in range(62)]


@pytest.mark.parametrize("path, compiled_with, edited", [
    ("specs/modern/gemma3.xspec", {"layers": 6}, {"layers": 12}),
    # The schedule is data: more layers than it lists need it longer too.
    ("specs/modern/gpt_oss.xspec", {},
     {"layers": 5, "layer_types": ("full_attention",) * 2 + ("sliding_attention",) * 3}),
    ("specs/modern/qwen3_moe.xspec", {"layers": 4, "decoder_sparse_step": 2},
     {"layers": 6, "sparse_layers": (False, False, True, False, False, True)}),
    ("specs/modern/qwen3.xspec", {"layers": 3, "use_sliding_window": True},
     {"layer_types": ("sliding_attention", "full_attention", "sliding_attention")}),
    # Hybrids: a class per kind of layer, each layer made of its kind by the config's list.
    ("specs/modern/bamba.xspec", {}, {"layers": 5, "layer_types": ("full_attention",) + ("linear_attention",) * 4}),
    ("specs/modern/nemotron_h.xspec", {},
     {"layers": 3, "layers_block_type": ("mlp", "full_attention", "linear_attention")}),
    # Branches no layer takes at the spec's values: written too, from the model built with them taken.
    ("specs/modern/gemma3.xspec", {}, {"layers": 12}),  # two layers, both local: the global one
    ("specs/modern/qwen3.xspec", {}, {"use_sliding_window": True, "max_window_layers": 1}),
    ("specs/modern/qwen3_moe.xspec", {}, {"sparse_layers": (True, False)}),  # every layer sparse: a dense one
    ("specs/modern/glm4_moe.xspec", {}, {"use_qk_norm": True}),
    ("specs/modern/qwen3_next.xspec", {}, {"sparse_layers": (False, True, False, True)}),  # in both kinds
    # A kind no layer is at the spec's values: its modules and its arm of the forward from the forced build.
    ("specs/modern/bamba.xspec", {"layers": 2, "layer_types": ["linear_attention"] * 2},
     {"layers": 3, "layer_types": ("linear_attention", "full_attention", "linear_attention")}),
])
def test_an_edited_config_builds_the_model_the_same_set_compiles(path, compiled_with, edited):
    generated = xspec.compile(path, overrides=compiled_with)
    _, config_class = module_and_config(generated)
    torch.manual_seed(0)
    from_config = generated.model_class()(config_class(**edited))  # derived fields computed anew
    torch.manual_seed(0)
    as_set = {k: list(v) if isinstance(v, tuple) else v for k, v in edited.items()}
    from_set = xspec.compile(path, overrides={**compiled_with, **as_set}).build("cpu")
    # The same classes in the same places (a hybrid's classes are named in the order its kinds first occur).
    assert _in_order([type(m).__name__ for m in from_config.modules()]) == \
        _in_order([type(m).__name__ for m in from_set.modules()])
    assert {k: v.shape for k, v in from_config.state_dict().items()} == \
        {k: v.shape for k, v in from_set.state_dict().items()}
    tokens = torch.randint(4, 100, (2, 9))
    from_set.load_state_dict(from_config.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(from_config.eval()(tokens), from_set.eval()(tokens))


def test_a_hybrids_layers_of_several_kinds_are_one_class_that_keeps_its_kind_at_any_depth():
    """As transformers writes Nemotron-H's block: the kind kept from the config's list, its modules made in the
    constructor's `if`, and the forward branching on it where the kinds compute differently."""
    source = xspec.compile("specs/modern/nemotron_h.xspec", overrides={"layers": 52}).python_source
    assert re.findall(r"^class (LmLayer\w*)\(", source, re.M) == ["LmLayer"]
    assert "[LmLayer(config, i) for i in range(config.layers)]" in source
    assert "        self.layers_block_type = config.layers_block_type[i]  # nemotron_h.xspec:29\n" in source
    forward = source[source.index("    def forward(self, x, mask, cache=None):"):]
    assert forward.startswith(
        "    def forward(self, x, mask, cache=None):\n"
        "        h = self.norm(x)  # nemotron_h.xspec:42\n"
        "        if self.layers_block_type == 'linear_attention':  # nemotron_h.xspec:29\n"
        "            mixer = self.mixer(h, cache=cache)  # nemotron_h.xspec:42\n"
        "        elif self.layers_block_type == 'full_attention':  # nemotron_h.xspec:35\n"
        "            mixer = self.mixer(h, h, h, cache=cache, attention_mask=mask)  # nemotron_h.xspec:42\n"
        "        else:\n"
        "            mixer = self.mixer(h)  # nemotron_h.xspec:42\n"
        "        return x + mixer  # nemotron_h.xspec:42\n")
    assert not [line for line in source.split("\n") if len(line) >= LINE_LIMIT]


def _in_order(names: list[str]) -> list[int]:
    """Each name as the number of names before its first occurrence: the same pattern of classes."""
    first: dict[str, int] = {}
    return [first.setdefault(name, len(first)) for name in names]


def test_layers_that_differ_by_more_than_an_if_on_their_index_keep_classes_of_their_own():
    """A width computed from the index, not chosen by an `if`: no condition says which layer is which."""
    source = xspec.compile_source("""
model m {
  param layers = 2
  block layer(x, i) {
    return linear(x, 8 + i) as proj
  }
  block decoder(tokens) {
    x = embedding(tokens, 10, 8)
    repeat i in layers { x = layer(x, i) }
    return linear(x, 10)
  }
}""", "<spec>").python_source
    assert re.findall(r"^class (Layer\w*)\(", source, re.M) == ["Layer", "Layer2"]
    assert "(config, i)" not in source


SCHEDULED = """import "specs/modern/mistral.xspec"

model scheduled extends mistral {
  set layers = 4
  param layer_types = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]

  block lm_layer(x, i) {
    if layer_types[i] == "sliding_attention" {
      attend = h => attention(h, h, h, heads = heads, kv_heads = kv_heads, d_k = head_dim, d_v = head_dim,
                              causal = true, rotary = true, window = sliding_window) as self_attn
    } else {
      attend = h => attention(h, h, h, heads = heads, kv_heads = kv_heads, d_k = head_dim, d_v = head_dim,
                              causal = true, rotary = true) as self_attn
    }
    x = sublayer(x, attend)
    return sublayer(x, h => feed_forward(h) as ffn)
  }

  block decoder(tokens) {
    x = embedding(tokens, vocab, d_model) as embedding
    repeat i in layers { x = lm_layer(x, i) }
    return linear(rms_norm(x, eps = rms_norm_eps) as norm, vocab, bias = false) as generator
  }
}
"""


def windows(model: torch.nn.Module) -> list:
    return [getattr(layer.self_attn, "window", None) for layer in model.decoder.layers]


def test_a_list_parameter_is_a_per_layer_schedule_the_config_holds():
    spec = xspec.compile_source(SCHEDULED, "scheduled.xspec")
    source = spec.python_source
    assert ("    layer_types: tuple[str, ...] = (\n"
            "        'sliding_attention', 'full_attention', 'sliding_attention', 'full_attention')\n") in source
    # One constructor call: the window None in the full layers, as transformers writes it.
    assert "window=config.sliding_window if config.layer_types[i] == 'sliding_attention' else None)" in source
    assert "        if config.layer_types[i]" not in source
    assert windows(spec.build("cpu")) == [8, None, 8, None]
    # --set takes a list; the config edited to the same list builds the same model.
    schedule = ("full_attention", "full_attention", "sliding_attention")
    overrides = {"layers": 3, "layer_types": list(schedule)}
    from_set = xspec.compile_source(SCHEDULED, "scheduled.xspec", overrides=overrides).build("cpu")
    module = sys.modules[spec.model_class().__module__]
    config = dataclasses.replace(module.ScheduledConfig(), layers=3, layer_types=schedule)
    assert windows(from_set) == windows(spec.model_class()(config)) == [None, None, 8]


UNCHECKED_BRANCH = """
model m {
  param layers = 2
  param wide = false
  block layer(x, i) {
    if wide and i > 0 { h = linear(x, 6, bias = false) as proj } else { h = linear(x, 6) as proj }
    return linear(h, 6) as out
  }
  block decoder(tokens) {
    x = embedding(tokens, 10, 6)
    repeat i in layers { x = layer(x, i) }
    return linear(x, 10)
  }
}"""


def test_a_branch_no_layer_takes_is_refused_by_name_where_the_model_taking_it_does_not_check():
    """A branch whose shapes do not check at the spec's values (an attention of 4 heads over 6 features)
    cannot be written: a config that takes it is refused by name. One that checks is written."""
    spec = UNCHECKED_BRANCH.replace("linear(x, 6, bias = false)", "attention(x, x, x, heads = 4)")
    generated = xspec.compile_source(spec, "unchecked.xspec")
    _, config_class = module_and_config(generated)
    with pytest.raises(ValueError, match="^layer 1 takes a branch this file was generated without: "
                                         r"compile the spec with these values \(xspec compile --set\)$"):
        generated.model_class()(dataclasses.replace(config_class(), wide=True))
    assert generated.model_class()(config_class()) is not None
    source = xspec.compile_source(UNCHECKED_BRANCH, "checked.xspec").python_source
    assert "generated without" not in source and "if config.wide and i > 0:" in source


@pytest.mark.parametrize("name, kinds, mixers", [
    ("qwen3_next", "layer_types", {"full_attention": "self_attn", "linear_attention": "linear_attn"}),
    ("bamba", "layer_types", {"full_attention": "self_attn", "linear_attention": "mamba"})])
def test_a_hybrids_layer_keeps_its_kind_and_makes_that_kinds_modules_alone(name, kinds, mixers):
    """transformers' names: one `LmLayer` class, never one per kind (`AttentionLmLayer`, ...), each layer
    holding the mixer of its kind only."""
    spec = xspec.compile(f"specs/modern/{name}.xspec")
    defined = set(re.findall(r"^class (\w+)\(nn\.Module\)", spec.python_source, re.MULTILINE))
    assert {cls for cls in defined if cls.endswith("Layer")} == {"LmLayer"}
    model = spec.build("cpu")
    for kind, layer in zip(getattr(model.config, kinds), model.decoder.layers):
        assert layer.layer_type == kind
        assert {child for child in mixers.values() if hasattr(layer, child)} == {mixers[kind]}


@pytest.mark.parametrize("name", ["deepseek_v3", "glm4_moe"])
def test_the_prediction_layer_is_the_decoders_layer_class_at_its_index(name):
    """DeepSeek-V3's multi-token prediction runs `lm_layer(x, layers)`: the decoder's one class of layer,
    built with that index, not a copy of it fixed to the branch the index takes."""
    spec = xspec.compile(f"specs/modern/{name}.xspec", overrides={"mtp_depth": 2})
    source = spec.python_source
    assert "self.layer = LmLayer(config, config.layers)" in source
    assert "LmLayer2" not in source
    model = spec.build("cpu")
    assert type(model.mtp[1].layer) is type(model.decoder.layers[-1])
    # the index past the last layer takes the sparse branch, as the spec's condition says
    assert type(model.mtp[0].layer.mlp).__name__ == "SparseFeedForward"


def test_the_untaken_branches_of_many_stacks_come_from_one_build():
    """Each forced build is a whole model's, and lowering makes few (compiler/lower.py MAX_FORCED_BUILDS):
    thirty stacks, each of its own block with a branch no layer takes, are served by the one model that
    takes them all, so every branch is written and none refused."""
    blocks = "\n".join(f"""  block layer{k}(x, i) {{
    if wide and i > 100 {{ h = linear(x, 16, bias = false) as proj }} else {{ h = linear(x, 16) as proj }}
    return x + h
  }}""" for k in range(30))
    calls = "\n".join(f"    repeat i in layers {{ x = layer{k}(x, i) }}" for k in range(30))
    source = xspec.compile_source(f"""model m {{
  param layers = 2
  param wide = false
{blocks}
  block decoder(tokens) {{
    x = embedding(tokens, 50, 16)
{calls}
    return linear(x, 50)
  }}
}}""", "stacks.xspec").python_source
    assert "generated without" not in source and source.count("if config.wide and i > 100:") == 30


PARITY_HYBRID = """import "specs/modern/qwen3_next.xspec"

model parity extends qwen3_next {
  block lm_layer(x, rope, mask, i) {
    if i % 2 == 0 {
      mix = h => gated_delta_net(h, k_heads = linear_num_key_heads, v_heads = linear_num_value_heads,
                                 d_k = linear_key_head_dim, d_v = linear_value_head_dim,
                                 conv_kernel = linear_conv_kernel_dim, norm_eps = rms_norm_eps) as linear_attn
    } else {
      mix = h => attention(h, h, h, heads = heads, kv_heads = kv_heads, d_k = head_dim, d_v = head_dim,
                           causal = true, position_embeddings = rope) as self_attn
    }
    x = x + mix(rms_norm(x, eps = rms_norm_eps) as input_layernorm)
    return x + feed_forward(rms_norm(x, eps = rms_norm_eps) as post_attention_layernorm) as mlp
  }
}
"""


def test_a_kind_chosen_by_a_condition_on_the_index_is_kept_as_its_truth():
    """Where no config list says the kind, the layer keeps the condition's truth, named after what its branch
    calls, and the forward branches on it; an edited depth builds what `--set` builds."""
    spec = xspec.compile_source(PARITY_HYBRID, "parity.xspec")
    source = spec.python_source
    assert "        self.is_gated_delta_net = i % 2 == 0  # parity.xspec:5\n" in source
    assert "        if self.is_gated_delta_net:  # parity.xspec:5\n" in source
    _, config_class = module_and_config(spec)
    torch.manual_seed(0)
    from_config = spec.model_class()(config_class(layers=5))
    from_set = xspec.compile_source(PARITY_HYBRID, "parity.xspec", overrides={"layers": 5}).build("cpu")
    mixers = [type(layer.linear_attn if i % 2 == 0 else layer.self_attn).__name__
              for i, layer in enumerate(from_config.decoder.layers)]
    assert mixers == ["GatedDeltaNet", "Attention"] * 2 + ["GatedDeltaNet"]
    from_set.load_state_dict(from_config.state_dict())
    tokens = torch.randint(4, 100, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(from_config.eval()(tokens), from_set.eval()(tokens))


def test_layers_whose_held_modules_differ_by_branch_compile_to_classes_of_their_own():
    """A parameter-free module the forward holds (a dropout of another rate in each branch) is no child the
    spec's `if` can be found from: the layers keep a class each, as before, rather than failing."""
    source = xspec.compile_source("""
model m {
  param layers = 3
  param layer_types = ["a", "b", "a"]
  block layer(x, i) {
    if layer_types[i] == "a" { h = dropout(linear(x, 8) as proj, 0.1) }
    else { h = dropout(linear(x, 8) as proj, 0.2) }
    return x + h
  }
  block decoder(tokens) {
    x = embedding(tokens, 10, 8)
    repeat i in layers { x = layer(x, i) }
    return linear(x, 10)
  }
}""", "held.xspec").python_source
    assert re.findall(r"^class (Layer\w*)\(", source, re.M) == ["Layer", "Layer2"]
