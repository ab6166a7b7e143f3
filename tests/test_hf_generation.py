"""An imported checkpoint continues a prompt as transformers does: the prompt encoded by the checkpoint's own
tokenizer (its BOS where its post-processor adds one, none where it adds none), the decode section written
from generation_config.json (greedy where it says nothing), and a continuation ending at any of its
end-of-sequence ids; `--no-sample` and `generate(sample=False)` are greedy."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

import xspec
from hf_checkpoints import BOS, EOS, saved, saved_model
from xspec.base.errors import UserError
from xspec.hf.importer import import_checkpoint

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")
PROMPT = "w5 w7 w34 w3"    # no word with a special token's text in it (w1, w2)
NEW = 10


def checkpoint(tmp_path: Path, name: str, adds_bos: bool, generation: dict | None, label: str = "") -> Path:
    """The family's checkpoint with a tokenizer that adds BOS to a text or adds nothing (Llama 3's and
    Qwen's post-processors), the tokenizer_config.json AutoTokenizer reads, and a generation_config.json."""
    from tokenizers import Tokenizer, processors

    directory = tmp_path / f"{name}-{'bos' if adds_bos else 'plain'}{label}"
    shutil.copytree(saved(name), directory)
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    if adds_bos:
        tokenizer.post_processor = processors.TemplateProcessing(single=f"w{BOS} $A", special_tokens=[(f"w{BOS}", BOS)])
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": f"w{BOS}", "eos_token": f"w{EOS}"}))
    (directory / "generation_config.json").unlink(missing_ok=True)
    if generation is not None:
        (directory / "generation_config.json").write_text(json.dumps(generation))
    return directory


