"""What generated Python code reads, found in its syntax tree rather than by searching its text: the
bare names it uses (a library class it constructs) and the attributes it reads of a name
(`config.d_ff`, `math.sqrt`, `self.heads`)."""

from __future__ import annotations

import ast
import functools


@functools.lru_cache(maxsize=4096)  # the library's classes, and a spec's, recur from file to file
def _reads(code: str) -> tuple[frozenset[str], tuple[tuple[str, str], ...]]:
    """The bare names `code` reads, and each (name, attribute) it reads, in the order ast.walk meets them."""
    names, attributes = set(), []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            attributes.append((node.value.id, node.attr))
    return frozenset(names), tuple(attributes)


def names_used(*parts: str) -> set[str]:
    """The bare names the code `parts` read (`RMSNorm` in `RMSNorm(...)`, not in `nn.RMSNorm(...)`); each
    part a whole statement or more."""
    return {name for part in parts for name in _reads(part)[0]}


def attributes_read(*parts: str, owner: str) -> list[str]:
    """The attributes the code `parts` read of the name `owner` (`d_ff` of `config.d_ff`), in order, once
    each."""
    return list(dict.fromkeys(attr for part in parts for name, attr in _reads(part)[1] if name == owner))


def config_argument(constructor: str) -> str | None:
    """The parameter a one-argument constructor reads (`dropout` of `nn.Dropout(config.dropout)`)."""
    call = ast.parse(constructor, mode="eval").body
    if isinstance(call, ast.Call) and len(call.args) == 1 and not call.keywords:
        argument = call.args[0]
        if isinstance(argument, ast.Attribute) and isinstance(argument.value, ast.Name) \
                and argument.value.id == "config":
            return argument.attr
    return None
