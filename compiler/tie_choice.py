"""Ties under a model-level `if` (`if tie_word_embeddings { tie ... }`) stay `if`s in generated code, over the
config, so a config edited to tie or untie builds what the same --set compiles.

Each condition's ties are resolved together with the unconditional ones, and written as the assignments that
differ from theirs. They stay a choice only where that is sound: the condition reads only parameters no
block's `if` reads (BERT's `num_labels` chooses its head: a field for it would lie), and every combination
of the conditions, the assignments run in order, ties what the spec resolves for that combination.
Otherwise the ties are written as the spec's values decide them. Ties that do not check at the spec's sizes
(of modules a derived spec removed) are left out: their condition cannot hold.
"""

from __future__ import annotations

import ast as pyast
import itertools
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

from . import ast
from .body import ifs_in, reads
from .config import config_condition
from .diagnostics import Diagnostics, Span, TooManyErrors
from .evaluate import Constant
from .validate import ValidatedModel, check_ties

# Conditions whose combinations are checked at most; a spec with more writes its ties as its values decide.
MAX_CONDITIONS = 4


@dataclass(frozen=True)
class TieGroup:
    """Ties written together: always (condition None), or under the spec's `if`, as Python over the config."""

    condition: Optional[pyast.expr]
    span: Optional[Span]  # the spec's condition
    ties: dict[str, str]  # tied tensor -> the tensor it becomes
    spans: dict[str, Span]  # tied tensor -> where its tie is written
    every_layer: frozenset[str]  # tied through a stack without an index (compiler/validate.py)


def tie_groups(written: Sequence[ast.Tie], blocks: Iterable[ast.Block], fields: dict[str, Constant],
               validated: ValidatedModel) -> list[TieGroup]:
    """The ties of the generated file's constructor, group by group."""
    decided = {name for block in blocks for statement in ifs_in(block.body) for name in reads(statement.condition)}
    always = [tie for tie in written if tie.condition is None]
    base = _resolved(always, validated.params)
    assert base is not None, "the unconditional ties checked at validation"
    by_condition: dict[int, list[ast.Tie]] = {}
    for tie in written:
        if tie.condition is not None:
            by_condition.setdefault(id(tie.condition), []).append(tie)
    groups, conditional = [TieGroup(None, None, *base)], []
    for ties in by_condition.values():
        condition = ties[0].condition
        assert condition is not None
        resolved = _resolved([*always, *ties], validated.params)
        if resolved is None:  # so it does not hold: a subset of the ties that checked would check
            continue
        code = config_condition(condition, fields, "")
        if code is None or decided & set(reads(condition)):
            return [_as_decided(validated)]
        own = {tied: owner for tied, owner in resolved[0].items() if base[0].get(tied) != owner}
        groups.append(TieGroup(code, condition.span, own, {tied: resolved[1][tied] for tied in own},
                               resolved[2] & set(own)))
        conditional.append(ties)
    if len(conditional) > MAX_CONDITIONS:
        return [_as_decided(validated)]
    for chosen in itertools.product((False, True), repeat=len(conditional)):
        taken = [ties for ties, holds in zip(conditional, chosen) if holds]
        wanted = _resolved([*always, *(tie for ties in taken for tie in ties)], validated.params)
        written_groups = [groups[0], *(group for group, holds in zip(groups[1:], chosen) if holds)]
        if wanted is None or _partition(wanted[0]) != _partition(_applied(written_groups)):
            return [_as_decided(validated)]
    return groups


def _as_decided(validated: ValidatedModel) -> TieGroup:
    return TieGroup(None, None, validated.ties, validated.tie_spans, validated.tied_in_every_layer)


def _resolved(ties: Sequence[ast.Tie], params: dict[str, tuple[int, ...]]
              ) -> Optional[tuple[dict[str, str], dict[str, Span], frozenset[str]]]:
    """The ties resolved as validation does; None where they do not check."""
    diagnostics = Diagnostics()
    try:
        resolved = check_ties(ties, params, diagnostics)
    except TooManyErrors:
        return None
    return None if diagnostics.errors else resolved


def _applied(groups: Sequence[TieGroup]) -> dict[str, str]:
    """Which tensor each name holds after the groups' assignments run in order."""
    holder: dict[str, str] = {}
    for group in groups:
        for tied, owner in group.ties.items():
            holder[tied] = holder.get(owner, owner)
    return holder


def _partition(holder: dict[str, str]) -> frozenset[frozenset[str]]:
    """The sets of names that are one tensor, each name holding `holder`'s tensor (else its own)."""
    groups: dict[str, set[str]] = {}
    for name in {*holder, *holder.values()}:
        groups.setdefault(holder.get(name, name), set()).add(name)
    return frozenset(frozenset(group) for group in groups.values() if len(group) > 1)
