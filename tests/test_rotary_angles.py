"""Rotary angles are made once and sliced by every forward (xspec/nn/rotary.py): a forward of a Llama
computes no cos or sin once its positions have been reached, its decoder makes them for all its layers
and passes them down, and the rotation is the one computed from the angles of the positions themselves."""

import pytest
import torch
from torch.overrides import TorchFunctionMode

import xspec
from float32 import assert_close
from xspec.nn import Attention, LinearRotaryEmbedding, RotaryEmbedding, YarnRotaryEmbedding
from xspec.runtime.cache import DecoderCache
from attention_pieces import turned


class TrigonometryCount(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (torch.cos, torch.sin, torch.Tensor.cos, torch.Tensor.sin):
            self.calls += 1
        return func(*args, **(kwargs or {}))


def test_a_forward_of_an_eight_layer_llama_computes_its_angles_once_for_every_layer():
    RotaryEmbedding.tables.clear()          # as in a new process
    spec = xspec.compile("specs/modern/llama.xspec", overrides={"layers": 8})
    model = spec.build("cpu").eval()
    tokens = torch.randint(4, 1000, (2, 24))
    with torch.no_grad(), TrigonometryCount() as first:
        model(tokens)
    with torch.no_grad(), TrigonometryCount() as again:
        model(tokens)
        cache = DecoderCache()
        model.decode(tokens[:, :20], cache=cache)
        model.decode(tokens[:, 20:21], cache=cache)
    assert first.calls == 2  # one cos and one sin, for every layer
    assert again.calls == 0
    embeddings = [name for name, module in model.named_modules() if isinstance(module, RotaryEmbedding)]
    assert embeddings == ["decoder.rotary_emb"]     # the decoder's, whose angles every layer reads


@pytest.mark.parametrize("path, stack", [("specs/modern/gemma3.xspec", "decoder"),
                                         ("specs/modern/modernbert.xspec", "encoder")])
def test_local_and_global_layers_read_the_two_bases_angles_the_stack_makes_once(path, stack):
    """Gemma 3 and ModernBERT: the stack makes the angles of both bases once a forward (two tables, a cos and
    a sin each), and each layer passes on its kind's; no layer holds an embedding of its own."""
    RotaryEmbedding.tables.clear()
    model = xspec.compile(path, overrides={"layers": 6}).build("cpu").eval()
    embeddings = [name for name, module in model.named_modules() if isinstance(module, RotaryEmbedding)]
    assert embeddings == [f"{stack}.rotary_emb", f"{stack}.rotary_emb_local"]
    tokens = torch.randint(4, 100, (2, 12))
    with torch.no_grad(), TrigonometryCount() as counted:
        model(tokens)
    assert counted.calls == 4


def test_attentions_with_embeddings_of_their_own_share_one_table():
    """The form older specs have (`rotary = true` on each attention): one table for all the layers."""
    RotaryEmbedding.tables.clear()
    source = open("specs/modern/llama.xspec").read().replace("position_embeddings = rope", "rotary = true")
    model = xspec.compile_source(source, "specs/modern/llama.xspec", overrides={"layers": 4}).build("cpu").eval()
    with torch.no_grad(), TrigonometryCount() as counted:
        model(torch.randint(4, 1000, (2, 24)))
    assert counted.calls == 2   # one table, the decoder's (unread here), for the four layers too
    tables = {module.turns.data_ptr() for module in model.modules() if isinstance(module, RotaryEmbedding)}
    assert len(tables) == 1


def test_the_kept_angles_turn_as_the_positions_own_do():
    RotaryEmbedding.tables.clear()          # no table of the same frequencies made before
    for rotary in (RotaryEmbedding(16, 10000.0), LinearRotaryEmbedding(16, 10000.0, 4.0),
                   YarnRotaryEmbedding(16, 10000.0, 4.0, 64, 32.0, 1.0, 1.2, True)):
        x = torch.randn(2, 3, 5, 16)
        turned(rotary, x, 0)  # angles for 5 positions
        for start in (0, 3, 7, 40):
            position = torch.arange(start, start + 5, dtype=torch.float32)
            angles = torch.outer(position, rotary.inverse_frequency).repeat(1, 2)
            scale = getattr(rotary, "attention_factor", 1.0)
            # cos and sin of the same angles, over tensors of other shapes: SIMD lanes may round apart
            expected = Attention.turned(x, torch.cat([angles.cos(), angles.sin()], dim=-1)[None] * scale)
            assert_close(turned(rotary, x, start), expected, rel=1e-6)
        assert rotary.turns.size(0) == 45  # 5, 10 (twice 5), 20 (twice 10), then 45 (past twice 20)


def test_while_traced_the_angles_are_those_of_the_table(monkeypatch):
    """torch.compile traces a forward with the angles computed in the graph (a table that grew would
    compile the step again): they turn as the table's do, for a slice of positions and for each row's."""
    for rotary in (RotaryEmbedding(16, 10000.0), YarnRotaryEmbedding(16, 10000.0, 4.0, 64, 32.0, 1.0, 1.2, True)):
        x = torch.randn(2, 3, 5, 16)
        rows = torch.tensor([[0, 0, 0, 1, 2], [3, 4, 5, 6, 7]])
        kept = turned(rotary, x, 3), turned(rotary, x, 3, rows)
        with monkeypatch.context() as traced:
            traced.setattr(torch.compiler, "is_compiling", lambda: True)
            grown = rotary.turns.size(0)
            assert_close(turned(rotary, x, 3), kept[0], rel=1e-6)
            assert_close(turned(rotary, x, 40), Attention.turned(x, rotary.angles(45)[None, 40:]), rel=1e-6)
            assert_close(turned(rotary, x, 3, rows), kept[1], rel=1e-6)
            assert rotary.turns.size(0) == grown    # the table is not touched while traced
