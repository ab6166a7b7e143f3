"""xspec: declarative Transformer specs compiled to PyTorch.

    spec = xspec.compile("specs/base.xspec", overrides={"heads": 16})
    spec.parameters, spec.graph, spec.python_source, spec.train, spec.data, spec.decode
    model = spec.build()  # torch.nn.Module with encode / decode(cache=xspec.DecoderCache()) / forward

    trained = xspec.load("runs/lm")  # a trained run or checkpoint: model, tokenizer, spec
    trained.generate(["the cat"]), trained.score(["a line"]), xspec.load("runs/tiny").translate(["..."])

See docs/model-interface.md for the model's interface.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Mapping, Optional, Union

from xspec.base.errors import SpecError, UserError

if TYPE_CHECKING:
    from xspec.runtime.inference import TrainedModel
    from xspec.compiler.spec import CompiledSpec

__all__ = ["compile", "compile_source", "load", "CompiledSpec", "DecoderCache", "SpecError", "UserError"]


def compile(path: Union[str, os.PathLike], overrides: Optional[Mapping[str, Any]] = None) -> CompiledSpec:
    """Parse, resolve, build the graph, validate and lower the spec at `path`.

    `path` may be a run directory: one `xspec import` wrote (its model.xspec is compiled), or one `xspec train`
    wrote (its spec.xspec, the spec as it trained, self-contained).
    `overrides` sets parameters (`{"heads": 16}`) or section keys (`{"train.warmup_steps": 400}`);
    string values are parsed as spec expressions. Raises SpecError with every diagnostic found.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        from xspec.runtime.run_dir import IMPORTED_SPEC_FILE, SPEC_FILE

        path = next((os.path.join(path, name) for name in (IMPORTED_SPEC_FILE, SPEC_FILE)
                     if os.path.isfile(os.path.join(path, name))), path)
    # Imported here, not above: `import xspec` (and so every `xspec` command's start-up) stays
    # free of the compiler's dependencies until a spec is compiled.
    from xspec.compiler.spec import compile_file

    return compile_file(path, overrides)


def compile_source(text: str, name: str = "<spec>", overrides: Optional[Mapping[str, Any]] = None,
                   allow_imports: bool = True) -> CompiledSpec:
    """Like `compile`, for spec text held in memory (imports resolve relative to `name`).

    `allow_imports=False` refuses `import` (a spec read from a checkpoint or a run directory is
    self-contained, and must not reach for other files)."""
    from xspec.compiler.spec import compile_source as compile_text

    return compile_text(text, name, overrides, allow_imports)


def load(run_or_checkpoint, device=None, compile: str = "off", weights: Optional[str] = None) -> TrainedModel:
    """A trained run (its latest checkpoint) or checkpoint file, ready to translate, generate or score.

    `device`: "cpu", "cuda", ... (default: CUDA when available); `compile` ("auto", "on", "off"):
    whether the decoder's step runs through torch.compile; `weights` ("auto", "fp32", "bf16", "int8";
    default: the spec's decode.weights): what the linear layers' weights are kept in. Raises UserError
    for what cannot be loaded.
    """
    from xspec.runtime.inference import load as load_trained

    return load_trained(run_or_checkpoint, device, compile, weights)


def __getattr__(name: str) -> Any:
    """`xspec.CompiledSpec` and `xspec.DecoderCache`, imported on first use (see `compile`)."""
    if name == "CompiledSpec":
        from xspec.compiler.spec import CompiledSpec

        return CompiledSpec
    if name == "DecoderCache":
        from xspec.runtime.cache import DecoderCache

        return DecoderCache
    raise AttributeError(f"module 'xspec' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | {"CompiledSpec", "DecoderCache"})
