"""LoRA (train.lora_rank): adapters train beside frozen weights, start as the base model, are saved alone
with a reference to their base, and merge into it for decoding, averaging and export; the merged export's
logits, read by transformers, are the adapted model's."""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import replace

import pytest
import torch

import xspec
from float32 import assert_close
from hf_checkpoints import imported
from xspec.base.errors import UserError
from xspec.runtime import checkpoint as ckpt
from xspec.runtime.inference import compile_checkpoint_spec
from xspec.runtime.precision import Precision
from xspec.runtime.lora import (LoRALinear, apply_lora, as_trained, is_adapter, lora_targets, merged_weight,
                                store_frozen_base, trainable_share)

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")

TRAIN = ["--no-test", "--no-tensorboard", "--no-progress", "--set", "train.batch_tokens=256"]


def text_files(directory, lines: int = 60) -> list[str]:
    for split, seed in (("train", 2), ("valid", 3)):
        draw = random.Random(seed)
        words = [" ".join(f"w{draw.randint(3, 40)}" for _ in range(draw.randint(3, 10))) for _ in range(lines)]
        (directory / f"{split}.txt").write_text("\n".join(words) + "\n")
    return ["--train", str(directory / "train.txt"), "--valid", str(directory / "valid.txt")]


def adapted_model(run):
    """The LoRA run's model as it trained: its base's weights, frozen (kept as train.lora_base says), and its
    adapters beside them."""
    saved = ckpt.load_weights(ckpt.resolve(run))
    spec = compile_checkpoint_spec(saved)
    model = spec.build(device="cpu")
    cfg = spec.train
    apply_lora(model, spec, cfg.lora_rank, cfg.lora_alpha, 0.0, cfg.lora_targets)
    ckpt.load_into(model, replace(saved, tensors={**ckpt.load_base(saved).tensors, **saved.tensors}))
    if cfg.lora_base != "float32":
        store_frozen_base(model, cfg.lora_base)
    return model.eval()


def test_adapters_start_as_the_base_model_and_only_they_train():
    spec = xspec.compile("specs/modern/qwen3.xspec")
    torch.manual_seed(0)
    model = spec.build(device="cpu").eval()
    ids = torch.randint(0, spec.vocab_size, (2, 7))
    with torch.no_grad():
        before = model(ids)
    names = apply_lora(model, spec, rank=4, alpha=8, dropout=0.0, targets=("attention", "linear"))
    assert "decoder.lm_head" not in names and len(names) == 7 * spec.params["layers"]
    with torch.no_grad():
        assert_close(model(ids), before, rel=1e-6)              # B = 0: the base model's forward
    trainable, total = trainable_share(model)
    adapters = sum(m.lora_A.numel() + m.lora_B.numel() for m in model.modules() if isinstance(m, LoRALinear))
    assert trainable == adapters and 0 < trainable < total
    model.train()
    model(ids).logsumexp(-1).sum().backward()
    grads = {name for name, p in model.named_parameters() if p.grad is not None}
    assert grads and all(name.endswith(("lora_A", "lora_B")) for name in grads)
    assert any(name.endswith("lora_B") for name in grads)

    with torch.no_grad():       # a trained adapter, merged as checkpoints merge it: the same function
        for module in model.modules():
            if isinstance(module, LoRALinear):
                module.lora_B.normal_(std=0.05)
        model.eval()
        adapted = model(ids)
        state = {name: tensor for name, tensor in model.state_dict().items() if not is_adapter(name)}
        lora = {name: module for name, module in model.named_modules() if isinstance(module, LoRALinear)}
        assert sorted(lora) == sorted(names)
        for name, module in lora.items():
            state[f"{name}.weight"] = merged_weight(module.weight, module.lora_A, module.lora_B, module.scaling)
        plain = spec.build(device="cpu").eval()
        plain.load_state_dict(state)
        assert not any(isinstance(m, LoRALinear) for m in plain.modules())
        assert_close(plain(ids), adapted)
        assert (adapted - before).abs().max() > 1e-3


