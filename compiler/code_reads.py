"""What generated Python code reads, found in its syntax tree rather than by searching its text: the
bare names it uses (a prelude class it constructs) and the attributes it reads of a name
(`config.d_ff`, `math.sqrt`, `self.heads`)."""

from __future__ import annotations

import ast


def names_used(code: str) -> set[str]:
    """The bare names `code` reads (`RMSNorm` in `RMSNorm(...)`, not in `nn.RMSNorm(...)`)."""
    return {node.id for node in ast.walk(ast.parse(code))
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}


def attributes_read(code: str, owner: str) -> list[str]:
    """The attributes `code` reads of the name `owner` (`d_ff` of `config.d_ff`), in order, once each."""
    found = [node.attr for node in ast.walk(ast.parse(code)) if isinstance(node, ast.Attribute)
             and isinstance(node.value, ast.Name) and node.value.id == owner]
    return list(dict.fromkeys(found))


def config_argument(constructor: str) -> str | None:
    """The parameter a one-argument constructor reads (`dropout` of `nn.Dropout(config.dropout)`)."""
    call = ast.parse(constructor, mode="eval").body
    if isinstance(call, ast.Call) and len(call.args) == 1 and not call.keywords:
        argument = call.args[0]
        if isinstance(argument, ast.Attribute) and isinstance(argument.value, ast.Name) \
                and argument.value.id == "config":
            return argument.attr
    return None
