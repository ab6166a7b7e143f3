"""Language models end to end: documents into examples, training (quality, exact resume), sampling and
beam search, scoring, `xspec.load`, and the commands (`train`, `generate`, `eval --text`)."""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path

import pytest
import torch

import xspec
from xspec.cli import main
from xspec.base.errors import UserError
from xspec.runtime.batching import NO_LABEL, collate_sequences
from xspec.runtime.beam_search import continue_prompts
from xspec.runtime.demo_data import generate_split
from xspec.runtime.documents import Documents, encode_documents, windows
from xspec.runtime.precision import cpu_bf16_instructions
from xspec.runtime.run_dir import DataFiles, Split, read_metrics_log
from xspec.runtime.sampling import Drawing, Sampling, draw, filtered_probabilities, sample
from xspec.runtime.train import RunOptions, train
from xspec.runtime.vocab import BOS, EOS, PAD

ROOT = Path(__file__).resolve().parents[2]
LM = str(ROOT / "specs" / "lm.xspec")
SMALL = {"d_model": 64, "d_ff": 256, "heads": 2, "layers": 2, "vocab": 400, "max_len": 128,
         "train.batch_tokens": 1024, "train.warmup_steps": 50, "train.max_steps": 150,
         "train.validate_every_steps": 50, "train.checkpoint_every_steps": 50, "train.lr_scale": 0.3,
         "data.block_size": 64, "decode.max_new_tokens": 12}


class _Words:
    """A stand-in vocabulary: each word is its number; documents start and end as xspec's do."""

    document_start = document_end = EOS

    def encode(self, lines: list[str]) -> list[list[int]]:
        return [[int(w) for w in line.split()] for line in lines]


def test_blocks_follow_the_documents_each_after_an_eos_every_token_predicted_once():
    docs = Documents(["10 11 12", "13", "14 15 16 17"], Path("t.txt"))
    encoded = encode_documents(docs, _Words(), "blocks", 4, truncate=False)
    stream = [EOS, 10, 11, 12, EOS, 13, EOS, 14, 15, 16, 17, EOS]
    assert encoded.sequences == [stream[0:5], stream[4:9], stream[8:12]]
    assert encoded.predictions == len(stream) - 1
    batch = collate_sequences([0, 1, 2], encoded.sequences)
    (inputs,) = batch.inputs
    assert inputs.tolist() == [stream[0:4], stream[4:8], stream[8:11] + [PAD]]
    assert batch.labels.tolist() == [stream[1:5], stream[5:9], stream[9:12] + [NO_LABEL]]   # shifted by one
    assert batch.target_tokens == 11                                                    # no loss on padding


def test_lines_are_examples_of_their_own_and_long_ones_are_skipped_or_cut():
    docs = Documents(["10 11", "12", "13 14 15 16 17"], Path("t.txt"))
    skipped = encode_documents(docs, _Words(), "lines", 4, truncate=False)
    assert skipped.sequences == [[EOS, 10, 11, EOS], [EOS, 12, EOS]] and skipped.too_long == 1
    cut = encode_documents(docs, _Words(), "lines", 4, truncate=True)
    assert cut.sequences[2] == [EOS, 13, 14, 15, EOS]
    batch = collate_sequences([0, 1], skipped.sequences)
    assert batch.inputs[0].tolist() == [[EOS, 10, 11], [EOS, 12, PAD]]
    assert batch.labels.tolist() == [[10, 11, EOS], [12, EOS, NO_LABEL]]
    assert "1 too long skipped" in skipped.summary("train")


def test_windows_predict_every_token_once():
    sequence = list(range(20))
    pieces = windows(sequence, 6)
    assert [p[1:] for p in pieces] == [sequence[1:7], sequence[7:13], sequence[13:19], sequence[19:20]]
    assert all(len(p) <= 7 for p in pieces)


