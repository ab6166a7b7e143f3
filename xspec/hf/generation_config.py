"""A checkpoint's generation_config.json: how transformers' `generate` decodes the model by default, as the
imported spec's `decode` section (each line commented with the key it came from), and the ids a
continuation ends at. Without the file, `generate` is greedy, and so is the import.

Read as untrusted as config.json: a value of the wrong kind is refused by name. A setting xspec's decoding
does not apply is set aside with the reason (import.json), and the import says so where it changes what
a continuation is."""

from __future__ import annotations

from dataclasses import dataclass, field

from xspec.base.errors import UserError
from xspec.base.input_dir import InputDirectory
from xspec.base.text import shown
from xspec.hf.config_reader import COUNT, ConfigReader, Setting, holds, render

FILE = "generation_config.json"
MAX_BYTES = 1 << 20

# Settings transformers' generate applies that xspec's decoding does not (yet): the continuation may differ.
NOT_APPLIED = {
    "bad_words_ids": None, "forced_bos_token_id": None,     # bad_words_ids of several tokens
    "forced_eos_token_id": None, "encoder_repetition_penalty": 1.0, "exponential_decay_length_penalty": None,
    "diversity_penalty": 0.0, "num_beam_groups": 1,
}
# Sampling's filters after top-k and top-p (runtime/sampling.py), keys of the decode section of the same names:
# the value that turns each off, and the bounds transformers' warpers take.
FILTERS: dict[str, tuple[float | None, float, float]] = {
    "min_p": (None, 0.0, 1.0), "typical_p": (1.0, 1e-9, 1.0), "epsilon_cutoff": (0.0, 0.0, 1 - 1e-9),
    "eta_cutoff": (0.0, 0.0, 1 - 1e-9),
}
# Settings transformers' logits processors apply and xspec's decoding applies alike (runtime/score_rules.py),
# keys of the decode section of the same names, each with the value that turns it off: read by an import,
# written back by an export.
RULES: dict[str, float | int | tuple[int, ...]] = {
    "repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "min_new_tokens": 0, "min_length": 0,
    "suppress_tokens": (), "begin_suppress_tokens": (),
}
MAX_COUNT = (1 << 31) - 1       # a rule's count or token id: beyond it, no model xspec builds has one
# Settings that change no continuation: how generate runs or what it returns.
UNUSED = ("transformers_version", "_from_model_config", "use_cache", "cache_implementation", "return_dict_in_generate",
          "output_scores", "output_logits", "output_attentions", "output_hidden_states", "num_return_sequences",
          "pad_token_id", "bos_token_id", "decoder_start_token_id", "remove_invalid_values", "renormalize_logits",
          "max_length", "trust_remote_code", "assistant_confidence_threshold",
          "num_assistant_tokens", "num_assistant_tokens_schedule")


@dataclass
class Generation:
    decode: list[Setting]                    # the decode section's lines, each with its key
    eos_ids: list[int]                       # ids a continuation ends at, beyond config.json's
    notes: dict[str, str] = field(default_factory=dict)
    changed: list[str] = field(default_factory=list)   # settings not applied that change a continuation
    file: dict | None = None                           # the file as given (an export writes it back)


