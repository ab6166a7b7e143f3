"""Wrapping generated lines: a call's arguments found past nested brackets and string literals; long
arithmetic split at its operators."""

import ast

import pytest

from xspec.compiler.wrap import LINE_LIMIT, assignment, outer_call, split_arguments


@pytest.mark.parametrize("code, opening", [
    ("f(a)(b)", 4), ("nn.ModuleDict({'norm': g(x)})", 13), ("f(')', a)", 1), ("x + y", None), ("(a)", 0),
])
def test_the_call_that_ends_a_line_is_found_past_brackets_and_strings(code: str, opening):
    assert outer_call(code) == opening


def test_arguments_split_only_at_top_level_commas():
    items = ["a", "(b, c)", "[d, e]", "'f, (g'", "h=i(j, k)"]
    assert split_arguments("a, (b, c), [d, e], 'f, (g', h=i(j, k),") == items
    assert split_arguments("") == []


def test_long_arithmetic_is_split_at_its_operators_and_keeps_its_meaning():
    code = ("(('sliding_attention',) * (self.sliding_window_pattern - 1) + ('full_attention',)) * "
            "(self.layers // self.sliding_window_pattern + 1) - self.offset_of_the_schedule_in_layers")
    lines = assignment("self.layer_types", code, "            ")
    assert len(lines) > 1 and all(len(line) < LINE_LIMIT for line in lines)
    assert ast.dump(ast.parse("\n".join(lines).strip())) == ast.dump(ast.parse(f"self.layer_types = {code}"))
    assert assignment("self.d_k", "self.d_model // self.heads", "        ") == \
        ["        self.d_k = self.d_model // self.heads"]


def test_an_assignment_too_long_for_its_line_is_split_where_its_expression_alone_would_fit():
    """The target shares the first line: a string holding brackets and quotes is a literal, not syntax."""
    code = "('sliding_attention', 'x\\')\" + self.__class__ #') * ((self.layers + 1) // 2)"
    lines = assignment("self.layer_types", code, " " * 12)
    assert len(lines) == 3 and all(len(line) < LINE_LIMIT for line in lines)
    assert ast.dump(ast.parse("\n".join(lines).strip())) == ast.dump(ast.parse(f"self.layer_types = {code}"))
