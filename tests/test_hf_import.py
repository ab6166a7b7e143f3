"""`xspec import` of every family's Hugging Face checkpoint (tests/hf_checkpoints.py: small random models
that transformers builds and saves): the imported run directory's model gives the checkpoint's logits and
its greedy generation with the cache gives `generate`'s tokens; what import writes, and what it says."""

from __future__ import annotations

import json

import pytest
import torch

import xspec
from float32 import assert_close
from hf_checkpoints import BOS, imported, rope, saved, saved_model
from hf_families import FAMILIES
from xspec.runtime.cache import DecoderCache

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")
NAMES = [family.name for family in FAMILIES]
# Llama 3.2's small models tie the output projection to the embedding (no lm_head.weight is saved).
# Llama's other rotary scalings: linear, and YaRN (positions past its 8 original ones). Layer kinds of a
# checkpoint's own (layer_types), in no family's default pattern.
CASES = [(name, "", {}) for name in NAMES] + [("llama3", "-tied", {"tie_word_embeddings": True}),
                                              ("llama3", "-linear", rope("linear")), ("llama3", "-yarn", rope("yarn"))]
CASES += [(name, "-layer-types", {"layer_types": kinds}) for name, kinds in (
    ("gemma3", ["full_attention", "sliding_attention", "full_attention"]),
    ("gemma2", ["full_attention", "full_attention", "sliding_attention"]),
    ("gpt_oss", ["full_attention", "sliding_attention", "sliding_attention"]))]
CASES += [("qwen3_moe", "-dense-first", {"decoder_sparse_step": 1, "mlp_only_layers": [0]})]  # experts after layer 0
CASES += [("bamba", "-schedule", {"attn_layer_indices": [0, 2]})]  # attention where the spec's default has none
CASES += [("nemotron_h", "-schedule", {"layers_block_type": ["full_attention", "linear_attention", "mlp",
                                                              "linear_attention", "linear_attention"]})]
CASES += [("qwen3_next", "-schedule", {"layer_types": ["full_attention", "linear_attention", "linear_attention",
                                                       "full_attention"], "mlp_only_layers": [1]})]
