"""Filling masked tokens: a masked language model's most likely tokens at each mask of a text (BERT's
[MASK], RoBERTa's <mask>), as transformers' fill-mask pipeline gives them: each text encoded as the
checkpoint's tokenizer encodes one (its [CLS] and [SEP]), the model's probabilities at each mask, the top k
with the text they make. A text with one mask gives its candidates; with several, each mask's, the other
masks kept in the texts they make (as the pipeline keeps them)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from xspec.base.errors import UserError
from xspec.base.text import printable
from .batching import pad_with_mask

TEXTS_PER_BATCH = 32


class TextError(UserError):
    """A text that cannot be filled; `index` its place in the list given, `at("masked.txt:12")` names it as
    its file and line instead."""

    def __init__(self, index: int, problem: str) -> None:
        self.index, self.problem = index, problem
        super().__init__(f"text {index + 1}: {problem}")

    def at(self, place: str) -> UserError:
        return UserError(f"{place}: {self.problem}")


@dataclass(frozen=True)
class Candidate:
    score: float        # the model's probability of the token at the mask
    token: int
    token_str: str      # the token alone, as the tokenizer decodes it
    sequence: str       # the text with the mask filled by it

    def as_dict(self) -> dict:
        return {"score": self.score, "token": self.token, "token_str": self.token_str, "sequence": self.sequence}


def fill_masks(trained, texts: list[str], top_k: int = 5) -> list[list[list[Candidate]]]:
    """For each text, for each of its masks in order, the `top_k` candidates, most likely first. `trained`: an
    encoder-only masked LM (xspec.load) whose tokenizer names a mask token."""
    if not trained.is_masked_lm:
        kind = "a classifier" if trained.classes is not None else \
            "a translation model" if trained.spec.has_encoder else "a language model"
        raise UserError(f"{trained.label}: filling masks takes a masked language model (an encoder alone whose "
                        f"output scores each token: BERT, RoBERTa); this is {kind}")
    tokenizer = trained.tokenizer
    mask, mask_id = tokenizer.mask()
    encoded = tokenizer.encode_sources(texts)
    longest = trained.max_tokens
    for index, (text, ids) in enumerate(zip(texts, encoded)):
        if mask_id not in ids:
            raise TextError(index, f"no {printable(mask)} to fill in \"{printable(text[:60])}\"")
        if len(ids) > longest:
            raise TextError(index, f"{len(ids)} tokens, more than the model's {longest} positions")
    filled: list[list[list[Candidate]]] = []
    for start in range(0, len(texts), TEXTS_PER_BATCH):
        chunk = encoded[start:start + TEXTS_PER_BATCH]
        probabilities = _probabilities(trained, chunk)
        for row, ids in enumerate(chunk):
            filled.append(_candidates(tokenizer, ids, mask_id, probabilities[row], top_k))
    return filled


def _probabilities(trained, rows: list[list[int]]) -> torch.Tensor:
    """[B, T, vocab] probabilities of the rows, padded on the right and masked."""
    tokens, padding = pad_with_mask(rows)
    with torch.no_grad():
        logits = trained.model(tokens.to(trained.device), padding.to(trained.device))
    return logits.float().softmax(dim=-1).cpu()


def _candidates(tokenizer, ids: list[int], mask_id: int, probabilities: torch.Tensor,
                top_k: int) -> list[list[Candidate]]:
    positions = [i for i, token in enumerate(ids) if token == mask_id]
    values, predictions = probabilities[positions].topk(min(top_k, probabilities.size(-1)))
    single = len(positions) == 1      # several: the other masks stay in the texts made (special tokens kept)
    found = []
    for position, scores, tokens in zip(positions, values.tolist(), predictions.tolist()):
        row = []
        for score, token in zip(scores, tokens):
            made = [*ids[:position], token, *ids[position + 1:]]
            row.append(Candidate(score, token, tokenizer.decode([token], skip_special=False),
                                 tokenizer.decode(made, skip_special=single)))
        found.append(row)
    return found
