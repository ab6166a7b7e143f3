"""`xspec treebank prepare`: a treebank (one tree a line) and its file ids (one a line, aligned) to the
files `xspec train` and `xspec treebank score` read, per split:

    SPLIT.words  the sentence, words separated by spaces       (`xspec train --train-src`)
    SPLIT.trees  the linearised tree (xspec/parsing/linearise)  (`xspec train --train-tgt`)
    SPLIT.gold   the normalised tree, with its tags and words   (`xspec treebank score --gold`)

Line i of the three files is the same sentence. Beside them, `sentencepiece.model`: the shared BPE
vocabulary (§5.1) of the training split's two sides, in which every symbol of the linearised trees
(`(NP`, `)NP`, `XX`, ...) is one piece (`xspec train --vocab`). The treebank's own files are only read: its terms may
not allow copies, and the output folder is the user's.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from xspec.base.errors import UserError
from xspec.base.files import write_atomically
from xspec.parsing.linearise import linearise
from xspec.parsing.normalise import normalise
from xspec.parsing.reader import parse_tree
from xspec.parsing.split import SPLIT_NAMES, describe, split_of
from xspec.parsing.textfile import read_lines
from xspec.parsing.tree import to_bracketed, words
from xspec.runtime.vocab import MODEL_FILE, train_vocab

SUFFIXES = ("words", "trees", "gold")


@dataclass
class Prepared:
    """What was written: sentences per split, and the trees left out."""

    counts: dict[str, int] = field(default_factory=dict)
    words: dict[str, int] = field(default_factory=dict)
    outside: int = 0          # trees from files no split takes (the `wsj` scheme's sections 00, 01, 24)
    empty: int = 0            # trees of empty elements only: no sentence to parse
    files: list[Path] = field(default_factory=list)
    pieces: int = 0           # the vocabulary's size
    symbols: int = 0          # tree symbols made pieces of their own


def prepare(tree_file: Path, fileids_file: Path, output: Path, scheme: str, vocab_size: int) -> Prepared:
    tree_lines, ids = read_lines(tree_file), read_lines(fileids_file)
    if len(tree_lines) != len(ids):
        raise UserError(f"{fileids_file}: {len(ids)} lines, but {tree_file} has {len(tree_lines)}: the file ids "
                        "must be one a line, aligned with the trees")
    lines: dict[str, dict[str, list[str]]] = {name: {suffix: [] for suffix in SUFFIXES} for name in SPLIT_NAMES}
    result = Prepared(counts=dict.fromkeys(SPLIT_NAMES, 0), words=dict.fromkeys(SPLIT_NAMES, 0))
    for number, (text, file_id) in enumerate(zip(tree_lines, ids), 1):
        tree = parse_tree(text, f"{tree_file}:{number}")    # every line is checked, even ones left out
        name = split_of(file_id, scheme, f"{fileids_file}:{number}")
        normal = normalise(tree)
        if name is None:
            result.outside += 1
            continue
        if normal is None:
            result.empty += 1
            continue
        sentence = words(normal)
        lines[name]["words"].append(" ".join(sentence))
        lines[name]["trees"].append(" ".join(linearise(normal)))
        lines[name]["gold"].append(to_bracketed(normal))
        result.counts[name] += 1
        result.words[name] += len(sentence)
    missing = [name for name in SPLIT_NAMES if not result.counts[name]]
    if missing:
        raise UserError(f"{tree_file}: no trees for the {' and '.join(missing)} split(s) of --split {scheme} "
                        f"({describe(scheme)})")
    # The vocabulary first: a --vocab-size too small for the text stops prepare before it writes anything.
    train = lines["train"]
    symbols = tree_symbols(train["trees"], vocab_size)
    vocab = train_vocab(train["words"] + train["trees"], vocab_size, "bpe", output, symbols, setting="--vocab-size")
    result.files.append(output / MODEL_FILE)
    result.pieces, result.symbols = len(vocab), len(symbols)
    for name in SPLIT_NAMES:
        for suffix in SUFFIXES:
            path = output / f"{name}.{suffix}"
            write_atomically(path, "".join(line + "\n" for line in lines[name][suffix]))
            result.files.append(path)
    return result


def tree_symbols(trees: list[str], vocab_size: int) -> list[str]:
    """The symbols of the linearised trees, most frequent first, to be pieces of their own: whole, a
    target is one piece per symbol, as the linearisation means it, not two (sentencepiece cuts `(NP` at
    the change of script). A symbol with a comma is left out (sentencepiece reads the list comma-separated),
    and at most a quarter of the vocabulary goes to symbols (a treebank with thousands of labels still
    leaves room for the words)."""
    counts = Counter(symbol for tree in trees for symbol in tree.split())
    return [symbol for symbol, _ in counts.most_common() if "," not in symbol][:vocab_size // 4]