# DeepSeek: queries straight from the input with rotary features in halves; YaRN past its 8 original positions,
# its mscale and mscale_all_dim changing the cos and sin and the scores' scale.
CASES += [("deepseek_v3", "-direct-queries", {"q_lora_rank": None, "rope_interleave": False}),
          ("deepseek_v3", "-yarn", {"max_position_embeddings": 64, "rope_parameters": {
              "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 8,
              "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 0.9, "mscale_all_dim": 1.1}}),
          ("deepseek_v2", "-yarn", {"max_position_embeddings": 64, "rope_parameters": {
              "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 8,
              "mscale": 0.707, "mscale_all_dim": 0.707}})]
IDS = [name + variant for name, variant, _ in CASES]


def tokens(vocab: int, length: int, seed: int = 5) -> torch.Tensor:
    return torch.randint(0, vocab, (2, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name, variant, changes", CASES, ids=IDS)
def test_an_import_gives_the_checkpoints_logits_and_greedy_tokens_and_fine_tunes(name, variant, changes):
    run = imported(name, variant, **changes)
    reference = saved_model(name, variant, **changes)
    trained = xspec.load(run, device="cpu")
    model, vocab = trained.model, reference.config.vocab_size
    with torch.no_grad():
        text = tokens(vocab, 20)                     # past every window of the families' first sizes
        assert_close(model(text), reference(text).logits)

        prompt, new = tokens(vocab, 5, seed=6), 12
        expected = reference.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                                      eos_token_id=None)
        cache, sequence = DecoderCache(), prompt
        logits = model.decode(prompt, cache=cache)
        for _ in range(new):
            token = logits[:, -1].argmax(dim=-1, keepdim=True)
            sequence = torch.cat([sequence, token], dim=1)
            logits = model.decode(token, cache=cache)
        assert torch.equal(sequence, expected)
    losses = fine_tuning_losses(trained)
    assert losses[-1] < losses[0]


def fine_tuning_losses(trained) -> list[float]:
    """Four training steps (runtime/step.py) from the import on documents its own tokenizer encodes."""
    from xspec.runtime.documents import document_sequence
    from xspec.runtime.step import TrainingStep

    lines = ["w3 w9 w4 w12 w30 w7 w8 w9 w10", "w5 w6 w7 w21 w22 w8 w9 w3 w4 w3"]
    rows = [document_sequence(ids, trained.tokenizer)[:10] for ids in trained.tokenizer.encode(lines)]
    assert rows[0][0] == BOS and rows[1][1:4] == [5, 6, 7]
    batch = torch.tensor(rows)
    step = TrainingStep(trained.model.train(), label_smoothing=0.0,
                        aux_loss_coef=trained.spec.train.router_aux_loss_coef)
    optimizer = torch.optim.Adam(step.parameters(), lr=3e-3)
    losses = []
    for _ in range(4):
        loss = step(batch[:, 1:], batch[:, :-1])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def test_the_imported_spec_names_each_values_config_key_and_extends_the_family():
    run = imported("qwen2")
    text = (run / "model.xspec").read_text()
    assert 'import "specs/modern/qwen2.xspec"' in text and "extends qwen2 {" in text
    assert "set d_model = 64" in text and "# hidden_size" in text.split("set d_model = 64")[1].splitlines()[0]
    assert "set max_window_layers = 1" in text and "set use_sliding_window = true" in text
    spec = xspec.compile(run)                      # a run directory compiles as its model.xspec
    assert spec.params["sliding_window"] == 6 and spec.parameters == sum(
        p.numel() for p in saved_model("qwen2").parameters())
    record = json.loads((run / "import.json").read_text())
    assert record["model_type"] == "qwen2" and record["verification"]["verified"] is True
    assert record["verification"]["max_abs_logit_difference"] < 1e-4
    assert record["not_architectural"]["use_cache"].startswith("whether generation keeps")


def test_import_prints_its_verification_and_generate_continues_a_prompt(tmp_path, capsys):
    from xspec.cli import main

    out = tmp_path / "run"
    assert main(["import", str(saved("mistral")), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "verified against transformers' MistralForCausalLM: max |Δlogit|" in printed and "KL" in printed
    assert "positions (2 x 16)" in printed           # past the window of 6
    assert main(["show", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "  set         sliding_window = 6   (config.json sliding_window)\n" in shown
    assert "  unchanged   use_cache: whether generation keeps a key/value cache" in shown
    assert "  verified    max |Δlogit| " in shown and "; no chat template" in shown
    assert main(["generate", str(out), "--prompt", "w5 w6 w7", "--max-new-tokens", "4", "--beam", "1"]) == 0
    words = capsys.readouterr().out.split()
    assert 1 <= len(words) <= 4 and all(w.startswith("w") for w in words)
    assert main(["generate", str(out), "--prompt", "w5 w6 w7", "--max-new-tokens", "4", "--beam", "3"]) == 0
    words = capsys.readouterr().out.split()
    assert 1 <= len(words) <= 4 and all(w.startswith("w") for w in words)
    assert main(["import", str(saved("mistral")), "-o", str(out)]) == 1
    assert "already exists; pass --force" in capsys.readouterr().err
    assert main(["import", str(saved("mistral")), "-o", str(out), "--force", "--no-verify"]) == 0
    assert "not verified (--no-verify)" in capsys.readouterr().out


def test_without_transformers_the_import_says_it_is_not_verified(tmp_path, monkeypatch):
    from xspec.hf import verify
    from xspec.hf.importer import import_checkpoint

    monkeypatch.setattr(verify, "transformers_available", lambda: False)
    said = []
    import_checkpoint(saved("olmo2"), tmp_path / "run", say=said.append)
    assert said == ["not verified: transformers is not installed (pip install 'xspec[hf]' to compare the import's "
                    "logits with the checkpoint's own class)"]
    assert json.loads((tmp_path / "run" / "import.json").read_text())["verification"]["verified"] is False


def test_verification_reaches_past_the_window_and_the_original_positions():
    from xspec.hf.families import map_config
    from xspec.hf.verify import check_length

    config = json.loads((saved("gpt_oss") / "config.json").read_text())
    mapped = map_config(config)
    assert (mapped.window, mapped.scaled_from) == (6, 8) and check_length(mapped) == 16
    config["rope_parameters"]["original_max_position_embeddings"] = 40
    config["original_max_position_embeddings"] = 40
    assert check_length(map_config(config)) == 44


def test_docs_name_every_config_attribute_each_family_saves():
    """docs/import.md lists, for every family, each attribute of the config.json transformers writes."""
    from xspec.hf.config_reader import NOT_ARCHITECTURAL

    docs = open("docs/import.md", encoding="utf-8").read()
    for name in NAMES:
        config = json.loads((saved(name) / "config.json").read_text())
        keys = set(config) | {f"rope_parameters.{k}" for k in config.get("rope_parameters") or {}
                              if k not in ("full_attention", "sliding_attention")}
        undocumented = sorted(k for k in keys if f"`{k.split('.')[-1]}`" not in docs and f"`{k}`" not in docs)
        assert not undocumented, (name, undocumented)
    assert all(f"`{key}`" in docs for key in NOT_ARCHITECTURAL)


def test_every_command_takes_an_import(tmp_path, capsys):
    """viz (and --diff against another import), stats, compile, eval --text, and export (torch.export, with
    the import's own tokenizer and its ids in the manifest)."""
    from xspec.cli import main

    olmo, llama = imported("olmo2"), imported("llama3")
    assert main(["viz", str(olmo), "--diff", str(llama), "-o", str(tmp_path / "diff.dot")]) == 0
    drawn = (tmp_path / "diff.dot").read_text()
    assert "checkpoint" in drawn and "changed" in drawn
    assert main(["stats", str(olmo)]) == 0 and "checkpoint (" in capsys.readouterr().out
    (tmp_path / "text.txt").write_text("w3 w4 w5\nw6 w7\n")
    assert main(["eval", str(olmo), "--text", str(tmp_path / "text.txt")]) == 0
    assert "perplexity" in (out := capsys.readouterr().out) and "(2 lines, 7 tokens)" in out   # each line and its EOS
    assert main(["export", str(olmo), "-o", str(tmp_path / "exported")]) == 0
    manifest = json.loads((tmp_path / "exported" / "export.json").read_text())
    assert (manifest["tokenizer"], manifest["special_tokens"], manifest["start_token"]) == (
        "tokenizer.json", {"bos": 1, "eos": 2}, 1)


def test_a_model_too_large_for_memory_is_verified_on_its_first_layers_and_says_so(tmp_path, monkeypatch):
    from xspec.hf import verify
    from xspec.hf.importer import import_checkpoint

    whole = xspec.compile(imported("qwen3"))._compilation.validated.bytes_needed   # 3 layers
    monkeypatch.setattr(verify, "available_memory", lambda device: int(whole * 0.9 / 0.8))
    said = []
    import_checkpoint(saved("qwen3"), tmp_path / "run", say=said.append)
    assert said[0].startswith("verified against transformers' Qwen3ForCausalLM: max |Δlogit| ")
    assert said[0].endswith(", on the first 2 of 3 layers on both sides (the whole model does not fit in memory "
                            "as float32)")
    assert json.loads((tmp_path / "run" / "import.json").read_text())["verification"]["layers"] == 2
    monkeypatch.setattr(verify, "available_memory", lambda device: 1000)
    with pytest.raises(xspec.UserError, match="not even one layer of the model fits in memory"):
        import_checkpoint(saved("qwen3"), tmp_path / "run2", say=said.append)
