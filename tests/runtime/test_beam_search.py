"""Beam search against brute-force enumeration, cached against uncached decoding, greedy."""

import itertools

import pytest
import torch

from xspec.runtime.beam_search import beam_search, length_penalty
from xspec.runtime.vocab import BOS, EOS, PAD

from toy_spec import ToyTransformer

VOCAB = 6        # PAD, UNK, BOS, EOS and two words: the hypotheses can use UNK and the two words


def _model(seed: int) -> ToyTransformer:
    torch.manual_seed(seed)
    model = ToyTransformer(VOCAB, d_model=16).eval()
    with torch.no_grad():       # sharpen the random model so hypotheses differ clearly
        model.out.weight.mul_(4.0)
    return model


def _sources() -> tuple[torch.Tensor, torch.Tensor]:
    src = torch.tensor([[4, 5, 1, EOS], [5, EOS, PAD, PAD], [4, 4, EOS, PAD]])
    return src, src == PAD


@torch.no_grad()
def _brute_force(model, src, src_padding, max_len: int, alpha: float) -> tuple[list[int], float]:
    """Scores every output of up to `max_len` tokens (EOS included) with a full, uncached decode."""
    memory = model.encode(src[None], src_padding[None])
    words = [t for t in range(VOCAB) if t not in (PAD, BOS, EOS)]
    best = (None, float("-inf"))
    for n in range(max_len):
        for body in itertools.product(words, repeat=n):
            sequence = [BOS, *body, EOS]
            logits = model.decode(torch.tensor([sequence[:-1]]), memory, src_padding[None])
            logp = torch.log_softmax(logits[0].float(), -1).gather(1, torch.tensor(sequence[1:])[:, None]).sum()
            score = float(logp) / length_penalty(n + 1, alpha)
            if score > best[1]:
                best = (list(body), score)
    return best


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
@pytest.mark.parametrize("seed", [0, 1])
def test_exhaustive_beam_matches_brute_force(seed, alpha):
    model = _model(seed)
    src, src_padding = _sources()
    max_len = 4     # every output has at most 4 tokens: 3^3 prefixes alive at most, so beam 32 prunes nothing
    results = beam_search(model, src, src_padding, beam=32, alpha=alpha, max_len_a=0.0, max_len_b=max_len)
    for i in range(src.size(0)):
        tokens, score = _brute_force(model, src[i], src_padding[i], max_len, alpha)
        assert results[i][0].tokens == tokens
        assert results[i][0].score == pytest.approx(score, abs=1e-5)


def test_cached_and_uncached_decoding_agree():
    model = _model(3)
    src, src_padding = _sources()
    kwargs = dict(beam=4, alpha=0.6, max_len_a=1.0, max_len_b=5, nbest=4)
    cached = beam_search(model, src, src_padding, use_cache=True, **kwargs)
    uncached = beam_search(model, src, src_padding, use_cache=False, **kwargs)
    for a, b in zip(cached, uncached):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)


def test_nbest_is_sorted_and_distinct():
    model = _model(4)
    src, src_padding = _sources()
    results = beam_search(model, src, src_padding, beam=4, alpha=0.6, max_len_a=1.0, max_len_b=5, nbest=4)
    for hyps in results:
        assert len(hyps) == 4
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.tokens) for h in hyps}) == 4


@torch.no_grad()
def test_beam_one_is_greedy_argmax():
    model = _model(5)
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
    model = _model(6)
    with torch.no_grad():       # a model that never wants to stop
        model.out.bias[EOS] = -1e4
    src, src_padding = _sources()
    results = beam_search(model, src, src_padding, beam=2, alpha=0.6, max_len_a=1.0, max_len_b=3)
    lengths = (~src_padding).sum(1).tolist()
    for hyps, n in zip(results, lengths):
        assert len(hyps[0].tokens) + 1 == n + 3       # |Y| with EOS = input length + b
