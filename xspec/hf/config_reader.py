"""Reading config.json strictly: every attribute is taken by the family's mapping (becoming a spec
parameter), set aside as not changing the architecture (with the reason), or refused by name. What is
left over once the family's mapping has run is an attribute xspec does not know: refused too."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, NoReturn, Sequence

from xspec.base.errors import UserError
from xspec.base.text import printable
from xspec.compiler.limits import MAX_INT

_MISSING = object()

# Attributes every family may carry that do not change what the model computes, with the reason.
NOT_ARCHITECTURAL: dict[str, str] = {
    "_name_or_path": "where transformers last loaded the model from",
    "architectures": "the class name; model_type alone decides the family",
    "transformers_version": "the version that wrote the file",
    "torch_dtype": "the precision the weights are stored in; each tensor carries its own",
    "dtype": "the precision the weights are stored in; each tensor carries its own",
    "use_cache": "whether generation keeps a key/value cache; xspec's decoding always does",
    "initializer_range": "how a new model is initialised; an import starts from the weights",
    "bos_token_id": "a tokenizer id (kept with the tokenizer, for generation)",
    "eos_token_id": "a tokenizer id (kept with the tokenizer, for generation)",
    "pad_token_id": "a tokenizer id: padding is never attended to",
    "output_router_logits": "whether the forward also returns the router's logits",
    "pretraining_tp": "the tensor-parallel degree of pretraining; transformers ignores it too",
    "cache_implementation": "the kind of cache transformers' generation uses",
    "return_dict": "the form of transformers' outputs",
    "output_attentions": "whether transformers' forward also returns attention weights",
    "output_hidden_states": "whether transformers' forward also returns hidden states",
    "tokenizer_class": "the tokenizer is read from its own files",
    "chunk_size_feed_forward": "how transformers splits the feed-forward to save memory: the same values",
    "id2label": "the labels of a classification head; a language model has none",
    "label2id": "the labels of a classification head; a language model has none",
    "problem_type": "the loss of a classification head; a language model has none",
    "num_labels": "the outputs of a classification head; a language model has none",
}
# What a value of config.json must be, as a message says it (`holds` checks it).
COUNT, POSITIVE_COUNT, NUMBER, POSITIVE, FRACTION = ("an integer >= 0", "an integer >= 1", "a number >= 0",
                                                     "a number > 0", "a number in (0, 1]")
FLAG, TEXT, TEXTS, OBJECT = "true or false", "a string", "a list of strings", "an object"


def holds(kind: str, value: Any) -> bool:
    """Whether `value` is of `kind` (one of the kinds above)."""
    if kind == FLAG:
        return isinstance(value, bool)
    if kind == TEXT:
        return isinstance(value, str)
    if kind == TEXTS:
        return isinstance(value, list) and all(isinstance(item, str) for item in value)
    if kind == OBJECT:
        return isinstance(value, dict)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if kind in (COUNT, POSITIVE_COUNT):
        return isinstance(value, int) and value >= (1 if kind == POSITIVE_COUNT else 0)
    if kind == NUMBER:
        return value >= 0
    return value > 0 and (kind != FRACTION or value <= 1)


# What each attribute set aside must hold where it is given (null aside): unused, it is still checked, as
# transformers' own config classes check it.
SET_ASIDE_KINDS: dict[str, str] = {
    "_name_or_path": TEXT, "architectures": TEXTS, "transformers_version": TEXT, "torch_dtype": TEXT,
    "dtype": TEXT, "use_cache": FLAG, "initializer_range": NUMBER, "output_router_logits": FLAG,
    "pretraining_tp": COUNT, "cache_implementation": TEXT, "return_dict": FLAG, "output_attentions": FLAG,
    "output_hidden_states": FLAG, "tokenizer_class": TEXT, "chunk_size_feed_forward": COUNT,
    "id2label": OBJECT, "label2id": OBJECT, "problem_type": TEXT, "num_labels": COUNT,
    # families' own
    "head_dim": COUNT, "qk_head_dim": COUNT, "n_group": COUNT, "topk_group": COUNT, "num_logits_to_keep": COUNT,
    "original_max_position_embeddings": COUNT, "sliding_window_pattern": COUNT, "_sliding_window_pattern": COUNT,
    "max_window_layers": COUNT, "full_attention_interval": COUNT, "attn_rotary_emb": COUNT,
    "moe_layer_freq": COUNT, "ep_size": COUNT, "num_local_experts": COUNT, "experts_per_token": COUNT,
    "initial_context_length": COUNT, "num_nextn_predict_layers": COUNT, "num_hidden_layers": COUNT,
    "z_loss_coefficient": NUMBER, "aux_loss_alpha": NUMBER, "clip_qkv": NUMBER, "partial_rotary_factor": NUMBER,
    "time_step_min": NUMBER, "time_step_max": NUMBER, "time_step_floor": NUMBER, "rms_norm_eps": NUMBER,
    "seq_aux": FLAG, "topk_method": TEXT, "scoring_func": TEXT, "hybrid_override_pattern": TEXT,
    "expand": NUMBER, "mamba_expand": NUMBER, "mamba_dt_max": NUMBER, "mamba_dt_init_floor": NUMBER,
    "residual_in_fp32": FLAG, "rescale_prenorm_residual": FLAG, "use_mamba_kernels": FLAG,
    "mamba_ssm_cache_dtype": TEXT, "attention_head_dim": COUNT,
    "n_routed_experts": COUNT, "n_shared_experts": COUNT, "moe_intermediate_size": COUNT,
    "moe_shared_expert_intermediate_size": COUNT, "moe_latent_size": COUNT, "moe_shared_expert_overlap": FLAG,
    "num_experts_per_tok": COUNT, "routed_scaling_factor": NUMBER, "norm_topk_prob": FLAG,
    "mtp_layers_block_type": TEXTS, "mtp_hybrid_override_pattern": TEXT,
}


# Generation settings that versions before transformers 5 wrote into config.json; it drops them on reading
# (generation_config.json holds them).
GENERATION_KEYS = (
    "assistant_confidence_threshold", "assistant_lookbehind", "bad_words_ids", "begin_suppress_tokens",
    "diversity_penalty", "do_sample", "early_stopping", "encoder_no_repeat_ngram_size", "encoder_repetition_penalty",
    "epsilon_cutoff", "eta_cutoff", "exponential_decay_length_penalty", "forced_bos_token_id", "forced_eos_token_id",
    "length_penalty", "max_length", "min_length", "no_repeat_ngram_size", "num_assistant_tokens",
    "num_assistant_tokens_schedule", "num_beam_groups", "num_beams", "num_return_sequences", "output_scores",
    "remove_invalid_values", "repetition_penalty", "return_dict_in_generate", "suppress_tokens", "target_lookbehind",
    "temperature", "top_k", "top_p", "typical_p")


def render(value: Any) -> str:
    """A config value as an error message shows it (JSON's spelling)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{printable(value)}"'
    shown = printable(json.dumps(value, ensure_ascii=False))    # a list or object may hold any string
    return shown if len(shown) <= 80 else shown[:77] + "..."


@dataclass
class Setting:
    """One `set` line of the imported spec: the parameter, its value, and the config key it came from."""

    param: str
    value: Any
    source: str


@dataclass
class ConfigReader:
    config: dict[str, Any]
    file: str = "config.json"
    taken: set[str] = field(default_factory=set)
    settings: list[Setting] = field(default_factory=list)
    notes: dict[str, str] = field(default_factory=dict)     # attribute -> why it changes nothing
    fixed: dict[str, list] = field(default_factory=dict)    # attribute -> the only values the spec computes

    def has(self, key: str) -> bool:
        return key in self.config

    def get(self, key: str, default: Any = _MISSING) -> Any:
        """The attribute's value, marked as taken. Without a default, a missing attribute is an error."""
        self.taken.add(key)
        if key in self.config:
            return self.config[key]
        if default is _MISSING:
            raise UserError(f"{self.file}: no {key}, which a {self.config.get('model_type')} model needs")
        return default

    def number(self, key: str, default: Any = _MISSING, *, integer: bool = True, least: float = 1,
               most: float = MAX_INT, null: bool = False) -> Any:
        """An integer (or, not `integer`, any number) in [least, most]; the default bound is the int64 range
        every size and count of a spec lies in. `null`: null means the default, as transformers reads it."""
        value = self.get(key, default)
        if value is None and null and default is not _MISSING:
            value = default
        kinds = (int,) if integer else (int, float)
        if isinstance(value, bool) or not isinstance(value, kinds) or not least <= value <= most:
            what = "an integer" if integer else "a number"
            large = isinstance(value, (int, float)) and value > most
            bound = f"between {least:g} and {most:,}" if large else f">= {least:g}"
            raise UserError(f"{self.file}: {key} {render(value)} is not {what} {bound}")
        return value

    def flag(self, key: str, default: Any = _MISSING) -> bool:
        value = self.get(key, default)
        if not isinstance(value, bool):
            raise UserError(f"{self.file}: {key} {render(value)} is not true or false")
        return value

    def put(self, param: str, value: Any, source: str) -> None:
        """`set param = value` in the imported spec; a value derived from the config (YaRN's magnitude
        correction, say) is checked finite here, where its keys are still known."""
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, float) and not math.isfinite(item):
                raise UserError(f"{self.file}: {source} gives {param} = {item}, not a finite number")
        self.settings.append(Setting(param, value, source))

    def map(self, key: str, param: str, default: Any = _MISSING, *, integer: bool = True, least: float = 1,
            most: float = MAX_INT, null: bool = False) -> Any:
        value = self.number(key, default, integer=integer, least=least, most=most, null=null)
        self.put(param, value, key)
        return value

    def spelling(self, *keys: str) -> str:
        """Of several spellings of one attribute (`attribute_map` aliases, older names), in the order
        transformers prefers them, the one it reads: the first present (else the first). The others are
        taken, each noted as another spelling."""
        present = [key for key in keys if key in self.config]
        chosen = present[0] if present else keys[0]
        for other in present[1:]:
            self.taken.add(other)
            differs = "" if self.config[other] == self.config[chosen] else f"; transformers reads {chosen} over it"
            self.notes[other] = f"another spelling of {chosen}{differs}"
        return chosen

    def expect(self, key: str, allowed: Sequence[Any], default: Any = _MISSING, what: str = "") -> Any:
        """An attribute whose only supported values are `allowed` (those the family's spec computes)."""
        value = self.get(key, default)
        self.fixed[key] = list(allowed)
        if not any(value == a and isinstance(value, bool) == isinstance(a, bool) for a in allowed):
            refuse(f"{key} {render(value)}", allowed, self.file, what)
        return value

    def ignore(self, key: str, reason: str) -> None:
        """`key` set aside, with the reason; a value of the wrong kind (SET_ASIDE_KINDS) is refused all the same."""
        if key in self.config:
            value, kind = self.config[key], SET_ASIDE_KINDS.get(key)
            if value is not None and kind is not None and not holds(kind, value):
                raise UserError(f"{self.file}: {printable(key)} {render(value)} is not {kind}")
            self.taken.add(key)
            self.notes[key] = reason

    def finish(self, encoder_decoder: bool = False) -> None:
        """The attributes every family may carry, then a refusal of any left unread. `encoder_decoder`: the
        family is one (Marian's), else a decoder alone."""
        for key, reason in NOT_ARCHITECTURAL.items():
            if key not in self.taken:       # a family that reads one (a classifier's id2label) says where
                self.ignore(key, reason)
        for key in GENERATION_KEYS:
            self.ignore(key, "a generation setting older versions kept here; transformers reads none from config.json")
        self.expect("is_encoder_decoder", [encoder_decoder], encoder_decoder,
                    f" (model_type {render(self.config.get('model_type'))} is "
                    f"{'an encoder-decoder' if encoder_decoder else 'a decoder alone'})")
        left = [key for key in self.config if key not in self.taken]
        if left:
            key = left[0]
            raise UserError(f"{self.file}: attribute {printable(key)} ({render(self.config[key])}) is not one xspec "
                            f"maps for model_type {render(self.config.get('model_type'))}; refusing rather than "
                            "guessing what it changes")


def refuse(what: str, supported: Sequence[Any], file: str = "config.json", note: str = "") -> NoReturn:
    listed = ", ".join(str(v) if isinstance(v, str) else render(v) for v in supported)
    raise UserError(f"{file}: {what} is not supported (supported: {listed}){note}")
