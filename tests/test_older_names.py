"""Checkpoints an older xspec wrote load under today's names: attention's W^O was `out_proj`, latent
attention's parts had names of their own, a router's load correction was `correction_bias`; a Mamba-2
mixer's `out_proj` is its name still."""

from __future__ import annotations

import torch

import xspec
from xspec.runtime.older_names import current_names


def test_attention_and_latent_attention_take_todays_names_and_mamba_keeps_its_own():
    one = torch.zeros(1)
    older = {
        "decoder.layers.0.self_attn.q_proj.weight": one, "decoder.layers.0.self_attn.k_proj.weight": one,
        "decoder.layers.0.self_attn.out_proj.weight": one, "decoder.layers.0.self_attn.out_proj.bias": one,
        "decoder.layers.1.mixer.in_proj.weight": one, "decoder.layers.1.mixer.out_proj.weight": one,
        "decoder.layers.2.self_attn.q_proj.lora_A": one, "decoder.layers.2.self_attn.out_proj.lora_A": one,
        "decoder.layers.3.self_attn.q_proj.down.weight": one, "decoder.layers.3.self_attn.q_proj.norm.weight": one,
        "decoder.layers.3.self_attn.q_proj.up.weight": one, "decoder.layers.3.self_attn.kv_down.weight": one,
        "decoder.layers.3.self_attn.kv_norm.weight": one, "decoder.layers.3.self_attn.kv_up.weight": one,
        "decoder.layers.3.self_attn.out_proj.weight": one, "decoder.layers.4.mlp.moe.router.correction_bias": one,
    }
    assert list(current_names(older)) == [
        "decoder.layers.0.self_attn.q_proj.weight", "decoder.layers.0.self_attn.k_proj.weight",
        "decoder.layers.0.self_attn.o_proj.weight", "decoder.layers.0.self_attn.o_proj.bias",
        "decoder.layers.1.mixer.in_proj.weight", "decoder.layers.1.mixer.out_proj.weight",
        "decoder.layers.2.self_attn.q_proj.lora_A", "decoder.layers.2.self_attn.o_proj.lora_A",
        "decoder.layers.3.self_attn.q_a_proj.weight", "decoder.layers.3.self_attn.q_a_layernorm.weight",
        "decoder.layers.3.self_attn.q_b_proj.weight", "decoder.layers.3.self_attn.kv_a_proj_with_mqa.weight",
        "decoder.layers.3.self_attn.kv_a_layernorm.weight", "decoder.layers.3.self_attn.kv_b_proj.weight",
        "decoder.layers.3.self_attn.o_proj.weight", "decoder.layers.4.mlp.moe.router.e_score_correction_bias",
    ]


@torch.no_grad()
def test_a_checkpoint_written_under_the_older_names_loads_and_computes_the_same(tmp_path):
    """Today's names of a DeepSeek-V3 and a Bamba (attention beside Mamba-2), and a Qwen3-Next's gated
    attention, written back under the older names and layout, as an older checkpoint holds them: read
    back, the model loads them and gives the same logits."""
    from xspec.runtime import checkpoint as ckpt

    for path, sizes in (("specs/modern/deepseek_v3.xspec", {"mtp_depth": 0}), ("specs/modern/bamba.xspec", {}),
                        ("specs/modern/qwen3_next.xspec", {"attention_bias": True})):
        spec = xspec.compile(path, overrides=sizes)
        torch.manual_seed(0)
        model = spec.build("cpu").eval()
        older = {}
        for name, tensor in model.state_dict().items():
            if name.endswith(("self_attn.q_proj.weight", "self_attn.q_proj.bias")) and "qwen3_next" in path:
                # Qwen3-Next's gate apart: each head's rows [queries; gate] split into q_proj and gate_proj
                queries, gate = tensor.unflatten(0, (spec.params["heads"], 2, -1)).unbind(1)
                older[name] = queries.flatten(0, 1)
                older[name.replace("q_proj", "gate_proj")] = gate.flatten(0, 1)
                continue
            for new, old in (("o_proj", "out_proj"), ("kv_a_proj_with_mqa", "kv_down"), ("kv_a_layernorm", "kv_norm"),
                             ("kv_b_proj", "kv_up"), ("q_a_proj", "q_proj.down"), ("q_a_layernorm", "q_proj.norm"),
                             ("q_b_proj", "q_proj.up")):
                name = name.replace(f".{new}.", f".{old}.")
            older[name] = tensor
        assert older.keys() != model.state_dict().keys()
        written = tmp_path / f"{spec.name}.safetensors"
        ckpt.save_weights(written, older, "model m {}", {}, b"", 1)
        fresh = spec.build("cpu").eval()
        ckpt.load_into(fresh, ckpt.load_weights(written))
        tokens = torch.randint(0, spec.params["vocab"], (2, 7), generator=torch.Generator().manual_seed(1))
        assert torch.equal(fresh(tokens), model(tokens))


def test_a_gate_that_does_not_split_into_the_queries_heads_is_left_for_the_models_checks():
    """The sizes are the file's: a head size of 0, or queries and a gate that are not whole heads of it, are
    not repacked (no error here); loading then refuses the names or shapes the model lacks."""
    base = "decoder.layers.0.self_attn"
    for norm, queries, gate in ((torch.zeros(0), torch.zeros(8, 4), torch.zeros(8, 4)),
                                (torch.zeros(3), torch.zeros(8, 4), torch.zeros(8, 4)),
                                (torch.zeros(4), torch.zeros(8, 4), torch.zeros(3, 4)),
                                (torch.zeros(4), torch.zeros(8, 4), torch.zeros(8, 5))):
        read = current_names({f"{base}.q_norm.weight": norm, f"{base}.q_proj.weight": queries,
                              f"{base}.gate_proj.weight": gate})
        assert read[f"{base}.gate_proj.weight"] is gate and read[f"{base}.q_proj.weight"] is queries
    read = current_names({f"{base}.q_norm.weight": torch.zeros(4), f"{base}.q_proj.weight": torch.arange(8.)[:, None],
                          f"{base}.gate_proj.weight": -torch.arange(8.)[:, None]})
    assert read.keys() == {f"{base}.q_norm.weight", f"{base}.q_proj.weight"}
    assert read[f"{base}.q_proj.weight"].flatten().tolist() == [0, 1, 2, 3, 0, -1, -2, -3, 4, 5, 6, 7, -4, -5, -6, -7]
