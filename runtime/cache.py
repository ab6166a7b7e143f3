"""The cache incremental decoding keeps between steps, for a compiled model.

A generated model's attention reads and writes it through a small contract: `length` (positions decoded,
where the next step's positions start; the model's `decode` moves it on), `append(module, k, v, window)`
(a self-attention's new keys and values in, all it cached out, or the last `window` positions' for a
sliding window) and `memory` (an attention over the encoder output keeps that output's keys and values
there, once per memory tensor). A recurrent layer (a linear-attention or state space mixer) keeps a
state of fixed size instead: `state(module)` (the tensors it kept, or None before its first call) and
`keep(module, *tensors)` (its state after this call, each tensor [rows, ...], in place of the last); it
does not move `length`. Prompts of different lengths decode in one batch padded on the left, as
transformers' `generate` pads them: `padding` [rows] counts each row's leading positions that hold no
token, so row b's token at cache position p is at position p - padding[b]; `row_positions(new)` gives each
row's positions (rotary embeddings and position tables read them), `key_positions(window, new, device)` the
positions of the keys an attention of that window is handed, and `kept_keys(window, new)` those its queries may
see besides what causality and windows hide (not the padding's). Beam search moves the rows of all three with
`reorder`. In training, `PackedDocuments` stands in for it where
packed documents are kept apart: its `documents` say which document each position is of, its `kept_keys`
which positions may see which, and it caches nothing; a DecoderCache's `documents` is None. The contract is
xspec/nn/contracts.py's DecodingCache. Generated files do not hold the cache: they carry the model alone.
runtime/export.py implements the same contract over tensors for exported decoding steps.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from xspec.nn.contracts import CacheOwner, RecurrentMixer
from xspec.nn.convolution import ConvolvedMixer


class DecoderCache:
    """Self-attention's keys and values in buffers [rows, heads, capacity, d], written in place, whose
    capacity doubles when outgrown (a sliding window's stops at the window: a ring) and whose rows are
    gathered into a spare pair when beam search reorders them (no allocation per step); the encoder
    memory's keys and values; recurrent layers' states."""

    def __init__(self, capacity: int = 64, padding: torch.Tensor | None = None) -> None:
        self.length = 0            # positions decoded: where the next step's queries and keys start
        self.capacity = capacity   # positions each buffer holds at first
        self.tensors: dict[nn.Module, list[torch.Tensor]] = {}   # self-attention -> keys, values, 2 spares
        self.memory: dict[nn.Module, tuple] = {}   # encoder-decoder attention -> (key in, value in, keys, values)
        self.states: dict[nn.Module, tuple[torch.Tensor, ...]] = {}   # recurrent layer -> its state's tensors
        self.documents: torch.Tensor | None = None   # decoding continues one document a row
        self.padding = padding     # [rows] leading positions of each row that hold no token; None: none
        self.step = -1     # the length a padded batch's positions and masks were last made at
        self.made: dict[tuple, torch.Tensor] = {}   # them, for every layer of that forward
        self.rings: dict[int, int] = {}   # sliding window -> the positions its attentions' buffers hold

    def append(self, module: nn.Module, k: torch.Tensor, v: torch.Tensor,
               window: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Writes k, v [B, h, T, d] after the cached positions; returns the keys and values `module`
        attends to: all it cached, or, with a sliding `window`, those of the ring that holds it (`ring`)."""
        start, end, rows = self.length, self.length + k.size(2), k.size(0)
        needed, size = end, max(self.capacity, 2 * end)
        if window is not None:
            needed = size = self.ring_size(window, end)
        buffers = self.tensors.get(module)
        if buffers is None or needed > buffers[0].size(2):     # none yet, or outgrown
            grown = [t.new_empty(rows, t.size(1), size, t.size(3)) for t in (k, v, k, v)]
            for old, new in zip(buffers or [], grown[:2]):
                new[:, :, :start] = old[:rows, :, :start]
            buffers = self.tensors[module] = grown
        keys, values = buffers[0][:rows], buffers[1][:rows]     # the rows in use
        if window is not None:
            return self.ring(keys, values, k, v, window)
        keys[:, :, start:end], values[:, :, start:end] = k, v
        return keys[:, :, :end], values[:, :, :end]

    def ring(self, keys: torch.Tensor, values: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             window: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Writes k, v into a sliding-window attention's buffers, a ring holding position p in slot
        p % size. Returns the keys and values to attend: for one new position, the ring's filled slots
        (all within the new query's window, in slot order); for several, the cached positions the first
        new query sees, in order, then the new ones (the attention masks them by relative position)."""
        start, end, size = self.length, self.length + k.size(2), keys.size(2)
        if k.size(2) == 1:
            slot = start % size
            keys[:, :, slot:slot + 1], values[:, :, slot:slot + 1] = k, v
            return keys[:, :, :min(end, size)], values[:, :, :min(end, size)]
        seen = torch.arange(max(start - window + 1, 0), start, device=k.device) % size
        attend = torch.cat([keys[:, :, seen], k], dim=2), torch.cat([values[:, :, seen], v], dim=2)
        kept = torch.arange(max(start, end - size), end, device=k.device)     # the positions the ring keeps
        keys.index_copy_(2, kept % size, k[:, :, kept - start])
        values.index_copy_(2, kept % size, v[:, :, kept - start])
        return attend

    def ring_size(self, window: int, end: int) -> int:
        """The positions the buffers of a sliding `window`'s attentions hold once `end` positions are decoded:
        grown as another buffer grows (to twice what it must hold, at least `capacity`), up to the window. Every
        attention of that window holds as many, so a stack's mask knows their keys before they are appended."""
        size = self.rings.get(window, 0)
        if min(end, window) > size:
            size = self.rings[window] = min(max(self.capacity, 2 * end), window)
        return size

    def row_positions(self, new: int) -> torch.Tensor | None:
        """The positions [rows, new] of a forward's new tokens, each row's own (its padding's at 0); None where
        no row is padded: every row's start at `length`."""
        if self.padding is None:
            return None
        padding = self.padding
        return self._per_step(("rows", new), lambda: (self._steps(new)[None, :] - padding[:, None]).clamp(min=0))

    def kept_keys(self, window: int | None, new: int) -> torch.Tensor | None:
        """Which of the keys `append` returns to an attention of `window` for `new` positions its queries may
        see, in a padded batch [rows, 1, new, keys]: all but the padding's (a query of the padding sees every
        key: a row seeing none would be no number, and its output is never read). None where no row is padded."""
        if self.padding is None:
            return None
        padding = self.padding

        def kept() -> torch.Tensor:
            keys = self.key_positions(window, new, padding.device)
            padded_query = (self._steps(new)[None, :] < padding[:, None])[:, None, :, None]   # [rows, 1, new, 1]
            return (keys[None, :] >= padding[:, None])[:, None, None, :] | padded_query

        return self._per_step(("kept", new, window), kept)

    def _steps(self, new: int) -> torch.Tensor:
        assert self.padding is not None
        return torch.arange(self.length, self.length + new, device=self.padding.device)

    def _per_step(self, key: tuple, make: Callable[[], torch.Tensor]) -> torch.Tensor:
        """`make()`, made once a forward for all layers alike (`key`: what else it depends on)."""
        if self.step != self.length:
            self.step, self.made = self.length, {}
        if key not in self.made:
            self.made[key] = make()
        return self.made[key]

    def key_positions(self, window: int | None, new: int, device: torch.device) -> torch.Tensor:
        """The positions [keys] of those `append` returns to an attention of `window` for `new` positions
        (before the model's `decode` moves `length` on): all up to the new ones, or, with a sliding `window`,
        those `ring` returns: for one new position the ring's slots in order (slot s holds the last position p
        decoded with p % size == s), for several the positions the first new query sees, then the new ones."""
        start, end = self.length, self.length + new
        if window is None:
            return torch.arange(end, device=device)
        if new > 1:
            return torch.arange(max(start - window + 1, 0), end, device=device)
        size = self.ring_size(window, end)
        slots = torch.arange(min(end, size), device=device)
        return slots + size * torch.div(end - 1 - slots, size, rounding_mode="floor")

    def state(self, module: nn.Module) -> tuple[torch.Tensor, ...] | None:
        """The tensors a recurrent `module` kept with `keep` (its state after the positions decoded), or None
        where it has kept none yet (it starts from its zero state)."""
        return self.states.get(module)

    def keep(self, module: nn.Module, *tensors: torch.Tensor) -> None:
        """A recurrent `module`'s state after this call, each tensor [rows, ...]: it replaces the one kept, so
        the cache holds one state per module whatever the number of positions decoded."""
        self.states[module] = tensors

    def reorder(self, index: torch.Tensor) -> None:
        """Row i becomes row index[i] (rows may repeat, and drop out): gathered into the spares, which
        then swap with the buffers; a recurrent state's rows and the padding are gathered anew (small)."""
        if self.padding is not None:
            self.padding = self.padding.index_select(0, index)
            self.step = -1
        self.states = {module: tuple(t.index_select(0, index) for t in tensors)
                       for module, tensors in self.states.items()}
        rows = index.numel()
        for buffers in self.tensors.values():
            for i in (0, 1):
                if buffers[i + 2].size(0) < rows:   # more rows than ever: a larger spare
                    buffers[i + 2] = buffers[i].new_empty(rows, *buffers[i].shape[1:])
                filled = min(self.length, buffers[i].size(2))    # a ring holds its window only
                torch.index_select(buffers[i][:, :, :filled], 0, index, out=buffers[i + 2][:rows, :, :filled])
                buffers[i], buffers[i + 2] = buffers[i + 2], buffers[i]


class PackedDocuments:
    """What a training or validation forward passes as its `cache` where the documents packed into a block
    see nothing of each other (`data.document_boundaries = "separate"`): `documents` [B, T], the number of
    the document each position belongs to, by which attention masks the other documents' keys (`kept_keys`)
    and a recurrent layer starts each document from the zero state. It caches nothing: positions start at 0,
    keys and values come back as they went in, and no state is kept."""

    def __init__(self, documents: torch.Tensor) -> None:
        self.documents = documents
        self.length = 0
        self.memory: dict = {}
        self.own_documents: torch.Tensor | None = None   # made by the first layer that asks, for all

    def append(self, module: nn.Module, k: torch.Tensor, v: torch.Tensor,
               window: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        return k, v

    def row_positions(self, new: int) -> None:
        return None

    def key_positions(self, window: int | None, new: int, device: torch.device) -> torch.Tensor:
        return torch.arange(new, device=device)     # the new positions' own keys

    def kept_keys(self, window: int | None, new: int) -> torch.Tensor:
        """The keys each query may see [B, 1, T, T]: those of its own document; made once a forward."""
        if self.own_documents is None:
            documents = self.documents
            self.own_documents = (documents[:, :, None] == documents[:, None, :])[:, None]
        return self.own_documents

    def state(self, module: nn.Module) -> None:
        return None

    def keep(self, module: nn.Module, *tensors: torch.Tensor) -> None:
        pass


def document_numbers(tokens: torch.Tensor, start: int) -> torch.Tensor:
    """[B, T] tokens -> the number of the document each position belongs to: a document starts at the
    token `start` (runtime/documents.py: EOS, then its tokens), which counts as its own."""
    return (tokens == start).long().cumsum(-1)


def pads_rows(model: nn.Module) -> bool:
    """Whether `model` decodes prompts padded on the left in a DecoderCache: it brings no cache of its own,
    and no module keeps a recurrent state (whose update the padding would enter)."""
    return not isinstance(model, CacheOwner) and \
        not any(isinstance(module, (ConvolvedMixer, RecurrentMixer)) for module in model.modules())


def new_cache(model: Any, positions: int | None = None, padding: torch.Tensor | None = None) -> Any:
    """The cache to decode `model` with: the model's own where it brings one (`model.new_cache()`, as a
    wrapper or a hand-written model may), else a DecoderCache sized for `positions`, the most the decoding
    will write (`sized_for`; None: grown as needed), counting each row's left `padding`."""
    if isinstance(model, CacheOwner):
        if padding is not None:
            raise ValueError(f"{type(model).__name__} brings a cache of its own: its prompts are not padded")
        return model.new_cache()
    return DecoderCache(**({} if positions is None else {"capacity": sized_for(positions)}), padding=padding)


def sized_for(positions: int) -> int:
    """The capacity of buffers that hold `positions` without growing: one more, so a step's keys are never the
    whole buffer. A compiled step is then one graph for every length: torch.compile guards on the shapes a
    step sees, and both a buffer's growth and a slice that is the whole (contiguous) buffer compile it again,
    till its limit of recompilations turns compiling off."""
    return positions + 1