def transformers_continuation(directory: Path, model, prompt: str) -> tuple[list[int], list[int]]:
    """(the prompt's ids, the continuation's ids without the end token) as AutoTokenizer and generate make
    them, by generation_config.json."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    config = transformers.GenerationConfig.from_pretrained(directory) if (directory / "generation_config.json") \
        .is_file() else transformers.GenerationConfig(do_sample=False, eos_token_id=EOS)
    with torch.no_grad():
        out = model.generate(ids, generation_config=config, max_new_tokens=NEW, pad_token_id=0)
    continuation = out[0, ids.size(1):].tolist()
    ends = config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id]
    if continuation and continuation[-1] in ends:
        continuation = continuation[:-1]
    return ids[0].tolist(), continuation


def xspec_continuation(run: Path, prompt: str, **settings) -> tuple[list[int], list[int]]:
    trained = xspec.load(run, device="cpu")
    generator = trained.generator(max_new_tokens=NEW, **settings)
    prompts, _ = generator.prompt_tokens([prompt])
    return prompts[0], next(iter(generator.stream([prompt])))[0]


@pytest.mark.parametrize("adds_bos", [False, True], ids=["no BOS (Qwen)", "BOS (Llama 3)"])
def test_greedy_text_from_a_prompt_equals_transformers(tmp_path, adds_bos):
    directory = checkpoint(tmp_path, "qwen3", adds_bos, None)
    run = tmp_path / "run"
    import_checkpoint(directory, run, say=lambda _: None)
    expected_prompt, expected = transformers_continuation(directory, saved_model("qwen3"), PROMPT)
    assert expected_prompt == ([BOS] if adds_bos else []) + [5, 7, 34, 3]
    prompt, continuation = xspec_continuation(run, PROMPT)
    assert (prompt, continuation) == (expected_prompt, expected) and continuation
    decode = xspec.compile(run).decode
    assert (decode.sample, decode.beam) == (False, 1)      # no generation_config.json: greedy, as generate is


def test_generation_config_sets_the_decode_section_and_every_eos_ends_a_continuation(tmp_path):
    plain = checkpoint(tmp_path, "qwen3", False, None)
    _, free = transformers_continuation(plain, saved_model("qwen3"), PROMPT)
    stop = free[3]        # a token greedy decoding reaches: made an end-of-sequence id too
    generation = {"do_sample": False, "eos_token_id": [EOS, stop], "temperature": 0.6, "top_p": 0.9,
                  "max_new_tokens": 7, "exponential_decay_length_penalty": [5, 1.5]}
    directory = checkpoint(tmp_path, "qwen3", False, generation, "-configured")
    said: list[str] = []
    import_checkpoint(directory, tmp_path / "run", say=said.append)
    assert f"{directory}/generation_config.json: exponential_decay_length_penalty [5, 1.5] is not applied by " \
           "xspec's decoding yet: continuations may differ from transformers' generate" in said
    spec = xspec.compile(tmp_path / "run")
    assert (spec.decode.sample, spec.decode.beam, spec.decode.max_new_tokens) == (False, 1, 7)
    text = (tmp_path / "run" / "model.xspec").read_text()
    assert re.search(r"^    sample = false +# generation_config.json do_sample$", text, re.M)
    assert re.search(r"^    beam_scoring = \"transformers\" +# beams scored as transformers' generate scores them$",
                     text, re.M)
    _, expected = transformers_continuation(directory, saved_model("qwen3"), PROMPT)
    _, continuation = xspec_continuation(tmp_path / "run", PROMPT)
    assert continuation == expected == free[:3]
    record = json.loads((tmp_path / "run" / "import.json").read_text())
    assert record["tokenizer"]["eos_ids"] == [EOS, stop]
    assert "exponential_decay_length_penalty" in record["generation_not_applied"]


LEAST = ("min_new_tokens", "min_length")     # settings that hold an end back


@pytest.mark.parametrize("key, value", [("repetition_penalty", 2.0), ("no_repeat_ngram_size", 1),
                                        ("min_new_tokens", 6), ("min_length", 10), ("suppress_tokens", "first"),
                                        ("begin_suppress_tokens", "first")])
def test_a_repeat_length_or_suppression_rule_continues_as_transformers_does(tmp_path, key, value):
    """generation_config.json's repetition_penalty, no_repeat_ngram_size, min_new_tokens, min_length,
    suppress_tokens and begin_suppress_tokens, over every token of the prompt and of the continuation so far:
    greedy decoding gives transformers' tokens, which the setting changed (for the least lengths, a token
    greedy decoding reaches early is made an end-of-sequence id too, which the setting holds back; the
    suppressions suppress greedy decoding's first token)."""
    plain = checkpoint(tmp_path, "qwen3", False, None)
    _, free = transformers_continuation(plain, saved_model("qwen3"), PROMPT)
    stops = [EOS, free[2]] if key in LEAST else EOS
    value = [free[0]] if value == "first" else value
    directory = checkpoint(tmp_path, "qwen3", False, {"do_sample": False, "eos_token_id": stops, key: value},
                           "-ruled")
    said: list[str] = []
    import_checkpoint(directory, tmp_path / "run", say=said.append)
    assert not [line for line in said if key in line]
    assert getattr(xspec.compile(tmp_path / "run").decode, key) == (tuple(value) if isinstance(value, list) else value)
    _, expected = transformers_continuation(directory, saved_model("qwen3"), PROMPT)
    _, continuation = xspec_continuation(tmp_path / "run", PROMPT)
    unruled = free[:2] if key in LEAST else free
    assert continuation == expected != unruled
    neutral = {"repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "min_new_tokens": 0, "min_length": 0,
               "suppress_tokens": (), "begin_suppress_tokens": ()}[key]
    assert xspec_continuation(tmp_path / "run", PROMPT, **{key: neutral})[1] == unruled


def test_bad_words_of_one_token_are_suppressed_as_transformers_bans_them(tmp_path):
    """bad_words_ids of single tokens ban them, as generate's NoBadWordsLogitsProcessor does (which leaves the
    end token out); a sequence of several tokens, which xspec's decode section cannot hold, is said not to be
    applied."""
    plain = checkpoint(tmp_path, "qwen3", False, None)
    _, free = transformers_continuation(plain, saved_model("qwen3"), PROMPT)
    directory = checkpoint(tmp_path, "qwen3", False, {"do_sample": False, "eos_token_id": EOS,
                                                      "bad_words_ids": [[free[0]], [EOS]]}, "-banned")
    said: list[str] = []
    import_checkpoint(directory, tmp_path / "run", say=said.append)
    assert not [line for line in said if "bad_words_ids" in line]
    assert xspec.compile(tmp_path / "run").decode.suppress_tokens == (free[0],)
    _, expected = transformers_continuation(directory, saved_model("qwen3"), PROMPT)
    _, continuation = xspec_continuation(tmp_path / "run", PROMPT)
    assert continuation == expected and continuation[0] != free[0]
    sequences = checkpoint(tmp_path, "qwen3", False, {"bad_words_ids": [[free[0], free[1]]]}, "-sequences")
    said.clear()
    import_checkpoint(sequences, tmp_path / "run2", say=said.append)
    assert [line for line in said if "bad_words_ids" in line and "is not applied" in line]


