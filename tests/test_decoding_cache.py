"""Incremental decoding with the key/value cache gives the logits of a full decode."""

import pytest
import torch

import xspec
from float32 import assert_close
from xspec.runtime.cache import DecoderCache, new_cache, sized_for


@pytest.mark.parametrize("overrides", [{}, {"norm_first": True, "positions": "learned"}])
@torch.no_grad()
def test_cached_steps_match_full_decode(overrides):
    torch.manual_seed(0)
    spec = xspec.compile("specs/tiny.xspec", overrides=overrides)
    model = spec.build(device="cpu").eval()
    src = torch.randint(0, spec.vocab_size, (2, 9))
    src_pad = torch.zeros(2, 9, dtype=torch.bool)
    src_pad[0, 6:] = True
    tgt = torch.randint(0, spec.vocab_size, (2, 6))
    memory = model.encode(src, src_pad)
    full = model.decode(tgt, memory, src_pad)

    cache = DecoderCache()
    steps = [model.decode(tgt[:, t:t + 1], memory, src_pad, cache=cache) for t in range(tgt.size(1))]
    assert_close(torch.cat(steps, dim=1), full)
    assert cache.length == 6


@torch.no_grad()
def test_cache_reorder_follows_beam_rows():
    torch.manual_seed(0)
    spec = xspec.compile("specs/tiny.xspec")
    model = spec.build(device="cpu").eval()
    src = torch.randint(0, spec.vocab_size, (2, 5))
    tgt = torch.randint(0, spec.vocab_size, (2, 4))
    memory = model.encode(src)
    cache = DecoderCache()
    model.decode(tgt[:, :3], memory, cache=cache)  # a prefix in one call
    order = torch.tensor([1, 1, 0])  # beam search keeps row 1 twice and row 0 once
    cache.reorder(order)
    step = model.decode(tgt[order, 3:4], memory[order], cache=cache)
    full = model.decode(tgt[order], memory[order])
    assert_close(step[:, 0], full[:, 3])


@torch.no_grad()
def test_language_model_decodes_incrementally():
    torch.manual_seed(0)
    spec = xspec.compile("specs/lm.xspec")
    assert not spec.has_encoder
    model = spec.build(device="cpu").eval()
    tokens = torch.randint(0, spec.vocab_size, (2, 7))
    full = model(tokens)
    assert full.shape == (2, 7, spec.vocab_size)
    cache = DecoderCache()
    steps = [model.decode(tokens[:, t:t + 1], cache=cache) for t in range(7)]
    assert_close(torch.cat(steps, dim=1), full)


@torch.no_grad()
@pytest.mark.parametrize("path", ["specs/tiny.xspec", "specs/modern/llama.xspec"])
def test_cached_decoding_equals_full_decoding_after_random_reorders(path: str):
    """Rows repeat and drop out as in beam search, and the buffers outgrow their first capacity."""
    torch.manual_seed(0)
    spec = xspec.compile(path)
    model = spec.build(device="cpu").eval()
    tokens = torch.randint(0, spec.vocab_size, (3, 1))  # [rows, positions so far]
    memory = model.encode(torch.randint(0, spec.vocab_size, (3, 5))) if spec.has_encoder else None
    context = (memory,) if memory is not None else ()
    cache = DecoderCache()
    cache.capacity = 2
    model.decode(tokens, *context, cache=cache)
    for rows in ([2, 0, 0, 1], [3, 1], [0, 0, 1], [2, 1, 0], [1, 1, 0, 2, 2], [4, 0]):
        index = torch.tensor(rows)
        cache.reorder(index)
        tokens = torch.cat([tokens[index], torch.randint(0, spec.vocab_size, (len(rows), 1))], dim=1)
        context = (context[0][index],) if context else ()
        step = model.decode(tokens[:, -1:], *context, cache=cache)
        full = model.decode(tokens, *context)
        assert_close(step[:, 0], full[:, -1])


def test_decoding_uses_the_runtime_cache_unless_a_model_brings_its_own():
    spec = xspec.compile("specs/tiny.xspec")
    model = spec.build(device="cpu")
    assert "class DecoderCache" not in spec.python_source and not hasattr(model, "new_cache")
    assert isinstance(new_cache(model), DecoderCache) and isinstance(xspec.DecoderCache(), DecoderCache)

    class Own(torch.nn.Module):
        def new_cache(self):
            return "its own"

    assert new_cache(Own()) == "its own"
    with pytest.raises(ValueError, match="brings a cache of its own"):
        new_cache(Own(), padding=torch.zeros(2, dtype=torch.long))    # padded rows need the runtime's


@torch.no_grad()
def test_a_cache_sized_for_its_positions_never_grows_nor_hands_out_a_whole_buffer():
    """What a compiled step needs to stay one graph (runtime/cache.py's sized_for): the buffers are made once,
    and the keys a step attends to are never all of one."""
    spec = xspec.compile("specs/modern/llama.xspec", overrides={"layers": 1})
    model = spec.build(device="cpu").eval()
    tokens = torch.randint(0, spec.vocab_size, (2, 70))     # past the default first capacity (64)
    cache = new_cache(model, positions=70)
    model.decode(tokens[:, :6], cache=cache)
    buffers = [t.data_ptr() for t in next(iter(cache.tensors.values()))]
    steps = [model.decode(tokens[:, t:t + 1], cache=cache) for t in range(6, 70)]
    assert [t.data_ptr() for t in next(iter(cache.tensors.values()))] == buffers
    assert next(iter(cache.tensors.values()))[0].size(2) == sized_for(70) == 71
    assert_close(torch.cat(steps, dim=1), model.decode(tokens)[:, 6:])
