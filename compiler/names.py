"""Which spec names may become which Python names in the generated module.

A spec's names reach generated code three ways: values (block arguments, assigned values, function
arguments) become local variables of `forward`; module names (`as` labels, and otherwise the name
of the op or block called) become attributes of an `nn.Module`; block and model names become class
names. Each kind must not shadow or break what the generated code and PyTorch rely on, so a spec
that compiles always builds. Local and module names are refused with a diagnostic (they are part of
the model's interface: parameter paths, ties); class names are only internal, and are renamed.
"""

from __future__ import annotations

import keyword
from typing import Optional

# Names every generated `forward` or `__init__` uses itself (`_` takes what a layer without outputs returns).
GENERATED_CODE_NAMES = frozenset({"self", "cache", "token_types", "layer", "torch", "nn", "F", "math", "super",
                                  "range", "_"})

# Public attributes of torch.nn.Module (torch 2.x). A child module of that name would replace a method
# (`forward`, `eval`, `to`) or a flag (`training`). tests/test_names.py checks this list against torch.
MODULE_ATTRIBUTES = frozenset({
    "T_destination", "add_module", "apply", "bfloat16", "buffers", "call_super_init", "children", "compile",
    "cpu", "cuda", "double", "dump_patches", "eval", "extra_repr", "float", "forward", "get_buffer",
    "get_extra_state", "get_parameter", "get_submodule", "half", "ipu", "load_state_dict", "modules", "mtia",
    "named_buffers", "named_children", "named_modules", "named_parameters", "parameters",
    "register_backward_hook", "register_buffer", "register_forward_hook", "register_forward_pre_hook",
    "register_full_backward_hook", "register_full_backward_pre_hook", "register_load_state_dict_post_hook",
    "register_load_state_dict_pre_hook", "register_module", "register_parameter",
    "register_state_dict_post_hook", "register_state_dict_pre_hook", "requires_grad_", "set_extra_state",
    "set_submodule", "share_memory", "state_dict", "to", "to_empty", "train", "training", "type", "xpu",
    "zero_grad",
})

# Class names the generated module defines or imports besides the spec's own classes.
RESERVED_CLASS_NAMES = frozenset({"Model", "F", "None", "True", "False"}) | GENERATED_CODE_NAMES


def local_name_problem(name: str) -> Optional[str]:
    """Why `name` cannot be a value in a block (a local variable of the generated `forward`), if it cannot."""
    if keyword.iskeyword(name):
        return f"'{name}' is a Python keyword"
    if name in GENERATED_CODE_NAMES:
        return f"'{name}' is reserved in generated code"
    if name.startswith("__"):
        return f"'{name}': names starting with '__' are reserved in generated code"
    return None


def module_name_problem(name: str) -> Optional[str]:
    """Why `name` cannot name a module (an attribute of the generated nn.Module), if it cannot."""
    if keyword.iskeyword(name):
        return f"'{name}' is a Python keyword"
    if name.startswith("_"):
        return f"'{name}': module names starting with '_' are reserved for PyTorch's own attributes"
    if name in MODULE_ATTRIBUTES:
        return f"'{name}' is an attribute of torch.nn.Module"
    return None


def class_name(name: str, taken: set[str]) -> str:
    """A CamelCase class name for a block or model (`encoder_layer` -> `EncoderLayer`) that is not in
    `taken`, not reserved and not a keyword: `F` becomes `F2` rather than shadow torch.nn.functional."""
    preferred = "".join(part[:1].upper() + part[1:] for part in name.split("_") if part) or "Block"
    candidate, n = preferred, 2
    while candidate in taken or candidate in RESERVED_CLASS_NAMES or keyword.iskeyword(candidate):
        candidate, n = f"{preferred}{n}", n + 1
    return candidate
