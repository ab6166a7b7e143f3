"""A small stand-in for a compiled spec, implementing docs/model-interface.md with torch.nn.Transformer.

The runtime tests use it where they must not depend on the compiler (beam search against brute force,
batching, checkpoints). End-to-end tests use the real `specs/tiny.xspec`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
from torch import nn

from xspec.compiler.sections import DataSection, DecodeSection, TrainSection


class PrefixCache:
    """Keeps the tokens decoded so far; `decode` recomputes from them (slow, but exactly the interface)."""

    def __init__(self) -> None:
        self.tokens: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.tokens is None else self.tokens.size(1)

    def reorder(self, rows: torch.Tensor) -> None:
        if self.tokens is not None:
            self.tokens = self.tokens[rows]


class ToyTransformer(nn.Module):
    def __init__(self, vocab: int, d_model: int = 32, layers: int = 1, heads: int = 2,
                 dropout: float = 0.0, max_positions: int = 128) -> None:
        super().__init__()
        self.d_model = d_model
        self.embed = nn.Embedding(vocab, d_model)
        self.positions = nn.Embedding(max_positions, d_model)
        self.transformer = nn.Transformer(d_model, heads, layers, layers, 2 * d_model, dropout, batch_first=True)
        self.out = nn.Linear(d_model, vocab)

    def _embed(self, tokens: torch.Tensor, start: int = 0) -> torch.Tensor:
        positions = torch.arange(start, start + tokens.size(1), device=tokens.device)
        return self.embed(tokens) * math.sqrt(self.d_model) + self.positions(positions)

    def encode(self, src: torch.Tensor, src_padding: torch.Tensor) -> torch.Tensor:
        return self.transformer.encoder(self._embed(src), src_key_padding_mask=src_padding)

    def decode(self, tgt: torch.Tensor, memory: torch.Tensor, memory_padding: torch.Tensor,
               cache: PrefixCache | None = None) -> torch.Tensor:
        new = tgt.size(1)
        if cache is not None:
            cache.tokens = tgt if cache.tokens is None else torch.cat([cache.tokens, tgt], dim=1)
            tgt = cache.tokens
        causal = nn.Transformer.generate_square_subsequent_mask(tgt.size(1), device=tgt.device)
        hidden = self.transformer.decoder(self._embed(tgt), memory, tgt_mask=causal, tgt_is_causal=True,
                                          memory_key_padding_mask=memory_padding)
        return self.out(hidden[:, -new:])

    def forward(self, src: torch.Tensor, tgt: torch.Tensor, src_padding: torch.Tensor) -> torch.Tensor:
        return self.decode(tgt, self.encode(src, src_padding), src_padding)

    def new_cache(self) -> PrefixCache:
        return PrefixCache()


@dataclass
class ToySpec:
    """The fields of a compiled spec that the runtime reads."""

    vocab_size: int = 64
    d_model: int = 32
    dropout: float = 0.0
    train: TrainSection = field(default_factory=TrainSection)
    data: DataSection = field(default_factory=DataSection)
    decode: DecodeSection = field(default_factory=DecodeSection)
    name: str = "toy"
    max_positions: int = 128
    has_encoder: bool = True
    has_decoder: bool = True
    masked_lm: bool = False
    classes: Optional[int] = None
    output_head: Optional[str] = None  # no multi-token prediction shares it
    # called as hook(module, inputs, output) after every forward pass; may return a replacement output
    forward_hook: Optional[Callable] = None

    @property
    def model_dim(self) -> int:
        return self.d_model

    @property
    def params(self) -> dict:
        return {"vocab_size": self.vocab_size, "d_model": self.d_model, "dropout": self.dropout}

    @property
    def resolved_source(self) -> str:
        return f"# toy spec {self.params}\n"

    @property
    def parameters(self) -> int:
        return sum(p.numel() for p in self.build().parameters())

    def training_memory(self, batch: int, length: int, *, activation_bytes: int = 4, shards: int = 1,
                        replicas: int = 1, trained=None, weight_bytes=None, recomputed=False):
        """A rough stand-in for the compiled spec's estimate: 16 bytes a parameter (weights, gradients, Adam),
        and per token 64 activations of d_model plus the loss's two rows of the vocabulary (every parameter
        trains, no layer recomputes: the toy model has neither LoRA nor repeated stacks)."""
        from xspec.compiler.cost import Memory

        weights = 4 * self.parameters // shards
        tokens = batch * length
        return Memory(batch, length, weights, weights, 2 * weights,
                      64 * tokens * self.d_model * activation_bytes, 2 * tokens * self.vocab_size * 4)

    def with_overrides(self, overrides: dict) -> "ToySpec":
        """Section keys only (what the runtime sets): {"data.vocab_size": 150}."""
        sections = {"train": self.train, "data": self.data, "decode": self.decode}
        for key, value in overrides.items():
            section, _, name = key.partition(".")
            sections[section] = sections[section].model_copy(update={name: value})
        return dataclasses.replace(self, **sections)

    def build(self, device=None, compile: bool = False) -> ToyTransformer:
        model = ToyTransformer(self.vocab_size, self.d_model, dropout=self.dropout, max_positions=self.max_positions)
        if self.forward_hook is not None:
            model.register_forward_hook(self.forward_hook)
        return model.to(torch.device(device)) if device is not None else model


def toy_spec(**train) -> ToySpec:
    """A 1+1-layer toy with dropout (exact resume must reproduce it) and a short schedule."""
    settings = dict(batch_tokens=600, max_batch_tokens=300, warmup_steps=20, max_steps=8,
                    checkpoint_every_minutes=None, checkpoint_every_steps=4, keep_checkpoints=5,
                    average_last=2, validate_every_steps=4, lr_scale=0.5)
    settings.update(train)
    return ToySpec(vocab_size=160, d_model=32, dropout=0.1, train=TrainSection(**settings),
                   data=DataSection(vocab_size=160, max_tokens=100),
                   decode=DecodeSection(beam=2, max_len_b=10))
