"""Decoding through torch.compile, as `--compile on` loads a model: the runtime sizes its cache for the
whole decoding and rotary angles are computed in the graph, so a compiled step is one graph at every
length (a cache that grew, or a rotary table, compiled it again at each growth, till torch's limit of
recompilations left the step uncompiled); and a later compile reads the code from torch's cache. One test:
compiling takes tens of seconds on a CPU."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

import xspec
from xspec.runtime.beam_search import continue_prompts
from xspec.runtime.cache import new_cache
from xspec.runtime.compile_choice import compiled
from xspec.runtime.sampling import sample
from xspec.runtime.vocab import BOS, EOS, PAD


@torch.no_grad()
def test_a_compiled_decoder_is_two_graphs_at_any_length_and_decodes_as_eager():
    spec = xspec.compile("specs/modern/llama.xspec", overrides={
        "layers": 1, "d_model": 32, "heads": 2, "kv_heads": 1, "d_ff": 64, "vocab": 100})
    torch.manual_seed(0)
    model = spec.build("cpu").eval()
    prompts = torch.randint(3, 100, (2, 5))
    never = (PAD, BOS, EOS)     # no continuation ends early: each runs past the first 64 positions
    eager_beams = continue_prompts(model, prompts, 2, 0.6, 20, never=never)
    eager = model.decode
    model.decode = compiled(model.decode, dynamic=True)     # as runtime/inference.py's load does
    graphs = counters["stats"]["unique_graphs"]
    continued = sample(model, prompts, 80, None, never=never)
    assert counters["stats"]["unique_graphs"] - graphs == 2      # the prompt's, and one step's for all
    assert [row[:80] for row in sample(model, prompts, 150, None, never=never)] == continued
    assert counters["stats"]["unique_graphs"] - graphs == 2      # a longer decoding compiles nothing new

    # Step by step along the continuations, the compiled steps give the eager model's logits (greedy tokens
    # are not compared with eager's: the compiler may round a near tie the other way).
    tokens = torch.cat([prompts, torch.tensor(continued)], dim=1)
    cache = new_cache(model, tokens.size(1))
    steps = [model.decode(prompts, cache=cache)[:, -1:]]
    steps += [model.decode(tokens[:, t:t + 1], cache=cache) for t in range(5, tokens.size(1) - 1)]
    expected = eager(tokens[:, :-1])[:, 4:]
    torch.testing.assert_close(torch.cat(steps, dim=1), expected, rtol=1e-4, atol=1e-4 * expected.abs().max().item())
    beams = continue_prompts(model, prompts, 2, 0.6, 20, never=never)
    for found, alike in zip(beams, eager_beams):     # the best scores alike, whichever of a near tie won
        assert found[0].score == pytest.approx(alike[0].score, rel=1e-4)

    # As a later run would: Dynamo traces again, and the compiled code is read from torch's cache on disk.
    torch._dynamo.reset()
    model.decode = compiled(eager, dynamic=True)
    hits = counters["inductor"]["fxgraph_cache_hit"]
    assert sample(model, prompts, 80, None, never=never) == continued
    assert counters["inductor"]["fxgraph_cache_hit"] - hits == 2
