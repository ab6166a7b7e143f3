"""The model's entry points, in one place (docs/model-interface.md): the blocks named `encoder` and
`decoder`, the arguments each may take, the graph inputs they read and the outputs they return.

    block encoder(src, src_mask)              -> memory [batch, src_len, d_model]
    block decoder(tgt, memory, memory_mask)   -> logits [batch, tgt_len, vocab]   (encoder-decoder)
    block decoder(tokens)                     -> logits                           (language model)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .shapes import BATCH, SRC_LEN, TGT_LEN, TensorType

ENCODER, DECODER = "encoder", "decoder"


@dataclass(frozen=True)
class GraphInput:
    name: str      # the input's name in the graph and in graph.json
    kind: Literal["tokens", "mask"]  # "tokens" (long ids) or "mask" (bool, True at padding)
    length: str    # its symbolic length

    @property
    def node(self) -> str:
        return f"input.{self.name}"

    @property
    def type(self) -> TensorType:
        return TensorType((BATCH, self.length), "long" if self.kind == "tokens" else "bool")


@dataclass(frozen=True)
class GraphOutput:
    name: str
    entry: str     # the block that returns it
    length: str
    size: str      # what its last dimension is

    @property
    def node(self) -> str:
        return f"output.{self.name}"


SRC = GraphInput("src", "tokens", SRC_LEN)
SRC_MASK = GraphInput("src_mask", "mask", SRC_LEN)
TGT = GraphInput("tgt", "tokens", TGT_LEN)
MEMORY = GraphOutput("memory", ENCODER, SRC_LEN, "d_model")
LOGITS = GraphOutput("logits", DECODER, TGT_LEN, "vocab")
OUTPUTS = (MEMORY, LOGITS)

# What each entry block's parameters may be, by count: the encoder reads the source and its padding;
# the decoder reads the target alone (a language model) or with the encoder's memory and its padding.
SIGNATURES: dict[str, dict[int, str]] = {
    ENCODER: {2: "(tokens, padding_mask)"},
    DECODER: {1: "(tokens)", 3: "(tokens, memory, memory_mask)"},
}


def takes_cache(block: str) -> bool:
    """The decoder decodes one step at a time, continuing from a cache; the encoder runs once."""
    return block == DECODER