def read_generation(folder: InputDirectory, config: dict | None = None) -> Generation:
    """`config`: an encoder-decoder's config.json, whose decoder start token generate falls back to; the
    output's length and its start are then read too (`_translation`)."""
    if not folder.has(FILE):
        generation = Generation([Setting("sample", False, f"no {FILE}: transformers' generate is greedy"),
                                 Setting("beam", 1, f"no {FILE}: transformers' generate is greedy"),
                                 *_beams(ConfigReader({}, f"no {FILE}"))], [])
        if config is not None:
            generation.decode += _translation(ConfigReader({}, f"no {FILE}"), config)
        return generation
    where, values = shown(folder.file(FILE)), folder.read_json(FILE, MAX_BYTES)
    if not isinstance(values, dict):
        raise UserError(f"{where}: not a JSON object")
    cfg = ConfigReader(values, where)
    # what an encoder-decoder's output, or any model's banned words, add
    extra = _translation(cfg, config) if config is not None else _bad_words(cfg, _eos_ids(cfg), refuse=False)
    sample, beams = cfg.flag("do_sample", False), cfg.number("num_beams", 1)
    decode = [Setting("sample", sample, _source(cfg, "do_sample", False)),
              Setting("beam", beams, _source(cfg, "num_beams", 1)), *_beams(cfg)]
    if sample and beams > 1:
        decode.append(Setting("beam_sampling", True, f"{FILE} do_sample with num_beams: beam sampling"))
    for key, default in (("temperature", 1.0), ("top_k", 50), ("top_p", 1.0)):
        if not sample:
            cfg.ignore(key, "a sampling setting; do_sample is false")
            continue
        value = cfg.get(key, default)
        if key == "top_k":
            if value is not None and not holds(COUNT, value):
                raise UserError(f"{cfg.file}: top_k {render(value)} is not {COUNT}")
            value = value or 0             # 0 (or null): no top-k filter
        else:
            value = cfg.number(key, default, integer=False, least=1e-9, most=1 if key == "top_p" else 1e9)
        decode.append(Setting(key, value, _source(cfg, key, default)))
    for key, (neutral, least, most) in FILTERS.items():
        if not sample:
            cfg.ignore(key, "a sampling setting; do_sample is false")
        elif cfg.get(key, None) not in (None, neutral):
            decode.append(Setting(key, cfg.number(key, integer=False, least=least, most=most), f"{FILE} {key}"))
    for key, off in RULES.items():
        value = _rule(cfg, key, off)
        if value != off:
            decode.append(Setting(key, list(value) if isinstance(value, tuple) else value,
                                  _source(cfg, key, list(off) if isinstance(off, tuple) else off)))
    if cfg.has("max_new_tokens"):
        decode.append(Setting("max_new_tokens", cfg.number("max_new_tokens"), _source(cfg, "max_new_tokens", None)))
    decode = _suppressing(decode, extra)
    generation = Generation(decode, _eos_ids(cfg), cfg.notes, file=values)
    applied = set(cfg.taken)
    for key, neutral in NOT_APPLIED.items():
        value = cfg.get(key, neutral)
        if key not in applied and value != neutral and value not in (None, [], {}):
            generation.notes[key] = "transformers' generate applies it; xspec's decoding does not yet"
            generation.changed.append(f"{key} {render(value)}")
    for key in UNUSED:
        if key not in applied:
            cfg.ignore(key, "how generate runs, what it returns, or a length counted with the prompt; the decode "
                            "section sets xspec's")
    for key in cfg.config:
        if key not in cfg.taken:
            generation.notes[key] = "not read: xspec's decoding has no such setting"
    return generation


def _beams(cfg: ConfigReader) -> list[Setting]:
    """Beam search as generate's: its scoring, length_penalty (an exponent of the length there) and
    early_stopping, read even where num_beams is 1, so that a beam given later decodes as generate would."""
    penalty = cfg.number("length_penalty", 1.0, integer=False, least=0, most=1e9)
    early = cfg.get("early_stopping", False)
    if early not in (True, False, "never"):
        raise UserError(f"{cfg.file}: early_stopping {render(early)} is not true, false or \"never\"")
    return [Setting("beam_scoring", "transformers", "beams scored as transformers' generate scores them"),
            Setting("length_penalty", float(penalty), _source(cfg, "length_penalty", 1.0)),
            Setting("early_stopping", early, _source(cfg, "early_stopping", False))]


def _translation(cfg: ConfigReader, config: dict) -> list[Setting]:
    """What generate does with an encoder-decoder that xspec's translation does alike: the output starts from
    decoder_start_token_id (config.json's where the file has none), holds at most max_length - 1 tokens after
    it (20 where none is given), begins with forced_bos_token_id where one is given, ends with the end token
    at the maximum length (forced_eos_token_id, where it is that token: the search allows only the end token
    there), and never holds the single tokens of bad_words_ids (Marian's padding). Each key read here is
    marked taken."""
    start_key = "decoder_start_token_id"
    start = cfg.get(start_key, None)
    if start is None:   # as generate falls back: config.json's, else the bos token
        start = next((v for v in (config.get(start_key), cfg.get("bos_token_id", None), config.get("bos_token_id"))
                      if v is not None), None)
    if type(start) is not int or not 0 <= start <= MAX_COUNT:
        raise UserError(f"{cfg.file}: {start_key} {render(start)} is not a token id (config.json's, or the "
                        "bos_token_id of either, is read where the file has none)")
    length = cfg.number("max_length", 20)
    settings = [Setting("decoder_start", start, _source(cfg, start_key, config.get(start_key))),
                Setting("max_len_a", 0.0, f"{FILE} max_length: the output's length alone"),
                Setting("max_len_b", length - 1, _source(cfg, "max_length", 20) + " (less the start token)")]
    eos = _eos_ids(cfg) or ([config["eos_token_id"]] if type(config.get("eos_token_id")) is int else [])
    forced = cfg.get("forced_eos_token_id", None)
    if forced is not None and forced not in eos:
        raise UserError(f"{cfg.file}: forced_eos_token_id {render(forced)} is not the end token ({render(eos)}): "
                        "not supported")
    if forced is None:      # generate cuts the output at max_length
        settings.append(Setting("force_end", False, f"{FILE}: no forced_eos_token_id: cut at max_length"))
    forced = cfg.get("forced_bos_token_id", None)
    if forced is not None:
        if not _count(forced):
            raise UserError(f"{cfg.file}: forced_bos_token_id {render(forced)} is not a token id")
        settings.append(Setting("forced_bos", forced, f"{FILE} forced_bos_token_id"))
    return settings + _bad_words(cfg, eos, refuse=True)


