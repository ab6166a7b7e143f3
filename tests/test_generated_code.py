"""The rules that keep generated code safe: which spec names may become which Python names
(compiler/names.py), and the AST check every generated module passes before it runs
(compiler/codecheck.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import xspec
from xspec.compiler.codecheck import GeneratedCodeError, check_module, compile_checked
from xspec.compiler.names import MODULE_ATTRIBUTES, class_name, local_name_problem, module_name_problem


def test_every_public_attribute_of_nn_module_is_reserved():
    # Asked of a fresh interpreter: libraries imported by other tests (transformers) patch nn.Module.
    listing = subprocess.run([sys.executable, "-c", "import torch; print(*dir(torch.nn.Module()))"],
                             capture_output=True, text=True, check=True).stdout
    public = {name for name in listing.split() if not name.startswith("_")}
    assert public <= MODULE_ATTRIBUTES, f"torch added attributes: {sorted(public - MODULE_ATTRIBUTES)}"


@pytest.mark.parametrize("name, problem", [
    ("training", "is an attribute of torch.nn.Module"), ("forward", "is an attribute of torch.nn.Module"),
    ("_parameters", "module names starting with '_'"), ("__x", "module names starting with '_'"),
    ("class", "is a Python keyword"), ("ffn", None), ("layers", None)])
def test_module_names(name: str, problem: str | None):
    found = module_name_problem(name)
    assert (found is None) if problem is None else (problem in found)


@pytest.mark.parametrize("name, problem", [
    ("self", "reserved in generated code"), ("cache", "reserved in generated code"), ("F", "reserved"),
    ("None", "is a Python keyword"), ("__dict__", "names starting with '__'"), ("input", None), ("x", None)])
def test_local_names(name: str, problem: str | None):
    found = local_name_problem(name)
    assert (found is None) if problem is None else (problem in found)


def test_class_names_avoid_what_the_module_already_has():
    assert class_name("encoder_layer", set()) == "EncoderLayer"
    assert class_name("f", set()) == "F2"
    assert class_name("none", set()) == "None2"
    assert class_name("sublayer", {"Sublayer", "Sublayer2"}) == "Sublayer3"
    assert class_name("__", set()) == "Block"


@pytest.mark.parametrize("path", sorted(Path("specs").rglob("*.xspec")), ids=lambda p: p.stem)
def test_every_shipped_spec_generates_code_that_passes_the_check(path: Path):
    spec = xspec.compile(str(path))
    check_module(spec.python_source)
    check_module(spec.standalone_source)


TINY = xspec.compile("specs/tiny.xspec").standalone_source  # the library's classes copied in
IMPORTING = xspec.compile("specs/tiny.xspec").python_source  # `from xspec.nn import ...`
LIBRARY_IMPORT = "from xspec.nn import Attention, LearnedPositions, ScaledEmbedding, SinusoidalPositions"


INIT = "        self.encoder = Encoder(config)"  # a line of the generated model class's __init__


@pytest.mark.parametrize("line, refused", [
    ("__import__('os')", "the name '__import__'"),
    ("eval('1')", "the name 'eval'"),
    ("self.__class__", "a Expr statement"),
    ("x = self.__class__", "private attribute"),
    ("x = F.torch", "F.torch other than"),
    ("x = torch.load('m')", "the name 'torch'"),
    ("x = [1 for t in () if t]", "comprehension other than"),
    ("import os", "a Import statement"),
    ("x = b'bytes'", "the constant b'bytes'"),
    ("x = config.d_model ** 10", "a BinOp"),  # a power only by a small literal exponent
    ("x = config.d_model ** config.d_ff", "a BinOp"),
    # A refusal is `raise ValueError(text)`, nothing else: no other exception, no cause, no formatting.
    ("raise RuntimeError('x')", "a Raise statement"),
    ("raise ValueError('x') from None", "a Raise statement"),
    ("raise ValueError(eval('1'))", "a Raise statement"),
    ("raise ValueError(f'{eval(1)}')", "the name 'eval'"),
    ("raise ValueError(f'{config!r}')", "a formatted value with a conversion"),
], ids=lambda value: value[:30])
def test_the_check_refuses_in_a_method_what_the_generator_never_emits(line: str, refused: str):
    assert INIT in TINY
    with pytest.raises(GeneratedCodeError, match=refused.replace("(", r"\(")):
        compile_checked(TINY.replace(INIT, f"{INIT}\n        {line}", 1), "<test>")


@pytest.mark.parametrize("lines, refused", [
    (["def g(eval):", "    return eval", "x = eval('1')"], "the name 'eval'"),  # a function's names are its own
    (["@staticmethod", "def g(h):", "    return h"], "a FunctionDef statement"),
    (["def g(h):", "    import os", "    return h"], "a Import statement"),
    (["def g(h):", "    return h.__class__"], "private attribute"),
])
def test_the_check_looks_into_functions_defined_in_a_method(lines: list[str], refused: str):
    inserted = "".join(f"\n        {line}" for line in lines)
    with pytest.raises(GeneratedCodeError, match=refused):
        compile_checked(TINY.replace(INIT, INIT + inserted, 1), "<test>")


def test_a_refusal_with_an_f_string_passes_the_check():
    compile_checked(TINY.replace(INIT, f"{INIT}\n        raise ValueError(f'layer {{config}} and ' 'more')", 1),
                    "<test>")


def test_a_power_by_a_small_literal_exponent_passes_the_check():
    compile_checked(TINY.replace(INIT, f"{INIT}\n        x = config.d_model ** -0.5", 1), "<test>")


def test_a_spec_function_called_twice_is_a_nested_def_that_passes_the_check():
    source = xspec.compile_source("""