def test_the_adapters_gradients_are_the_products_derivatives():
    """LoRALinear's own backward (its products taken in the forms fast on CPUs) against autograd's numbers."""
    torch.manual_seed(2)
    layer = LoRALinear(torch.nn.Linear(5, 3, dtype=torch.float64), rank=2, alpha=6, dropout=0.0)
    with torch.no_grad():
        layer.lora_B.normal_()
    layer.weight.requires_grad_(True)
    x = torch.randn(2, 4, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(layer, (x,))
    expected = x @ layer.weight.t() + layer.bias + 3 * (x @ layer.lora_A.t()) @ layer.lora_B.t()
    torch.testing.assert_close(layer(x), expected)


def test_the_adapters_train_under_bf16_autocast_as_in_float32():
    """Autocast is off in a backward: the adapters' own products keep the forward's dtype there."""
    torch.manual_seed(3)
    layer = LoRALinear(torch.nn.Linear(32, 16), rank=4, alpha=8, dropout=0.0)
    with torch.no_grad():
        layer.lora_B.normal_()
    x = torch.randn(3, 5, 32)
    grads = {}
    for name, dtype in (("fp32", None), ("bf16", torch.bfloat16)):
        with Precision("cpu", dtype).context():
            out = layer(x)
        out.float().square().sum().backward()
        grads[name] = layer.lora_A.grad.clone(), layer.lora_B.grad.clone()
        assert layer.lora_A.grad.dtype == torch.float32          # the parameters' own dtype
        layer.zero_grad()
    for ours, exact in zip(grads["bf16"], grads["fp32"]):
        torch.testing.assert_close(ours, exact, rtol=0.05, atol=0.05 * exact.abs().max().item())


@pytest.mark.parametrize("form", ["bfloat16", "int8"])
def test_a_frozen_weight_kept_smaller_computes_with_its_rounding_and_keeps_no_float_copy(form):
    torch.manual_seed(3)
    linear = torch.nn.Linear(48, 24)
    weight = linear.weight.detach().clone()
    layer = LoRALinear(linear, rank=4, alpha=8, dropout=0.0)
    with torch.no_grad():
        layer.lora_B.normal_()
    layer.store_base(form)
    assert layer.weight.dtype == getattr(torch, form) and "weight" not in layer.state_dict()
    rounded = as_trained(weight, form)
    step = 2 * weight.abs().amax(dim=1, keepdim=True) / 127 if form == "int8" else weight.abs() / 2 ** 7
    assert ((rounded - weight).abs() <= step / 2 + 1e-7).all() and not torch.equal(rounded, weight)

    reference = LoRALinear(torch.nn.Linear(48, 24), rank=4, alpha=8, dropout=0.0)
    reference.load_state_dict({**layer.state_dict(), "weight": rounded})
    x = torch.randn(3, 5, 48)
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = layer(x.requires_grad_())
    assert not [t for t in saved if t.shape == weight.shape and t.data_ptr() != layer.weight.data_ptr()], \
        "a float copy of the frozen weight is kept for the backward"
    x_ref = x.detach().clone().requires_grad_()
    y_ref = reference(x_ref)
    assert_close(y, y_ref, rel=1e-5)
    y.square().sum().backward()
    y_ref.square().sum().backward()
    assert_close(x.grad, x_ref.grad, rel=1e-5)
    assert_close(layer.lora_A.grad, reference.lora_A.grad, rel=1e-5)
    assert_close(layer.lora_B.grad, reference.lora_B.grad, rel=1e-5)
    merged = merged_weight(weight, layer.lora_A, layer.lora_B, layer.scaling, form)
    with torch.no_grad():
        assert_close(torch.nn.functional.linear(x, merged, layer.bias), y, rel=1e-5)


def test_a_shared_weight_is_not_kept_smaller():
    spec = xspec.compile("specs/lm.xspec")              # the output head shares the embedding's weight
    model = spec.build(device="cpu")
    apply_lora(model, spec, 2, 4, 0.0, ("generator",))
    with pytest.raises(UserError, match="train.lora_base = \"int8\": decoder.generator.weight is shared with another "
                                        "module; keep it in float32"):
        store_frozen_base(model, "int8")


@pytest.mark.parametrize("targets, expected", [
    (("attention",), {"q_proj", "k_proj", "v_proj", "o_proj"}),
    (("linear",), {"gate_proj", "up_proj", "down_proj"}),
    (("q_proj", "mlp.down_proj"), {"q_proj", "down_proj"}),
])
def test_targets_are_op_kinds_or_ends_of_module_names(targets, expected):
    spec = xspec.compile("specs/modern/qwen3.xspec")
    model = spec.build(device="meta")
    chosen = lora_targets(model, spec, targets)
    assert {name.rsplit(".", 1)[-1] for name in chosen} == expected
    assert len(chosen) == len(expected) * spec.params["layers"]


def test_latent_attention_projections_are_targets_of_their_kind():
    spec = xspec.compile("specs/modern/deepseek_v3.xspec")
    chosen = lora_targets(spec.build(device="meta"), spec, ("latent_attention",))
    assert chosen and all(".self_attn." in name for name in chosen)
    assert {name.split(".self_attn.")[1] for name in chosen} == {"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa",
                                                                 "kv_b_proj", "o_proj"}


def test_a_target_naming_nothing_is_refused_by_name():
    spec = xspec.compile("specs/modern/qwen3.xspec")
    with pytest.raises(UserError, match="train.lora_targets: 'qproj' is neither an op kind nor the end of a linear "
                                        "layer's name in qwen3 .its linear layers: down_proj, gate_proj, k_proj, "
                                        "lm_head"):
        lora_targets(spec.build(device="meta"), spec, ("attention", "qproj"))
    with pytest.raises(UserError, match=r"train.lora_targets \['moe', 'mamba2'\]: no linear layer of qwen3 is among "
                                        "them .its op kinds: add, attention, attention_mask, embedding"):
        apply_lora(spec.build(device="meta"), spec, 4, 8, 0.0, ("moe", "mamba2"))


def test_a_lora_fine_tune_saves_adapters_resumes_and_exports_merged(tmp_path, capsys):
    from xspec.cli import main

    data = text_files(tmp_path)
    base = tmp_path / "base"
    shutil.copytree(imported("qwen3"), base)
    tuned = tmp_path / "tuned"
    assert main(["train", "--init", str(base), *data, "-o", str(tuned), *TRAIN, "--set", "train.lora_rank=4",
                 "--set", "train.lora_alpha=8", "--set", "train.max_steps=2", "--set", "train.epochs=5"]) == 0
    out = capsys.readouterr().out
    assert ", lr 0.0002, " in out                    # LoRA's learning rate in the fine-tuning recipe
    layers = 7 * 3                  # qwen3's test sizes: three layers, seven projections each
    line = next(line for line in out.splitlines() if line.startswith("LoRA: "))
    assert line.startswith(f"LoRA: rank 4, alpha 8, on {layers} linear layers (down_proj, gate_proj, k_proj, o_proj, "
                           "q_proj, up_proj, v_proj); ")
    saved = ckpt.load_weights(ckpt.resolve(tuned))
    trained = sum(t.numel() for t in saved.tensors.values())
    assert f"; {trained:,} of " in line
    assert saved.base is not None and saved.base.scaling == 2.0
    assert saved.base.path == (base / "checkpoints" / "step-00000000.safetensors").resolve()
    assert sorted({name.rsplit(".", 1)[1] for name in saved.tensors}) == ["lora_A", "lora_B"]
    assert len(saved.tensors) == 2 * layers

    # Resumed, it goes on from its adapters and its base.
    assert main(["train", "--resume", str(tuned), *TRAIN, "--set", "train.max_steps=3"]) == 0
    assert "resuming" in capsys.readouterr().out
    resumed = ckpt.load_weights(ckpt.resolve(tuned))
    assert resumed.step == 3 and resumed.base == saved.base

    ids = torch.randint(3, 40, (1, 9), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        adapted = adapted_model(tuned)(ids)
        loaded = xspec.load(tuned, device="cpu", weights="fp32")
        assert_close(loaded.model(ids), adapted)              # decoding reads the adapters merged
        assert (adapted - xspec.load(base, device="cpu", weights="fp32").model(ids)).abs().max() > 0
        exported = tmp_path / "exported"
        assert main(["export", str(tuned), "--format", "hf", "-o", str(exported)]) == 0
        reloaded = transformers.AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32).eval()
        assert_close(reloaded(ids).logits, adapted)
        average = tmp_path / "average.safetensors"
        assert main(["average", str(tuned), "--last", "2", "--output", str(average)]) == 0
        averaged = ckpt.load_weights(average)
        assert averaged.base is None and "decoder.layers.0.self_attn.q_proj.weight" in averaged.tensors

    # A base that changed since, or went away, is refused by name.
    weights = base / "checkpoints" / "step-00000000.safetensors"
    original = ckpt.load_weights(weights)
    changed = {name: tensor + 1 if name.endswith("q_proj.weight") else tensor for name, tensor in
               original.tensors.items()}
    ckpt.save_weights(weights, changed, original.spec_source, original.params, original.vocab_proto, 0,
                      original.tokenizer)
    with pytest.raises(UserError, match="adapt .*step-00000000.safetensors as it was when the run started .metadata "
                                        "xspec.lora_base"):
        xspec.load(tuned, device="cpu")
    weights.unlink()
    assert main(["generate", str(tuned), "--prompt", "w3 w4"]) != 0
    assert "which is gone; put that checkpoint back where it was" in capsys.readouterr().err


def test_lora_needs_weights_to_adapt(tmp_path, capsys):
    from xspec.cli import main

    data = text_files(tmp_path, lines=20)
    assert main(["train", "specs/lm.xspec", *data, "-o", str(tmp_path / "a"), *TRAIN,
                 "--set", "train.lora_rank=4"]) != 0
    assert "train.lora_rank = 4: LoRA adapts trained weights; start from them with --init RUN" in \
        capsys.readouterr().err
    tuned = tmp_path / "tuned"
    assert main(["train", "--init", str(imported("qwen3")), *data, "-o", str(tuned), *TRAIN, "--set",
                 "train.lora_rank=2", "--set", "train.max_steps=1"]) == 0
    capsys.readouterr()
    assert main(["train", "--init", str(tuned), *data, "-o", str(tmp_path / "again"), *TRAIN, "--set",
                 "train.lora_rank=2", "--set", "train.max_steps=1"]) != 0
    assert "holds LoRA adapters, which new adapters cannot adapt; merge them first" in capsys.readouterr().err
    assert main(["train", "--resume", str(tuned), *TRAIN, "--set", "train.lora_rank=0"]) != 0
    assert "the run trained LoRA adapters; resuming it with train.lora_rank = 0 would change that" in \
        capsys.readouterr().err
    assert main(["train", "--resume", str(tuned), *TRAIN, "--set", "train.lora_alpha=4"]) != 0
    assert "its adapters were trained with lora_alpha / lora_rank = 8" in capsys.readouterr().err
    assert main(["train", "--resume", str(tuned), *TRAIN, "--set", "train.lora_base=int8"]) != 0
    assert "its adapters were trained beside weights kept in float32; train.lora_base = \"int8\" would change " \
           "them" in capsys.readouterr().err
    assert main(["train", "--init", str(imported("qwen3")), *data, "-o", str(tmp_path / "b"), *TRAIN, "--set",
                 "train.lora_base=int8"]) != 0
    assert "train.lora_base = \"int8\" keeps the frozen weights of a LoRA run; set train.lora_rank too" in \
        capsys.readouterr().err
    # A full fine-tune may start from the adapted model: its weights merged.
    assert main(["train", "--init", str(tuned), *data, "-o", str(tmp_path / "full"), *TRAIN,
                 "--set", "train.max_steps=1"]) == 0


def test_an_int8_base_trains_and_merges_into_the_model_that_trained(tmp_path, capsys):
    from xspec.cli import main

    data = text_files(tmp_path, lines=30)
    tuned = tmp_path / "tuned"
    assert main(["train", "--init", str(imported("qwen3")), *data, "-o", str(tuned), *TRAIN, "--set",
                 "train.lora_rank=4", "--set", "train.lora_base=int8", "--set", "train.max_steps=2"]) == 0
    out = capsys.readouterr().out
    assert "LoRA: frozen weights of the 21 adapted layers kept in int8: " in out
    saved = ckpt.load_weights(ckpt.resolve(tuned))
    assert saved.base is not None and saved.base.stored == "int8"
    ids = torch.randint(3, 40, (1, 9), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        adapted = adapted_model(tuned)(ids)
        assert_close(xspec.load(tuned, device="cpu", weights="fp32").model(ids), adapted)
        unrounded = replace(saved, base=replace(saved.base, stored="float32"))
        model = compile_checkpoint_spec(saved).build(device="cpu").eval()
        ckpt.load_into(model, ckpt.merged(unrounded))
        assert (model(ids) - adapted).abs().max() > 1e-5          # merging without the rounding is another model


def test_a_lora_checkpoints_base_reference_is_checked(tmp_path):
    saved = tmp_path / "adapters.safetensors"
    for text, problem in (("[]", "expected path, sha256, scaling and stored"),
                          ('{"path": "x", "sha256": "' + "0" * 64 + '", "scaling": 1, "stored": "int4"}',
                           "stored: expected one of float32, bfloat16, int8"),
                          ('{"path": "x", "sha256": "00", "scaling": 1}', "sha256: expected 64 hexadecimal"),
                          ('{"path": "x", "sha256": "' + "0" * 64 + '", "scaling": -1}', "scaling: expected a "
                                                                                          "positive number")):
        ckpt.save_weights(saved, {"a.lora_A": torch.zeros(1, 2)}, "model m {}", {}, b"", 1)
        from safetensors.torch import load_file, save_file

        save_file(load_file(str(saved)), str(saved), metadata={
            ckpt.SPEC_KEY: "model m {}", ckpt.PARAMS_KEY: "{}", ckpt.VOCAB_KEY: "", ckpt.STEP_KEY: "1",
            ckpt.BASE_KEY: text})
        with pytest.raises(UserError, match=f"metadata xspec.lora_base: {problem}"):
            ckpt.load_weights(saved)
    base = tmp_path / "base.safetensors"
    ckpt.save_weights(base, {"a.weight": torch.zeros(3, 2)}, "model m {}", {}, b"", 0)
    ref = ckpt.BaseRef.of(base, 1.0)
    for tensors, problem in (({"a.lora_A": torch.zeros(1, 2)}, "tensor a.lora_B is missing"),
                             ({"a.lora_A": torch.zeros(1, 2), "a.lora_B": torch.zeros(4, 1)},
                              r"adapters of a of shapes \(1, 2\) and \(4, 1\) do not fit its weight of shape \(3, 2\)"),
                             ({"b.lora_A": torch.zeros(1, 2), "b.lora_B": torch.zeros(3, 1)},
                              "adapters of b, which has no weight in"),
                             ({"a.weight": torch.zeros(3, 2)}, "tensor a.weight beside LoRA adapters")):
        ckpt.save_weights(saved, tensors, "model m {}", {}, b"", 1, base=ref)
        with pytest.raises(UserError, match=problem):
            ckpt.load_merged(saved)
    ckpt.save_weights(saved, {"a.lora_A": torch.ones(1, 2), "a.lora_B": torch.full((3, 1), 2.0)}, "model m {}",
                      {}, b"", 1, base=ref)
    assert torch.equal(ckpt.load_merged(saved).tensors["a.weight"], torch.full((3, 2), 2.0))
    assert json.loads(ckpt.load_weights(saved).base.text())["scaling"] == 1.0
