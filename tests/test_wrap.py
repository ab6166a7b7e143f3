"""Wrapping generated lines: a call's arguments found past nested brackets and string literals."""

import pytest

from xspec.compiler.wrap import outer_call, split_arguments


@pytest.mark.parametrize("code, opening", [
    ("f(a)(b)", 4), ("nn.ModuleDict({'norm': g(x)})", 13), ("f(')', a)", 1), ("x + y", None), ("(a)", 0),
])
def test_the_call_that_ends_a_line_is_found_past_brackets_and_strings(code: str, opening):
    assert outer_call(code) == opening


def test_arguments_split_only_at_top_level_commas():
    items = ["a", "(b, c)", "[d, e]", "'f, (g'", "h=i(j, k)"]
    assert split_arguments("a, (b, c), [d, e], 'f, (g', h=i(j, k),") == items
    assert split_arguments("") == []