model m {
  block decoder(tokens) {
    x = embedding(tokens, 10, 8)
    f = h => relu(h) * 2.0 + x
    return linear(f(f(x)), 10)
  }
}""").python_source
    assert "        def f(h):  # <spec>:5\n            return F.relu(h) * 2.0 + x  # <spec>:5\n" in source
    assert "f(f(x))" in source
    check_module(source)


def test_a_spec_function_called_once_is_written_in_place_of_its_call():
    """Its steps where the call was, on the call's line, the argument named after the parameter where
    the spec names it not; the model computes what the function and its call computed."""
    text = """
model m {
  block decoder(tokens) {
    x = embedding(tokens, 10, 8) as embed
    f = h => linear(h, 8) as proj * sigmoid(h) + h
    return linear(f(relu(x)), 10) as head
  }
}"""
    spec = xspec.compile_source(text)
    assert "def f(" not in spec.python_source
    assert ("        h = F.relu(x)  # <spec>:6\n"
            "        proj = self.proj(h)  # <spec>:6\n"
            "        return self.head(proj * F.sigmoid(h) + h)") in spec.python_source
    check_module(spec.python_source)
    model = spec.build("cpu")
    tokens = torch.tensor([[1, 2, 3]])
    x = F.relu(model.decoder.embed(tokens))
    expected = model.decoder.head(model.decoder.proj(x) * torch.sigmoid(x) + x)
    torch.testing.assert_close(model.decode(tokens), expected)


@pytest.mark.parametrize("edit, refused", [
    (("import math", "import os"), "an import other than"),
    (("import math", "from os import system"), "an import other than `from dataclasses"),
    (("from dataclasses import dataclass", "from dataclasses import field"), "an import other than"),
    (("    d_model: int = 128", "    d_model: int = print()"), "a AnnAssign in the config"),
    (("@dataclass\nclass TransformerTinyConfig:", "@dataclass(frozen=print)\nclass TransformerTinyConfig:"),
     "not a plain dataclass"),
    (("Model = ", "Model = print or "), "a module-level assignment"),
    # init_weights() checks classes: the file's, the library's and torch.nn's that set tensors, nothing else.
    (("                    nn.Linear, nn.LayerNorm,", "                    nn.modules, nn.LayerNorm,"),
     "the name 'isinstance'"),
    (("            if isinstance(module, (", "            if isinstance(module.__class__, ("), "'__class__'"),
    (("                torch.empty_like(shared))", "                torch.load(shared))"),
     "the name 'torch' here"),
    # The config computes fields in __post_init__ by assignments to its own fields, nothing else.
    (("    def __post_init__(self):", "    def setup(self):"), "other than __post_init__"),
    (("    def __post_init__(self):", "    def __post_init__(self, other):"), "other than __post_init__"),
    (("        self.d_k = self.d_model", "        print(self)\n        self.d_k = self.d_model"),
     "a Expr in TransformerTinyConfig.__post_init__"),
    (("        self.d_k = self.d_model // self.heads", "        self.d_k = __import__('os')"), "'__import__'"),
    (("class Attention(nn.Module):", "class Attention(nn.Module):\n    evil = 1"),
     "differs from the library's"),
    # A library class is copied whole: a statement, a parameter or a keyword changed or left out is refused.
    (("        self.heads, self.kv_heads, self.causal, self.cross = heads, kv_heads, causal, cross",
      "        self.heads, self.kv_heads, self.causal, self.cross = heads, kv_heads, True, cross"),
     "differs from the library's"),
    (("        self.heads, self.kv_heads, self.causal, self.cross = heads, kv_heads, causal, cross\n", ""),
     "differs from the library's"),
    ((" *, bias, out_bias, causal,\n", " *, bias, out_bias, causal=False,\n"),
     "differs from the library's"),
    (("is_causal=is_causal,\n", "is_causal=is_causal, scale=1.0,\n"), "differs from the library's"),
    # A class of the file extends nn.Module alone: library classes are composed, never extended.
    (("class Attention(nn.Module):", "class Both(Attention, Embedding):\n    evil = 1\n\n\n"
                                    "class Attention(nn.Module):"), "class Both is not a plain nn.Module"),
    (("class Attention(nn.Module):", "class Both(Attention, nn.Module):\n    \"\"\"x\"\"\"\n\n\n"
                                    "class Attention(nn.Module):"), "class Both is not a plain nn.Module"),
    (("\n\nModel = ", "\n__import__('os')\n\nModel = "), "a module-level Expr"),
], ids=lambda value: value if isinstance(value, str) else value[1].strip()[:30])
def test_the_check_refuses_in_the_module_what_the_generator_never_emits(edit: tuple[str, str], refused: str):
    old, new = edit
    assert old in TINY
    with pytest.raises(GeneratedCodeError, match=refused.replace("(", r"\(")):
        compile_checked(TINY.replace(old, new, 1), "<test>")


@pytest.mark.parametrize("edit, refused", [
    ((LIBRARY_IMPORT, LIBRARY_IMPORT + " as M"), "other than its classes"),
    ((LIBRARY_IMPORT, LIBRARY_IMPORT + ", attention"), "other than its classes"),
    ((LIBRARY_IMPORT, LIBRARY_IMPORT + ", torch"), "other than its classes"),
    ((LIBRARY_IMPORT, "from xspec.nn.attention import Attention"), "an import other than"),
    ((LIBRARY_IMPORT, "from .nn import Attention"), "an import other than"),
    # A class of the file may not take the name of one it imports.
    (("class Embed(nn.Module):", "class Attention(nn.Module):\n    pass\n\n\nclass Embed(nn.Module):"),
     "other than its classes"),
    # A class of the file extends nn.Module alone.
    (("class Embed(nn.Module):", "class Both(Attention, RotaryEmbedding):\n    \"\"\"x\"\"\"\n\n\n"
                                 "class Embed(nn.Module):"), "class Both is not a plain nn.Module"),
], ids=lambda value: value if isinstance(value, str) else value[1].strip()[:30])
def test_the_check_refuses_an_import_of_the_library_the_generator_never_emits(edit: tuple[str, str], refused: str):
    old, new = edit
    assert old in IMPORTING
    compile_checked(IMPORTING, "<test>")
    with pytest.raises(GeneratedCodeError, match=refused):
        compile_checked(IMPORTING.replace(old, new, 1), "<test>")


def test_a_source_edited_after_compiling_does_not_run(tmp_path: Path):
    spec = xspec.compile("specs/tiny.xspec")
    spec.python_source = spec.python_source.replace("import math", "import os")
    with pytest.raises(GeneratedCodeError):
        spec.build("cpu")


def test_a_standalone_module_copies_only_the_library_classes_it_uses():
    import re

    classes = lambda path: set(re.findall(r"^class (\w+)", xspec.compile(path).standalone_source, re.M))  # noqa: E731
    assert not classes("specs/base.xspec") & {"RotaryEmbedding", "RMSNorm", "TopKRouter", "Experts"}
    mixtral = classes("specs/modern/mixtral.xspec")
    assert {"RotaryEmbedding", "Router", "TopKRouter", "GroupedExperts", "Experts"} <= mixtral  # and their bases
    assert not mixtral & {"MixtureOfExperts", "BiasedExperts"}
    assert "RMSNorm" in classes("specs/modern/gemma2.xspec") and "RMSNorm" not in classes("specs/modern/llama.xspec")
