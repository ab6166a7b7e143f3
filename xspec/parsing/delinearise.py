"""From a predicted target sequence back to a tree over the sentence's words: always a well-formed tree
(every phrase holds at least one word, every word is under one preterminal) with exactly the sentence's
words, in order, so that every output of the decoder can be scored.

Reading. The sequence is cut into tokens: `(LABEL` opens a phrase, `)` or `)LABEL` closes one, and any
other run of characters is a leaf (XX when the model is right; whatever else it wrote is taken as a
leaf too, since only the number and place of the leaves matter). The label on a closing bracket is
ignored: a closing bracket closes the innermost open phrase, whose label is the one on its opening
bracket. An opening bracket with no label (`(` alone) opens a phrase labelled X, the treebank's own
label for "unclear", so the bracket structure the model wrote is kept.

Repairs, each counted in `Repairs`:
1. a closing bracket with nothing open is dropped;
2. leaves beyond the sentence's length are dropped (the first n leaves take the n words, in order);
3. words the sequence has no leaf for are added, in order, as preterminals at the end of the innermost
   phrase still open when the sequence ends, or, when every phrase was closed, at the end of the last
   top-level phrase (the root when there is none); every one of those phrases is on the right edge of
   the tree, so the words stay in order;
4. phrases still open at the end are closed there;
5. phrases left holding no word (`(NP )NP`, or ones whose leaves were dropped) are removed, innermost
   first.
Every preterminal is tagged XX unless the caller gives the tags (the scorer gives the gold tags, so that
EVALB's punctuation rule sees the same words in both trees).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Sequence

from xspec.parsing.linearise import TAG
from xspec.parsing.tree import ROOT, Tree, fold

UNLABELLED = "X"
_TOKEN = re.compile(r"\(([^\s()]*)|\)[^\s()]*|[^\s()]+")


@dataclass
class Repairs:
    """How many of each repair one sequence (or, summed, a file) needed."""

    unmatched_closing: int = 0
    extra_leaves: int = 0
    missing_leaves: int = 0
    unclosed: int = 0
    empty_phrases: int = 0

    def any(self) -> bool:
        return any(getattr(self, field.name) for field in fields(self))

    def add(self, other: "Repairs") -> None:
        for field in fields(self):
            setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))


class _Open:
    """A phrase being built: its label and children (finished trees and open phrases)."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.children: list[Tree | _Open] = []


def delinearise(sequence: str | Sequence[str], words: Sequence[str],
                tags: Sequence[str] | None = None) -> tuple[Tree, Repairs]:
    """The tree (root TOP) that `sequence` (a line, or its tokens) describes over `words`, and the repairs
    it took. `tags`, one per word, label the preterminals (default: XX)."""
    if tags is not None and len(tags) != len(words):
        raise ValueError(f"{len(tags)} tags for {len(words)} words")
    text = sequence if isinstance(sequence, str) else " ".join(sequence)
    repairs = Repairs()
    root = _Open(ROOT)
    stack = [root]
    used = 0

    def leaf(index: int) -> Tree:
        return Tree(tags[index] if tags is not None else TAG, (words[index],))

    for match in _TOKEN.finditer(text):
        token = match.group(0)
        if token.startswith("("):
            phrase = _Open(match.group(1) or UNLABELLED)
            stack[-1].children.append(phrase)
            stack.append(phrase)
        elif token.startswith(")"):
            if len(stack) > 1:
                stack.pop()
            else:
                repairs.unmatched_closing += 1
        elif used < len(words):
            stack[-1].children.append(leaf(used))
            used += 1
        else:
            repairs.extra_leaves += 1
    repairs.unclosed = len(stack) - 1
    if used < len(words):
        repairs.missing_leaves = len(words) - used
        home = stack[-1]
        if home is root and root.children and isinstance(root.children[-1], _Open):
            home = root.children[-1]
        home.children.extend(leaf(index) for index in range(used, len(words)))
    return _finish(root, repairs), repairs


def _finish(root: _Open, repairs: Repairs) -> Tree:
    """The built tree, without the phrases that hold no word (repair 5); the root stays."""
    def preterminal(node: Tree) -> Tree | None:
        return node

    def phrase(node: Tree, kept: list[Tree | None]) -> Tree | None:
        children = tuple(child for child in kept if child is not None)
        if not children:
            repairs.empty_phrases += 1
            return None
        return Tree(node.label, children)

    built = [fold(child, preterminal, phrase) for child in _skeleton(root).subtrees()]
    return Tree(ROOT, tuple(child for child in built if child is not None))


def _skeleton(root: _Open) -> Tree:
    """The open phrases as Trees, empty ones included (built without recursion: outputs can nest deeply)."""
    built: dict[int, Tree] = {}
    stack: list[tuple[_Open, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if not children_done:
            stack.append((node, True))
            stack.extend((child, False) for child in node.children if isinstance(child, _Open))
        else:
            children = tuple(built.pop(id(child)) if isinstance(child, _Open) else child for child in node.children)
            built[id(node)] = Tree(node.label, children)
    return built[id(root)]
