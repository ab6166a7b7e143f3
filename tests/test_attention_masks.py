"""The masks a stack makes once a forward (AttentionMask, the `attention_mask` op) say what each attention's own
rule says: whole sequences, packed documents, and decoding padded rows past a sliding window (the ring's keys
in their order), a prompt and several tokens at once included; and the generated code of a stack passes them."""

from __future__ import annotations

import pytest
import torch

import xspec
from float32 import assert_close
from xspec.nn import Attention, AttentionMask
from xspec.runtime.cache import DecoderCache, PackedDocuments


@pytest.mark.parametrize("causal, window", [(True, None), (True, 3), (False, 3), (False, None)])
@torch.no_grad()
def test_a_stacks_mask_gives_what_the_attentions_own_rule_gives(causal, window):
    torch.manual_seed(0)
    attention = Attention(16, 2, 2, 8, 8, bias=False, out_bias=False, causal=causal, window=window).eval()
    masks = AttentionMask(causal=causal, window=window)
    x = torch.randn(3, 9, 16)
    documents = PackedDocuments(torch.tensor([[0] * 4 + [1] * 5, [0] * 9, [0] * 2 + [1] * 3 + [2] * 4]))
    for cache in (None, documents):
        assert_close(attention(x, x, x, cache=cache, attention_mask=masks(x, cache)), attention(x, x, x, cache=cache))
    if not causal:
        return
    # decoding rows padded on the left: a prompt, one token at a time past the window, then several at once,
    # the buffers grown from a capacity of 2 (a sliding window's ring, its keys out of order)
    padding = torch.tensor([0, 2, 4])
    own, stacks = DecoderCache(capacity=2, padding=padding), DecoderCache(capacity=2, padding=padding)
    for start, end in [(0, 5), (5, 6), (6, 7), (7, 8), (8, 9)] + [(0, 1), (1, 4), (4, 5), (5, 9)]:
        if start == 0:
            own, stacks = DecoderCache(capacity=2, padding=padding), DecoderCache(capacity=2, padding=padding)
        part = x[:, start:end]
        mask = masks(part, stacks)
        assert_close(attention(part, part, part, cache=stacks, attention_mask=mask),
                     attention(part, part, part, cache=own))
        own.length = stacks.length = end


@torch.no_grad()
def test_where_nothing_but_causality_hides_a_key_no_mask_is_made():
    """A whole sequence's causal mask is SDPA's own, and one new position sees every key its cache hands it."""
    x = torch.zeros(2, 5, 4)
    assert AttentionMask()(x) is None
    assert AttentionMask(window=2)(x[:, :1], cache=DecoderCache()) is None
    assert AttentionMask(causal=False)(x) is None
    band = AttentionMask(window=2)(x)
    assert band is not None and band[0, 0].tolist() == [[j <= i and i - j < 2 for j in range(5)] for i in range(5)]


def test_a_stack_passes_its_masks_to_the_layers_of_their_kind():
    """Gemma 2: the stack makes a causal mask and a sliding window's, and each layer's attention reads its
    kind's, as transformers' Gemma2Model passes `causal_mask_mapping[layer.attention_type]`."""
    source = xspec.compile("specs/modern/gemma2.xspec").python_source
    assert "        self.causal_mask = AttentionMask()  # gemma2.xspec:46\n" in source
    assert "        self.sliding_mask = AttentionMask(window=config.sliding_window)  # gemma2.xspec:47\n" in source
    assert "attention_mask=sliding_mask if self.layer_type == 'sliding_attention' else mask)" in source
    assert "            x = layer(x, rope, mask, sliding_mask, cache=cache)" in source
