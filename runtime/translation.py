"""Translating many sentences: sorted by length into batches, beam search, original order restored."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from tqdm import tqdm

from xspec.compiler.sections import DecodeSection
from xspec.runtime.batching import pad
from xspec.runtime.beam_search import Hypothesis, beam_search
from xspec.runtime.corpus import encode_source
from xspec.runtime.precision import choose_precision
from xspec.runtime.vocab import PAD, Vocab


@dataclass(frozen=True)
class Translator:
    model: torch.nn.Module
    vocab: Vocab
    decode: DecodeSection
    device: torch.device
    max_tokens: int                 # the model's longest sequence (its positions), source and output
    batch_tokens: int = 4000        # source tokens per beam-search batch (times the beam in memory)

    def with_batch_tokens(self, batch_tokens: int) -> "Translator":
        return replace(self, batch_tokens=batch_tokens)

    @torch.no_grad()
    def nbest(self, lines: list[str], progress: bool = False) -> list[list[Hypothesis]]:
        sources = encode_source(lines, self.vocab, self.max_tokens)
        # Empty lines translate to empty lines (and cost nothing).
        order = sorted((i for i, line in enumerate(lines) if line.strip()), key=lambda i: len(sources[i]))
        results: list[list[Hypothesis]] = [[] for _ in sources]
        bar = tqdm(total=len(sources), desc="decoding", unit="sent", disable=not progress, leave=False)
        self.model.eval()
        start = 0
        while start < len(order):
            end = start + 1
            while end < len(order) and (end - start + 1) * len(sources[order[end]]) <= self.batch_tokens:
                end += 1
            chunk = order[start:end]
            src = pad([sources[i] for i in chunk]).to(self.device)
            with choose_precision(self.device).autocast():
                hyps = beam_search(self.model, src, src == PAD, self.decode.beam, self.decode.length_penalty,
                                   self.decode.max_len_a, self.decode.max_len_b, nbest=self.decode.nbest,
                                   max_positions=self.max_tokens)
            for i, h in zip(chunk, hyps):
                results[i] = h
            bar.update(len(chunk))
            start = end
        bar.close()
        return results

    def translate(self, lines: list[str], progress: bool = False) -> list[str]:
        return [self.vocab.decode(h[0].tokens) if h else "" for h in self.nbest(lines, progress)]

