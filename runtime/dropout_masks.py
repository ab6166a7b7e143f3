"""Dropout's masks on a CPU from a counter-based hash, not from torch's sequential generator.

`F.dropout` in training keeps each element with probability 1 - p and scales the kept by 1 / (1 - p). On a
CPU torch draws its mask with `bernoulli_`, element after element from one Mersenne Twister on one thread:
3.3 ms for a [4096 x 128] activation on a 2-core AMD Zen 4, a tenth of a small model's training step
(docs/runtime.md). Under `HashedDropout` the mask of element i is a 32-bit hash of i mixed with a seed drawn
once per call from torch's generator, kept where the hash is at least p of the way through its range: a few
integer operations over the whole tensor, vectorized and on every thread. The masks follow the generator
(train.seed, and the trainer's seeding of each update, so a resumed run draws them again) as torch's do;
they are other draws than torch's sampler would make.

The hash is lowbias32 (Chris Wellons' integer hash prospector: two rounds of xor-shift and multiply, a
measured bias of 0.17), applied twice: once to the element's index within a chunk of CHUNK elements (kept),
once to that value xor the chunk's seed (the call's, and for each further chunk the next of a Weyl sequence
from it), so that two calls' or chunks' masks are unrelated bit patterns (tests check the keep rate, and the
independence of neighbours, chunks and calls). A mask is made chunk by chunk: what it holds besides the bool
mask itself is two chunks of int32, whatever the tensor's size.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import ContextManager

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from xspec.nn.attention import WrittenOutAttention

_ROUNDS = ((16, 0x7FEB352D), (15, 0x846CA68B - (1 << 32)))   # (shift, factor) of lowbias32, factors as int32
_LAST_SHIFT = 16
CHUNK = 1 << 20       # elements hashed at a time: 4 MiB of int32, within a core's share of the cache
_WEYL = 0x9E3779B9    # the step between chunks' seeds (2^32 / the golden ratio, odd)


def mix(h: torch.Tensor) -> torch.Tensor:
    """lowbias32 of each element of the int32 tensor `h`, in place: products wrap around as unsigned ones
    would, and each right shift is made logical by masking off the sign's copies."""
    shifted = torch.empty_like(h)
    for shift, factor in _ROUNDS:
        torch.bitwise_right_shift(h, shift, out=shifted)
        h.bitwise_xor_(shifted.bitwise_and_((1 << (32 - shift)) - 1)).mul_(factor)
    torch.bitwise_right_shift(h, _LAST_SHIFT, out=shifted)
    return h.bitwise_xor_(shifted.bitwise_and_((1 << (32 - _LAST_SHIFT)) - 1))


class HashedDropout(TorchFunctionMode):
    """`F.dropout(x, p, training=True)` of a CPU tensor as x * keep / (1 - p), keep[i] = hash(key[i] ^ seed) >=
    p's share of the int32 range, the seed one draw of torch's generator. Dropout out of training, with p of
    0 or 1, in place, off the CPU or while torch.compile traces is torch's own."""

    def __init__(self) -> None:
        super().__init__()
        self.keys = mix(torch.arange(CHUNK, dtype=torch.int32))   # each chunk's elements' keys: a prefix

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.dropout or torch.compiler.is_compiling():
            return func(*args, **kwargs)
        x, p, training, inplace = _dropout_arguments(*args, **kwargs)
        if not training or inplace or not 0.0 < p < 1.0 or x.device.type != "cpu" or not x.is_floating_point():
            return func(*args, **kwargs)
        return x * self.kept(x.shape, p).to(x.dtype).mul_(1.0 / (1.0 - p))

    def kept(self, shape: torch.Size, p: float) -> torch.Tensor:
        """A bool mask of `shape`, each element True with probability 1 - p (to within 2^-32)."""
        kept = torch.empty(shape.numel(), dtype=torch.bool)
        # The hashes are uniform over the int32 range; a p within 2^-33 of 1 keeps one hash in 2^32.
        threshold = min(round(p * (1 << 32)) - (1 << 31), (1 << 31) - 1)
        seed = int(torch.randint(0, 1 << 32, ()))
        for start in range(0, kept.numel(), CHUNK):
            end = min(start + CHUNK, kept.numel())
            chunk_seed = (seed + start // CHUNK * _WEYL) % (1 << 32) - (1 << 31)   # as an int32
            hashed = mix(torch.bitwise_xor(self.keys[:end - start], chunk_seed))
            torch.ge(hashed, threshold, out=kept[start:end])
        return kept.view(shape)


def dropout_masks(device: torch.device, model: nn.Module) -> ContextManager:
    """The context a training pass of `model` on `device` draws dropout's masks in: HashedDropout on a CPU
    where the model drops anything, torch's own sampler elsewhere (a GPU's is counter-based and parallel
    already). A torch function mode costs every torch call of a pass a Python call (2% of a dropout-free
    Llama's step), so a model that draws no mask gets none."""
    return HashedDropout() if device.type == "cpu" and draws_masks(model) else nullcontext()


def draws_masks(model: nn.Module) -> bool:
    """Whether `model` calls `F.dropout` with a rate above 0: through nn.Dropout (generated files, LoRA's
    adapters) or on attention weights written out (WrittenOutAttention)."""
    return any(isinstance(module, nn.Dropout) and module.p > 0
               or isinstance(module, WrittenOutAttention) and module.dropout > 0 for module in model.modules())


def _dropout_arguments(input: torch.Tensor, p: float = 0.5, training: bool = True,
                       inplace: bool = False) -> tuple[torch.Tensor, float, bool, bool]:
    """`F.dropout`'s arguments, however they were passed."""
    return input, p, training, inplace
