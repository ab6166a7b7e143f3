"""The generated module of a compiled spec and its config class (the `@dataclass` ...Config), as tests edit it."""

import dataclasses
import sys


def module_and_config(spec) -> tuple:
    """(the generated module, its config class) of a compiled spec."""
    module = sys.modules[spec.model_class().__module__]
    return module, next(v for k, v in vars(module).items() if k.endswith("Config") and dataclasses.is_dataclass(v))
