"""Constituency parsing (§6.3): reading trees, the linearisation and its inverse (with repairs), the EVALB-style
scorer on hand-computed cases, the split, and `xspec treebank prepare/score` on a made-up treebank."""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xspec import cli
from xspec.commands import treebank as treebank_command
from xspec.base.errors import UserError
from xspec.parsing import compare, delinearise, linearise, normalise, parse_tree, score, to_bracketed, words
from xspec.parsing.evalb import sentence_brackets
from xspec.parsing.prepare import tree_symbols
from xspec.parsing.split import split_of
from xspec.parsing.tree import Tree, spans, tags
from xspec.runtime.vocab import Vocab

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "ptb-sample-nltk"

# A made-up treebank in the Penn Treebank's style: traces, function tags and indices, gapping (=),
# unary chains, punctuation, PRT, -LRB-/-RRB-, an SBAR of empty elements only, ADVP|PRT.
TREEBANK = [
    "( (S (NP-SBJ (NNP Mary)) (VP (VBZ sleeps)) (. .)) )",
    "( (S (NP-SBJ-1 (DT The) (NN cat)) (VP (VBD wanted) (S (NP-SBJ (-NONE- *-1)) (VP (TO to) (VP (VB eat)))))"
    " (. .)) )",
    "( (SBARQ (WHNP-1 (WP What)) (SQ (VBD did) (NP-SBJ (PRP she)) (VP (VB see) (NP (-NONE- *T*-1)))) (. ?)) )",
    "( (S (NP-SBJ (PRP He)) (VP (VBD gave) (PRT (RP up)) (NP (DT the) (NN fight))) (. .)) )",
    "( (S (NP-SBJ (NNS Sales)) (VP (VBD rose) (NP-EXT (CD 5) (NN %)) (PP-TMP=2 (IN in) (NP (NNP May)))) "
    "(, ,) (NP (NNS profits)) (ADVP (RB too)) (. .)) )",
    "( (S (NP-SBJ (NP (NNP Acme) (NNP Corp.)) (PRN (-LRB- -LRB-) (NP (NNP ACM)) (-RRB- -RRB-))) "
    "(VP (VBD said) (SBAR (-NONE- 0) (S (-NONE- *T*-2)))) (. .)) )",
    "( (FRAG (NP (JJ Good) (NN news)) (: :) (`` ``) (NP (DT a) (NN raise)) ('' '') (. !)) )",
    "( (S (NP-SBJ (PRP They)) (VP (VBD sold) (ADVP|PRT (RB off)) (NP (PRP it))) (. .)) )",
]


def tree(text: str) -> Tree:
    normal = normalise(parse_tree(text))
    assert normal is not None
    return normal


# --- reading and normalising --------------------------------------------------------------------

def test_normalisation_removes_empty_elements_and_function_tags_and_keeps_tags():
    t = tree(TREEBANK[1])
    assert to_bracketed(t) == ("(TOP (S (NP (DT The) (NN cat)) (VP (VBD wanted) (S (VP (TO to) (VP (VB eat))))) "
                               "(. .)))")
    # an SBAR of nothing but empty elements goes whole; -LRB- is a tag, not a label with a function tag
    assert to_bracketed(tree(TREEBANK[5])) == (
        "(TOP (S (NP (NP (NNP Acme) (NNP Corp.)) (PRN (-LRB- -LRB-) (NP (NNP ACM)) (-RRB- -RRB-))) "
        "(VP (VBD said)) (. .)))")
    assert [n.label for n, _, _ in spans(tree(TREEBANK[4]))] == ["TOP", "S", "NP", "VP", "NP", "PP", "NP", "NP",
                                                                   "ADVP"]
    assert [n.label for n, _, _ in spans(tree(TREEBANK[7]))][4] == "ADVP|PRT"    # kept as EVALB compares it


