"""Masked language modelling's examples (BERT, §3.1 of Devlin et al., 2019): 15% of each text's tokens
chosen to be predicted (round(0.15 n) of its n tokens that are not special, at least one, as BERT's own
create_pretraining_data chooses them), each chosen one replaced by the mask token 80% of the time, by a
random token 10% and kept 10%. A text's count of predictions is so known before it is masked, which is what
training divides an update's loss by. Each text's choice is drawn from a stream of its own, seeded by the
run's seed and the text's place in its split, whatever batch it falls in: a validation split is masked the
same way at every validation and by `xspec eval` at any --batch-tokens, and a resumed run masks as the first
did."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .batching import NO_LABEL, Batch, pad_with_mask
from .data_order import WholeCorpusWindows

CHOSEN = 0.15        # the share of a text's tokens predicted
AS_MASK = 0.8        # of those, replaced by the mask token ...
AS_RANDOM = 0.5      # ... and of the rest, this share by a random token (10% of all), the others kept


@dataclass(frozen=True)
class Masking:
    mask_id: int
    special: frozenset[int]     # never chosen
    vocab_size: int             # random replacements are drawn from [0, vocab_size)
    seed: int


def predictions(eligible: int) -> int:
    """How many of a text's `eligible` tokens are chosen: 15%, rounded, at least one (none of none)."""
    return max(1, round(CHOSEN * eligible)) if eligible else 0


def eligible(tokens: torch.Tensor, padding: torch.Tensor, masking: Masking) -> torch.Tensor:
    """[B, T]: the tokens that may be chosen (neither padding nor special)."""
    return ~padding & ~torch.isin(tokens, torch.tensor(sorted(masking.special), dtype=tokens.dtype))


def masked(tokens: torch.Tensor, padding: torch.Tensor, masking: Masking,
           examples: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, labels) of [B, T] `tokens`, row i the text of place `examples[i]`: labels the chosen tokens
    (NO_LABEL elsewhere), inputs with the chosen replaced; each row's `predictions` of its eligible tokens
    chosen, uniformly, from the text's own stream."""
    allowed = eligible(tokens, padding, masking)
    counts = torch.tensor([predictions(int(n)) for n in allowed.sum(1)])
    keys, mask_draws, random_draws = (torch.zeros(tokens.shape) for _ in range(3))
    random_tokens = torch.zeros_like(tokens)
    for row, (example, length) in enumerate(zip(examples, (~padding).sum(1).tolist())):
        draw = stream(masking.seed, example)
        for drawn in (keys, mask_draws, random_draws):
            drawn[row, :length] = torch.rand(length, generator=draw)
        random_tokens[row, :length] = torch.randint(0, masking.vocab_size, (length,), generator=draw)
    # the row's `count` eligible tokens of the highest random keys
    ranks = keys.masked_fill(~allowed, -1.0).argsort(1, descending=True).argsort(1)
    chosen = allowed & (ranks < counts[:, None])
    labels = tokens.masked_fill(~chosen, NO_LABEL)
    as_mask = chosen & (mask_draws < AS_MASK)
    as_random = chosen & ~as_mask & (random_draws < AS_RANDOM)
    return torch.where(as_random, random_tokens, tokens.masked_fill(as_mask, masking.mask_id)), labels


def stream(seed: int, example: int) -> torch.Generator:
    """The random stream of the text of place `example`."""
    digest = hashlib.sha256(f"xspec-masking:{seed}:{example}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))


@dataclass
class MaskedText(WholeCorpusWindows):
    """Texts as the tokenizer frames them ([CLS] ... [SEP]), each an example whose batch is masked when made:
    the inputs (masked tokens, padding), the labels of the chosen tokens. Batching reads a text's length as
    a source's."""

    sequences: list[list[int]]
    masking: Masking
    empty_skipped: int = 0
    too_long: int = 0
    truncated: bool = False
    lengths: list[int] = field(init=False)
    counts: list[int] = field(init=False)       # each text's predictions

    def __post_init__(self) -> None:
        self.lengths = [len(s) for s in self.sequences]
        special = self.masking.special
        self.counts = [predictions(sum(token not in special for token in s)) for s in self.sequences]

    def __len__(self) -> int:
        return len(self.sequences)

    @property
    def src_lens(self) -> list[int]:
        return self.lengths

    @property
    def tgt_lens(self) -> list[int]:
        """Predictions - 1, as a target's tokens count (an update's loss is divided by their sum + 1 each)."""
        return [count - 1 for count in self.counts]

    def collate(self, indices: list[int]) -> Batch:
        tokens, padding = pad_with_mask([self.sequences[i] for i in indices])
        inputs, labels = masked(tokens, padding, self.masking, indices)
        return Batch((inputs, padding), labels, int((labels != NO_LABEL).sum()))

    def summary(self, name: str) -> str:
        parts = [f"{name}: {len(self)} texts, {sum(self.lengths):,} tokens, {sum(self.counts):,} predicted a pass"]
        if self.empty_skipped:
            parts.append(f"{self.empty_skipped} empty lines skipped")
        if self.too_long:
            parts.append(f"{self.too_long} too long {'truncated' if self.truncated else 'skipped'}")
        return ", ".join(parts)


@dataclass(frozen=True)
class MaskedScores:
    loss: float         # nats per masked token
    accuracy: float     # the share of masked tokens predicted right (the most likely token)
    tokens: int         # masked tokens scored

    @property
    def perplexity(self) -> float:
        return math.exp(self.loss)


def masked_scores(model: torch.nn.Module, text: MaskedText, device: torch.device,
                  batch_tokens: int = 4000) -> MaskedScores:
    """The masked-token loss and accuracy of a split, masked as its batches are in training."""
    from .batching import micro_batches

    loss, right, count = 0.0, 0, 0
    model.eval()
    with torch.no_grad():
        for indices in micro_batches(text.src_lens, text.tgt_lens, batch_tokens):
            batch = text.collate(indices).to(device)
            logits = model(*batch.inputs).float()
            counted = batch.labels != NO_LABEL
            loss += F.cross_entropy(logits[counted], batch.labels[counted], reduction="sum").item()
            right += int((logits[counted].argmax(-1) == batch.labels[counted]).sum())
            count += int(counted.sum())
    return MaskedScores(loss / max(count, 1), right / max(count, 1), count)
