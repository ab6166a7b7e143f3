"""`xspec export RUN --format hf`: every family's import exported back loads with transformers'
from_pretrained and gives the original checkpoint's logits; a spec that computes what no family does is
refused, naming where it differs."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch

import xspec
from float32 import assert_close
from hf_checkpoints import imported, rope, saved, saved_model
from hf_families import FAMILIES
from xspec.base.errors import UserError
from xspec.base.output_dir import WRITTEN

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")
CASES = [(f.name, "", {}) for f in FAMILIES] + [("llama3", "-tied", {"tie_word_embeddings": True}),
                                                ("llama3", "-yarn", rope("yarn"))]


@pytest.mark.parametrize("name, variant, changes", CASES, ids=[n + v for n, v, _ in CASES])
@torch.no_grad()
def test_an_import_exported_back_loads_with_from_pretrained_and_gives_the_same_logits(tmp_path, name, variant, changes):
    from xspec.cli import main

    out = tmp_path / "exported"
    assert main(["export", str(imported(name, variant, **changes)), "--format", "hf", "-o", str(out)]) == 0
    original = saved_model(name, variant, **changes)
    exported = getattr(transformers, type(original).__name__).from_pretrained(
        out, dtype=torch.float32, attn_implementation="eager").eval()
    text = torch.randint(0, original.config.vocab_size, (2, 20), generator=torch.Generator().manual_seed(9))
    assert_close(exported(text).logits, original(text).logits)
    assert sorted(p.name for p in out.iterdir()) == [WRITTEN, "config.json", "generation_config.json",
                                                     "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    source = json.loads((saved(name, variant, **changes) / "config.json").read_text())
    written = json.loads((out / "config.json").read_text())
    assert set(source) <= set(written), sorted(set(source) - set(written))         # every key kept
    assert (out / "tokenizer.json").read_bytes() == (saved(name, variant, **changes) / "tokenizer.json").read_bytes()


def test_exporting_onto_the_checkpoint_a_run_came_from_changes_nothing(tmp_path, capsys):
    from xspec.cli import main

    checkpoint = tmp_path / "downloaded"
    shutil.copytree(saved("qwen3"), checkpoint)
    (checkpoint / "README.md").write_text("model card")
    before = {p.name: p.read_bytes() for p in checkpoint.iterdir()}
    run = imported("qwen3")
    capsys.readouterr()             # what making the checkpoint and its import printed
    assert main(["export", str(run), "--format", "hf", "-o", str(checkpoint)]) == 1
    assert capsys.readouterr().err == (f"xspec: error: --output {checkpoint}: holds README.md, which no xspec export "
                                       "wrote there; give a new or empty directory (xspec replaces only a directory "
                                       "it wrote, as it left it)\n")
    assert {p.name: p.read_bytes() for p in checkpoint.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["downloaded"]


def test_an_export_is_replaced_by_the_next_but_not_once_a_file_is_added(tmp_path, capsys):
    from xspec.cli import main

    out, run = tmp_path / "exported", str(imported("qwen3"))
    assert main(["export", run, "--format", "hf", "-o", str(out)]) == 0
    assert main(["export", run, "--format", "hf", "-o", str(out)]) == 0
    (out / "README.md").write_text("a model card")
    assert main(["export", run, "--format", "hf", "-o", str(out)]) == 1
    assert "holds README.md, which no xspec export wrote there" in capsys.readouterr().err
    assert (out / "README.md").read_text() == "a model card" and (out / "config.json").is_file()


def test_shards_are_consecutive_runs_within_the_size_a_larger_tensor_alone():
    from xspec.hf.export import shards

    assert shards([10, 10, 50, 5, 5], 20) == [range(0, 2), range(2, 3), range(3, 5)]
    assert shards([30], 20) == [range(0, 1)] and shards([], 20) == []


@torch.no_grad()
def test_a_model_larger_than_the_shard_size_is_written_in_shards_with_an_index(tmp_path):
    """As save_pretrained writes a large model: model-0000i-of-0000n.safetensors and an index naming each
    tensor's file; from_pretrained loads it, and it imports back."""
    import json
    import math

    from xspec.cli import main
    from xspec.hf.safetensors_file import SafetensorsFile

    out = tmp_path / "exported"
    assert main(["export", str(imported("qwen3")), "--format", "hf", "-o", str(out), "--max-shard-size", "40KB"]) == 0
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(p.name for p in out.glob("model-*.safetensors"))
    assert len(files) > 1 and files[-1].endswith(f"-of-{len(files):05d}.safetensors")
    assert sorted(set(index["weight_map"].values())) == files and not (out / "model.safetensors").exists()
    for name in files:                   # at most 40 KB of tensors a file, unless one tensor alone is larger
        shard = SafetensorsFile(out / name)
        sizes = [math.prod(shard.shape(t)) * shard.dtype(t).itemsize for t in shard.names]
        assert sum(sizes) <= 40_000 or len(sizes) == 1
    original = saved_model("qwen3")
    exported = type(original).from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
    text = torch.randint(0, original.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(3))
    assert_close(exported(text).logits, original(text).logits)
    assert main(["import", str(out), "-o", str(tmp_path / "back")]) == 0
    assert main(["export", str(imported("qwen3")), "-o", str(tmp_path / "pt2"), "--max-shard-size", "5GB"]) == 1