def _bad_words(cfg: ConfigReader, eos: list[int], refuse: bool) -> list[Setting]:
    """bad_words_ids of single tokens as suppress_tokens (generate bans them alike, Marian's padding among
    them), but the end tokens `eos`, which generate leaves out. Longer sequences, which a decode section
    cannot hold, are refused where `refuse`, else left unread for the import to say it does not apply them."""
    words = cfg.config.get("bad_words_ids") or []
    if not (isinstance(words, list) and all(isinstance(w, list) and len(w) == 1 and _count(w[0]) for w in words)):
        if refuse:
            raise UserError(f"{cfg.file}: bad_words_ids {render(words)}: only single tokens are supported (each a "
                            "list of one token id)")
        return []
    cfg.taken.add("bad_words_ids")      # applied
    banned = [w[0] for w in words if w[0] not in eos]
    return [Setting("suppress_tokens", banned, f"{FILE} bad_words_ids")] if banned else []


def _suppressing(decode: list[Setting], extra: list[Setting]) -> list[Setting]:
    """The decode settings with the `extra` ones (a translation's, bad words'), one suppress_tokens holding both
    lists."""
    more = next((s for s in extra if s.param == "suppress_tokens"), None)
    own = next((s for s in decode if s.param == "suppress_tokens"), None)
    if more is not None and own is not None:
        own.value = list(dict.fromkeys([*own.value, *more.value]))
        own.source += f", {more.source}"
        extra = [s for s in extra if s is not more]
    return decode + extra


def _rule(cfg: ConfigReader, key: str, off: float | int | tuple[int, ...]) -> float | int | tuple[int, ...]:
    """One of RULES, checked for its kind (null: off, as transformers reads it)."""
    if isinstance(off, float):
        return cfg.number(key, off, integer=False, least=1e-9, most=1e9)
    value = cfg.get(key, None) or off
    if isinstance(off, tuple):
        if not isinstance(value, (list, tuple)) or not all(_count(token) for token in value):
            raise UserError(f"{cfg.file}: {key} {render(value)} is not a list of token ids (integers from 0 to "
                            f"{MAX_COUNT:,})")
        return tuple(value)
    if not _count(value):
        raise UserError(f"{cfg.file}: {key} {render(value)} is not an integer from 0 to {MAX_COUNT:,}")
    return value


def _count(value: object) -> bool:
    return isinstance(value, int) and holds(COUNT, value) and value <= MAX_COUNT


def check_token_ids(generation: Generation, rows: int, where: str) -> None:
    """The token ids of the rules (suppress_tokens, ...) must be rows of the model's embedding (`rows`);
    `where` names generation_config.json."""
    for setting in generation.decode:
        if isinstance(RULES.get(setting.param), tuple):
            for token in setting.value:
                if token >= rows:
                    raise UserError(f"{where}: {setting.param} holds {token}, which is not a token id: the model's "
                                    f"embedding has {rows:,} rows")


def _source(cfg: ConfigReader, key: str, default: object) -> str:
    return f"{FILE} {key}" if cfg.has(key) else f"{FILE}: no {key} (transformers' default: {render(default)})"


def _eos_ids(cfg: ConfigReader) -> list[int]:
    value = cfg.get("eos_token_id", None)
    ids = value if isinstance(value, list) else [] if value is None else [value]
    for i, token in enumerate(ids):
        if type(token) is not int or token < 0:
            where = f"eos_token_id[{i}]" if isinstance(value, list) else "eos_token_id"
            raise UserError(f"{cfg.file}: {where} {render(token)} is not a token id (an integer from 0)")
    return ids
