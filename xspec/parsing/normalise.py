"""The normalised tree that is trained on and scored against, as is standard for WSJ parsing.

- Empty elements go: every `(-NONE- ...)` preterminal (traces `*T*-1`, null subjects `*`, `*-2`, null
  complementisers `0`, `*U*`, `*EXP*`, `*ICH*`, `*RNR*`, `*PPA*`, ...), and then every phrase left with
  nothing in it (`(NP-SBJ (-NONE- *-1))`, `(SBAR (-NONE- 0) (S (-NONE- *T*-1)))`). They are not words
  of the sentence a parser is given, and EVALB does not count them (COLLINS.prm: DELETE_LABEL -NONE-).
- Phrase labels lose their function tags and indices, as EVALB cuts them: at the first `-` or `=`
  (`NP-SBJ-1` -> `NP`, `PP-TMP=3` -> `PP`, `S-TPC-2` -> `S`). The indices link a phrase to a trace
  just removed; function tags are not part of the labelled-bracket task. Other labels are kept as they
  are, `ADVP|PRT` included (EVALB compares it as written).
- Part-of-speech tags are kept (`-LRB-`, `-NONE-`-free, `PRP$`): the scorer needs them to know which
  words are punctuation. The linearisation, not the normalisation, replaces them by XX.
"""

from __future__ import annotations

from xspec.parsing.tree import ROOT, Tree, fold

EMPTY_ELEMENT = "-NONE-"


def normalise(tree: Tree) -> Tree | None:
    """The normalised tree (root TOP), or None when nothing but empty elements is left."""
    kept = _without_empty_elements(tree)
    if kept is None:
        return None
    return Tree(ROOT, kept.children)


def phrase_label(label: str) -> str:
    """A phrase label without function tags or indices (EVALB's cut at the first `-` or `=`); a label that
    starts with `-` is left whole (only tags such as `-LRB-` do)."""
    if label.startswith("-"):
        return label
    for position, char in enumerate(label):
        if char in "-=":
            return label[:position]
    return label


def _without_empty_elements(tree: Tree) -> Tree | None:
    def preterminal(node: Tree) -> Tree | None:
        return None if node.label == EMPTY_ELEMENT else node

    def phrase(node: Tree, kept: list[Tree | None]) -> Tree | None:
        children = tuple(child for child in kept if child is not None)
        return Tree(phrase_label(node.label), children) if children else None

    return fold(tree, preterminal, phrase)
