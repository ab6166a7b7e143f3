"""A constituency tree: a phrase holds trees, a preterminal holds one word under its part-of-speech tag.

Trees are immutable and compare by value, so tests can check a round trip with `==`. The functions
that walk a tree are iterative: a decoder's malformed output can nest hundreds of brackets deep, which
must not reach Python's recursion limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, TypeVar, Union

# The label the root of every tree gets here (EVALB's COLLINS.prm deletes it before scoring).
ROOT = "TOP"

T = TypeVar("T")


@dataclass(frozen=True)
class Tree:
    """A node: `children` are trees (a phrase) or a single word (a preterminal: `label` is its tag)."""

    label: str
    children: tuple[Union["Tree", str], ...]

    @property
    def is_preterminal(self) -> bool:
        return len(self.children) == 1 and isinstance(self.children[0], str)

    @property
    def word(self) -> str:
        assert self.is_preterminal, "only a preterminal has a word"
        word = self.children[0]
        assert isinstance(word, str)
        return word

    def subtrees(self) -> list["Tree"]:
        """The phrase children (every child of a phrase; none of a preterminal)."""
        return [child for child in self.children if isinstance(child, Tree)]


def preterminals(tree: Tree) -> list[Tree]:
    """The (tag, word) nodes, left to right."""
    return [node for node, _ in walk(tree) if node.is_preterminal]


def words(tree: Tree) -> list[str]:
    return [node.word for node in preterminals(tree)]


def tags(tree: Tree) -> list[str]:
    return [node.label for node in preterminals(tree)]


def walk(tree: Tree) -> Iterator[tuple[Tree, int]]:
    """Every node in document order (pre-order), with its depth (the root's is 0)."""
    stack: list[tuple[Tree, int]] = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        yield node, depth
        stack.extend((child, depth + 1) for child in reversed(node.subtrees()))


def spans(tree: Tree) -> list[tuple[Tree, int, int]]:
    """Every phrase (not the preterminals) with its span of word positions [start, end), in pre-order."""
    found: list[list] = []   # [phrase, start, end], the end filled in when the phrase is left
    position = 0
    stack: list[tuple[Tree, int | None]] = [(tree, None)]
    while stack:
        node, entry = stack.pop()
        if entry is not None:
            found[entry][2] = position
        elif node.is_preterminal:
            position += 1
        else:
            found.append([node, position, position])
            stack.append((node, len(found) - 1))
            stack.extend((child, None) for child in reversed(node.subtrees()))
    return [(node, start, end) for node, start, end in found]


def fold(tree: Tree, preterminal: Callable[[Tree], T], phrase: Callable[[Tree, list[T]], T]) -> T:
    """Bottom-up: `preterminal(node)` for each preterminal, `phrase(node, results of its children)` for each
    phrase; the root's result."""
    results: list[T] = []
    stack: list[tuple[Tree, bool]] = [(tree, False)]
    while stack:
        node, children_done = stack.pop()
        if node.is_preterminal:
            results.append(preterminal(node))
        elif not children_done:
            stack.append((node, True))
            stack.extend((child, False) for child in reversed(node.subtrees()))
        else:
            count = len(node.subtrees())
            first = len(results) - count
            value = phrase(node, results[first:])
            del results[first:]
            results.append(value)
    assert len(results) == 1
    return results[0]


def to_bracketed(tree: Tree) -> str:
    """The tree on one line, PTB style: `(TOP (S (NP (NNP John)) (VP (VBZ runs))))`."""
    out: list[str] = []
    stack: list[Union[Tree, str]] = [tree]
    while stack:
        item = stack.pop()
        if isinstance(item, str):   # a closing bracket, or a separator
            out.append(item)
        elif item.is_preterminal:
            out.append(f"({item.label} {item.word})")
        else:
            out.append(f"({item.label}")
            stack.append(")")
            for child in reversed(item.subtrees()):
                stack.append(child)
                stack.append(" ")
    return "".join(out)
