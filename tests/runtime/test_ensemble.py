"""Ensembles: each step mixes the models' next-token distributions (the mean probability); an ensemble of a
model with itself is the model; runs with different vocabularies or tasks are refused; `xspec translate`,
`xspec eval` and `xspec generate` with several runs end to end."""

from __future__ import annotations

import contextlib
import io
import itertools
from pathlib import Path

import pytest
import torch

import xspec
from xspec.cli import main
from xspec.runtime.beam_search import EncoderDecoderSteps, beam_search, continue_prompts, length_penalty
from xspec.runtime.ensemble import EnsembleSteps
from xspec.runtime.inference import TrainedEnsemble, load, load_ensemble
from xspec.runtime.run_dir import DataFiles
from xspec.runtime.sampling import Sampling, sample
from xspec.runtime.vocab import BOS, EOS, PAD

ROOT = Path(__file__).resolve().parents[2]
TINY, LM = str(ROOT / "specs" / "tiny.xspec"), str(ROOT / "specs" / "lm.xspec")
VOCAB = 8        # PAD, UNK, BOS, EOS and four words
SHRINK = ["--set", "d_model=32", "--set", "d_ff=64", "--set", "heads=2", "--set", "layers=1", "--set", "vocab=200",
          "--set", "max_len=128", "--set", "train.batch_tokens=600", "--set", "train.warmup_steps=20",
          "--set", "decode.max_len_a=0", "--set", "decode.max_len_b=10"]


def _model(seed: int, spec: str = TINY, **overrides) -> torch.nn.Module:
    """A small compiled model, its random weights sharpened so that hypotheses differ clearly."""
    sizes = {"vocab": VOCAB, "d_model": 16, "d_ff": 32, "heads": 2, "layers": 2}
    if spec == TINY:
        sizes["tie_embeddings"] = False
    torch.manual_seed(seed)
    model = xspec.compile(spec, overrides={**sizes, **overrides}).build(device="cpu").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(2.0)
    return model


def _sources() -> tuple[torch.Tensor, torch.Tensor]:
    src = torch.tensor([[4, 5, 1, EOS], [7, EOS, PAD, PAD], [6, 4, EOS, PAD]])
    return src, src == PAD


@torch.no_grad()
def _mixture(models, tgt: torch.Tensor, src: torch.Tensor, src_padding: torch.Tensor) -> torch.Tensor:
    """The log of the models' mean probability after each token of `tgt` [R, T], each model's from a full
    decode without a cache, over the shared vocabulary: [R, T, VOCAB]."""
    each = [torch.softmax(m.decode(tgt, m.encode(src, src_padding), src_padding).double(), -1)[..., :VOCAB]
            for m in models]
    return torch.stack(each).mean(dim=0).log().float()                           # [M, R, T, V] -> [R, T, V]


@torch.no_grad()
def test_each_step_is_the_mixture_of_the_models_distributions():
    # Different weights, depths and widths; the second's embedding has two rows beyond the shared vocabulary.
    models = [_model(0), _model(1, layers=1, d_ff=48, vocab=VOCAB + 2)]
    src, src_padding = _sources()
    beam = 2
    rows = torch.arange(src.size(0)).repeat_interleave(beam)                      # [B*K] sentence of each row
    steps = EnsembleSteps([EncoderDecoderSteps(m, src, src_padding, beam, use_cache=True) for m in models])
    torch.manual_seed(7)
    hyps = torch.cat([torch.full((rows.size(0), 1), BOS), torch.randint(4, VOCAB, (rows.size(0), 3))], 1)  # [B*K, 4]
    order = torch.tensor([1, 1, 3, 2, 5, 4])                     # beams moving within their sentences, as in a search
    for t in range(1, hyps.size(1) + 1):
        got = steps.log_probs(hyps[:, :t])                                        # [B*K, V]
        expected = _mixture(models, hyps[:, :t], src[rows], src_padding[rows])[:, -1]
        assert got.shape == (rows.size(0), VOCAB)
        # float32: the cached steps and the full decodes differ by rounding alone (a few ulps of the largest)
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6 * expected.abs().max().item())
        if t == 2:
            steps.reorder(order)
            hyps = hyps[order]


