"""Constituency parsing as translation (§6.3, Table 4): Penn Treebank trees read, normalised and linearised
into sentence/tree pairs for `xspec train`, a decoder's output turned back into trees, and labelled bracket
F1 with EVALB's conventions (`xspec treebank`; docs/parsing.md).

One job per module:
    tree         the tree, its words, spans and one-line bracketed form
    reader       bracketed trees from text, errors with file:line
    normalise    empty elements removed, function tags and indices stripped
    linearise    tree -> target sequence (Vinyals, Kaiser et al. 2014)
    delinearise  target sequence -> a well-formed tree over the sentence's words, with repairs
    evalb        labelled bracket precision, recall, F1 (COLLINS.prm conventions)
    split        train/valid/test by treebank file
    prepare      a treebank to the files `xspec train` reads
    score_files  a decoder's output against gold trees, and the report
    textfile     a file's lines
"""

from xspec.parsing.delinearise import Repairs, delinearise
from xspec.parsing.evalb import Score, Totals, compare, score, sentence_brackets
from xspec.parsing.linearise import linearise
from xspec.parsing.normalise import normalise
from xspec.parsing.reader import parse_tree, read_trees
from xspec.parsing.tree import Tree, to_bracketed, words

__all__ = ["Repairs", "Score", "Totals", "Tree", "compare", "delinearise", "linearise", "normalise", "parse_tree",
           "read_trees", "score", "sentence_brackets", "to_bracketed", "words"]