def test_the_root_is_top_whatever_the_file_calls_it():
    expected = tree("( (S (NP (NNP Mary)) (VP (VBZ sleeps))) )")
    for text in ("(TOP (S (NP (NNP Mary)) (VP (VBZ sleeps))))", "(ROOT (S (NP (NNP Mary)) (VP (VBZ sleeps))))",
                 "(S (NP (NNP Mary)) (VP (VBZ sleeps)))", "  ((S (NP (NNP Mary))(VP (VBZ sleeps))))  "):
        assert tree(text) == expected
    assert normalise(parse_tree("( (S (NP-SBJ (-NONE- *)) (VP (-NONE- *?*))) )")) is None


@pytest.mark.parametrize("text, message", [
    ("", "an empty line"),
    ("(S (NP (NNP Mary)) (VP (VBZ sleeps))", "1 bracket(s) not closed"),
    ("(S (NP (NNP Mary)) (VP (VBZ sleeps", "3 bracket(s) not closed (the last opened at column 24)"),
    ("(S (NP (NNP Mary))) (VP (VBZ sleeps)))", "column 21: more after the end"),
    ("(S (NP (NNP Mary) (NN x)))) ", "column 27: more after the end"),
    (") (S (NN x))", "column 1: a closing bracket with no opening one"),
    ("(S (NP (NN dog cat)))", "(NN dog ...: a word must be alone under its tag"),
    ("(S (NP the (NN dog)))", "(NP the ...: a word must be alone under its tag"),
    ("(S (NP (NN dog) cat))", "word 'cat' inside (NP ...)"),
    ("(S (NP ) (VP (VBZ runs)))", "column 4: (NP) holds nothing"),
    ("(S ( (NN dog)))", "a bracket without a label inside the tree"),
    ("(NN dog)", "a lone preterminal"),
    ("dog", "word 'dog' outside any bracket"),
])
def test_malformed_trees_are_refused_with_where_and_why(text, message):
    with pytest.raises(UserError) as error:
        parse_tree(text, "trees.txt:7")
    assert str(error.value).startswith("trees.txt:7: ") and message in str(error.value)


# --- linearisation --------------------------------------------------------------------------------

def test_linearisation_of_a_hand_example():
    t = tree("( (S (NP-SBJ (NNP John)) (VP (VBZ has) (NP (DT a) (NN dog))) (. .)) )")
    assert words(t) == ["John", "has", "a", "dog", "."]
    assert " ".join(linearise(t)) == "(S (NP XX )NP (VP XX (NP XX XX )NP )VP XX )S"


def with_xx(t: Tree) -> Tree:
    if t.is_preterminal:
        return Tree("XX", t.children)
    return Tree(t.label, tuple(with_xx(child) for child in t.subtrees()))


@pytest.mark.parametrize("text", TREEBANK)
def test_every_tree_of_the_treebank_round_trips(text):
    t = tree(text)
    back, repairs = delinearise(linearise(t), words(t))
    assert back == with_xx(t) and not repairs.any()
    back, _ = delinearise(" ".join(linearise(t)), words(t), tags(t))    # with the tags given: the tree itself
    assert back == t
    assert tree(to_bracketed(t)) == t                                   # the bracketed form reads back


LABELS = st.sampled_from(["S", "NP", "VP", "PP", "SBAR", "ADJP", "ADVP|PRT", "WHNP"])


@st.composite
def trees(draw, depth: int = 4) -> Tree:
    """A random well-formed phrase (never a lone preterminal)."""
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        count = draw(st.integers(1, 3))
        return Tree(draw(LABELS), tuple(Tree("NN", (f"w{draw(st.integers(0, 99))}",)) for _ in range(count)))
    kids = draw(st.lists(st.one_of(trees(depth=depth - 1), st.builds(lambda w: Tree("DT", (w,)), st.just("the"))),
                         min_size=1, max_size=3))
    return Tree(draw(LABELS), tuple(kids))