def test_an_export_keeps_the_imports_config_keys_tokenizer_files_and_generation_config(tmp_path):
    """What a user of the export reads back as of the original checkpoint: AutoTokenizer's ids, special
    tokens and chat template, GenerationConfig's settings, and every key of config.json at its value
    (max_window_layers, pad_token_id, layer_types, initializer_range, attention_dropout)."""
    from xspec.cli import main
    from xspec.hf.importer import import_checkpoint

    source = tmp_path / "source"
    shutil.copytree(saved("qwen3"), source)
    config = json.loads((source / "config.json").read_text())
    config |= {"max_window_layers": 28, "pad_token_id": 0, "initializer_range": 0.013}
    (source / "config.json").write_text(json.dumps(config))
    template = "{% for m in messages %}<{{ m.role }}> {{ m.content }}\n{% endfor %}"
    (source / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "w1", "eos_token": "w2", "pad_token": "w0",
         "unk_token": "w0", "chat_template": template, "model_max_length": 256}))
    (source / "generation_config.json").write_text(json.dumps(
        {"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "eos_token_id": [2, 9],
         "bos_token_id": 1, "repetition_penalty": 1.1, "suppress_tokens": [7]}))
    import_checkpoint(source, tmp_path / "run", say=lambda _: None)
    out = tmp_path / "exported"
    assert main(["export", str(tmp_path / "run"), "--format", "hf", "-o", str(out)]) == 0
    written = json.loads((out / "config.json").read_text())
    assert {key: written[key] for key in config if key not in ("dtype", "transformers_version")} == \
        {key: value for key, value in config.items() if key not in ("dtype", "transformers_version")}
    theirs, ours = (transformers.AutoTokenizer.from_pretrained(d) for d in (source, out))
    assert ours("w5 w33 w7").input_ids == theirs("w5 w33 w7").input_ids
    assert (ours.bos_token, ours.eos_token, ours.pad_token, ours.unk_token, ours.chat_template) == \
        (theirs.bos_token, theirs.eos_token, theirs.pad_token, theirs.unk_token, template)
    generation = transformers.GenerationConfig.from_pretrained(out)
    assert (generation.do_sample, generation.temperature, generation.top_p, generation.top_k,
            generation.eos_token_id, generation.repetition_penalty, generation.suppress_tokens) == \
        (True, 0.6, 0.95, 20, [2, 9], 1.1, [7])


def test_an_exports_generation_settings_are_the_decode_sections():
    """A run's decode section, edited after the import, is what the exported generation_config.json says."""
    from xspec.compiler.sections import DecodeSection
    from xspec.hf.export import generation_config

    imported_file = {"repetition_penalty": 1.1, "no_repeat_ngram_size": 3, "eos_token_id": 2}
    edited = DecodeSection(beam=1, repetition_penalty=1.3, begin_suppress_tokens=(5,))
    written = generation_config(imported_file, edited, 1, [2])
    assert (written["repetition_penalty"], written["begin_suppress_tokens"], written["num_beams"]) == (1.3, [5], 1)
    assert "no_repeat_ngram_size" not in written and written["eos_token_id"] == 2
    # sampling draws one continuation whatever the beam (4 by default) unless it samples in beams, as generate's
    assert generation_config({"num_beams": 3}, DecodeSection(sample=True), 1, [2])["num_beams"] == 1
    written = generation_config(None, DecodeSection(sample=True, beam=3, beam_sampling=True), 1, [2])
    assert (written["do_sample"], written["num_beams"]) == (True, 3)


