"""Rotary settings as config.json gives them, in either spelling transformers has written: `rope_theta`
beside `rope_scaling` (a type and its parameters, or null), or one `rope_parameters` object holding both
(per layer kind where layers differ). Each is read strictly: a key the spec does not compute is refused."""

from __future__ import annotations

from typing import Any, Sequence

from xspec.base.errors import UserError
from xspec.base.text import printable
from xspec.hf.config_reader import ConfigReader, refuse, render

# The parameters each rope_type has in the specs, beside rope_theta and rope_type.
PARAMETERS: dict[str, tuple[str, ...]] = {
    "default": (),
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "beta_fast", "beta_slow", "original_max_position_embeddings", "truncate"),
}
ALL_TYPES = tuple(PARAMETERS)

# What each parameter may be: checked where it is read, so no value of another type goes further.
_POSITIVE, _COUNT, _FLAG, _FRACTION = "a number > 0", "an integer >= 1", "true or false", "a number in (0, 1]"
_NONNEGATIVE = "a number >= 0"
KINDS: dict[str, str] = {
    "factor": _POSITIVE, "low_freq_factor": _POSITIVE, "high_freq_factor": _POSITIVE, "beta_fast": _POSITIVE,
    "beta_slow": _POSITIVE, "original_max_position_embeddings": _COUNT, "truncate": _FLAG,
    "partial_rotary_factor": _FRACTION, "mscale": _NONNEGATIVE, "mscale_all_dim": _NONNEGATIVE,
    "attention_factor": _POSITIVE,
}


def _is(kind: str, value: Any) -> bool:
    if kind == _FLAG:
        return isinstance(value, bool)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if kind == _COUNT:
        return isinstance(value, int) and value >= 1
    if kind == _NONNEGATIVE:
        return value >= 0
    return value > 0 and (kind != _FRACTION or value <= 1)


class Rope(dict):
    """rope_type, rope_theta and the type's parameters; `where` names the config key they came from."""

    where: str = "rope_parameters"


def read_rope(cfg: ConfigReader, supported: Sequence[str], kind: str | None = None,
              default_theta: float = 10000.0, scaling_extras: Sequence[str] = ()) -> Rope:
    """The rotary settings (of layer kind `kind`, e.g. "full_attention", where they differ by kind), and the
    parameters `scaling_extras` that the family's scaling also reads (DeepSeek's YaRN: mscale, mscale_all_dim)."""
    if cfg.has("rope_parameters"):
        found = cfg.get("rope_parameters")
        where = "rope_parameters"
        if kind is not None and isinstance(found, dict) and kind in found:
            found, where = found[kind], f"rope_parameters.{kind}"
        if not isinstance(found, dict):
            raise UserError(f"{cfg.file}: {where} is not an object")
        values = dict(found)
        if cfg.has("rope_theta"):   # both spellings: they must agree
            _agree(cfg, "rope_theta", cfg.get("rope_theta"), values.get("rope_theta"), where)
    else:
        scaling = cfg.get("rope_scaling", None)
        where = "rope_scaling"
        if scaling is not None and not isinstance(scaling, dict):
            raise UserError(f"{cfg.file}: rope_scaling {render(scaling)} is not an object or null")
        values = {"rope_type": "default", **(scaling or {})}
        if "type" in values:        # the older spelling of rope_type
            values["rope_type"] = values.pop("type")
        values["rope_theta"] = cfg.number("rope_theta", default_theta, integer=False, least=1e-9)
    rope_type = values.pop("rope_type", "default")
    if rope_type not in supported:
        refuse(f"{where}.rope_type {render(rope_type)}", list(supported), cfg.file)
    theta = values.pop("rope_theta", default_theta)
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or theta <= 0:
        raise UserError(f"{cfg.file}: {where}.rope_theta {render(theta)} is not a positive number")
    rope = Rope(rope_type=rope_type, rope_theta=float(theta))
    rope.where = where
    if "partial_rotary_factor" in values:      # kept beside the rotary settings by newer versions
        rope["partial_rotary_factor"] = values.pop("partial_rotary_factor")
    allowed = (*PARAMETERS[rope_type], *(scaling_extras if rope_type != "default" else ()))
    for name in allowed:
        if name in values:
            rope[name] = values.pop(name)
    for name, value in rope.items():
        if name in KINDS and not _is(KINDS[name], value):
            raise UserError(f"{cfg.file}: {where}.{name} {render(value)} is not {KINDS[name]}")
    if values:
        extra = sorted(values)[0]
        supported = ", ".join(allowed) or "no parameters"
        raise UserError(f"{cfg.file}: {where}.{printable(extra)} ({render(values[extra])}) is not supported with "
                        f"rope_type {render(rope_type)} (supported: {supported})")
    if rope_type != "default" and "factor" not in rope:
        raise UserError(f"{cfg.file}: {where} has rope_type {render(rope_type)} but no factor")
    if "original_max_position_embeddings" in PARAMETERS[rope_type]:
        top = cfg.get("original_max_position_embeddings", None)
        if "original_max_position_embeddings" not in rope:
            if top is None:
                raise UserError(f"{cfg.file}: {where} has rope_type {render(rope_type)} but no "
                                "original_max_position_embeddings")
            if not _is(_COUNT, top):
                raise UserError(f"{cfg.file}: original_max_position_embeddings {render(top)} is not {_COUNT}")
            rope["original_max_position_embeddings"] = top
        elif top is not None:
            _agree(cfg, "original_max_position_embeddings", top, rope["original_max_position_embeddings"], where)
    return rope


def _agree(cfg: ConfigReader, key: str, top: Any, inner: Any, where: str) -> None:
    if inner is not None and top != inner:
        raise UserError(f"{cfg.file}: {key} {render(top)} and {where}.{key} {render(inner)} disagree")