def test_sampling_settings_come_from_generation_config_and_no_sample_means_greedy(tmp_path, capsys):
    from xspec.cli import main

    directory = checkpoint(tmp_path, "qwen3", False, {"do_sample": True, "top_k": 0, "temperature": 0.7})
    run = tmp_path / "run"
    import_checkpoint(directory, run, say=lambda _: None)
    decode = xspec.compile(run).decode
    assert (decode.sample, decode.top_k, decode.temperature, decode.top_p) == (True, 0, 0.7, 1.0)
    greedy = xspec_continuation(run, PROMPT, sample=False, beam=1)[1]
    trained = xspec.load(run, device="cpu")
    assert trained.generate([PROMPT], max_new_tokens=NEW, sample=False) == [trained.tokenizer.decode(greedy)]
    capsys.readouterr()
    assert main(["generate", str(run), "--prompt", PROMPT, "--no-sample", "--max-new-tokens", str(NEW)]) == 0
    assert capsys.readouterr().out.strip() == trained.tokenizer.decode(greedy)


def test_beam_sampling_is_imported_and_draws_continuations_as_often_as_transformers_does(tmp_path):
    """do_sample with num_beams > 1 is transformers' beam sampling: the import keeps both, and xspec draws each
    step's candidates among the beams. Drawn 1,000 times for one prompt on each side (transformers from torch's
    generator, xspec from each line's stream), the continuations come as often on both (a total variation
    distance at the noise of 1,000 draws, about 0.1), and as neither sampling one continuation nor beam search
    (always its best) would give them."""
    from collections import Counter

    generation = {"do_sample": True, "num_beams": 3, "temperature": 0.3, "top_k": 0, "eos_token_id": EOS}
    directory = checkpoint(tmp_path, "qwen3", False, generation)
    said: list[str] = []
    import_checkpoint(directory, tmp_path / "run", say=said.append)
    assert not [line for line in said if "num_beams" in line]
    decode = xspec.compile(tmp_path / "run").decode
    assert (decode.sample, decode.beam, decode.beam_sampling) == (True, 3, True)
    draws, new = 1000, 3
    ids = transformers.AutoTokenizer.from_pretrained(directory)([PROMPT] * draws, return_tensors="pt").input_ids
    torch.manual_seed(0)
    with torch.no_grad():
        out = saved_model("qwen3").generate(ids, generation_config=transformers.GenerationConfig.from_pretrained(
            directory), max_new_tokens=new, pad_token_id=0)
    theirs = Counter(tuple(row[ids.size(1):].tolist()) for row in out)
    trained = xspec.load(tmp_path / "run", device="cpu")

    def drawn(**settings) -> Counter:
        generator = trained.generator(max_new_tokens=new, **settings)
        return Counter(tuple(tokens) for done in generator.stream([PROMPT] * draws) for tokens in done)

    def distance(a: Counter, b: Counter) -> float:
        return sum(abs(a[key] - b[key]) for key in {*a, *b}) / (2 * draws)

    ours = drawn()
    assert len(ours) > 3 and distance(ours, theirs) < 0.2
    best = drawn(sample=False, beam=3)
    assert len(best) == 1 and distance(best, theirs) > 0.5
    assert distance(drawn(sample=True, beam=1), theirs) > 0.5      # one continuation sampled a prompt