@settings(max_examples=100, deadline=None)
@given(st.lists(trees(depth=3), min_size=1, max_size=2))
def test_random_trees_round_trip(children):
    t = Tree("TOP", tuple(children))
    back, repairs = delinearise(linearise(t), words(t), tags(t))
    assert back == t and not repairs.any()


# --- de-linearisation of malformed output ---------------------------------------------------------------

def well_formed(t: Tree) -> bool:
    """Every phrase holds something; every preterminal holds one word."""
    stack = [t]
    while stack:
        node = stack.pop()
        if not node.is_preterminal:
            if not node.children or not all(isinstance(child, Tree) for child in node.children):
                return False
            stack.extend(node.subtrees())
    return True


TOKENS = st.sampled_from(["(S", "(NP", "(VP", ")S", ")NP", ")", "XX", "XX", "XX", "(", "word", "(NPXX", "))"])


@settings(max_examples=300, deadline=None)
@given(base=st.sampled_from(TREEBANK), seed=st.integers(0, 2**32 - 1), noise=st.lists(TOKENS, max_size=12))
def test_malformed_sequences_give_a_well_formed_tree_with_exactly_the_words(base, seed, noise):
    t = tree(base)
    sequence = linearise(t)
    rng = random.Random(seed)
    for token in noise:         # insertions, deletions, truncation, at random places
        what = rng.random()
        if what < 0.4:
            sequence.insert(rng.randrange(len(sequence) + 1), token)
        elif what < 0.8 and sequence:
            del sequence[rng.randrange(len(sequence))]
        else:
            sequence = sequence[: rng.randrange(len(sequence) + 1)]
    for text in (" ".join(sequence), "".join(sequence)):    # spaces lost too
        out, _ = delinearise(text, words(t), tags(t))
        assert well_formed(out) and words(out) == words(t) and tags(out) == tags(t)
        assert tree(to_bracketed(out)) == out               # scorable: it reads back as a tree


@pytest.mark.parametrize("sequence, expected, repair", [
    # 1. a closing bracket with nothing open is dropped
    ("(S XX )S )S XX", "(TOP (S (XX a)) (XX b))", "unmatched_closing"),
    # 2. leaves past the sentence's length are dropped; the phrase left empty goes too (5)
    ("(S XX XX )S (NP XX )NP", "(TOP (S (XX a) (XX b)))", "extra_leaves"),
    # 3. missing words go to the innermost phrase still open at the end ...
    ("(S (NP XX", "(TOP (S (NP (XX a) (XX b))))", "missing_leaves"),
    # ... or, all closed, to the end of the last top-level phrase
    ("(S (NP XX )NP )S", "(TOP (S (NP (XX a)) (XX b)))", "missing_leaves"),
    ("", "(TOP (XX a) (XX b))", "missing_leaves"),
    # 4. phrases open at the end are closed
    ("(S (NP XX XX", "(TOP (S (NP (XX a) (XX b))))", "unclosed"),
    # 5. empty phrases are removed, innermost first
    ("(S (VP (NP )NP )VP XX XX )S", "(TOP (S (XX a) (XX b)))", "empty_phrases"),
    # the label on a closing bracket is ignored; `(` alone opens an X
    ("(S (NP XX )VP ( XX ) )S", "(TOP (S (NP (XX a)) (X (XX b))))", None),
])
def test_each_repair_rule(sequence, expected, repair):
    out, repairs = delinearise(sequence, ["a", "b"])
    assert to_bracketed(out) == expected
    if repair:
        assert getattr(repairs, repair) > 0
    else:
        assert not repairs.any()


def test_deep_nesting_does_not_reach_the_recursion_limit():
    out, repairs = delinearise("(NP " * 5000 + "XX", ["a"])
    assert words(out) == ["a"] and repairs.unclosed == 5000
    assert len(sentence_brackets(out)) == 1      # 5000 identical NP(0,1) brackets, one key
    assert sum(sentence_brackets(out).values()) == 5000


