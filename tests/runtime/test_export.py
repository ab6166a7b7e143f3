"""`xspec export` and runtime/export.py: the exported graphs give the model's logits and greedy tokens at
sizes other than those they were traced with, as torch.export programs and under onnxruntime, for a
translation model and a language model; the vocabulary and manifest travel with them; mistakes are
one clear message. The models are small and untrained (their logits are as good a check as any)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import xspec
from xspec.cli import main
from xspec.base.errors import UserError
from xspec.runtime import checkpoint as ckpt
from xspec.runtime.demo_data import generate_split
from xspec.base.output_dir import WRITTEN, write_directory
from xspec.runtime.export import WRITER, Graph, check_destination, export_model, export_program
from xspec.runtime.vocab import BOS, EOS, MODEL_FILE, PAD, Vocab, train_vocab
from xspec.runtime.cache import DecoderCache

ROOT = Path(__file__).resolve().parents[2]
SMALL = {"d_model": 32, "d_ff": 64, "heads": 2, "layers": 2, "vocab": 120, "max_len": 64}
TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}
STEPS = 6


def _checkpoint(spec_file: str, vocab: Vocab, path: Path) -> Path:
    spec = xspec.compile(str(ROOT / "specs" / spec_file), overrides=SMALL)
    torch.manual_seed(0)
    model = spec.build()
    ckpt.save_weights(path, model.state_dict(), spec.resolved_source, spec.params, vocab.model_proto, step=1)
    return path


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("export")
    vocab = train_vocab([s for pair in generate_split("train", 200) for s in pair], 100, "bpe", directory)
    return {"translation": _checkpoint("tiny.xspec", vocab, directory / "translation.safetensors"),
            "language model": _checkpoint("lm.xspec", vocab, directory / "lm.safetensors")}


@pytest.fixture(scope="module")
def trained(checkpoints) -> dict:
    return {kind: xspec.load(path, device="cpu") for kind, path in checkpoints.items()}


def _export_with_the_command(checkpoint: Path, output: Path, *options: str) -> Path:
    assert main(["export", str(checkpoint), "-o", str(output), "--device", "cpu", *options]) == 0
    return output


@pytest.fixture(scope="module")
def translation_export(checkpoints, tmp_path_factory) -> Path:
    return _export_with_the_command(checkpoints["translation"], tmp_path_factory.mktemp("out") / "translation")


@pytest.fixture(scope="module")
def language_model_export(checkpoints, tmp_path_factory) -> Path:
    return _export_with_the_command(checkpoints["language model"], tmp_path_factory.mktemp("out") / "lm")


# --- references and greedy decoding, with the model and with the graphs --------------------------------

def _sources(batch: int = 3, length: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, S] source tokens with padding in all rows but the first; sizes unlike the export's examples."""
    generator = torch.Generator().manual_seed(1)
    src = torch.randint(EOS + 1, SMALL["vocab"], (batch, length), generator=generator)
    lengths = torch.tensor([length - 2 * i for i in range(batch)])
    padding = torch.arange(length)[None, :] >= lengths[:, None]
    return src.masked_fill(padding, PAD), padding


@torch.no_grad()
def _model_greedy(model, first: torch.Tensor, step) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """STEPS argmax tokens after `first` [B, 1], with the model's own cache; `step(tokens, cache)` -> logits."""
    cache, tokens, chosen, logits = DecoderCache(), first, [], []
    for _ in range(STEPS):
        step_logits = step(tokens, cache)[:, -1]
        tokens = step_logits.argmax(-1, keepdim=True)
        chosen.append(tokens)
        logits.append(step_logits)
    return torch.cat(chosen, dim=1), logits


