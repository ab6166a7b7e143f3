"""Scores with sacrebleu (BLEU and chrF, with the signatures that make them comparable)."""

from __future__ import annotations

from dataclasses import dataclass

import sacrebleu


@dataclass(frozen=True)
class Scores:
    bleu: float
    chrf: float
    bleu_line: str          # sacrebleu's line: "BLEU|nrefs:1|case:mixed|...|version:2.6.0 = 37.90 ..."
    chrf_line: str


def score(hypotheses: list[str], references: list[str]) -> Scores:
    bleu, chrf = sacrebleu.BLEU(), sacrebleu.CHRF()
    b = bleu.corpus_score(hypotheses, [references])
    c = chrf.corpus_score(hypotheses, [references])
    return Scores(b.score, c.score, b.format(signature=str(bleu.get_signature())),
                  c.format(signature=str(chrf.get_signature())))