def test_top_k_and_top_p_keep_the_most_likely_tokens():
    logits = torch.log(torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.5, 0.3, 0.15, 0.05]]))
    top_k = filtered_probabilities(logits, Sampling(top_k=2))
    torch.testing.assert_close(top_k[0, 4:], torch.tensor([0.625, 0.375, 0.0, 0.0]))
    top_p = filtered_probabilities(logits, Sampling(top_p=0.8))            # 0.5 + 0.3 reaches 0.8
    torch.testing.assert_close(top_p[0, 4:], torch.tensor([0.625, 0.375, 0.0, 0.0]))
    assert filtered_probabilities(logits, Sampling(top_p=0.81))[0, 6] > 0   # it takes the third
    cold = filtered_probabilities(logits, Sampling(temperature=0.5))[0]
    assert cold[4] / cold[5] == pytest.approx((0.5 / 0.3) ** 2, rel=1e-4)
    # Drawing inverts the cumulative distribution: [0, .625) -> token 4, [.625, 1) -> token 5.
    assert draw(top_k.repeat(3, 1), [0.0, 0.6, 0.99]).tolist() == [4, 4, 5]


@pytest.fixture(scope="module")
def model():
    spec = xspec.compile(LM, overrides={"vocab": 50, "d_model": 32, "d_ff": 64, "heads": 2, "layers": 2,
                                        "max_len": 40})
    torch.manual_seed(0)
    built = spec.build(device="cpu").eval()
    with torch.no_grad():                       # sharper than at initialisation, so choices differ clearly
        for p in built.parameters():
            p.mul_(3.0)
    return built


