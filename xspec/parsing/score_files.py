"""`xspec treebank score`: a decoder's output (one linearised tree a line) against gold trees (one bracketed
tree a line, e.g. `prepare`'s test.gold or the treebank's own lines), and the report it prints.

Each output line is de-linearised over its gold tree's words (xspec/parsing/delinearise: always a tree,
repaired where needed) and tagged with the gold tags, so the scorer's punctuation rule sees the same
words on both sides, as EVALB does when a parser's trees carry the gold tags. The trees written with
`--output` are those: EVALB-ready, `evalb -p COLLINS.prm GOLD TREES` gives the same figures.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from xspec.base.errors import UserError
from xspec.parsing.delinearise import Repairs, delinearise
from xspec.parsing.evalb import CUTOFF_LENGTH, Score, Totals, score
from xspec.parsing.normalise import normalise
from xspec.parsing.reader import read_trees
from xspec.parsing.textfile import read_lines
from xspec.parsing.tree import Tree, tags, words


@dataclass
class Scored:
    score: Score
    repairs: Repairs = field(default_factory=Repairs)
    repaired: int = 0                 # output lines that needed at least one repair
    trees: list[Tree] = field(default_factory=list)


def score_files(gold_file: Path, hyp_file: Path) -> Scored:
    gold: list[Tree] = []
    for number, tree in enumerate(read_trees(gold_file), 1):
        normal = normalise(tree)
        if normal is None:
            raise UserError(f"{gold_file}:{number}: the tree has no words once its empty elements are removed")
        gold.append(normal)
    outputs = read_lines(hyp_file)
    if len(outputs) != len(gold):
        raise UserError(f"{hyp_file}: {len(outputs)} lines, but {gold_file} has {len(gold)} trees: one output a "
                        "line, aligned with the gold trees")
    if not gold:
        raise UserError(f"{gold_file}: no trees to score against")
    result = Scored(Score())
    for gold_tree, output in zip(gold, outputs):
        tree, repairs = delinearise(output, words(gold_tree), tags(gold_tree))
        result.trees.append(tree)
        result.repairs.add(repairs)
        result.repaired += repairs.any()
    result.score = score(zip(gold, result.trees))
    return result


def report(scored: Scored) -> str:
    """EVALB's summary lines for all sentences and for len<=40, the repairs, and a last line with F1."""
    lines: list[str] = []
    for title, totals in (("All", scored.score.all), (f"len<={CUTOFF_LENGTH}", scored.score.short)):
        lines += [f"-- {title} --", *_summary(totals), ""]
    r, total = scored.repairs, scored.score.all.sentences
    lines.append(f"repaired outputs: {scored.repaired} of {total} (unmatched closing brackets dropped "
                 f"{r.unmatched_closing}, unclosed brackets closed {r.unclosed}, extra leaves dropped "
                 f"{r.extra_leaves}, missing leaves added {r.missing_leaves}, empty phrases removed "
                 f"{r.empty_phrases})")
    every = scored.score.all
    lines.append(f"labelled bracket F1 {every.f1:.2f} (precision {every.precision:.2f}, recall "
                 f"{every.recall:.2f}; {every.sentences} sentences, {every.complete} complete matches; "
                 "EVALB COLLINS.prm conventions)")
    return "\n".join(lines) + "\n"


def as_json(scored: Scored) -> dict:
    def totals(t: Totals) -> dict:
        return {"sentences": t.sentences, "gold_brackets": t.gold, "test_brackets": t.test,
                "matched_brackets": t.matched, "precision": t.precision, "recall": t.recall, "f1": t.f1,
                "complete_matches": t.complete, "average_crossing": t.average_crossing}

    return {"all": totals(scored.score.all), f"len<={CUTOFF_LENGTH}": totals(scored.score.short),
            "repaired_outputs": scored.repaired, "repairs": vars(scored.repairs)}


def _summary(t: Totals) -> list[str]:
    return [f"Number of sentence        = {t.sentences:6d}",
            f"Bracketing Recall         = {t.recall:6.2f}   ({t.matched} of {t.gold} gold brackets)",
            f"Bracketing Precision      = {t.precision:6.2f}   ({t.matched} of {t.test} test brackets)",
            f"Bracketing FMeasure       = {t.f1:6.2f}",
            f"Complete match            = {t.complete_match:6.2f}   ({t.complete} sentences)",
            f"Average crossing          = {t.average_crossing:6.2f}"]
