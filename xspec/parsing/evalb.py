"""Labelled bracket precision, recall and F1, with the conventions of EVALB's COLLINS.prm (Sekine and
Collins' `evalb -p COLLINS.prm gold test`, the scorer behind the paper's Table 4).

A tree's brackets are its phrases as (label, first word, end), each counted as often as it occurs:
- preterminals (part-of-speech tags) are not brackets;
- the root (TOP, ROOT, or the treebank's unlabelled outer bracket) is not counted: DELETE_LABEL TOP;
- words tagged `,` `:` `` `` `` `''` `.` (punctuation) and `-NONE-` (empty elements) are taken out of the
  sentence before spans are measured (DELETE_LABEL for those tags), and a phrase left spanning no
  word is not counted;
- labels are cut at the first `-` or `=` (`NP-SBJ-1` is NP), as EVALB does, and ADVP and PRT are the
  same label (EQ_LABEL ADVP PRT).
A test bracket matches a gold bracket with the same span and label, each used once. Totals are over the
corpus (micro-averaged), as EVALB's summary gives them: precision = matched / test brackets, recall =
matched / gold brackets, F1 their harmonic mean. A sentence is a complete match when its gold and test
brackets are the same multiset. A test bracket crosses when it overlaps some gold bracket without either
containing the other. The `len<=40` figures take the sentences of at most 40 words, empty elements not
counted and punctuation counted (CUTOFF_LEN 40, DELETE_LABEL_FOR_LENGTH -NONE-).

Not applied, since our trees do not need them: EVALB's quote fix-up (QUOTE_LABEL, not in COLLINS.prm)
and its error sentences (words that differ: here that is refused, see `sentence_brackets`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable

from xspec.parsing.normalise import EMPTY_ELEMENT, phrase_label
from xspec.parsing.tree import Tree, preterminals, spans

DELETED_TAGS = frozenset({",", ":", "``", "''", ".", EMPTY_ELEMENT})
ROOT_LABELS = frozenset({"TOP", "ROOT", ""})
EQUIVALENT = {"PRT": "ADVP"}
CUTOFF_LENGTH = 40

Bracket = tuple[str, int, int]


def bracket_label(label: str) -> str:
    label = phrase_label(label)
    return EQUIVALENT.get(label, label)


def sentence_brackets(tree: Tree) -> Counter[Bracket]:
    """The brackets EVALB counts in one tree, spans in words that are neither punctuation nor empty."""
    # kept[i]: how many counted words come before word i
    kept = [0]
    for node in preterminals(tree):
        kept.append(kept[-1] + (node.label not in DELETED_TAGS))
    brackets: Counter[Bracket] = Counter()
    for index, (node, start, end) in enumerate(spans(tree)):
        if index == 0 or node.label in ROOT_LABELS:   # the root, or a TOP below it
            continue
        first, last = kept[start], kept[end]
        if first < last:
            brackets[(bracket_label(node.label), first, last)] += 1
    return brackets


def sentence_length(tree: Tree) -> int:
    """Words for the length cut-off: every word but the empty elements."""
    return sum(node.label != EMPTY_ELEMENT for node in preterminals(tree))


@dataclass
class Totals:
    """Bracket counts over some sentences."""

    sentences: int = 0
    gold: int = 0
    test: int = 0
    matched: int = 0
    complete: int = 0
    crossing: int = 0

    @property
    def precision(self) -> float:
        return 100.0 * self.matched / self.test if self.test else 0.0

    @property
    def recall(self) -> float:
        return 100.0 * self.matched / self.gold if self.gold else 0.0

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else 0.0

    @property
    def complete_match(self) -> float:
        return 100.0 * self.complete / self.sentences if self.sentences else 0.0

    @property
    def average_crossing(self) -> float:
        return self.crossing / self.sentences if self.sentences else 0.0


@dataclass
class Score:
    """EVALB's two summaries: every sentence, and those of at most 40 words."""

    all: Totals = field(default_factory=Totals)
    short: Totals = field(default_factory=Totals)


def compare(gold: Tree, test: Tree) -> Totals:
    """One sentence's counts. The two trees must have the same words (the de-linearised test trees do)."""
    gold_words = [node.word for node in preterminals(gold)]
    test_words = [node.word for node in preterminals(test)]
    if gold_words != test_words:
        raise ValueError(f"the trees' words differ: {' '.join(gold_words)!r} and {' '.join(test_words)!r}")
    gold_brackets, test_brackets = sentence_brackets(gold), sentence_brackets(test)
    matched = sum((gold_brackets & test_brackets).values())
    gold_count, test_count = sum(gold_brackets.values()), sum(test_brackets.values())
    crossing = sum(count for bracket, count in test_brackets.items() if _crosses(bracket, gold_brackets))
    return Totals(sentences=1, gold=gold_count, test=test_count, matched=matched,
                  complete=int(gold_count == test_count == matched), crossing=crossing)


def score(pairs: Iterable[tuple[Tree, Tree]]) -> Score:
    """Corpus totals over (gold, test) pairs."""
    result = Score()
    for gold, test in pairs:
        one = compare(gold, test)
        _add(result.all, one)
        if sentence_length(gold) <= CUTOFF_LENGTH:
            _add(result.short, one)
    return result


def _crosses(bracket: Bracket, gold: Counter[Bracket]) -> bool:
    _, start, end = bracket
    return any(s < start < e < end or start < s < end < e for _, s, e in gold)


def _add(total: Totals, one: Totals) -> None:
    for name in ("sentences", "gold", "test", "matched", "complete", "crossing"):
        setattr(total, name, getattr(total, name) + getattr(one, name))
