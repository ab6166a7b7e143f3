"""Rotary settings as config.json gives them, in either spelling transformers has written: `rope_theta`
beside `rope_scaling` (a type and its parameters, or null), or one `rope_parameters` object holding both
(per layer kind where layers differ). Each is read strictly: a key the spec does not compute is refused."""

from __future__ import annotations

from typing import Any, Sequence

from xspec.base.errors import UserError
from xspec.base.text import printable
from xspec.hf.config_reader import (FLAG, FRACTION, NUMBER, POSITIVE, POSITIVE_COUNT, ConfigReader, holds,
                                    refuse, render)

# The parameters each rope_type has in the specs, beside rope_theta and rope_type.
PARAMETERS: dict[str, tuple[str, ...]] = {
    "default": (),
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "beta_fast", "beta_slow", "original_max_position_embeddings", "truncate"),
}
ALL_TYPES = tuple(PARAMETERS)

# What each parameter may be: checked where it is read, so no value of another type goes further.
KINDS: dict[str, str] = {
    "factor": POSITIVE, "low_freq_factor": POSITIVE, "high_freq_factor": POSITIVE, "beta_fast": POSITIVE,
    "beta_slow": POSITIVE, "original_max_position_embeddings": POSITIVE_COUNT, "truncate": FLAG,
    "partial_rotary_factor": FRACTION, "mscale": NUMBER, "mscale_all_dim": NUMBER,
    "attention_factor": POSITIVE, "rope_theta": POSITIVE,
}


class Rope(dict):
    """rope_type, rope_theta and the type's parameters; `where` names the config key they came from, and
    `sources` the key each value was read from where that is not `where` (a top-level key, a default)."""

    where: str = "rope_parameters"
    sources: dict[str, str]

    def source(self, name: str) -> str:
        return self.sources.get(name, f"{self.where}.{name}")


def read_rope(cfg: ConfigReader, supported: Sequence[str], default_theta: float = 10000.0,
              scaling_extras: Sequence[str] = (), top_level_partial: bool = True,
              default: dict | None = None) -> Rope:
    """The rotary settings, and the parameters `scaling_extras` that the family's scaling also reads
    (DeepSeek's YaRN: mscale, mscale_all_dim).

    As transformers reads them (modeling_rope_utils' convert_rope_params_to_dict): a non-empty rope_scaling
    over rope_parameters; rope_theta and partial_rotary_factor inside them over the top-level keys (which
    fill in what they lack); `type`, the older spelling, where rope_type is absent; and for a scaling that
    starts past original_max_position_embeddings, max_position_embeddings where they lack it (a top-level
    original_max_position_embeddings is not read). `top_level_partial`: False where the family's config
    class overwrites the top-level partial_rotary_factor (Bamba); `default`: the settings where config.json
    gives neither rope_scaling nor rope_parameters (gpt-oss's YaRN)."""
    scaling, parameters = _object(cfg, "rope_scaling"), _object(cfg, "rope_parameters")
    if scaling:
        found, where = scaling, "rope_scaling"
        if parameters:
            cfg.notes["rope_parameters"] = "transformers reads rope_scaling in its place"
    elif parameters is None and scaling is None and default is not None:
        found, where = default, "rope_parameters (the config class's default)"
    else:
        found, where = parameters or {}, "rope_parameters" if cfg.has("rope_parameters") else "rope_scaling"
    values, sources = dict(found), dict[str, str]()
    _fill(cfg, values, sources, where, "rope_theta", "rope_theta", default_theta)
    if top_level_partial:
        _fill(cfg, values, sources, where, "partial_rotary_factor", "partial_rotary_factor", None)
    return _checked(cfg, values, where, sources, supported, scaling_extras)


def read_gemma3_rope(cfg: ConfigReader, kind: str, supported: Sequence[str]) -> Rope:
    """Gemma 3's rotary settings of layer kind `kind` ("sliding_attention" or "full_attention"): rope_scaling
    merged into the full-attention layers', rope_theta the full-attention layers' base and
    rope_local_base_freq the sliding ones' where rope_parameters lacks them (read_rope_of_kind)."""
    top = ("rope_theta", 1000000.0) if kind == "full_attention" else ("rope_local_base_freq", 10000.0)
    return read_rope_of_kind(cfg, kind, supported, top, scaled=kind == "full_attention", family="Gemma 3")