# --- the scorer ---------------------------------------------------------------------------------------

def test_a_perfect_parse():
    gold = tree("(S (NP (DT The) (NN dog)) (VP (VBZ barks)) (. .))")
    # brackets S(0,3) NP(0,2) VP(2,3): the full stop is not a word for spans. 3 of 3 matched.
    t = compare(gold, gold)
    assert (t.matched, t.gold, t.test, t.complete, t.crossing) == (3, 3, 3, 1, 0)
    assert t.precision == t.recall == t.f1 == 100.0


def test_a_crossing_bracket():
    gold = tree("(S (NP (DT the) (NN man)) (VP (VBD saw) (NP (PRP her))))")
    test = tree("(S (NP (DT the)) (X (NN man) (VBD saw)) (NP (PRP her)))")
    # gold: S(0,4) NP(0,2) VP(2,4) NP(3,4); test: S(0,4) NP(0,1) X(1,3) NP(3,4).
    # matched S and NP(3,4): P = 2/4 = 50, R = 2/4 = 50, F1 = 50. X(1,3) crosses NP(0,2) (and VP(2,4)): 1
    # crossing test bracket.
    t = compare(gold, test)
    assert (t.matched, t.gold, t.test, t.crossing, t.complete) == (2, 4, 4, 1, 0)
    assert t.f1 == pytest.approx(50.0)


def test_a_missing_constituent():
    gold = tree("(S (NP (PRP I)) (VP (VBD saw) (NP (NP (DT the) (NN man)) (PP (IN with) (NP (DT a) (NN dog))))))")
    test = tree("(S (NP (PRP I)) (VP (VBD saw) (NP (DT the) (NN man)) (PP (IN with) (NP (DT a) (NN dog)))))")
    # gold: S NP(0,1) VP(1,7) NP(2,7) NP(2,4) PP(4,7) NP(5,7) = 7; test lacks NP(2,7): 6 of 6 matched.
    # P = 100, R = 6/7 = 85.714, F1 = 2 * 100 * 85.714 / 185.714 = 92.308; no crossing.
    t = compare(gold, test)
    assert (t.matched, t.gold, t.test, t.crossing) == (6, 7, 6, 0)
    assert (t.precision, t.recall, t.f1) == (100.0, pytest.approx(85.714, abs=1e-3), pytest.approx(92.308, abs=1e-3))


def test_an_extra_constituent_in_a_unary_chain():
    gold = tree("(S (NP (PRP She)) (VP (VBD left)))")
    test = tree("(S (NP (PRP She)) (VP (VP (VBD left))))")
    # gold: S(0,2) NP(0,1) VP(1,2); test adds a second VP(1,2). Brackets are a multiset: the gold VP matches
    # one test VP only. 3 matched; P = 3/4 = 75, R = 3/3 = 100, F1 = 2 * 75 * 100 / 175 = 85.714.
    t = compare(gold, test)
    assert (t.matched, t.gold, t.test) == (3, 3, 4)
    assert t.f1 == pytest.approx(85.714, abs=1e-3)
    # a unary chain of two labels over one word (the `!` is punctuation: tag `.`): S(0,1) VP(0,1); the test
    # has NP for VP: 1 of 2 matched each way, F1 = 50
    t = compare(tree("(S (VP (VB Go)) (. !))"), tree("(S (NP (VB Go)) (. !))"))
    assert (t.matched, t.gold, t.test, t.f1) == (1, 2, 2, 50.0)


