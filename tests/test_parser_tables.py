"""The precomputed parser tables (compiler/parser_tables.py) are the grammar's, and parse as it does."""

from __future__ import annotations

import json
from pathlib import Path

import lark
import pytest
from lark import Lark

from xspec.compiler import parser_tables

SPECS = sorted(Path("specs").rglob("*.xspec")) + sorted(Path("tests/diagnostics").glob("*.xspec"))


def stored_fingerprint() -> dict:
    return json.loads(parser_tables.TABLES.read_text(encoding="utf-8"))["made_from"]


def test_the_tables_were_made_from_the_current_grammar():
    current = parser_tables.fingerprint(parser_tables.GRAMMAR.read_text(encoding="utf-8"))
    assert stored_fingerprint()["source_sha256"] == current["source_sha256"], (
        "compiler/grammar.lark changed: regenerate its tables with `python -m xspec.compiler.parser_tables`")


@pytest.mark.skipif(stored_fingerprint()["lark"] != lark.__version__,
                    reason="tables made by another Lark version are not used (the parser is built instead)")
def test_the_tables_parse_exactly_as_the_grammar_does():
    grammar = parser_tables.GRAMMAR.read_text(encoding="utf-8")
    from_tables = parser_tables._from_tables(grammar)
    built = Lark(grammar, **parser_tables.OPTIONS)
    assert from_tables is not None
    for path in SPECS:
        text = path.read_text(encoding="utf-8")
        try:
            expected = built.parse(text, start="start")
        except lark.exceptions.UnexpectedInput as error:
            with pytest.raises(type(error)):
                from_tables.parse(text, start="start")
            continue
        assert _flat(from_tables.parse(text, start="start")) == _flat(expected), path


def _flat(tree: lark.Tree) -> list[tuple]:
    """Every node with its tokens and position, without recursion (some test files nest deeply)."""
    return [(node.data, [(c.type, str(c)) if isinstance(c, lark.Token) else type(c).__name__ for c in node.children],
             () if node.meta.empty else (node.meta.line, node.meta.column, node.meta.end_line, node.meta.end_column))
            for node in tree.iter_subtrees()]


def test_tables_from_another_grammar_are_not_used(monkeypatch, tmp_path: Path):
    grammar = tmp_path / "grammar.lark"
    grammar.write_text(parser_tables.GRAMMAR.read_text(encoding="utf-8").replace('"repeat"', '"loop"'))
    monkeypatch.setattr(parser_tables, "GRAMMAR", grammar)
    parser = parser_tables.grammar_parser()
    assert parser.parse("model m { block b(x) { loop 2 { x = relu(x) } return x } }", start="start")


def test_unreadable_tables_fall_back_to_the_grammar(monkeypatch, tmp_path: Path):
    broken = tmp_path / "grammar.tables.json"
    broken.write_text('{"made_from": 1, "data": ')
    monkeypatch.setattr(parser_tables, "TABLES", broken)
    assert parser_tables.grammar_parser().parse("model m {}", start="start")
