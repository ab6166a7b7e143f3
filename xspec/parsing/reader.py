"""Reading Penn Treebank bracketed trees, one tree a line (`( (S (NP-SBJ (NNP John)) (VP (VBZ runs))) )`).

A tree is `(LABEL WORD)` (a preterminal) or `(LABEL TREE TREE ...)` (a phrase). The outermost bracket
may have no label, as in the treebank's own files; it becomes the root, TOP. A tree whose outermost
label is TOP or ROOT is that root; any other outermost phrase is put under a TOP root, so every tree
read here has the same shape at the top. Anything else is refused with the file, line and column:
the scorer must never guess what a gold tree meant.
"""

from __future__ import annotations

import re
from pathlib import Path

from xspec.base.errors import UserError
from xspec.parsing.textfile import read_lines
from xspec.parsing.tree import ROOT, Tree

_TOKEN = re.compile(r"(\()|(\))|([^\s()]+)")
_KINDS = ("", "(", ")", "atom")
_ROOT_LABELS = ("", "TOP", "ROOT")


def read_trees(path: Path) -> list[Tree]:
    """Every line of `path` as a tree; an empty or malformed line is a UserError naming `path:line`."""
    return [parse_tree(line, f"{path}:{number}") for number, line in enumerate(read_lines(path), 1)]


def parse_tree(text: str, where: str = "<tree>") -> Tree:
    """One bracketed tree; `where` (e.g. `file:line`) starts every error message."""
    tokens = _tokenise(text)
    if not tokens:
        raise UserError(f"{where}: an empty line, not a tree")
    # Each open phrase on the stack: its label, its children, and where it opened (for messages).
    stack: list[tuple[str, list, int]] = []
    tree: Tree | None = None
    index = 0
    while index < len(tokens):
        kind, value, column = tokens[index]
        if tree is not None:
            raise UserError(f"{where}: column {column}: more after the end of the tree")
        if kind == "(":
            label, step = "", 1
            if index + 1 < len(tokens) and tokens[index + 1][0] == "atom":
                label, step = tokens[index + 1][1], 2
            if not label and stack:
                raise UserError(f"{where}: column {column}: a bracket without a label inside the tree")
            if index + step < len(tokens) and tokens[index + step][0] == "atom":
                # (TAG word): a preterminal, which must close right after its word
                word = tokens[index + step]
                if index + step + 1 == len(tokens):
                    raise UserError(f"{where}: {len(stack) + 1} bracket(s) not closed (the last opened at column "
                                    f"{column})")
                closing = tokens[index + step + 1]
                if closing[0] != ")":
                    raise UserError(f"{where}: column {closing[2]}: ({label} {word[1]} ...: a word must be "
                                    "alone under its tag")
                if not stack:
                    raise UserError(f"{where}: column {column}: a lone preterminal, not a tree")
                stack[-1][1].append(Tree(label, (word[1],)))
                index += step + 2
                continue
            stack.append((label, [], column))
            index += step
        elif kind == ")":
            if not stack:
                raise UserError(f"{where}: column {column}: a closing bracket with no opening one")
            label, children, opened = stack.pop()
            if not children:
                raise UserError(f"{where}: column {opened}: ({label}) holds nothing")
            node = Tree(label, tuple(children))
            if stack:
                stack[-1][1].append(node)
            else:
                tree = node
            index += 1
        else:
            where_word = f"inside ({stack[-1][0]} ...)" if stack else "outside any bracket"
            raise UserError(f"{where}: column {column}: word {value!r} {where_word} beside constituents")
    if stack:
        raise UserError(f"{where}: {len(stack)} bracket(s) not closed (the last opened at column {stack[-1][2]})")
    assert tree is not None
    return _rooted(tree)


def _tokenise(text: str) -> list[tuple[str, str, int]]:
    """(kind, text, 1-based column) for each bracket and atom; only whitespace lies between them."""
    return [(_KINDS[match.lastindex or 0], match.group(), match.start() + 1) for match in _TOKEN.finditer(text)]


def _rooted(tree: Tree) -> Tree:
    assert not tree.is_preterminal, "a lone preterminal is refused above"
    if tree.label in _ROOT_LABELS:
        return Tree(ROOT, tree.children)
    return Tree(ROOT, (tree,))