def test_sampling_filters_come_from_generation_config_and_go_back_on_export(tmp_path):
    """min_p, typical_p, epsilon_cutoff and eta_cutoff are read where do_sample is true (runtime/sampling.py
    applies them as transformers' warpers do, tests/runtime/test_sampling_filters.py), and written back."""
    from xspec.cli import main

    filters = {"min_p": 0.05, "typical_p": 0.9, "epsilon_cutoff": 0.001, "eta_cutoff": 0.002}
    directory = checkpoint(tmp_path, "qwen3", False, {"do_sample": True, "top_k": 20, **filters}, "-filtered")
    run = tmp_path / "run"
    said: list[str] = []
    import_checkpoint(directory, run, say=said.append)
    assert not [line for line in said if "not applied" in line]
    decode = xspec.compile(run).decode
    assert {key: getattr(decode, key) for key in filters} == filters
    lines = [line.split() for line in (run / "model.xspec").read_text().splitlines()]
    assert ["min_p", "=", "0.05", "#", "generation_config.json", "min_p"] in lines
    assert len(xspec.load(run, device="cpu").generate([PROMPT], max_new_tokens=4)) == 1
    assert main(["export", str(run), "--format", "hf", "-o", str(tmp_path / "exported")]) == 0
    written = json.loads((tmp_path / "exported" / "generation_config.json").read_text())
    assert {key: written[key] for key in filters} == filters
    greedy = checkpoint(tmp_path, "qwen3", False, {"do_sample": False, "min_p": 0.05}, "-greedy")
    import_checkpoint(greedy, tmp_path / "greedy", say=lambda _: None)
    assert xspec.compile(tmp_path / "greedy").decode.min_p is None      # a sampling setting, and no sampling


def test_a_sentencepiece_tokenizer_adds_what_tokenizer_config_says(tmp_path):
    """tokenizer.model adds BOS and EOS to a text as tokenizer_config.json's add_bos_token and add_eos_token say
    (LlamaTokenizer's defaults: BOS, no EOS); a value of another kind is refused by name."""
    import io

    import sentencepiece as spm

    from xspec.base.errors import UserError
    from xspec.hf.tokenizer import find_tokenizer

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter([f"w{i} w{i + 1} w{2 * i}" for i in range(200)]),
                                   model_writer=model, vocab_size=40, model_type="bpe", minloglevel=2)
    (tmp_path / "tokenizer.model").write_bytes(model.getvalue())
    config = {"bos_token_id": 1, "eos_token_id": 2}
    default = find_tokenizer(tmp_path, config)
    plain = default.encode(["w3 w12"])[0]
    assert default.encode_prompts(["w3 w12"]) == [[1, *plain]]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": False, "add_eos_token": True}))
    assert find_tokenizer(tmp_path, config).encode_prompts(["w3 w12"]) == [[*plain, 2]]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": "yes"}))
    with pytest.raises(UserError, match='tokenizer_config.json: add_bos_token "yes" is not true or false'):
        find_tokenizer(tmp_path, config)


def test_a_suppressed_id_beyond_the_vocabulary_is_refused(tmp_path):
    directory = checkpoint(tmp_path, "qwen3", False, None)
    import_checkpoint(directory, tmp_path / "run", say=lambda _: None)
    trained = xspec.load(tmp_path / "run", device="cpu")
    with pytest.raises(UserError, match=r"decode\.begin_suppress_tokens: 100000 is not a token id \(the vocabulary "
                                        r"has [0-9,]+\)"):
        trained.generator(begin_suppress_tokens=(5, 100000))


def test_prompts_of_different_lengths_in_one_batch_continue_as_transformers_left_padded_batch_does(tmp_path):
    directory = checkpoint(tmp_path, "qwen3", True, None)
    run = tmp_path / "run"
    import_checkpoint(directory, run, say=lambda _: None)
    prompts = [PROMPT, "w9", "w31 w32 w33", "w40 w41 w42 w43 w44 w45 w46"]  # w1x hold w1, a special token
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory, padding_side="left")
    tokenizer.pad_token_id = 0
    encoded = tokenizer(prompts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = saved_model("qwen3").generate(**encoded, do_sample=False, max_new_tokens=NEW, pad_token_id=0,
                                            eos_token_id=EOS)
    expected = []
    for row in out[:, encoded.input_ids.size(1):].tolist():
        expected.append(row[:row.index(EOS)] if EOS in row else row)

    generator = xspec.load(run, device="cpu").generator(max_new_tokens=NEW)
    assert generator.pads_prompts()
    assert [ids for done in generator.stream(prompts) for ids in done] == expected
    assert len({tuple(ids) for ids in expected}) > 1