def _prompts(length: int, count: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.cat([torch.full((count, 1), EOS), torch.randint(4, 50, (count, length), generator=generator)], 1)


def test_greedy_sampling_and_beam_search_agree_where_they_should(model):
    prompts = _prompts(5, 4, seed=1)
    greedy = sample(model, prompts, 12, None)
    assert sample(model, prompts, 12, Sampling(top_k=1)) == greedy            # top-k 1 is greedy
    assert sample(model, prompts, 12, Sampling(min_p=1.0)) == greedy          # so is min-p 1
    assert sample(model, prompts, 12, Sampling(min_p=0.05), seed=3) != greedy
    beam_1 = continue_prompts(model, prompts, beam=1, alpha=0.6, max_new_tokens=12)
    assert [h[0].tokens for h in beam_1] == greedy
    cached = continue_prompts(model, prompts, beam=3, alpha=0.6, max_new_tokens=10, nbest=3)
    uncached = continue_prompts(model, prompts, beam=3, alpha=0.6, max_new_tokens=10, nbest=3, use_cache=False)
    assert [[h.tokens for h in hs] for hs in cached] == [[h.tokens for h in hs] for hs in uncached]
    for hs_cached, hs_uncached in zip(cached, uncached):
        for a, b in zip(hs_cached, hs_uncached):
            assert a.score == pytest.approx(b.score, rel=1e-4)


def test_the_prompts_pass_makes_the_last_positions_logits_alone_and_decodes_as_before(model):
    """Given the module that makes the logits (CompiledSpec.output_head), a pass over several positions has it
    read the last position's states only, as transformers' generate asks for; the continuations are the same."""
    head_path = "decoder.generator"
    head = model.get_submodule(head_path)
    read: list[tuple[int, ...]] = []
    watch = head.register_forward_hook(lambda module, inputs, output: read.append(tuple(inputs[0].shape)))
    try:
        prompts = _prompts(6, 3, seed=2)
        padding = torch.tensor([2, 0, 1])
        for rows in range(3):
            prompts[rows, :padding[rows]] = PAD
        plain = sample(model, prompts, 8, None, padding=padding)
        assert read[0] == (3, 7, 32)                      # every prompt position, without the head named
        read.clear()
        assert sample(model, prompts, 8, None, padding=padding, output_head=head_path) == plain
        assert read[0] == (3, 1, 32) and all(shape[1] == 1 for shape in read)
        beams = continue_prompts(model, prompts, beam=3, alpha=0.6, max_new_tokens=6, nbest=3, padding=padding)
        read.clear()
        headed = continue_prompts(model, prompts, beam=3, alpha=0.6, max_new_tokens=6, nbest=3, padding=padding,
                                  output_head=head_path)
        assert read[0] == (9, 1, 32)
        assert [[h.tokens for h in hs] for hs in headed] == [[h.tokens for h in hs] for hs in beams]
        for hs, hs_plain in zip(headed, beams):
            assert [h.score for h in hs] == pytest.approx([h.score for h in hs_plain], rel=1e-5)
        uncached = continue_prompts(model, prompts[1:2], beam=2, alpha=0.6, max_new_tokens=5, use_cache=False,
                                    output_head=head_path)
        assert all(shape[1] == 1 for shape in read)        # without a cache, every pass reads the last alone
        assert uncached[0][0].tokens == continue_prompts(model, prompts[1:2], beam=2, alpha=0.6, max_new_tokens=5,
                                                         use_cache=False)[0][0].tokens
        assert sample([model, model], prompts, 4, None, padding=padding, output_head=head_path) == \
            sample([model, model], prompts, 4, None, padding=padding)    # an ensemble names no one head
    finally:
        watch.remove()
    assert not head._forward_pre_hooks                    # the pass's own hook is gone


class _PaddedRowsFavoured(torch.nn.Module):
    """The model with every token from 30 on made far likelier than the rest (rows beyond a vocabulary)."""

    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def decode(self, *args, **kwargs) -> torch.Tensor:
        logits = self.model.decode(*args, **kwargs).clone()
        logits[..., 30:] += 100.0
        return logits


def test_tokens_beyond_the_vocabulary_are_never_chosen(model):
    """A model may have more embedding rows than its vocabulary has pieces (an imported checkpoint's padded
    embedding): given the vocabulary's size, greedy decoding, sampling and beam search choose only its ids."""
    favoured, prompts = _PaddedRowsFavoured(model), _prompts(4, 3, seed=3)
    assert all(t >= 30 for row in sample(favoured, prompts, 8, None) for t in row)
    limited = [sample(favoured, prompts, 8, None, vocab_size=30),
               sample(favoured, prompts, 8, Sampling(), vocab_size=30),
               [h[0].tokens for h in continue_prompts(favoured, prompts, 3, 0.6, 8, vocab_size=30)]]
    assert all(row and all(t < 30 for t in row) for rows in limited for row in rows)
    assert limited[0] == sample(model, prompts, 8, None, never=(PAD, BOS, *range(30, 50)))


class _ScriptedLM(torch.nn.Module):
    """A language model that continues a prompt of `prompt_length` tokens with 0, 2, 3, 0, 2, 3, ... (xspec's
    PAD, BOS and EOS ids, ordinary tokens of some checkpoint's vocabulary) and then its own end token, 7,
    after `length` tokens."""

    def __init__(self, prompt_length: int, length: int, vocab: int = 10) -> None:
        super().__init__()
        self.prompt_length, self.length, self.vocab = prompt_length, length, vocab

    def new_cache(self):
        return None

    def decode(self, tokens: torch.Tensor, cache=None) -> torch.Tensor:
        logits = torch.zeros(*tokens.shape, self.vocab)
        for position in range(tokens.size(1)):
            written = position - self.prompt_length + 1           # tokens written before the next one
            favourite = 7 if written >= self.length else (0, 2, 3)[written % 3] if written >= 0 else 5
            logits[:, position, favourite] = 10.0
        return logits


def test_beam_search_decodes_with_a_checkpoint_s_own_end_and_special_tokens():
    """With a checkpoint's tokenizer, ids 0, 2 and 3 are ordinary tokens and the document ends at its own
    token: beam search keeps them in the text, stops at that token, and never writes the ones it is told."""
    prompts = torch.tensor([[1, 4, 4], [1, 5, 6]])
    scripted = _ScriptedLM(prompts.size(1), length=5)
    for beam in (1, 3):
        hyps = continue_prompts(scripted, prompts, beam, 0.6, 12, use_cache=False, end=7, never=(1,))
        assert [h[0].tokens for h in hyps] == [[0, 2, 3, 0, 2], [0, 2, 3, 0, 2]]
    banned = continue_prompts(scripted, prompts, 3, 0.6, 12, use_cache=False, end=7, never=(0, 1))
    assert all(0 not in h[0].tokens for h in banned)


def test_a_seed_gives_each_prompt_the_same_sample_in_any_batch(model):
    prompts = _prompts(4, 3, seed=2)
    settings = Sampling(temperature=1.5, top_p=0.95)
    together = sample(model, prompts, 15, settings, seed=7)
    assert sample(model, prompts, 15, settings, seed=7) == together
    alone = [sample(model, prompts[i:i + 1], 15, settings, seed=7, indices=[i])[0] for i in range(3)]
    assert alone == together
    assert sample(model, prompts, 15, settings, seed=8) != together


def _beam_sampled(model, prompts: torch.Tensor, seed: int, indices: list[int], sampling: Sampling = Sampling(1.5)
                  ) -> list[list[int]]:
    drawn = Drawing(sampling, seed, indices, torch.device("cpu"), keep=2)
    return [h[0].tokens for h in continue_prompts(model, prompts, 3, 0.6, 12, selection=drawn)]


def test_beam_sampling_gives_each_prompt_the_same_continuation_in_any_batch(model):
    prompts = _prompts(4, 3, seed=2)
    together = _beam_sampled(model, prompts, 7, [0, 1, 2])
    assert _beam_sampled(model, prompts, 7, [0, 1, 2]) == together
    assert [_beam_sampled(model, prompts[i:i + 1], 7, [i])[0] for i in range(3)] == together
    assert _beam_sampled(model, prompts, 8, [0, 1, 2]) != together
    assert together != [h[0].tokens for h in continue_prompts(model, prompts, 3, 0.6, 12)]   # not the best
    # one beam draws one token a step, as sampling does: the same draws from the same streams
    settings = Sampling(temperature=1.5, top_p=0.95)
    one = [h[0].tokens for h in continue_prompts(model, prompts, 1, 0.6, 12, selection=Drawing(
        settings, 7, [0, 1, 2], torch.device("cpu")))]
    assert one == sample(model, prompts, 12, settings, seed=7)


def test_drawn_candidates_come_without_replacement_as_often_as_their_softmax_says():
    scores = torch.tensor([[0.0, -0.5, -1.0, -2.0, float("-inf")]])
    p = scores.softmax(dim=-1)[0]
    drawing = Drawing(Sampling(), seed=0, indices=[0], device=torch.device("cpu"))
    firsts, pairs = torch.zeros(5), torch.zeros(5, 5)
    for _ in range(4000):
        firsts[drawing.choose(scores, 1, [0])[1][0, 0]] += 1                  # one: sampling's draw
        a, b = drawing.choose(scores, 2, [0])[1][0].tolist()                   # two, without replacement
        pairs[min(a, b), max(a, b)] += 1
    torch.testing.assert_close(firsts / 4000, p, atol=0.025, rtol=0)
    expected = torch.zeros(5, 5)                    # P{i, j} = p_i p_j / (1 - p_i) + p_j p_i / (1 - p_j)
    for i in range(4):
        for j in range(i + 1, 4):
            expected[i, j] = p[i] * p[j] / (1 - p[i]) + p[j] * p[i] / (1 - p[j])
    torch.testing.assert_close(pairs / 4000, expected, atol=0.025, rtol=0)
    for _ in range(50):
        chosen, columns = drawing.choose(scores, 4, [0])
        assert sorted(columns[0].tolist()) == [0, 1, 2, 3]                # each once, never the impossible one
        assert chosen[0].tolist() == [0.0, -0.5, -1.0, -2.0]              # best first
    chosen, columns = drawing.choose(scores, 5, [0])
    assert chosen[0, -1] == float("-inf") and columns[0, -1] == 4          # fewer possible than asked: the rest


def test_sampling_draws_one_continuation_a_prompt_unless_told_to_sample_in_beams():
    from pydantic import ValidationError
    from xspec.compiler.sections import DecodeSection
    from xspec.runtime.sampling import sampling_choice

    searching, sampling = DecodeSection(), DecodeSection(sample=True, beam=3, beam_sampling=True)
    assert sampling_choice(searching, True, None) == {"sample": True, "beam_sampling": False}   # --sample
    assert sampling_choice(searching, True, 2) == {"sample": True, "beam": 2, "beam_sampling": True}
    assert sampling_choice(sampling, True, None) == {}                        # the spec's beam sampling kept
    assert sampling_choice(sampling, None, 2) == {"sample": False, "beam": 2, "beam_sampling": False}
    assert sampling_choice(sampling, False, None) == {"sample": False, "beam": 1, "beam_sampling": False}
    with pytest.raises(ValidationError, match="it needs sample = true"):
        DecodeSection(beam_sampling=True)


# --- training -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def demo_text(tmp_path_factory) -> DataFiles:
    """The demo language's English-like side, a few thousand sentences."""
    directory = tmp_path_factory.mktemp("text")
    splits = {}
    for name, size in (("train", 3000), ("valid", 60), ("test", 60)):
        path = directory / f"{name}.txt"
        path.write_text("".join(s + "\n" for s, _ in generate_split(name, size)), encoding="utf-8")
        splits[name] = Split(path)
    return DataFiles(splits["train"], splits["valid"], splits["test"])


def _train(out: Path, data: DataFiles, resume: bool = False, **overrides) -> dict:
    spec = xspec.compile(LM, overrides={**SMALL, **overrides})
    return train(spec, RunOptions(out, data, device="cpu", resume=resume, progress=False))


@pytest.fixture(scope="module")
def lm_run(demo_text, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("lm") / "run"
    with contextlib.redirect_stdout(io.StringIO()) as out:
        _train(run, demo_text)
    (run / "stdout.txt").write_text(out.getvalue())
    return run


def test_a_language_model_learns_far_more_than_word_frequencies(lm_run, demo_text):
    """150 updates of 1024 tokens on 3000 demo sentences: test perplexity about 22, against about 150 for a
    unigram model of the training data (a model that ignores context)."""
    metrics = json.loads((lm_run / "metrics.json").read_text())
    assert metrics["steps"] == 150
    assert metrics["test_perplexity"] < 0.3 * metrics["unigram_perplexity"]
    assert metrics["test_perplexity"] == pytest.approx(math.exp(metrics["test_loss"]), rel=1e-3)
    assert metrics["valid_loss"] < math.log(metrics["unigram_perplexity"])
    printed = (lm_run / "stdout.txt").read_text().splitlines()
    assert printed[-1].startswith("test perplexity ") and "a unigram model of the training data" in printed[-1]
    samples = (lm_run / "samples.txt").read_text().splitlines()
    assert len(samples) == 4 and all(" ||| " in line for line in samples)
    assert sum(line.startswith("sample: [") for line in printed) == 4
    record = json.loads((lm_run / "run.json").read_text())
    assert record["data"]["train"] == {"text": str(demo_text.train.src.resolve())}


def test_a_resumed_language_model_replays_the_uninterrupted_losses(demo_text, tmp_path):
    short = {"train.max_steps": 8, "train.checkpoint_every_steps": 4, "train.validate_every_steps": 4,
             "data.examples": "lines"}
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    with contextlib.redirect_stdout(io.StringIO()):
        _train(whole, demo_text, **short)
        _train(parts, demo_text, **{**short, "train.max_steps": 4})
        _train(parts, demo_text, resume=True, **short)
    losses = [{r["step"]: r["loss"] for r in read_metrics_log(run) if "loss" in r} for run in (whole, parts)]
    assert losses[0] == losses[1] and sorted(losses[0]) == list(range(1, 9))


def test_the_modern_decoder_only_spec_trains(demo_text, tmp_path):
    spec = xspec.compile(str(ROOT / "specs" / "modern" / "llama.xspec"),
                         overrides={"vocab": 400, "d_model": 32, "layers": 1, "d_ff": 64, "train.max_steps": 3,
                                    "train.batch_tokens": 512, "data.block_size": 32})
    with contextlib.redirect_stdout(io.StringIO()):
        metrics = train(spec, RunOptions(tmp_path / "llama", demo_text, device="cpu", progress=False))
    assert metrics["steps"] == 3 and math.isfinite(metrics["test_perplexity"])


def test_without_a_test_split_the_figures_say_they_are_the_validation_splits(demo_text, tmp_path, capsys):
    """The final perplexity of a run given no test text is the validation text's, and is called so: in the
    printed line, metrics.json and `xspec show`, which then has no test row."""
    import dataclasses

    from xspec.run_summary import render, summarize

    data = dataclasses.replace(demo_text, test=None)
    with contextlib.redirect_stdout(io.StringIO()) as out:
        metrics = _train(tmp_path / "run", data, **{"train.max_steps": 3})
    assert "validation perplexity " in out.getvalue() and "test perplexity" not in out.getvalue()
    assert metrics["scored_on"] == "validation" and "test_perplexity" not in metrics
    assert math.isfinite(metrics["validation_perplexity"])
    shown = render(summarize(tmp_path / "run"))
    assert "at the end, scored (no test split): validation_loss" in shown
    assert not any(line.strip().startswith("test ") for line in shown.splitlines()), shown


# --- loading and the commands ----------------------------------------------------------------------

def test_load_round_trips_a_run(lm_run, demo_text):
    trained = xspec.load(lm_run, device="cpu")
    assert trained.is_language_model and "language model" in repr(trained)
    lines = demo_text.test.src.read_text().splitlines()[:5]
    log_probs = trained.score(lines)
    scores = trained.score_lines(lines)
    assert log_probs == scores.log_probs and all(lp < 0 for lp in log_probs)
    assert scores.tokens == [len(ids) + 1 for ids in trained.tokenizer.encode(lines)]
    again = xspec.load(lm_run / "checkpoints" / "step-00000150.safetensors", device="cpu")
    assert again.score(lines) == pytest.approx(log_probs, rel=1e-5)
    first = trained.generate(["the", ""], sample=True, seed=3)
    assert trained.generate(["the", ""], sample=True, seed=3) == first and all(first)
    with pytest.raises(UserError, match="does not translate"):
        trained.translate(["the"])
    with pytest.raises(UserError, match="decoding options: .*greater than 0"):
        trained.generate(["the"], temperature=0.0)


def test_a_model_loaded_for_decoding_on_a_cpu_has_its_weights_in_one_mapping(lm_run, demo_text, tmp_path, monkeypatch):
    """Where the kernel offers huge pages (as this test says it does), every weight is copied into one mapping
    advised for them (runtime/huge_pages.py), and the model scores as it did."""
    from xspec.runtime import huge_pages

    lines = demo_text.test.src.read_text().splitlines()[:3]
    expected = xspec.load(lm_run, device="cpu").score(lines)
    setting = tmp_path / "enabled"
    setting.write_text("always [madvise] never\n")
    monkeypatch.setattr(huge_pages, "SETTING", setting)
    monkeypatch.setattr(huge_pages, "LEAST_BYTES", 0)
    trained = xspec.load(lm_run, device="cpu")
    tensors = list(trained.model.parameters())
    span = max(t.data_ptr() + t.numel() * t.element_size() for t in tensors) - min(t.data_ptr() for t in tensors)
    assert span <= sum(t.numel() * t.element_size() + 64 for t in tensors)
    assert min(t.data_ptr() for t in tensors) % huge_pages.HUGE_PAGE == 0
    assert trained.score(lines) == pytest.approx(expected, rel=1e-6)


def _xspec(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_generate_and_eval_text_commands(lm_run, demo_text, capsys, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("the\n\nsome big\n")
    code, out, _ = _xspec(capsys, "generate", str(lm_run), "--input", str(prompts), "--seed", "5", "--top-k", "1")
    greedy = _xspec(capsys, "generate", str(lm_run), "--input", str(prompts), "--beam", "1")[1]
    assert code == 0 and len(out.splitlines()) == 3 and out == greedy
    assert _xspec(capsys, "generate", str(lm_run), "--input", str(prompts), "--min-p", "1")[1] == greedy
    code, drawn, _ = _xspec(capsys, "generate", str(lm_run), "--input", str(prompts), "--top-p", "0.9", "--beam", "2")
    assert code == 0 and len(drawn.splitlines()) == 3                     # beam sampling
    code, echoed, _ = _xspec(capsys, "generate", str(lm_run), "--prompt", "some big", "--beam", "1", "--echo")
    assert code == 0 and echoed == "some big " + out.splitlines()[2] + "\n"
    code, out, _ = _xspec(capsys, "eval", str(lm_run), "--text", str(demo_text.test.src))
    assert code == 0 and out.startswith(f"{demo_text.test.src}: perplexity ")
    metrics = json.loads((lm_run / "metrics.json").read_text())
    assert float(out.split("perplexity ")[1].split(",")[0]) == pytest.approx(metrics["test_perplexity"], rel=1e-3)
    averaged = tmp_path / "averaged.safetensors"                 # §6.1's averaging serves language models too
    assert _xspec(capsys, "average", str(lm_run), "--last", "3", "-o", str(averaged))[0] == 0
    code, out, _ = _xspec(capsys, "eval", str(averaged), "--text", str(demo_text.test.src))
    assert code == 0 and 1 < float(out.split("perplexity ")[1].split(",")[0]) < metrics["unigram_perplexity"]


@pytest.mark.skipif(cpu_bf16_instructions() is None, reason="bf16 and int8 weights need bf16 instructions")
def test_bf16_and_int8_weights_score_and_generate_as_float32_does_within_their_rounding(lm_run, demo_text, capsys):
    """decode.weights (--weights): the perplexity of the test text within 1% of float32's."""
    perplexities = {}
    for weights in ("fp32", "bf16", "int8"):
        code, out, _ = _xspec(capsys, "eval", str(lm_run), "--text", str(demo_text.test.src), "--weights", weights)
        assert code == 0
        perplexities[weights] = float(out.split("perplexity ")[1].split(",")[0])
        code, out, _ = _xspec(capsys, "generate", str(lm_run), "--prompt", "the", "--beam", "1",
                              "--max-new-tokens", "5", "--weights", weights)
        assert code == 0 and len(out.splitlines()) == 1 and out.strip()
    assert perplexities["bf16"] == pytest.approx(perplexities["fp32"], rel=0.01)
    assert perplexities["int8"] == pytest.approx(perplexities["fp32"], rel=0.01)
    # The lower precisions were used: their layers hold bf16 or int8 weights, and their logits differ
    # from float32's (printed perplexities may round to the same figure).
    from xspec.runtime.weight_formats import Bf16Linear, Float32Linear, Int8Linear

    tokens = torch.randint(4, 60, (2, 12), generator=torch.Generator().manual_seed(0))
    logits = {}
    for weights, layer, dtype in (("fp32", Float32Linear, torch.float32), ("bf16", Bf16Linear, torch.bfloat16),
                                  ("int8", Int8Linear, torch.int8)):
        model = xspec.load(lm_run, device="cpu", weights=weights).model
        linears = [m for m in model.modules() if isinstance(m, layer)]
        stored = {(m.quantized if isinstance(m, Int8Linear) else m.weight).dtype for m in linears}
        assert linears and stored == {dtype}
        with torch.no_grad():
            logits[weights] = model(tokens).float()
    for weights in ("bf16", "int8"):
        assert not torch.allclose(logits[weights], logits["fp32"], rtol=0, atol=1e-6)
        torch.testing.assert_close(logits[weights], logits["fp32"], rtol=0.1, atol=0.1 * logits["fp32"].abs().max())


def test_weights_that_outgrow_the_cache_decode_in_bf16_and_export_as_trained(lm_run, tmp_path, monkeypatch, capsys):
    """decode.weights = "auto" on a CPU with bf16 instructions whose cache the weights outgrow (simulated:
    a 1 KiB cache): loading for decoding keeps them in bf16; exporting writes them as trained."""
    from xspec.runtime import weight_formats

    monkeypatch.setattr(weight_formats, "cpu_bf16_instructions", lambda: "amx_bf16")
    monkeypatch.setattr(weight_formats, "last_level_cache_bytes", lambda: 1024)
    capsys.readouterr()
    decoding = xspec.load(lm_run, device="cpu")
    assert any(isinstance(m, weight_formats.Bf16Linear) for m in decoding.model.modules())
    notice = capsys.readouterr().err      # never chosen silently: what, why, and the flag that undoes it
    assert notice.startswith('xspec: decoding with bf16 weights (decode.weights = "auto": the CPU has amx_bf16, and '
                             "the linear layers' ") and notice.endswith("--weights fp32 keeps them as trained\n")
    tokens = torch.randint(4, 60, (1, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():       # made float again, as any torch user writes, the model runs in float32
        floated = decoding.model.float()(tokens)
    as_trained = xspec.load(lm_run, device="cpu", weights="fp32")
    assert not any(isinstance(m, weight_formats.Bf16Linear) for m in as_trained.model.modules())
    assert capsys.readouterr().err == ""
    with torch.no_grad():       # the weights keep their bf16 rounding: equal within it
        expected = as_trained.model(tokens)
    assert floated.dtype == torch.float32
    torch.testing.assert_close(floated, expected, rtol=0.05, atol=0.05 * expected.abs().max().item())
    code, _, err = _xspec(capsys, "export", str(lm_run), "--format", "exported-program", "-o", str(tmp_path / "ep"))
    assert code == 0, err
    program = torch.export.load(str(next((tmp_path / "ep").glob("*.pt2"))))
    assert {tensor.dtype for tensor in program.state_dict.values()} == {torch.float32}


@pytest.mark.parametrize("argv, message", [
    (["generate", "RUN", "--no-sample", "--temperature", "0.5"], "--no-sample with --temperature"),
    (["generate", "RUN", "--no-sample", "--min-p", "0.1"], "--no-sample with --temperature, --top-k, --top-p or"),
    (["eval", "RUN", "--src", "x", "--ref", "y"], "a language model; score its text with --text FILE"),
    (["eval", "RUN"], "which text?"),
    (["train", LM, "--train-src", "a", "--train-tgt", "b"], "--train-src gives a translation model's data"),
    (["train", str(ROOT / "specs" / "tiny.xspec"), "--train", "a.txt"], "--train FILE gives a language model's"),
])
def test_mistakes_get_one_line_each(lm_run, capsys, argv, message):
    argv = [str(lm_run) if a == "RUN" else a for a in argv]
    code, _, err = _xspec(capsys, *argv)
    assert code != 0 and message in err and len(err.splitlines()) == 1


def test_a_users_sentencepiece_model_is_used_and_kept(lm_run, demo_text, tmp_path):
    mine = tmp_path / "mine.model"
    mine.write_bytes((lm_run / "sentencepiece.model").read_bytes())
    spec = xspec.compile(LM, overrides={**SMALL, "train.max_steps": 2, "train.checkpoint_every_steps": 2})
    run = tmp_path / "run"
    with contextlib.redirect_stdout(io.StringIO()):
        train(spec, RunOptions(run, demo_text, device="cpu", progress=False, evaluate=False, vocab_file=mine))
    assert (run / "sentencepiece.model").read_bytes() == mine.read_bytes()
    other = tmp_path / "other.model"
    other.write_bytes(b"not a sentencepiece model")
    with pytest.raises(UserError, match=r"other\.model: not a sentencepiece model"):
        train(spec, RunOptions(tmp_path / "run2", demo_text, device="cpu", progress=False, vocab_file=other))