def _graph_greedy(first: torch.Tensor, cache: list[dict], step) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The same with an exported step: `step(tokens, past_keys, past_values)` -> logits, keys, values."""
    batch = first.size(0)
    past_keys = [torch.zeros(batch, c["heads"], 0, c["key_dim"]) for c in cache]
    past_values = [torch.zeros(batch, c["heads"], 0, c["value_dim"]) for c in cache]
    tokens, chosen, logits = first, [], []
    for _ in range(STEPS):
        step_logits, past_keys, past_values = step(tokens, past_keys, past_values)
        step_logits = torch.as_tensor(step_logits)
        tokens = step_logits.argmax(-1, keepdim=True)
        chosen.append(tokens)
        logits.append(step_logits)
    assert past_keys[0].shape[2] == STEPS
    return torch.cat(chosen, dim=1), logits


def _same_decoding(expected: tuple[torch.Tensor, list], found: tuple[torch.Tensor, list]) -> None:
    assert torch.equal(found[0], expected[0])
    for expected_logits, found_logits in zip(expected[1], found[1]):
        torch.testing.assert_close(found_logits, expected_logits, **TOLERANCE)


def _translation_reference(model, src, padding):
    with torch.no_grad():
        memory = model.encode(src, padding)
    first = torch.full((src.size(0), 1), BOS)
    return memory, first, _model_greedy(model, first, lambda t, cache: model.decode(t, memory, padding, cache=cache))


def _manifest(directory: Path) -> dict:
    return json.loads((directory / "export.json").read_text())


# --- torch.export programs -----------------------------------------------------------------------------

def test_translation_program_gives_the_model_s_memory_logits_and_greedy_tokens(translation_export, trained):
    model = trained["translation"].model
    manifest = _manifest(translation_export)
    encoder = torch.export.load(translation_export / "encoder.pt2").module()
    decoder = torch.export.load(translation_export / "decoder.pt2").module()
    src, padding = _sources()
    memory, first, expected = _translation_reference(model, src, padding)

    found_memory, memory_keys, memory_values = encoder(src, padding)
    torch.testing.assert_close(found_memory, memory, **TOLERANCE)
    assert len(memory_keys) == len(manifest["cache"]["memory_attention"]) == SMALL["layers"]
    found = _graph_greedy(first, manifest["cache"]["self_attention"],
                          lambda t, k, v: decoder(t, padding, memory_keys, memory_values, k, v))
    _same_decoding(expected, found)


def test_language_model_program_reads_a_prompt_token_by_token_and_continues_it(language_model_export, trained):
    model = trained["language model"].model
    manifest = _manifest(language_model_export)
    decoder = torch.export.load(language_model_export / "decoder.pt2").module()
    prompt = torch.tensor([[EOS, 10, 11, 12, 13], [EOS, 20, 21, 22, 23]])
    with torch.no_grad():
        whole = model.decode(prompt)                                   # [B, P, V], no cache
    cache = manifest["cache"]["self_attention"]
    past_keys = [torch.zeros(2, c["heads"], 0, c["key_dim"]) for c in cache]
    past_values = [torch.zeros(2, c["heads"], 0, c["value_dim"]) for c in cache]
    for position in range(prompt.size(1)):
        logits, past_keys, past_values = decoder(prompt[:, position:position + 1], past_keys, past_values)
        torch.testing.assert_close(logits, whole[:, position], **TOLERANCE)

    first = torch.full((3, 1), EOS)
    expected = _model_greedy(model, first, lambda t, c: model.decode(t, cache=c))
    _same_decoding(expected, _graph_greedy(first, cache, decoder))


def test_the_vocabulary_and_the_manifest_travel_with_the_graphs(translation_export, trained):
    manifest = _manifest(translation_export)
    assert sorted(p.name for p in translation_export.iterdir()) == [
        WRITTEN, "decoder.pt2", "encoder.pt2", "export.json", MODEL_FILE]
    assert (translation_export / MODEL_FILE).read_bytes() == trained["translation"].tokenizer.model_proto
    copied = Vocab.load(translation_export / MODEL_FILE)
    assert copied.encode(["a b"]) == trained["translation"].tokenizer.encode(["a b"])
    assert manifest["format"] == "exported-program" and manifest["kind"] == "translation"
    assert manifest["special_tokens"] == {"pad": PAD, "unk": 1, "bos": BOS, "eos": EOS}
    assert (manifest["start_token"], manifest["end_token"], manifest["source_end_token"]) == (BOS, EOS, EOS)
    assert manifest["dimensions"]["past"] == {"min": 0, "max": SMALL["max_len"] - 1}
    decoder = manifest["graphs"]["decoder"]
    assert decoder["file"] == "decoder.pt2"
    assert decoder["inputs"][:4] == ["tokens", "memory_padding_mask", "memory_keys.0", "memory_keys.1"]
    assert decoder["outputs"] == ["logits", "present_keys.0", "present_keys.1", "present_values.0", "present_values.1"]
    assert manifest["cache"]["self_attention"][0] == {"module": "decoder.layers.0.self_attn", "heads": 2,
                                                      "key_dim": 16, "value_dim": 16}


# --- ONNX, one test for each kind of model ---------------------------------------------------------------

def _onnx_session(path: Path):
    ort = pytest.importorskip("onnxruntime")
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _onnx_step(session, manifest: dict, graph: str, fixed: dict):
    """An exported step run by onnxruntime, called like the torch.export program's."""
    outputs = manifest["graphs"][graph]["outputs"]

    def step(tokens, past_keys, past_values):
        feeds = {"tokens": tokens.numpy(), **fixed,
                 **{f"past_keys.{i}": k for i, k in enumerate(past_keys)},
                 **{f"past_values.{i}": v for i, v in enumerate(past_values)}}
        found = dict(zip(outputs, session.run(None, {k: _numpy(v) for k, v in feeds.items()})))
        layers = range(len(past_keys))
        return (found["logits"], [torch.from_numpy(found[f"present_keys.{i}"]) for i in layers],
                [torch.from_numpy(found[f"present_values.{i}"]) for i in layers])
    return step


