"""Specs generated from the language's structure keep the compiler's contract (oracle.py)."""

from hypothesis import given

from . import freeform, grammar
from .config import cases, fuzz_settings
from .oracle import check
from .tally import counts, record

MODELS = 2000
FREE_FORM = 2400
DERIVED = 120


def test_generated_models_keep_the_contract():
    @fuzz_settings(MODELS)
    @given(grammar.specs())
    def case(generated: tuple[str, str]) -> None:
        name, text = generated
        record("generated models", check(text, name))

    case()
    tally = counts("generated models")
    assert tally["cases"] >= cases(MODELS)
    # The writer aims for models that compile, so that building and running them is exercised too.
    assert tally["ran"] >= tally["cases"] * 0.3, tally


def test_free_form_specs_keep_the_contract():
    @fuzz_settings(FREE_FORM)
    @given(freeform.specs())
    def case(text: str) -> None:
        record("free-form specs", check(text))

    case()
    tally = counts("free-form specs")
    # Most are refused; the rest are blocks of any shape beside a working model, which must compile.
    assert tally["cases"] >= cases(FREE_FORM) and tally["ran"] >= tally["cases"] * 0.1, tally


def test_specs_extending_the_shipped_ones_keep_the_contract():
    """`import`, `extends`, `set`, `remove` and replaced blocks over the real base model."""

    @fuzz_settings(DERIVED)
    @given(grammar.derived_specs())
    def case(derived: tuple[str, str]) -> None:
        name, text = derived
        record("derived specs", check(text, name, allow_imports=True))

    case()
    tally = counts("derived specs")
    assert tally["cases"] >= cases(DERIVED) and tally["ran"] >= tally["cases"] * 0.2, tally
