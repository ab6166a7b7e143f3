"""Printing generated syntax trees: each statement as Python writes it, its note as a comment; a statement
too long for a line wrapped at a call's arguments, at the call that ends arithmetic, at its operators (long
arithmetic), or one `or` operand a line; and the text always parses back to the tree."""

import ast

from xspec.compiler.python_code import Note, assign, call, class_def, concatenated, docstring, function, noted, variable
from xspec.compiler.python_print import LINE_LIMIT, print_checked, print_statements


def _statement(code: str, note: str | None = None) -> ast.stmt:
    return noted(ast.parse(code).body[0], note)


def _same_code(lines: list[str], code: str) -> bool:
    return ast.dump(ast.parse("\n".join(lines).strip())) == ast.dump(ast.parse(code))


def test_a_note_is_the_statements_comment_and_a_shape_comes_before_the_spec_line():
    statement = _statement("x = self.w_2(x)", None)
    noted(statement, Note("base.xspec:28", ("batch", "len", "d_model")))
    assert print_statements([statement]) == ["x = self.w_2(x)  # [batch, len, d_model]  base.xspec:28"]
    merged = Note("a.xspec:1", ("batch", "src_len")).merged(Note("a.xspec:1", ("batch", "tgt_len")))
    assert str(merged) == "[batch, src_len|tgt_len]  a.xspec:1"


def test_a_long_call_hangs_its_arguments_and_its_comment_stays_on_the_first_line():
    code = ("self.attention = Attention(config.d_model, config.heads, config.kv_heads, config.d_k, "
            "config.d_v, bias=False, out_bias=False, causal=True, rotary=RotaryEmbedding(config.d_k, 10000.0))")
    lines = print_statements([_statement(code, "llama.xspec:12")], "        ")
    assert lines[0] == "        self.attention = Attention(  # llama.xspec:12"
    assert len(lines) > 1 and all(len(line) < LINE_LIMIT for line in lines) and _same_code(lines, code)


def test_a_module_dict_wraps_at_its_entries_and_arithmetic_at_the_call_that_ends_it():
    code = "self.sublayer = nn.ModuleDict({'norm': nn.LayerNorm(config.d_model), 'dropout': nn.Dropout(config.p)})"
    lines = print_statements([_statement(code, "base.xspec:3")], " " * 40)
    assert lines[0].endswith("nn.ModuleDict({  # base.xspec:3") and lines[-1].endswith("})")
    assert _same_code(lines, code)
    code = "summed = x + self.dropout(self.cross_attention(x, memory, memory, memory_padding_mask, cache))"
    lines = print_statements([_statement(code, "base.xspec:49")], " " * 8)
    assert lines == ["        summed = x + self.dropout(  # base.xspec:49",
                     "            self.cross_attention(x, memory, memory, memory_padding_mask, cache))"]


def test_long_arithmetic_is_split_at_its_operators_and_keeps_its_meaning():
    code = ("self.layer_types = (('sliding_attention',) * (self.sliding_window_pattern - 1) + ('full_attention',)) "
            "* (self.layers // self.sliding_window_pattern + 1) - self.offset_of_the_schedule_in_layers")
    lines = print_statements([_statement(code)], " " * 12)
    assert len(lines) > 1 and all(len(line) < LINE_LIMIT for line in lines) and _same_code(lines, code)
    assert print_statements([_statement("self.d_k = self.d_model // self.heads")], "        ") == \
        ["        self.d_k = self.d_model // self.heads"]


def test_an_assignment_too_long_for_its_line_is_split_where_its_expression_alone_would_fit():
    """The target shares the first line: a string holding brackets and quotes is a literal, not syntax."""
    code = "self.layer_types = ('sliding_attention', 'x\\')\" + self.__class__ #') * ((self.layers + 1) // 2)"
    lines = print_statements([_statement(code)], " " * 24)
    assert len(lines) == 3 and all(len(line) < LINE_LIMIT for line in lines) and _same_code(lines, code)


def test_a_long_import_packs_its_names_in_parentheses():
    names = ", ".join(f"LibraryClassNumber{n}" for n in range(8))
    lines = print_statements([_statement(f"from xspec.nn import {names}")])
    assert lines[0] == "from xspec.nn import (" and lines[-1].endswith(")")
    assert all(len(line) < LINE_LIMIT for line in lines) and _same_code(lines, f"from xspec.nn import {names}")


def test_a_long_or_is_one_operand_a_line_each_with_its_own_comment_and_a_long_string_its_pieces():
    test = ast.parse("config.layer_types[i] == 'sliding_attention_of_a_long_name' or config.layer_types[i] == "
                     "'full_attention_of_a_long_name'", mode="eval").body
    message = concatenated("layer takes a branch this file was generated without: ",
                           "compile the spec with these values (xspec compile --set)")
    guard = noted(ast.If(test, [ast.Raise(call("ValueError", message), None)], []), "a.xspec:3, a.xspec:9")
    guard.notes = ["a.xspec:3", "a.xspec:9"]
    lines = print_statements([guard], " " * 8)
    assert lines[0].endswith("'sliding_attention_of_a_long_name'  # a.xspec:3")
    assert lines[1].startswith("                or ") and lines[1].endswith("):  # a.xspec:9")
    assert lines[2] == "            raise ValueError('layer takes a branch this file was generated without: '"
    assert lines[3].strip() == "'compile the spec with these values (xspec compile --set)')"
    assert all(len(line) < LINE_LIMIT for line in lines)


def test_a_class_prints_its_docstring_escaped_and_its_methods_apart():
    method = function("forward", ["self", "x"], [ast.Return(variable("x"))])
    cls = class_def("Block", [variable("Base")], [docstring('quotes """ and \\ backslash'), method, method], "b:1")
    text = print_checked([cls, assign("Model", variable("Block"))])
    assert text.split("\n")[:6] == ["class Block(Base):  # b:1", '    """quotes \\"\\"\\" and \\\\ backslash"""', "",
                                    "    def forward(self, x):", "        return x", ""]
    assert ast.parse(text).body[0].body[0].value.value == 'quotes """ and \\ backslash'
