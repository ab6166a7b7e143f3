"""How likely a model finds text: the log-probability of each example, and perplexity over a file.

A language model scores a line as a document: its tokens and the EOS that ends it, each predicted from
what comes before it after the document's starting EOS. A line longer than the model's positions is
scored in windows (runtime/documents.py): the tokens of a later window are predicted without the
earlier ones as context. A translation model scores a target given its source.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from xspec.runtime.batching import micro_batches
from xspec.runtime.documents import EncodedText, document_sequence, windows
from xspec.runtime.precision import choose_precision
from xspec.runtime.vocab import PAD, Vocab


@torch.no_grad()
def example_log_probs(model, examples, device: torch.device, batch_tokens: int = 4000) -> list[float]:
    """log P (nats) of each example's labels given its inputs (`examples`: EncodedText or EncodedPairs)."""
    totals = [0.0] * len(examples)
    model.eval()
    for indices in micro_batches(examples.src_lens, examples.tgt_lens, batch_tokens):
        batch = examples.collate(indices).to(device)
        with choose_precision(device).autocast():
            logits = model(*batch.inputs)                                   # [B, T, V]
        loss = F.cross_entropy(logits.float().transpose(1, 2), batch.labels, ignore_index=PAD,
                               reduction="none")                            # [B, T]
        for i, value in zip(indices, loss.sum(dim=1).tolist()):
            totals[i] = -value
    return totals


@dataclass(frozen=True)
class LineScores:
    log_probs: list[float]      # nats, one per line
    tokens: list[int]           # predictions per line (its tokens and EOS)
    bytes: int                  # UTF-8 bytes of the lines, each with its newline

    @property
    def loss(self) -> float:
        """Cross entropy per token (nats)."""
        return -sum(self.log_probs) / max(sum(self.tokens), 1)

    @property
    def perplexity(self) -> float:
        return math.exp(self.loss)

    @property
    def bits_per_token(self) -> float:
        return self.loss / math.log(2)

    @property
    def bits_per_byte(self) -> float:
        return -sum(self.log_probs) / math.log(2) / max(self.bytes, 1)


def score_lines(model, vocab: Vocab, lines: list[str], device: torch.device, max_positions: int,
                batch_tokens: int = 4000) -> LineScores:
    """Each line's log-probability under a decoder-only model (windows of at most `max_positions`)."""
    pieces, owner = [], []
    for line, ids in enumerate(vocab.encode(lines)):
        for piece in windows(document_sequence(ids), max_positions):
            pieces.append(piece)
            owner.append(line)
    log_probs = [0.0] * len(lines)
    for line, value in zip(owner, example_log_probs(model, EncodedText(pieces, len(lines), "lines"), device,
                                                     max(batch_tokens, max_positions))):
        log_probs[line] += value
    tokens = [0] * len(lines)
    for line, piece in zip(owner, pieces):
        tokens[line] += len(piece) - 1
    return LineScores(log_probs, tokens, sum(len(line.encode("utf-8")) + 1 for line in lines))
