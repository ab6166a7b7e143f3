"""Mutants of the shipped specs, and hostile overrides of them, keep the compiler's contract."""

from hypothesis import given

from .config import cases, fuzz_settings
from .mutate import mutants
from .oracle import check
from .overrides import overridden
from .tally import counts, record

MUTANTS = 2000
OVERRIDDEN = 350


def test_mutated_shipped_specs_keep_the_contract():
    @fuzz_settings(MUTANTS)
    @given(mutants())
    def case(mutant: tuple[str, str]) -> None:
        name, text = mutant
        record("mutated shipped specs", check(text, name))

    case()
    tally = counts("mutated shipped specs")
    assert tally["cases"] >= cases(MUTANTS) and tally["ran"] > 0, tally


def test_hostile_overrides_keep_the_contract():
    @fuzz_settings(OVERRIDDEN)
    @given(overridden())
    def case(case: tuple[str, dict]) -> None:
        text, chosen = case
        record("overridden shipped specs", check(text, "spec.xspec", overrides=chosen))

    case()
    tally = counts("overridden shipped specs")
    assert tally["cases"] >= cases(OVERRIDDEN) and tally["compiled"] > 0, tally