def test_evalb_conventions():
    # punctuation is not counted in spans: NP(0,1) either way, whichever side the comma is on
    assert compare(tree("(S (NP (NNP John) (, ,)) (VP (VBD ran)) (. .))"),
                   tree("(S (NP (NNP John)) (, ,) (VP (VBD ran)) (. .))")).f1 == 100.0
    # a phrase over punctuation only spans no word: not counted
    assert compare(tree("(S (NP (DT the) (NN dog)) (. .))"), tree("(S (NP (DT the) (NN dog)) (FRAG (. .)))")).f1 == 100
    # ADVP and PRT are one label; function tags are cut; the root (TOP) and preterminals are not brackets
    gold = tree("(S (NP-SBJ (PRP He)) (VP (VBD gave) (PRT (RP up))))")
    assert gold == tree("(TOP (S (NP (PRP He)) (VP (VBD gave) (PRT (RP up)))))")
    assert compare(gold, tree("(S (NP (PRP He)) (VP (VBD gave) (ADVP (RP up))))")).f1 == 100.0
    assert sentence_brackets(gold) == {("S", 0, 3): 1, ("NP", 0, 1): 1, ("VP", 1, 3): 1, ("ADVP", 2, 3): 1}
    with pytest.raises(ValueError, match="words differ"):
        compare(gold, tree("(S (NP (PRP She)) (VP (VBD gave) (PRT (RP up))))"))


def test_corpus_figures_are_micro_averaged_with_a_length_cut_off():
    crossing = (tree("(S (NP (DT the) (NN man)) (VP (VBD saw) (NP (PRP her))))"),
                tree("(S (NP (DT the)) (X (NN man) (VBD saw)) (NP (PRP her)))"))
    unary = (tree("(S (NP (PRP She)) (VP (VBD left)))"), tree("(S (NP (PRP She)) (VP (VP (VBD left))))"))
    long_words = " ".join(f"(NN w{i})" for i in range(41))
    long = tree(f"(S (NP {long_words}) (. .))")     # 42 words: over the cut-off of 40
    result = score([crossing, unary, (long, long)])
    # all: matched 2 + 3 + 2, gold 4 + 3 + 2, test 4 + 4 + 2 -> P = 7/10 = 70, R = 7/9 = 77.778,
    # F1 = 2 * 7 / (9 + 10) = 73.684 (the mean of the sentences' F1s would be (50 + 85.714 + 100) / 3 = 78.571)
    assert (result.all.sentences, result.all.matched, result.all.gold, result.all.test) == (3, 7, 9, 10)
    assert result.all.f1 == pytest.approx(73.684, abs=1e-3) and result.all.complete == 1
    # len<=40: the first two only: 5 matched, gold 7, test 8, F1 = 10 / 15 = 66.667
    assert result.short.sentences == 2 and result.short.f1 == pytest.approx(66.667, abs=1e-3)
    assert result.all.average_crossing == pytest.approx(1 / 3)


# --- the split ----------------------------------------------------------------------------------------

def test_split_by_file():
    files = ("wsj_0001.mrg", "wsj_0159.mrg", "wsj_0160", "combined/wsj_0199.mrg")
    assert [split_of(f, "sample", "ids:1") for f in files] == ["train", "train", "valid", "test"]
    assert split_of("wsj_0200.mrg", "sample", "ids:1") is None
    assert [split_of(f, "wsj", "ids:1") for f in ("wsj_0199.mrg", "wsj_0200.mrg", "wsj_2215.mrg", "wsj_2301.mrg")] \
        == [None, "train", "valid", "test"]
    with pytest.raises(UserError, match=r"^ids:4: 'chapter1.txt' is not a WSJ file id"):
        split_of("chapter1.txt", "sample", "ids:4")


# --- the command ----------------------------------------------------------------------------------------

FILE_IDS = ["wsj_0001.mrg", "wsj_0001.mrg", "wsj_0002.mrg", "wsj_0100.mrg", "wsj_0160.mrg", "wsj_0161.mrg",
            "wsj_0180.mrg", "wsj_0199.mrg"]


def write_treebank(folder: Path, lines: list[str] = TREEBANK, ids: list[str] = FILE_IDS) -> tuple[Path, Path]:
    trees_file, ids_file = folder / "trees.txt", folder / "fileids.txt"
    trees_file.write_text("".join(line + "\n" for line in lines))
    ids_file.write_text("".join(line + "\n" for line in ids))
    return trees_file, ids_file