def test_a_spec_trained_from_a_familys_spec_maps_to_that_family():
    from xspec.hf.export import match_family

    config = match_family(xspec.compile("specs/modern/qwen2.xspec", overrides={"use_sliding_window": True}),
                          (1, [2])).config
    assert (config["model_type"], config["use_sliding_window"], config["sliding_window"]) == ("qwen2", True, 8)
    config = match_family(xspec.compile("specs/modern/llama3.xspec"), (None, [])).config
    assert config["rope_scaling"] == {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192,
                                      "low_freq_factor": 1.0, "high_freq_factor": 4.0}


@torch.no_grad()
def test_the_papers_model_trained_here_exports_as_marian_with_its_logits_and_greedy_translations(tmp_path):
    """The main job's model (specs/tiny.xspec): the paper's Transformer is Marian's with its sines and cosines
    alternating where Marian has every sine first, so its tensors are written with the model's features in
    Marian's order; its output projection, without a bias, is written with Marian's bias at zero. The
    tokenizer, the logits of a padded batch and greedy translations are xspec's."""
    from xspec.cli import main

    run, out = tmp_path / "run", tmp_path / "hf"
    assert main(["train", "specs/tiny.xspec", "--set", "train.max_steps=3", "--set", "train.batch_tokens=512",
                 "-o", str(run), "--no-tensorboard", "--no-progress", "--no-test"]) == 0
    assert main(["export", str(run), "--format", "hf", "-o", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["activation_function"]) == ("marian", "relu")
    assert config["decoder_start_token_id"] == 2     # xspec's translations start from BOS
    trained = xspec.load(run, device="cpu", weights="fp32")
    marian = transformers.MarianMTModel.from_pretrained(out, dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    lines = ["the cat sat on the mat .", "a dog"]
    encoded = tokenizer(lines, return_tensors="pt", padding=True)
    sources = trained.tokenizer.encode_sources(lines)
    assert [ids[:len(ours)] for ids, ours in zip(encoded["input_ids"].tolist(), sources)] == sources
    target = torch.randint(4, config["vocab_size"], (2, 5), generator=torch.Generator().manual_seed(0))
    padding = encoded["attention_mask"] == 0
    assert_close(marian(**encoded, decoder_input_ids=target).logits,
                 trained.model(encoded["input_ids"], target, padding))
    theirs = marian.generate(**encoded, num_beams=1, max_new_tokens=6)[:, 1:].tolist()
    ours = [line[0].tokens for done in trained.translator(beam=1).stream(lines) for line in done]
    assert [t[:6] for t in ours] == [[token for token in t if token != tokenizer.pad_token_id][:6] for t in theirs]


@pytest.mark.parametrize("spec, overrides, message", [
    ("specs/lm.xspec", {}, "spec 'transformer_lm' maps to none of the Hugging Face families; the closest, gemma2, "
                           "differs at decoder.embedding.positions (sinusoidal_positions: layout=interleaved, "
                           "max_len=1024; shape [tgt_len, 128]), where gemma2 has decoder.rotary_emb "
                           "(rotary_embedding"),
    ("specs/modern/llama.xspec", {"norm_first": True, "mlp_bias": True, "rms_norm_eps": 1e-5},
     None),   # parameters the family writes: maps
    ("specs/modern/alibi.xspec", {}, "maps to none of the Hugging Face families; the closest, gemma2, differs at "
                                     "decoder.embedding.dropout_1 (dropout: p=0.1"),
    ("specs/modern/qwen3_moe.xspec", {"shared_expert_intermediate_size": 8},
     "the closest, qwen3_moe, differs at decoder.layers.0.mlp.shared_expert_gate"),
])
def test_a_spec_that_computes_what_no_family_does_is_refused_naming_where(spec, overrides, message):
    from xspec.hf.export import match_family

    compiled = xspec.compile(spec, overrides=overrides)
    if message is None:
        assert match_family(compiled, (None, [])).config["mlp_bias"] is True
        return
    with pytest.raises(UserError) as error:
        match_family(compiled, (None, []))
    assert message in str(error.value), str(error.value)


@torch.no_grad()
def test_a_spec_naming_its_modules_otherwise_exports_under_transformers_names(tmp_path):
    """A run whose spec computes Mistral but names its modules otherwise (as runs written before the shipped
    specs took transformers' names did) is matched op by op: its tensors are written under the family's
    names, and the export gives the original checkpoint's logits."""
    from xspec.hf.export import export_hf
    from xspec.hf.spec_text import family_spec
    from xspec.runtime.inference import load

    trained = load(imported("mistral"), "cpu", weights="fp32")
    text = family_spec("mistral").read_text()
    for ours, older in (("input_layernorm", "attention_norm"), ("post_attention_layernorm", "ffn_norm"),
                        ("mlp", "ffn"), ("embed_tokens", "embedding"), ("lm_head", "generator")):
        text = text.replace(f"as {ours}", f"as {older}").replace(f"decoder.{ours}.", f"decoder.{older}.")
    older = xspec.compile_source(text, str(family_spec("mistral")),
                                 overrides={k: v for k, v in trained.spec.params.items()
                                            if k in xspec.compile(family_spec("mistral")).params
                                            and not isinstance(v, (str, list))})
    names = dict(zip(trained.model.state_dict(), older.param_shapes))
    assert "decoder.layers.0.ffn_norm.weight" in names.values()
    model = older.build("cpu").eval()
    model.load_state_dict({names[k]: v for k, v in trained.model.state_dict().items()})
    trained.spec, trained.model = older, model
    export_hf(trained, tmp_path)
    original = saved_model("mistral")
    exported = transformers.MistralForCausalLM.from_pretrained(tmp_path, dtype=torch.float32,
                                                             attn_implementation="eager").eval()
    text_ids = torch.randint(0, original.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(3))
    assert_close(exported(text_ids).logits, original(text_ids).logits)


@torch.no_grad()
@pytest.mark.parametrize("name, hf_class", [("mixtral", "MixtralForCausalLM"), ("gpt_oss", "GptOssForCausalLM")])
def test_a_run_with_the_one_op_mixture_of_experts_exports_as_its_family(tmp_path, name, hf_class):
    """Runs written before the families' specs wrote a router and an experts op hold the one `moe` op
    (`mlp.moe.router.weight`, `mlp.moe.gate`, `up`, `down`): compared as those two ops, their experts'
    tensors packed as the family's, they export to the original checkpoint's logits."""
    from xspec.hf.export import export_hf
    from xspec.hf.spec_text import family_spec
    from xspec.runtime.inference import load

    trained = load(imported(name), "cpu", weights="fp32")
    text = family_spec(name).read_text()
    two_ops = re.search(r"    routing = router\(.*?\) as (?:gate|router)\n"
                        r"    return experts\((.*?)\) as experts\n", text, re.S)
    assert two_ops is not None
    router = re.search(r"router\(x, (.*?)\) as", two_ops[0], re.S)[1].replace("bias = true", "router_bias = true")
    bank = two_ops[1].removeprefix("x, routing, ").replace("top_k = num_experts_per_tok, ", "")
    text = text.replace(two_ops[0], f"    return moe(x, {router}, {bank}) as moe\n")
    older = xspec.compile_source(text, str(family_spec(name)),
                                 overrides={k: v for k, v in trained.spec.params.items()
                                            if k in xspec.compile(family_spec(name)).params
                                            and not isinstance(v, (str, list))})
    assert "decoder.layers.0.mlp.moe.gate" in older.param_shapes
    model = older.build("cpu").eval()
    state = {}
    for key, value in trained.model.state_dict().items():   # the two ops' tensors in the one op's layout
        base = key.rsplit(".mlp.", 1)[0] + ".mlp.moe." if ".mlp." in key else ""
        if key.endswith(("mlp.gate.weight", "mlp.router.weight", "mlp.router.bias")):
            state[base + "router." + key.rsplit(".", 1)[1]] = value
        elif key.endswith("experts.gate_up_proj"):
            state[base + "gate"], state[base + "up"] = value.chunk(2, dim=1)
        elif key.endswith("experts.gate_up_proj_bias"):
            state[base + "gate_bias"], state[base + "up_bias"] = value.chunk(2, dim=1)
        elif key.endswith(("experts.down_proj", "experts.down_proj_bias")):
            state[base + key.rsplit(".", 1)[1].replace("_proj", "")] = value
        else:
            state[key] = value
    model.load_state_dict(state)
    trained.spec, trained.model = older, model
    export_hf(trained, tmp_path)
    original = saved_model(name)
    exported = getattr(transformers, hf_class).from_pretrained(tmp_path, dtype=torch.float32,
                                                              attn_implementation="eager").eval()
    text_ids = torch.randint(0, original.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(3))
    assert_close(exported(text_ids).logits, original(text_ids).logits)