def read_rope_of_kind(cfg: ConfigReader, kind: str, supported: Sequence[str], top: tuple[str, float],
                      scaled: bool, family: str) -> Rope:
    """The rotary settings of layer kind `kind` ("sliding_attention" or "full_attention"), as config classes
    that rotate each kind with its own base read them (Gemma 3's, ModernBERT's): rope_parameters by layer
    kind (a kind it lacks, or a flat rope_parameters, takes the defaults), rope_scaling merged in where
    `scaled`, the top-level key `top` (with its default) giving the base where rope_parameters lacks it."""
    scaling, parameters = _object(cfg, "rope_scaling"), _object(cfg, "rope_parameters")
    given = (parameters or {}).get(kind)
    if given is not None and not isinstance(given, dict):
        raise UserError(f"{cfg.file}: rope_parameters.{kind} {render(given)} is not an object or null")
    if parameters and not any(k in parameters for k in ("sliding_attention", "full_attention")):
        cfg.notes["rope_parameters"] = (f"transformers' {family} reads rope_parameters by layer kind "
                                        "(sliding_attention, full_attention) and takes the defaults for these flat "
                                        "values")
    values, where, sources = dict(given or {}), f"rope_parameters.{kind}", dict[str, str]()
    if scaled and scaling is not None:
        values.update(scaling)
        where = "rope_scaling" if given is None else f"{where} and rope_scaling"
    _fill(cfg, values, sources, where, "rope_theta", *top)
    return _checked(cfg, values, where, sources, supported, ())


def _object(cfg: ConfigReader, key: str) -> dict | None:
    value = cfg.get(key, None)
    if value is not None and not isinstance(value, dict):
        raise UserError(f"{cfg.file}: {key} {render(value)} is not an object or null")
    return value


def _fill(cfg: ConfigReader, values: dict, sources: dict[str, str], where: str, name: str, top_key: str,
          default: Any) -> None:
    """values[name] from the top-level key `top_key` (else `default`) where the rotary settings lack it; a
    top-level value they hold otherwise is noted as not read."""
    top = cfg.get(top_key, None)
    if top is not None and name in KINDS and not holds(KINDS[name], top):     # checked even where not read
        raise UserError(f"{cfg.file}: {top_key} {render(top)} is not {KINDS[name]}")
    if name not in values:
        if top is not None or default is not None:
            values[name] = top if top is not None else default
            sources[name] = top_key if top is not None else f"{top_key} (default)"
    elif top is not None and top != values[name]:
        cfg.notes[top_key] = f"transformers reads {where}.{name} ({render(values[name])}) over it"


def _checked(cfg: ConfigReader, values: dict, where: str, sources: dict[str, str], supported: Sequence[str],
             scaling_extras: Sequence[str]) -> Rope:
    """The gathered rotary settings, each checked: the type supported, every parameter of the kind it must
    be, none the spec does not compute."""
    legacy = values.pop("type", None)   # the older spelling of rope_type
    rope_type = values.pop("rope_type", None) or legacy or "default"
    if rope_type not in supported:
        refuse(f"{where}.rope_type {render(rope_type)}", list(supported), cfg.file)
    theta = values.pop("rope_theta")
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or theta <= 0:
        raise UserError(f"{cfg.file}: {sources.get('rope_theta', where + '.rope_theta')} {render(theta)} is not a "
                        "positive number")
    rope = Rope(rope_type=rope_type, rope_theta=float(theta))
    rope.where, rope.sources = where, sources
    if "partial_rotary_factor" in values:      # kept beside the rotary settings by newer versions
        rope["partial_rotary_factor"] = values.pop("partial_rotary_factor")
    allowed = (*PARAMETERS[rope_type], *(scaling_extras if rope_type != "default" else ()))
    for name in allowed:
        if name in values:
            rope[name] = values.pop(name)
    for name, value in rope.items():
        if name in KINDS and not holds(KINDS[name], value):
            raise UserError(f"{cfg.file}: {rope.source(name)} {render(value)} is not {KINDS[name]}")
    if values:
        extra = sorted(values)[0]
        listed = ", ".join(allowed) or "no parameters"
        raise UserError(f"{cfg.file}: {where}.{printable(extra)} ({render(values[extra])}) is not supported with "
                        f"rope_type {render(rope_type)} (supported: {listed})")
    if rope_type != "default" and "factor" not in rope:
        raise UserError(f"{cfg.file}: {where} has rope_type {render(rope_type)} but no factor")
    if "original_max_position_embeddings" in PARAMETERS[rope_type]:
        top = cfg.get("original_max_position_embeddings", None)
        if top is not None and not holds(POSITIVE_COUNT, top):
            raise UserError(f"{cfg.file}: original_max_position_embeddings {render(top)} is not {POSITIVE_COUNT}")
        if top is not None:
            cfg.notes["original_max_position_embeddings"] = \
                f"transformers reads {where}.original_max_position_embeddings (or max_position_embeddings) instead"
        if "original_max_position_embeddings" not in rope:
            longest = cfg.get("max_position_embeddings", None)
            if not holds(POSITIVE_COUNT, longest):
                raise UserError(f"{cfg.file}: {where} has rope_type {render(rope_type)} but no "
                                "original_max_position_embeddings, and max_position_embeddings "
                                f"{render(longest)} is not {POSITIVE_COUNT}")
            rope["original_max_position_embeddings"] = longest
            sources["original_max_position_embeddings"] = \
                f"max_position_embeddings ({where} has no original_max_position_embeddings)"
    return rope