@torch.no_grad()
def test_the_search_maximises_the_averaged_scores():
    """An exhaustive beam over an ensemble of two different models finds the output a brute-force search
    over the mixture finds, with its score."""
    models = [_model(2), _model(3, layers=1)]
    src, src_padding = _sources()
    alpha, max_len = 0.6, 4
    results = beam_search(models, src, src_padding, beam=125, alpha=alpha, max_len_a=0.0, max_len_b=max_len)
    words = [t for t in range(VOCAB) if t not in (PAD, BOS, EOS)]
    for i in range(src.size(0)):
        best: tuple[list[int], float] = ([], float("-inf"))
        for n in range(max_len):
            bodies = list(itertools.product(words, repeat=n))
            inputs = torch.tensor([[BOS, *body] for body in bodies])               # [N, n + 1]
            targets = torch.tensor([[*body, EOS] for body in bodies])              # [N, n + 1]
            logp = _mixture(models, inputs, src[i:i + 1].expand(len(bodies), -1),
                                     src_padding[i:i + 1].expand(len(bodies), -1))    # [N, n + 1, V]
            scores = logp.gather(2, targets[:, :, None]).sum(dim=(1, 2)) / length_penalty(n + 1, alpha)   # [N]
            j = int(scores.argmax())
            if float(scores[j]) > best[1]:
                best = (list(bodies[j]), float(scores[j]))
        assert results[i][0].tokens == best[0]
        assert results[i][0].score == pytest.approx(best[1], rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("beam", [1, 4])
def test_a_model_with_itself_is_the_model(beam):
    model = _model(4)
    src, src_padding = _sources()
    kwargs = dict(beam=beam, alpha=0.6, max_len_a=1.0, max_len_b=5, nbest=beam)
    alone = beam_search(model, src, src_padding, **kwargs)
    twice = beam_search([model, model], src, src_padding, **kwargs)
    for a, b in zip(alone, twice):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], rel=1e-6)
        assert [h.log_prob for h in a] == pytest.approx([h.log_prob for h in b], rel=1e-6)
    lm = _model(5, spec=LM, max_len=40)
    prompts = torch.cat([torch.full((3, 1), EOS), torch.randint(4, VOCAB, (3, 4))], 1)   # [3, 5]
    alone = continue_prompts(lm, prompts, beam=beam, alpha=0.6, max_new_tokens=6, nbest=beam)
    twice = continue_prompts([lm, lm], prompts, beam=beam, alpha=0.6, max_new_tokens=6, nbest=beam)
    assert [[h.tokens for h in hyps] for hyps in alone] == [[h.tokens for h in hyps] for hyps in twice]
    if beam == 1:       # greedy and sampling, through `sample`
        for sampling in (None, Sampling(temperature=0.8, top_p=0.9)):
            assert sample([lm, lm], prompts, 6, sampling, seed=3) == sample(lm, prompts, 6, sampling, seed=3)


@torch.no_grad()
def test_greedy_generation_follows_the_mixture():
    models = [_model(5, spec=LM, max_len=40), _model(6, spec=LM, max_len=40)]
    prompts = torch.cat([torch.full((4, 1), EOS), torch.randint(4, VOCAB, (4, 3))], 1)   # [4, 4]
    for prompt, continuation in zip(prompts, sample(models, prompts, 3, None)):
        expected = (continuation + [EOS])[:3]                   # a continuation leaves out the EOS it ends at
        tokens = torch.cat([prompt, torch.tensor(expected, dtype=prompt.dtype)])[None]          # [1, 4 + n]
        mixed = torch.stack([torch.softmax(m.decode(tokens).double(), -1) for m in models]).mean(0)  # [1, 4 + n, V]
        mixed[..., PAD] = mixed[..., BOS] = 0
        assert mixed[0, 3:3 + len(expected)].argmax(-1).tolist() == expected


# --- trained runs and the commands ---------------------------------------------------------------

def _train(*argv: str) -> None:
    # One thread, as the `one_thread` fixture gives tests (a module's fixture is set up before it).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["train", *argv, "--no-progress", "--no-test", "--device", "cpu"]) == 0
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def runs(small_corpus: DataFiles, tmp_path_factory) -> dict[str, Path]:
    """Translation runs "a", "b" (another seed, a wider feed-forward; the same vocabulary) and "c" (another
    vocabulary); language models "lm" and "lm2" (another seed) on the source side: a few updates each."""
    root = tmp_path_factory.mktemp("ensemble")
    data = ["--train-src", str(small_corpus.train.src), "--train-tgt", str(small_corpus.train.tgt),
            "--valid-src", str(small_corpus.valid.src), "--valid-tgt", str(small_corpus.valid.tgt)]
    _train(TINY, *SHRINK, "--set", "train.max_steps=4", *data, "--out", str(root / "a"))
    _train(TINY, *SHRINK, "--set", "train.max_steps=4", "--set", "train.seed=2", "--set", "d_ff=48", *data,
           "--out", str(root / "b"))
    _train(TINY, *SHRINK, "--set", "train.max_steps=1", "--set", "vocab=150", *data, "--out", str(root / "c"))
    text = ["--train", str(small_corpus.train.src), "--valid", str(small_corpus.valid.src)]
    lm = ["--set", "d_model=32", "--set", "d_ff=64", "--set", "heads=2", "--set", "layers=1", "--set", "vocab=200",
          "--set", "max_len=64", "--set", "data.block_size=32", "--set", "train.batch_tokens=512"]
    _train(LM, *lm, "--set", "train.max_steps=4", *text, "--out", str(root / "lm"))
    _train(LM, *lm, "--set", "train.max_steps=4", "--set", "train.seed=2", *text, "--out", str(root / "lm2"))
    return {name: root / name for name in ("a", "b", "c", "lm", "lm2")}


