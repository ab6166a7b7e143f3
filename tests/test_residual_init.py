"""GPT-2's scaled initialization (`train.residual_init = "depth"`): the weights that write into a residual
stream, found from the graph (compiler/residual.py), scaled by 1/sqrt(the stream's residual additions)."""

import math

import pytest
import torch

import xspec
from xspec.runtime.residual_init import scale_residual_writers


@pytest.mark.parametrize("spec, writers, additions", [
    ("specs/modern/llama.xspec", {"self_attn.o_proj.weight", "mlp.down_proj.weight"}, {"decoder": 4}),
    # PaLM's parallel block: both branches add to the stream at once
    ("specs/modern/palm_parallel.xspec", {"self_attn.o_proj.weight", "ffn.w_2.weight"}, {"decoder": 4}),
    # the paper's: the encoder's two sublayers a layer, the decoder's three
    ("specs/base.xspec", {"self_attn.o_proj.weight", "cross_attn.o_proj.weight", "ffn.w_2.weight"},
     {"encoder": 12, "decoder": 18}),
    # a shared expert beside the routed ones, and a recurrent mixer's output projection
    ("specs/modern/qwen3_next.xspec", {"linear_attn.out_proj.weight", "self_attn.o_proj.weight",
                                        "mlp.experts.down_proj", "mlp.shared_expert.down_proj.weight"},
     {"decoder": 8}),
    # sandwich norms: a norm ends each sublayer, so nothing writes into the stream unnormalized
    ("specs/modern/gemma3.xspec", set(), {}),
])
def test_the_writers_of_each_residual_stream_are_found(spec, writers, additions):
    found = xspec.compile(spec).residual_writers()
    assert {name.split(".", 3)[3] for name in found} == writers
    for name, factor in found.items():
        assert factor == pytest.approx(1 / math.sqrt(additions[name.split(".")[0]]))


def test_depth_scaling_scales_the_writers_alone():
    spec = xspec.compile("specs/modern/llama.xspec")
    torch.manual_seed(0)
    plain = spec.build("cpu")
    torch.manual_seed(0)
    scaled = spec.build("cpu")
    writers = spec.residual_writers()
    assert scale_residual_writers(scaled, writers) == \
        "residual init: 4 weights that write into a residual stream scaled by 0.5"
    for name, tensor in plain.state_dict().items():
        expected = tensor * writers[name] if name in writers else tensor
        assert torch.equal(scaled.state_dict()[name], expected), name
    assert "nothing scaled" in scale_residual_writers(plain, {})
