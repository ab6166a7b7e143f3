"""The model's entry points, in one place (docs/model-interface.md): the blocks named `encoder`,
`decoder` and `mtp`, the arguments each may take, the graph inputs they read and the outputs they return.

    block encoder(src, src_mask)              -> memory [batch, src_len, d_model]
    block decoder(tgt, memory, memory_mask)   -> logits [batch, tgt_len, vocab]   (encoder-decoder)
    block decoder(tokens)                     -> logits                           (language model)
    block mtp(hidden, tokens)                 -> hidden [batch, tgt_len, d_model] (multi-token prediction)

A language model's `mtp` block is one depth of DeepSeek-V3's multi-token prediction (§2.2), built
`mtp_depth` times: from the state the output head reads at each position and the embedding of a token
further on, the state from which the same head predicts one token more ahead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .shapes import BATCH, SRC_LEN, TGT_LEN, TensorType

ENCODER, DECODER, MTP = "encoder", "decoder", "mtp"
MTP_DEPTH = "mtp_depth"  # the model parameter that counts the depths (1 where the model declares none)


@dataclass(frozen=True)
class GraphInput:
    name: str      # the input's name in the graph and in graph.json
    kind: Literal["tokens", "mask", "hidden"]  # long ids, a bool mask (True at padding), or hidden states
    length: str    # its symbolic length
    width: int = 0  # hidden states' features

    @property
    def node(self) -> str:
        return f"input.{self.name}"

    @property
    def type(self) -> TensorType:
        if self.kind == "hidden":
            return TensorType((BATCH, self.length, self.width))
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
MTP_TOKENS = GraphInput("mtp_tokens", "tokens", TGT_LEN)


def mtp_hidden(width: int) -> GraphInput:
    """What the first depth of multi-token prediction reads: the state the output head reads."""
    return GraphInput("mtp_hidden", "hidden", TGT_LEN, width)


def mtp_output(depth: int) -> GraphOutput:
    return GraphOutput(f"mtp_{depth}", MTP, TGT_LEN, "d_model")

# What each entry block's parameters may be, by count: the encoder reads the source and its padding;
# the decoder reads the target alone (a language model) or with the encoder's memory and its padding.
SIGNATURES: dict[str, dict[int, str]] = {
    ENCODER: {2: "(tokens, padding_mask)"},
    DECODER: {1: "(tokens)", 3: "(tokens, memory, memory_mask)"},
    MTP: {2: "(hidden, tokens)"},
}


# What an encoder whose ops read token types (BERT's token type embedding) takes after its padding mask:
# [batch, src_len] ids, each position's type (a sentence pair's first text 0, its second 1); None gives
# every position the first type.
TOKEN_TYPES = "token_types"


def takes_cache(block: str) -> bool:
    """The decoder decodes one step at a time, continuing from a cache, and multi-token prediction drafts
    so (runtime/speculative.py); the encoder runs once."""
    return block in (DECODER, MTP)