def _xspec(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_translate_with_a_run_twice_is_the_run(runs, small_corpus, capsys):
    a, source = str(runs["a"]), str(small_corpus.test.src)
    code, alone, _ = _xspec(capsys, "translate", a, "--input", source, "--nbest", "3")
    assert code == 0 and len(alone.splitlines()) == 24
    code, twice, _ = _xspec(capsys, "translate", a, a, "--input", source, "--nbest", "3")
    assert code == 0 and twice == alone              # the same translations, and scores to the printed digits
    code, out, _ = _xspec(capsys, "eval", a, a, "--src", source, "--ref", str(small_corpus.test.tgt))
    assert code == 0 and out == _xspec(capsys, "eval", a, "--src", source, "--ref", str(small_corpus.test.tgt))[1]


def test_a_compiled_ensemble_leaves_torch_room_to_compile_every_member(runs):
    """Members of one spec share their generated classes, so their compiled steps count against one
    recompile limit: an ensemble raises it, or torch would run the later members uncompiled."""
    with torch._dynamo.config.patch(recompile_limit=8):  # restored after (pytest's monkeypatch deletes it)
        ensemble = load_ensemble([runs["a"]] * 3, device="cpu", compile="on")
        assert isinstance(ensemble, TrainedEnsemble)
        assert len({type(member.model).decode.__code__ for member in ensemble.models}) == 1
        assert torch._dynamo.config.recompile_limit == 24


def test_an_ensemble_of_two_runs_translates_and_scores(runs, small_corpus, capsys):
    source = str(small_corpus.test.src)
    code, out, _ = _xspec(capsys, "translate", str(runs["a"]), str(runs["b"]), "--input", source, "--beam", "2")
    assert code == 0 and len(out.splitlines()) == 8
    code, out, _ = _xspec(capsys, "eval", str(runs["a"]), str(runs["b"]), "--src", source,
                          "--ref", str(small_corpus.test.tgt))
    assert code == 0 and out.strip().splitlines()[-1].startswith("BLEU|nrefs:1|")
    ensemble = load_ensemble([runs["a"], runs["b"]], device="cpu")
    assert isinstance(ensemble, TrainedEnsemble)
    sources, targets = small_corpus.test.src.read_text().splitlines(), small_corpus.test.tgt.read_text().splitlines()
    models = [load(runs[name], device="cpu") for name in ("a", "b")]
    vocab = models[0].tokenizer
    expected = []
    for source, target in zip(vocab.encode(sources), vocab.encode(targets)):
        src = torch.tensor([[*source, EOS]])                                      # [1, S]
        tgt, labels = torch.tensor([[BOS, *target]]), torch.tensor([*target, EOS])  # [1, T], [T]
        expected.append(_mixed_label_log_prob([m.model(src, tgt, src == PAD)[0] for m in models], labels))
    assert ensemble.score(sources, targets) == pytest.approx(expected, rel=1e-5)


@torch.no_grad()
def _mixed_label_log_prob(logits: list[torch.Tensor], labels: torch.Tensor) -> float:
    """Sum over positions of log(mean over models of P(label)), from each model's [T, V] logits."""
    probs = torch.stack([torch.softmax(x.double(), -1) for x in logits]).mean(0)   # [T, V]
    return float(probs.gather(1, labels[:, None]).log().sum())


def test_language_models_score_text_token_by_token_with_the_mixture(runs, small_corpus, capsys):
    lm, text = str(runs["lm"]), str(small_corpus.test.src)
    code, out, _ = _xspec(capsys, "eval", lm, lm, "--text", text)
    assert code == 0 and out == _xspec(capsys, "eval", lm, "--text", text)[1]
    models = [load(runs[name], device="cpu") for name in ("lm", "lm2")]
    # lines that fit the 64 positions whole (longer ones are scored in windows)
    lines = [line for line in small_corpus.test.src.read_text().splitlines()
             if len(models[0].tokenizer.encode([line])[0]) + 1 <= 64]
    assert len(lines) >= 4
    scores = load_ensemble([runs["lm"], runs["lm2"]], device="cpu").score_lines(lines)
    expected = []
    for ids in models[0].tokenizer.encode(lines):
        sequence = torch.tensor([EOS, *ids, EOS])                                 # a document: EOS, tokens, EOS
        expected.append(_mixed_label_log_prob([m.model(sequence[None, :-1])[0] for m in models], sequence[1:]))
    assert scores.log_probs == pytest.approx(expected, rel=1e-5)
    each = [m.score_lines(lines) for m in models]
    # log of a mean >= the mean of logs, token by token (Jensen): no worse than the models' geometric mean
    assert scores.perplexity <= (each[0].perplexity * each[1].perplexity) ** 0.5


def _error(capsys, *argv: str) -> str:
    code, _, err = _xspec(capsys, *argv)
    lines = err.strip().splitlines()
    assert code != 0 and len(lines) == 1 and lines[0].startswith("xspec: error: "), err
    return lines[0]


def test_different_vocabularies_are_refused(runs, small_corpus, capsys):
    line = _error(capsys, "translate", str(runs["a"]), str(runs["c"]), "--input", str(small_corpus.test.src))
    assert f"{runs['a']} and {runs['c']} have different vocabularies" in line
    line = _error(capsys, "eval", str(runs["c"]), str(runs["a"]), "--src", str(small_corpus.test.src),
                  "--ref", str(small_corpus.test.tgt))
    assert f"{runs['c']} and {runs['a']} have different vocabularies" in line


def test_a_translation_model_and_a_language_model_are_refused(runs, small_corpus, tmp_path, capsys):
    # The language model's vocabulary, trained on the source side alone, differs: give it the translation
    # model's, so that the task is what is refused.
    from xspec.runtime import checkpoint as ckpt

    lm = ckpt.load_weights(ckpt.resolve(runs["lm"]))
    vocab = ckpt.load_weights(ckpt.resolve(runs["a"])).vocab_proto
    mixed = tmp_path / "lm.safetensors"
    ckpt.save_weights(mixed, lm.tensors, lm.spec_source, lm.params, vocab, lm.step)
    line = _error(capsys, "translate", str(runs["a"]), str(mixed), "--input", str(small_corpus.test.src))
    assert f"{runs['a']} is a translation model but {mixed} is a language model" in line


def test_the_run_arguments_of_translate_and_eval():
    from xspec.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["translate", "r1", "r2", "--beam", "2", "--input", "x"])
    assert args.models == ["r1", "r2"] and args.beam == 2 and args.input == "x"
    assert parser.parse_args(["eval", "r1", "--src", "s", "--ref", "t"]).models == ["r1"]
    assert parser.parse_args(["generate", "r1", "r2"]).models == ["r1", "r2"]


