"""A tree as a pair of sequences, the parsing task as translation (Vinyals, Kaiser et al. 2014, "Grammar as
a Foreign Language", the paper's reference [37]).

The source is the sentence: its words, space-separated. The target is the tree, depth first, with its
labels on both brackets and every part-of-speech tag replaced by one symbol, XX; the words themselves
are left out, since the source has them in order:

    (TOP (S (NP (NNP John)) (VP (VBZ has) (NP (DT a) (NN dog))) (. .)))
    source: John has a dog .
    target: (S (NP XX )NP (VP XX (NP XX XX )NP )VP XX )S

The root, TOP, is the same in every tree and is left out. Vinyals et al. label the closing brackets so
that the model need not remember which phrase it is closing; the tags are normalised because predicting
them is a different task (tagging), which EVALB's labelled brackets do not score. The tree is the
normalised one (xspec/parsing/normalise.py), so `delinearise(linearise(t), words(t))` gives back `t`
with XX for every tag.
"""

from __future__ import annotations

from xspec.parsing.tree import Tree

TAG = "XX"


def linearise(tree: Tree) -> list[str]:
    """The target tokens of a tree whose root is TOP (the root's brackets are not written)."""
    tokens: list[str] = []
    stack: list[Tree | str] = list(reversed(tree.subtrees()))
    while stack:
        item = stack.pop()
        if isinstance(item, str):       # a closing bracket
            tokens.append(item)
        elif item.is_preterminal:
            tokens.append(TAG)
        else:
            tokens.append(f"({item.label}")
            stack.append(f"){item.label}")
            stack.extend(reversed(item.subtrees()))
    return tokens