def test_prepare_then_score(tmp_path, capsys):
    trees_file, ids_file = write_treebank(tmp_path)
    out = tmp_path / "ptb"
    assert cli.main(["treebank", "prepare", str(trees_file), "--fileids", str(ids_file), "-o", str(out)]) == 0
    assert "train 4 sentences (20 words), valid 2 sentences (17 words), test 2 sentences (13 words)" \
        in capsys.readouterr().out
    test_words = (out / "test.words").read_text().splitlines()
    assert test_words == ["Good news : `` a raise '' !", "They sold off it ."]
    assert (out / "test.trees").read_text().splitlines()[1] == \
        "(S (NP XX )NP (VP XX (ADVP|PRT XX )ADVP|PRT (NP XX )NP )VP XX )S"
    assert (out / "train.gold").read_text().splitlines()[1] == to_bracketed(tree(TREEBANK[1]))
    # the vocabulary: every symbol of a training tree is one piece (sentencepiece alone cuts "(NP" in two)
    vocab = Vocab.load(out / "sentencepiece.model")
    for line in (out / "train.trees").read_text().splitlines():
        assert len(vocab.encode([line])[0]) == len(line.split()) and vocab.decode(vocab.encode([line])[0]) == line

    # the gold sequences score 100; a flat guess for the second sentence loses its brackets
    assert cli.main(["treebank", "score", "--gold", str(out / "test.gold"), "--hyp", str(out / "test.trees")]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("labelled bracket F1 100.00 (precision 100.00")
    hyp = tmp_path / "test.hyp"
    hyp.write_text((out / "test.trees").read_text().splitlines()[0] + "\n(S XX XX )S\n")
    parsed = tmp_path / "parsed.txt"
    assert cli.main(["treebank", "score", "--gold", str(out / "test.gold"), "--hyp", str(hyp), "-o", str(parsed),
                     "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    # sentence 1 (FRAG, NP, NP): 3 of 3; sentence 2: gold S NP VP ADVP|PRT NP (5), test S(0,4) only, which
    # matches. Matched 4, gold 8, test 4: P = 100, R = 50, F1 = 66.667
    assert (figures["all"]["matched_brackets"], figures["all"]["gold_brackets"], figures["all"]["test_brackets"]) \
        == (4, 8, 4)
    assert figures["all"]["f1"] == pytest.approx(66.667, abs=1e-3) and figures["all"]["complete_matches"] == 1
    assert figures["repaired_outputs"] == 1 and figures["repairs"]["missing_leaves"] == 3
    assert parsed.read_text().splitlines()[1] == "(TOP (S (PRP They) (VBD sold) (RB off) (PRP it) (. .)))"


def test_tree_symbols_are_the_most_frequent_within_a_quarter_of_the_vocabulary():
    trees = ["(S (NP XX )NP (VP XX )VP )S", "(S (NP XX XX )NP (A,B XX )A,B )S"]
    assert tree_symbols(trees, 1000)[:3] == ["XX", "(S", "(NP"]
    assert set(tree_symbols(trees, 1000)) == {"XX", "(S", ")S", "(NP", ")NP", "(VP", ")VP"}  # no comma
    assert tree_symbols(trees, 8) == ["XX", "(S"]


@pytest.mark.parametrize("lines, ids, message", [
    (TREEBANK[:2] + ["( (S (NP (NN x)) )) )"] + TREEBANK[3:], FILE_IDS, "trees.txt:3: column 21: more after"),
    (TREEBANK, FILE_IDS[:-1], "fileids.txt: 7 lines, but"),
    (TREEBANK, FILE_IDS[:2] + ["notes.txt"] + FILE_IDS[3:], "fileids.txt:3: 'notes.txt' is not a WSJ file id"),
    (TREEBANK[:4], FILE_IDS[:4], "no trees for the valid and test split(s) of --split sample"),
])
def test_prepare_refuses_bad_input_naming_the_file_and_line(tmp_path, capsys, lines, ids, message):
    trees_file, ids_file = write_treebank(tmp_path, lines, ids)
    assert cli.main(["treebank", "prepare", str(trees_file), "--fileids", str(ids_file), "-o",
                     str(tmp_path / "out")]) == 1
    error = capsys.readouterr().err
    assert error.startswith("xspec: error: ") and message in error, error
    assert not (tmp_path / "out").exists()


def test_prepare_refuses_a_vocabulary_too_small_for_the_text_before_writing(tmp_path, capsys):
    trees_file, ids_file = write_treebank(tmp_path)
    assert cli.main(["treebank", "prepare", str(trees_file), "--fileids", str(ids_file), "--vocab-size", "8",
                     "-o", str(tmp_path / "out")]) == 1
    error = capsys.readouterr().err
    assert error.startswith("xspec: error: --vocab-size 8: too few pieces for the training text") and \
        "need 42; ask for at least that many" in error, error   # 36 characters, special pieces, 2 symbols
    assert not (tmp_path / "out").exists()


def test_score_refuses_misaligned_or_malformed_files(tmp_path, capsys):
    gold, hyp = tmp_path / "gold.txt", tmp_path / "hyp.txt"
    gold.write_text(TREEBANK[0] + "\n" + TREEBANK[1] + "\n")
    hyp.write_text("(S XX )S\n")
    assert cli.main(["treebank", "score", "--gold", str(gold), "--hyp", str(hyp)]) == 1
    assert "hyp.txt: 1 lines, but" in capsys.readouterr().err
    gold.write_text(TREEBANK[0] + "\n(S (NP (NN x)\n")
    assert cli.main(["treebank", "score", "--gold", str(gold), "--hyp", str(hyp)]) == 1
    assert f"{gold}:2: 2 bracket(s) not closed" in capsys.readouterr().err


def test_the_modes_spell_options_as_every_command_does():
    # tests/test_command_line.py walks each command's own parser; these are one level further down.
    parser = cli.build_parser()
    top = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["treebank"]
    modes = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert set(modes) == {"prepare", "score"}
    for mode in modes.values():
        for action in mode._actions:
            longs = [o for o in action.option_strings if o.startswith("--")]
            for option in longs:
                assert re.fullmatch(r"--[a-z][a-z0-9]*(-[a-z0-9]+)*", option)
            if "--output" in longs:
                assert "-o" in action.option_strings
    assert treebank_command.NAME == "treebank" and not getattr(treebank_command, "COMPUTES", False)


# --- the shared sample, when present ----------------------------------------------------------------

@pytest.mark.skipif(not (SHARED / "wsj_0001-0199.trees.oneline.txt").exists(), reason="no shared treebank sample")
def test_the_shared_sample_round_trips_and_splits_as_documented(tmp_path, capsys):
    trees_file, ids_file = SHARED / "wsj_0001-0199.trees.oneline.txt", SHARED / "wsj_0001-0199.trees.fileids.txt"
    assert cli.main(["treebank", "prepare", str(trees_file), "--fileids", str(ids_file), "-o", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "train 3396 sentences (81793 words), valid 273 sentences (6327 words), test 245 sentences (5964 words)" \
        in out
    assert "vocabulary: 16000 pieces" in out and "each of the 53 tree symbols one piece" in out
    for name in ("valid", "test"):     # 518 trees; prepare has read and normalised all 3914
        gold = (tmp_path / f"{name}.gold").read_text().splitlines()
        sequences = (tmp_path / f"{name}.trees").read_text().splitlines()
        for gold_line, sequence in zip(gold, sequences, strict=True):
            t = parse_tree(gold_line)
            out, repairs = delinearise(sequence, words(t), tags(t))
            assert out == t and not repairs.any()