def test_language_models_generate_as_an_ensemble(runs, capsys):
    lm, lm2 = str(runs["lm"]), str(runs["lm2"])
    for how in (["--beam", "2"], ["--sample", "--seed", "4"]):
        argv = ["--prompt", "the", "--max-new-tokens", "6", *how]
        alone = _xspec(capsys, "generate", lm, *argv)
        assert alone[0] == 0 and alone[1] and _xspec(capsys, "generate", lm, lm, *argv) == alone
        code, out, _ = _xspec(capsys, "generate", lm, lm2, *argv)
        assert code == 0 and len(out.splitlines()) == 1
    line = _error(capsys, "generate", lm, str(runs["a"]), "--prompt", "the")
    assert "have different vocabularies" in line or "is a language model but" in line


def test_init_starts_a_new_run_from_a_runs_weights_and_vocabulary(runs, small_corpus, tmp_path):
    """`xspec train --init RUN` (fine-tuning): the run's spec, weights and sentencepiece model, kept in the new
    run where a resumed run finds them again."""
    from xspec.runtime import checkpoint as ckpt

    tuned = tmp_path / "tuned"
    text = ["--train", str(small_corpus.train.src), "--valid", str(small_corpus.valid.src)]
    _train("--init", str(runs["lm"]), "--set", "train.max_steps=1", *text, "--out", str(tuned))
    assert (tuned / "sentencepiece.model").read_bytes() == (runs["lm"] / "sentencepiece.model").read_bytes()
    start = ckpt.load_weights(ckpt.resolve(runs["lm"]))
    after = ckpt.load_weights(ckpt.resolve(tuned))
    assert after.step == 1 and after.params == start.params and after.vocab_proto == start.vocab_proto
    # one update from the run's weights, not from a fresh initialisation: every tensor moved only a little
    moved = max((after.tensors[n].float() - t.float()).abs().max().item() for n, t in start.tensors.items())
    assert 0 < moved < 0.1
    _train("--resume", str(tuned), "--set", "train.max_steps=2")
    assert ckpt.load_weights(ckpt.resolve(tuned)).step == 2
