"""What generated Python code reads, found in its syntax tree: the bare names it uses (a library class it
constructs) and the attributes it reads of a name (`config.d_ff`, `math.sqrt`, `self.heads`)."""

from __future__ import annotations

import ast
from typing import Iterator


def _walk(parts: tuple[ast.AST, ...]) -> Iterator[ast.AST]:
    for part in parts:
        yield from ast.walk(part)


def names_used(*parts: ast.AST) -> set[str]:
    """The bare names the code `parts` read (`RMSNorm` in `RMSNorm(...)`, not in `nn.RMSNorm(...)`)."""
    return {node.id for node in _walk(parts) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}


def attributes_read(*parts: ast.AST, owner: str) -> list[str]:
    """The attributes the code `parts` read of the name `owner` (`d_ff` of `config.d_ff`), in the order
    `ast.walk` meets them, once each."""
    return list(dict.fromkeys(node.attr for node in _walk(parts) if isinstance(node, ast.Attribute)
                              and isinstance(node.value, ast.Name) and node.value.id == owner))


def config_argument(constructor: ast.expr) -> str | None:
    """The parameter a one-argument constructor reads (`dropout` of `nn.Dropout(config.dropout)`)."""
    if isinstance(constructor, ast.Call) and len(constructor.args) == 1 and not constructor.keywords:
        return config_field(constructor.args[0])
    return None


def config_field(expression: ast.expr) -> str | None:
    """The parameter `expression` is, where it is one read bare (`d_model` of `config.d_model`)."""
    if isinstance(expression, ast.Attribute) and isinstance(expression.value, ast.Name) \
            and expression.value.id == "config":
        return expression.attr
    return None