def _numpy(value):
    return value.numpy() if isinstance(value, torch.Tensor) else value


def test_translation_onnx_gives_the_model_s_memory_and_greedy_tokens(checkpoints, trained, tmp_path):
    pytest.importorskip("onnxscript")
    files = export_model(trained["translation"], "onnx", tmp_path / "onnx")
    assert files == ["decoder.onnx", "encoder.onnx", "export.json", MODEL_FILE]
    manifest = _manifest(tmp_path / "onnx")
    src, padding = _sources(batch=4, length=9)
    memory, first, expected = _translation_reference(trained["translation"].model, src, padding)

    encoder = _onnx_session(tmp_path / "onnx" / "encoder.onnx")
    encoded = dict(zip(manifest["graphs"]["encoder"]["outputs"],
                       encoder.run(None, {"src": src.numpy(), "src_padding_mask": padding.numpy()})))
    torch.testing.assert_close(torch.from_numpy(encoded.pop("memory")), memory, **TOLERANCE)
    step = _onnx_step(_onnx_session(tmp_path / "onnx" / "decoder.onnx"), manifest, "decoder",
                      {"memory_padding_mask": padding.numpy(), **encoded})
    _same_decoding(expected, _graph_greedy(first, manifest["cache"]["self_attention"], step))


def test_language_model_onnx_gives_the_model_s_greedy_tokens(checkpoints, tmp_path, capsys, trained):
    pytest.importorskip("onnxscript")
    output = _export_with_the_command(checkpoints["language model"], tmp_path / "lm-onnx", "--format", "onnx")
    assert "decoder.onnx, export.json, sentencepiece.model" in capsys.readouterr().out
    manifest = _manifest(output)
    model = trained["language model"].model
    first = torch.full((2, 1), EOS)
    expected = _model_greedy(model, first, lambda t, c: model.decode(t, cache=c))
    step = _onnx_step(_onnx_session(output / "decoder.onnx"), manifest, "decoder", {})
    _same_decoding(expected, _graph_greedy(first, manifest["cache"]["self_attention"], step))


# --- mistakes and failures -------------------------------------------------------------------------------

