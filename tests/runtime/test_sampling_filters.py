"""Sampling's filters after top-k and top-p (min-p, typical, epsilon and eta) keep the tokens transformers'
warpers keep, alone and chained in transformers' order after the temperature, top-k and top-p; one token
at least is always kept, two in beam sampling (transformers' min_tokens_to_keep there)."""

import pytest
import torch

from xspec.runtime.sampling import Sampling, filtered_logits, filtered_probabilities

transformers = pytest.importorskip("transformers")


def transformers_probabilities(logits: torch.Tensor, sampling: Sampling, keep: int = 1) -> torch.Tensor:
    from transformers.generation import logits_process as lp

    warpers = [lp.TemperatureLogitsWarper(sampling.temperature)]
    if sampling.top_k is not None:
        warpers.append(lp.TopKLogitsWarper(sampling.top_k, min_tokens_to_keep=keep))
    if sampling.top_p < 1.0:
        warpers.append(lp.TopPLogitsWarper(sampling.top_p, min_tokens_to_keep=keep))
    if sampling.min_p is not None:
        warpers.append(lp.MinPLogitsWarper(sampling.min_p, min_tokens_to_keep=keep))
    if sampling.typical_p < 1.0:
        warpers.append(lp.TypicalLogitsWarper(sampling.typical_p, min_tokens_to_keep=keep))
    if sampling.epsilon_cutoff > 0:
        warpers.append(lp.EpsilonLogitsWarper(sampling.epsilon_cutoff, min_tokens_to_keep=keep))
    if sampling.eta_cutoff > 0:
        warpers.append(lp.EtaLogitsWarper(sampling.eta_cutoff, min_tokens_to_keep=keep))
    scores = logits.clone()
    ids = torch.zeros(logits.size(0), 1, dtype=torch.long)
    for warper in warpers:
        scores = warper(ids, scores)
    return scores.softmax(dim=-1)


SETTINGS = [
    Sampling(min_p=0.1), Sampling(min_p=0.9), Sampling(typical_p=0.5), Sampling(typical_p=0.95),
    Sampling(epsilon_cutoff=0.02), Sampling(epsilon_cutoff=0.5), Sampling(eta_cutoff=0.01), Sampling(eta_cutoff=0.3),
    Sampling(temperature=0.7, top_k=20, top_p=0.9, min_p=0.05, typical_p=0.9, epsilon_cutoff=0.001,
             eta_cutoff=0.002),
    Sampling(top_k=1), Sampling(top_p=0.01),
]


@pytest.mark.parametrize("keep", [1, 2])
@pytest.mark.parametrize("sampling", SETTINGS, ids=lambda s: ", ".join(
    f"{k}={v}" for k, v in vars(s).items() if v != Sampling.__dataclass_fields__[k].default))
def test_the_filters_keep_what_transformers_keeps(sampling, keep):
    torch.manual_seed(3)
    logits = torch.randn(6, 80) * torch.tensor([0.5, 1.0, 2.0, 3.0, 5.0, 8.0])[:, None]
    ours = filtered_logits(logits, sampling, never=(), keep=keep).softmax(dim=-1)
    theirs = transformers_probabilities(logits, sampling, keep)
    assert torch.equal(ours > 0, theirs > 0)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    assert (ours > 0).sum(dim=-1).min() >= keep
    if sampling.typical_p == 1.0:       # typical sampling keeps the most typical token, not the likeliest
        assert (ours.argmax(dim=-1) == logits.argmax(dim=-1)).all()


def test_a_filter_that_would_drop_everything_keeps_the_most_likely_token():
    logits = torch.tensor([[1.0, 1.1, 0.9, 1.05]])
    kept = filtered_probabilities(logits, Sampling(epsilon_cutoff=0.9), never=())
    assert kept[0].tolist() == [0.0, 1.0, 0.0, 0.0]
