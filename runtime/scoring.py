"""How likely a model finds text: the log-probability of each example, and perplexity over a file.

A language model scores a line as a document: its tokens and the EOS that ends it, each predicted from
what comes before it after the document's starting EOS. A line longer than the model's positions is
scored in windows (runtime/documents.py): the tokens of a later window are predicted without the
earlier ones as context. A translation model scores a target given its source. An ensemble (a list of
models) predicts each token with the mixture its decoding takes (runtime/ensemble.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .batching import micro_batches
from .documents import EncodedText, document_sequence, windows
from .ensemble import ModelOrEnsemble, eval_members, mixture_log_probs
from .precision import Precision, choose_precision
from .batching import NO_LABEL
from .vocab import Vocab


@torch.no_grad()
def example_log_probs(model: ModelOrEnsemble, examples, device: torch.device, batch_tokens: int = 4000,
                      precision: str = "auto") -> list[float]:
    """log P (nats) of each example's labels given its inputs (`examples`: EncodedText or EncodedPairs), in
    the `decode.precision` asked for."""
    models = eval_members(model)
    computed = choose_precision(device, precision, "decode.precision")
    totals = [0.0] * len(examples)
    for indices in micro_batches(examples.src_lens, examples.tgt_lens, batch_tokens):
        batch = examples.collate(indices).to(device)
        each = [_label_log_probs(m, batch, computed) for m in models]     # M x [B, T]
        token_log_probs = each[0] if len(each) == 1 else mixture_log_probs(each)
        for i, value in zip(indices, token_log_probs.sum(dim=1).tolist()):
            totals[i] = value
    return totals


def _label_log_probs(model: torch.nn.Module, batch, precision: Precision) -> torch.Tensor:
    """[B, T] log-probability of each label (0 at padding)."""
    with precision.context():
        logits = model(*batch.inputs)                                       # [B, T, V]
    return -F.cross_entropy(logits.float().transpose(1, 2), batch.labels, ignore_index=NO_LABEL, reduction="none")


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


def score_lines(model: ModelOrEnsemble, vocab: Vocab, lines: list[str], device: torch.device, max_positions: int,
                batch_tokens: int = 4000, precision: str = "auto") -> LineScores:
    """Each line's log-probability under a decoder-only model (windows of at most `max_positions`)."""
    pieces, owner = [], []
    for line, ids in enumerate(vocab.encode(lines)):
        for piece in windows(document_sequence(ids, vocab), max_positions):
            pieces.append(piece)
            owner.append(line)
    log_probs = [0.0] * len(lines)
    for line, value in zip(owner, example_log_probs(model, EncodedText(pieces, len(lines), "lines"), device,
                                                     max(batch_tokens, max_positions), precision)):
        log_probs[line] += value
    tokens = [0] * len(lines)
    for line, piece in zip(owner, pieces):
        tokens[line] += len(piece) - 1
    return LineScores(log_probs, tokens, sum(len(line.encode("utf-8")) + 1 for line in lines))

