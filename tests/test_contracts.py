"""The runtime finds what it needs of a model by type (xspec/nn/contracts.py): the mixtures that route, the
multi-token prediction depths, the recurrent mixers, a model's own cache; a hand-written module meets a
contract by having its methods."""

from pathlib import Path

import torch
import torch.nn as nn

import xspec
from xspec.nn import CachedDecoder, DecodingCache, MultiTokenPrediction, RecurrentMixer, RoutedMixture
from xspec.runtime.cache import DecoderCache, PackedDocuments, new_cache
from xspec.runtime.export import TensorCache
from xspec.runtime.load_balance import corrected_mixtures, load_balancing_loss, routing_modules
from xspec.runtime.multi_token import prediction_depths
from xspec.runtime.speculative import can_draft

MODERN = Path(__file__).resolve().parent.parent / "specs" / "modern"


def _built(name: str, **overrides) -> nn.Module:
    torch.manual_seed(0)
    return xspec.compile(str(MODERN / f"{name}.xspec"), overrides=overrides).build()


def test_a_deepseek_model_shows_its_mixtures_and_depths_by_type():
    model = _built("deepseek_v3", mtp_depth=2)
    assert isinstance(model.mtp, MultiTokenPrediction) and prediction_depths(model) is model.mtp
    assert len(model.mtp) == 2
    mixtures = routing_modules(model)
    assert mixtures and all(isinstance(m, RoutedMixture) for m in mixtures)
    # every mixture of deepseek_v3 routes with a corrected router; none has routed before a forward
    assert corrected_mixtures(model) == mixtures
    assert all(m.last_routing() is None for m in mixtures)
    model(torch.randint(0, 100, (2, 5)))
    chosen, probabilities = mixtures[0].last_routing()
    assert chosen.shape[0] == 10 and probabilities.shape == (10, mixtures[0].load_correction().numel())


def test_models_without_depths_or_corrections_have_none():
    llama, mixtral = _built("llama"), _built("mixtral")
    assert prediction_depths(llama) is None and routing_modules(llama) == []
    assert routing_modules(mixtral) and corrected_mixtures(mixtral) == []
    assert prediction_depths(_built("deepseek_v3", mtp_depth=0)) is None


def test_drafting_is_refused_for_a_recurrent_mixer():
    hybrid = _built("qwen3_next")
    assert any(isinstance(m, RecurrentMixer) for m in hybrid.modules())
    assert not can_draft(hybrid) and can_draft(_built("deepseek_v3"))


def test_every_cache_of_the_runtime_meets_the_decoding_contract():
    documents = torch.zeros(1, 3, dtype=torch.long)
    caches = [DecoderCache(), PackedDocuments(documents), TensorCache([], [torch.zeros(1, 1, 0, 2)], [], {})]
    assert all(isinstance(cache, DecodingCache) for cache in caches)
    assert [cache.documents is None for cache in caches] == [True, False, True]


def test_a_hand_written_model_meets_the_contracts_by_its_methods():
    class OwnCache(DecoderCache):
        pass

    class HandWritten(nn.Module):
        def decode(self, tgt_tokens, cache=None):
            return torch.zeros(*tgt_tokens.shape, 7)

        def new_cache(self):
            return OwnCache()

    class Routing(nn.Module):
        def last_routing(self):
            return torch.tensor([[0], [0], [1], [0]]), torch.full((4, 2), 0.5)

        def load_correction(self):
            return None

    model = HandWritten()
    model.mixture = Routing()
    assert isinstance(model, CachedDecoder) and isinstance(new_cache(model), OwnCache)
    assert isinstance(new_cache(nn.Linear(2, 2)), DecoderCache)
    # 2 experts, f = (3/4, 1/4), P = (1/2, 1/2): 2 * (3/8 + 1/8) = 1
    assert torch.allclose(load_balancing_loss(model), torch.tensor(1.0))
