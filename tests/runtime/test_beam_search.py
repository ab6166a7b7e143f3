"""Beam search against brute-force enumeration, cached against uncached decoding, greedy."""

import itertools
from pathlib import Path

import pytest
import torch

import xspec

from xspec.runtime.beam_search import beam_search, length_penalty
from xspec.runtime.vocab import BOS, EOS, PAD

from toy_spec import ToyTransformer

VOCAB = 8        # PAD, UNK, BOS, EOS and four words: the hypotheses can use UNK and the four words


def _toy(seed: int) -> ToyTransformer:
    torch.manual_seed(seed)
    model = ToyTransformer(VOCAB, d_model=16).eval()
    with torch.no_grad():       # sharpen the random model so hypotheses differ clearly
        model.out.weight.mul_(4.0)
    return model


def _compiled(seed: int):
    """specs/tiny.xspec, shrunk: the real generated model with its key/value cache."""
    spec = xspec.compile(str(Path(__file__).resolve().parents[2] / "specs" / "tiny.xspec"),
                         overrides={"vocab": VOCAB, "d_model": 16, "d_ff": 32, "heads": 2, "layers": 2,
                                    "tie_embeddings": False})
    torch.manual_seed(seed)
    model = spec.build(device="cpu").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(2.0)
    return model


MODELS = {"toy": _toy, "tiny.xspec": _compiled}


def _sources() -> tuple[torch.Tensor, torch.Tensor]:
    src = torch.tensor([[4, 5, 1, EOS], [7, EOS, PAD, PAD], [6, 4, EOS, PAD]])
    return src, src == PAD


@torch.no_grad()
def _brute_force(model, src, src_padding, max_len: int, alpha: float) -> tuple[list[int], float]:
    """Scores every output of up to `max_len` tokens (EOS included) with full, uncached decodes
    (one batch per output length)."""
    memory = model.encode(src[None], src_padding[None])
    words = [t for t in range(VOCAB) if t not in (PAD, BOS, EOS)]
    best = (None, float("-inf"))
    for n in range(max_len):
        bodies = list(itertools.product(words, repeat=n))
        inputs = torch.tensor([[BOS, *body] for body in bodies])                   # [N, n + 1]
        targets = torch.tensor([[*body, EOS] for body in bodies])                  # [N, n + 1]
        logits = model.decode(inputs, memory.expand(len(bodies), -1, -1), src_padding[None].expand(len(bodies), -1))
        logp = torch.log_softmax(logits.float(), -1).gather(2, targets[:, :, None]).sum(dim=(1, 2))   # [N]
        scores = logp / length_penalty(n + 1, alpha)
        i = int(scores.argmax())
        if float(scores[i]) > best[1]:
            best = (list(bodies[i]), float(scores[i]))
    return best


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("kind", MODELS)
def test_exhaustive_beam_matches_brute_force(kind, seed, alpha):
    model = MODELS[kind](seed)
    src, src_padding = _sources()
    max_len = 4     # every output has at most 4 tokens: 5^3 prefixes alive at most, so beam 125 prunes nothing
    results = beam_search(model, src, src_padding, beam=125, alpha=alpha, max_len_a=0.0, max_len_b=max_len)
    for i in range(src.size(0)):
        tokens, score = _brute_force(model, src[i], src_padding[i], max_len, alpha)
        assert results[i][0].tokens == tokens
        # float32 scores of ~10 summed in a different order: equal to float32's relative precision
        assert results[i][0].score == pytest.approx(score, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("kind", MODELS)
def test_cached_and_uncached_decoding_agree(kind):
    model = MODELS[kind](3)
    src, src_padding = _sources()
    kwargs = dict(beam=4, alpha=0.6, max_len_a=1.0, max_len_b=5, nbest=4)
    cached = beam_search(model, src, src_padding, use_cache=True, **kwargs)
    uncached = beam_search(model, src, src_padding, use_cache=False, **kwargs)
    for a, b in zip(cached, uncached):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], rel=1e-5, abs=1e-6)


def test_nbest_is_sorted_and_distinct():
    model = _toy(4)
    src, src_padding = _sources()
    results = beam_search(model, src, src_padding, beam=4, alpha=0.6, max_len_a=1.0, max_len_b=5, nbest=4)
    for hyps in results:
        assert len(hyps) == 4
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.tokens) for h in hyps}) == 4


@torch.no_grad()
def test_beam_one_is_greedy_argmax():
    model = _toy(5)
    src, src_padding = _sources()
    results = beam_search(model, src, src_padding, beam=1, alpha=0.6, max_len_a=0.0, max_len_b=8)
    for i in range(src.size(0)):
        memory = model.encode(src[i : i + 1], src_padding[i : i + 1])
        tokens = [BOS]
        while len(tokens) <= 8:
            logits = model.decode(torch.tensor([tokens]), memory, src_padding[i : i + 1])[0, -1]
            logits[[PAD, BOS]] = float("-inf")
            if len(tokens) == 8:
                break
            tokens.append(int(logits.argmax()))
            if tokens[-1] == EOS:
                break
        body = [t for t in tokens[1:] if t != EOS]
        assert results[i][0].tokens == body


def test_maximum_length_is_input_length_plus_b():
    model = _toy(6)
    with torch.no_grad():       # a model that never wants to stop
        model.out.bias[EOS] = -1e4
    src, src_padding = _sources()
    results = beam_search(model, src, src_padding, beam=2, alpha=0.6, max_len_a=1.0, max_len_b=3)
    lengths = (~src_padding).sum(1).tolist()
    for hyps, n in zip(results, lengths):
        assert len(hyps[0].tokens) + 1 == n + 3       # |Y| with EOS = input length + b


def test_a_length_penalty_past_a_floats_range_scores_without_failing():
    """alpha 1e300: ((5 + |Y|) / 6)^alpha is infinite, as a tensor's power makes it, not an OverflowError."""
    assert length_penalty(2, 1e300) == float("inf")
    model = _toy(7)
    src, src_padding = _sources()
    results = beam_search(model, src, src_padding, beam=2, alpha=1e300, max_len_a=0.0, max_len_b=4)
    assert [len(hyps) for hyps in results] == [1, 1, 1]