def _error(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err.strip()


def test_a_missing_run_is_one_message(capsys, tmp_path):
    code, err = _error(capsys, "export", str(tmp_path / "no-run"), "-o", str(tmp_path / "out"))
    assert code == 1 and err == f"xspec: error: {tmp_path / 'no-run'}: no such run directory or checkpoint"
    assert not (tmp_path / "out").exists()


def test_onnx_without_its_packages_names_the_extra(checkpoints, capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "onnxscript", None)    # as if not installed
    code, err = _error(capsys, "export", str(checkpoints["translation"]), "--format", "onnx",
                       "-o", str(tmp_path / "out"))
    assert code == 1 and err == "xspec: error: --format onnx needs the onnxscript package: pip install 'xspec[onnx]'"


@pytest.mark.parametrize("name, message", [
    ("a-file", "is not a directory"),
    ("model.pt2", "the export is a directory (graphs, vocabulary, manifest); give a directory name, e.g."),
    ("foreign", "holds notes.txt, which no xspec export wrote there; give a new or empty directory (xspec replaces "
                "only a directory it wrote, as it left it)"),
])
def test_outputs_that_cannot_hold_an_export_are_refused_first(checkpoints, capsys, tmp_path, name, message):
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("mine")
    code, err = _error(capsys, "export", str(tmp_path / "no-run"), "-o", str(tmp_path / name))
    assert code == 1 and message in err and "no such run" not in err
    assert (tmp_path / "foreign" / "notes.txt").read_text() == "mine"


def test_an_earlier_export_is_replaced_whole_and_a_failed_one_leaves_nothing(tmp_path):
    target = tmp_path / "export"

    def fill(files: list[str]):
        def write(staging: Path) -> None:
            (staging / "export.json").write_text("{}")
            for name in files:
                (staging / name).write_text(name)
        return write

    write_directory(check_destination(target), fill(["old.pt2"]), WRITER)
    write_directory(check_destination(target), fill(["new.pt2"]), WRITER)
    assert sorted(p.name for p in target.iterdir()) == [WRITTEN, "export.json", "new.pt2"]

    def fail(staging: Path) -> None:
        (staging / "half.pt2").write_text("...")
        raise UserError("an exporter failed")

    with pytest.raises(UserError):
        write_directory(target, fail, WRITER)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]           # no temporary folder left
    assert sorted(p.name for p in target.iterdir()) == [WRITTEN, "export.json", "new.pt2"]


def test_a_graph_torch_cannot_export_is_a_user_error():
    class DataDependent(torch.nn.Module):
        def forward(self, x):
            return x * 2 if x.sum() > 0 else x       # a branch on values: no single graph

    graph = Graph("encoder", DataDependent(), (torch.ones(2, 3),), ({0: torch.export.Dim("batch")},), ["x"], ["y"])
    with pytest.raises(UserError, match="^torch.export cannot export the encoder graph: "):
        export_program(graph)


def test_a_latent_attention_model_exports_with_its_latent_cache(tmp_path):
    """DeepSeek's latent attention: the exported step carries each layer's latent and rotary key (one
    "head" of kv_lora_rank and qk_rope_head_dim numbers a position) and gives the model's logits."""
    vocab = train_vocab([s for pair in generate_split("train", 200) for s in pair], 100, "bpe", tmp_path)
    spec = xspec.compile(str(ROOT / "specs" / "modern" / "deepseek_v3.xspec"), overrides={
        **{k: v for k, v in SMALL.items() if k != "max_len"}, "q_lora_rank": 0, "kv_lora_rank": 16,
        "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8, "first_k_dense_replace": 2})
    torch.manual_seed(0)
    checkpoint = tmp_path / "latent.safetensors"
    ckpt.save_weights(checkpoint, spec.build("cpu").state_dict(), spec.resolved_source, spec.params,
                      vocab.model_proto, step=1)
    exported = _export_with_the_command(checkpoint, tmp_path / "out")
    cache = _manifest(exported)["cache"]["self_attention"]
    assert [(c["heads"], c["key_dim"], c["value_dim"]) for c in cache] == [(1, 16, 4), (1, 16, 4)]
    decoder = torch.export.load(exported / "decoder.pt2").module()
    model = xspec.load(checkpoint, device="cpu").model
    prompt = torch.tensor([[EOS, 10, 11, 12, 13], [EOS, 20, 21, 22, 23]])
    with torch.no_grad():
        whole = model.decode(prompt)
    past_keys = [torch.zeros(2, 1, 0, 16) for _ in cache]
    past_values = [torch.zeros(2, 1, 0, 4) for _ in cache]
    for position in range(prompt.size(1)):
        logits, past_keys, past_values = decoder(prompt[:, position:position + 1], past_keys, past_values)
        torch.testing.assert_close(logits, whole[:, position], **TOLERANCE)
