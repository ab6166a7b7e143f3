"""Hostile versions of the files xspec reads besides specs: a Hugging Face checkpoint's config.json,
tokenizer.json and tokenizer.model, and a prepared data directory's manifest.json, data files and an
interrupted prepare's progress.json.

Each group of mutations is a Hypothesis strategy drawing a `Mutant` of a valid directory (a `Template`):
the files to write, remove, link or replace in a copy of it, with a description in words. A value change
is made on the parsed JSON and written back by json_text.dump (numbers JSON cannot hold spelled raw); a
text change works on the file's bytes (cut short, not UTF-8, not JSON). Where the files hash each other
(a prepared directory's manifest lists every file's SHA-256), a data change can re-hash, so that the
checks past the hashes are reached too.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from hypothesis import strategies as st

from .json_text import Raw, at, dump, name_of, paths, removed, renamed, replaced, shown, with_pairs

# A JSON string that becomes the absolute path of a file outside the input directory (the bait, which no
# command may read) when a case is written out.
BAIT = "@BAIT@"
BAIT_NAME = "secret.bin"

# --- values -------------------------------------------------------------------------------------------

# Values of another type than the one a key has.
WRONG_TYPES: tuple = ("3", "", "true", "null", [], [1], [[]], {}, {"a": 1}, None, True, False, 0.5, 1, -1, "0.0",
                      "\u001b[31mred\u001b[0m")

# Numbers as JSON text: the int64 and float64 edges and past them, overflow to infinity, underflow, NaN
# and Infinity spelled raw, more digits than Python converts, and tokens that are not JSON numbers.
EXTREME_NUMBERS = tuple(Raw(text) for text in (
    "0", "-0", "-1", "1", "2", "0.0", "-0.0", "0.5", "1.5", "1e2", "2.0", "65536", "4294967296",
    "9223372036854775807", "9223372036854775808", "-9223372036854775809", "18446744073709551616", "1e308",
    "-1e308", "1e999", "-1e999", "5e-324", "1e-320", "1e-400", "NaN", "Infinity", "-Infinity", "1" + "0" * 30,
    "1" + "0" * 5000, "01", "1.", ".5", "+1", "0x10", "1e", "--1",
))

# Strings: empty, blank, line breaks, a terminal's escapes, NUL, bidi and line-separator characters, a
# lone surrogate (valid as a JSON escape, not as UTF-8), long, paths, format directives.
HOSTILE_STRINGS = (
    "", " ", "a\nb", "\r", "\u001b[2J\u001b[31mred", "\u0000", "nul\u0000x", "\u202eevil", "\u2028", "\u007f",
    "\ud800", "\u00e9\U0001d4c1", "x" * 10_000, "../../etc/passwd", "%s%n", "{0}", "None", "'\"", "\\",
)

# Keys to add to an object: near-misses of real ones, escapes, nothing, a surrogate.
HOSTILE_KEYS = ("", " ", "\u001b[31mhidden_size\u001b[0m", "hidden_size\n", "hidden_size ", "Hidden_Size",
                "vocab\u0000size", "\ud800", "__class__", "x" * 5_000, "rope_scaling\u200b", "\u202etype")

# How a key is misspelled: the ways a hand-edited file goes wrong.
RENAMINGS: tuple[tuple[str, Callable[[str], str]], ...] = (
    ("upper case", str.upper), ("a trailing space", lambda k: k + " "), ("dashes", lambda k: k.replace("_", "-")),
    ("an ANSI escape", lambda k: "\u001b[31m" + k), ("a line break", lambda k: k + "\n"),
    ("a NUL", lambda k: k + "\u0000"), ("a zero-width space", lambda k: k + "\u200b"),
    ("its last letter dropped", lambda k: k[:-1]), ("a lone surrogate", lambda k: k + "\ud800"),
)

# Token ids: negative, at and past every width's edge, not integers.
TOKEN_IDS: tuple = (-1, -2**31, 300, 301, 1_000_000, 2**31 - 1, 2**31, 2**32, 2**63 - 1, Raw("9223372036854775808"),
                    Raw("1" + "0" * 30), 2.0, 1.5, "1", None, True, [], [2], {"id": 2})

# Regular expressions: ones that backtrack for ever on the right text, and ones that do not compile.
PATHOLOGICAL_REGEXES = ("(a+)+$", "(a|a)*b", "(?:a|aa)+$", "(.*a){20}", "(\\w+\\s?)+$", "((a*)*)*b",
                        "(?=(a+))+\\1b", "(a|b|ab)*c")
INVALID_REGEXES = ("(", "[", "\\", "a{2,1}", "(?<", "*", "(?P<x>a)(?P<x>b)", "\\p{Nope}", "[z-a]", "")

# Prompts for a tokenizer to encode: the text the pathological regexes choke on among them.
PROMPTS = ("w1 w2 w3", "", " ", "a" * 40 + "!", "ab" * 30 + "c", "w1\u001b[31m w2", "\u202ew1", "\U0001d4c1" * 8,
           "w299 w300 w301", "caf\udce9")     # the last: the byte 0xe9 in argv, as Python holds it (surrogateescape)

# Names a manifest or progress record may give its files: out of the directory, devices, not names at all.
FILE_NAMES = ("../" + BAIT_NAME, BAIT, "/dev/zero", "/dev/stdin", "/proc/self/environ", "", ".", "..", "sub/x.bin",
              "tokens-00000.bin/.", "tokens-00000.bin\n", "\u001b[31mtokens-00000.bin", "x\u0000y", "manifest.json",
              "sentencepiece.model", "documents.bin", "missing-00000.bin", "C:\\x.bin", "\\\\server\\share\\x",
              "~/x.bin", "tokens-00000.bin ", "TOKENS-00000.BIN", "\ud800.bin")

FAMILIES = ("mistral", "qwen2", "qwen3", "gemma2", "gemma3", "olmo2", "phi3", "mixtral", "qwen3_moe", "gpt_oss",
            "llama3")
MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "olmo2", "phi3", "mixtral", "qwen3_moe",
               "gpt_oss", "gemma3", "bert", "", "LLAMA", "llama ", "llama\u001b[0m", "\u0000", None, 1, [], ["llama"],
               {"type": "llama"}, "x" * 5_000)
ROPE_TYPES = ("default", "linear", "llama3", "yarn", "dynamic", "longrope", "su", "", "YARN", "\u001b[31m", None, 3,
              ["yarn"])
ROPE_FIELDS = ("rope_type", "type", "factor", "rope_theta", "low_freq_factor", "high_freq_factor",
               "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
               "attention_factor", "truncate", "short_factor", "long_factor", "partial_rotary_factor")
ROPE_VALUES: tuple = (4.0, 1.0, 0.5, 8, 32, 10000.0, [1.0, 2.0], True) + EXTREME_NUMBERS[:30] + ("4", None, {}, [])
SIZE_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers",
             "vocab_size", "head_dim", "max_position_embeddings", "sliding_window", "num_local_experts",
             "num_experts_per_tok", "num_experts", "moe_intermediate_size", "max_window_layers",
             "sliding_window_pattern",
             "query_pre_attn_scalar", "rms_norm_eps", "rope_theta", "final_logit_softcapping",
             "attn_logit_softcapping", "partial_rotary_factor", "swiglu_limit", "layer_types")
# Sizes relative to the key's own value (so that a product stays small while the shapes disagree), or absolute.
SIZE_CHANGES: tuple[tuple[str, Callable[[Any], Any]], ...] = (
    ("+1", lambda v: v + 1 if _is_int(v) else 1), ("-1", lambda v: v - 1 if _is_int(v) else -1),
    ("*2", lambda v: v * 2 if _is_int(v) else 2), ("//2", lambda v: v // 2 if _is_int(v) else 0),
    ("0", lambda v: 0), ("-1", lambda v: -1), ("1", lambda v: 1), ("2**20", lambda v: 2**20),
    ("2**31", lambda v: 2**31),
    ("2**40", lambda v: 2**40), ("10**6 (layers of nothing)", lambda v: 10**6), ("2**63", lambda v: 2**63),
    ("1e-30", lambda v: 1e-30), ("true", lambda v: True), ("a list", lambda v: [v, v]),
)
SPECIAL_ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")
SPECIAL_IDS: tuple = TOKEN_IDS + ([2, -1], [2, 10**6], [[2]], [2, "3"], [2] * 1000)


def _is_int(value: Any) -> bool:
    return type(value) is int


# --- what a case changes ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Template:
    """A valid input directory: its files' bytes (what a case starts from) and the parsed JSON ones."""

    path: Path
    files: dict[str, bytes]
    family: str = ""                   # a checkpoint's family, a prepared directory's kind

    def json(self, name: str) -> Any:
        return json.loads(self.files[name])


@dataclass(frozen=True)
class Mutant:
    """What a case does to a copy of its template, and a description that reproduces it."""

    what: str
    write: dict[str, bytes] = field(default_factory=dict)     # file -> new content (BAIT replaced)
    remove: tuple[str, ...] = ()
    links: dict[str, str] = field(default_factory=dict)       # file -> where the symlink leads (BAIT replaced)
    fifos: tuple[str, ...] = ()                               # files made named pipes
    folders: tuple[str, ...] = ()                             # files made empty folders

    def also(self, other: "Mutant") -> "Mutant":
        return Mutant(f"{self.what}; {other.what}", {**self.write, **other.write}, self.remove + other.remove,
                      {**self.links, **other.links}, self.fifos + other.fifos, self.folders + other.folders)


def document(name: str, value: Any, what: str) -> Mutant:
    return Mutant(f"{name}: {what}", write={name: dump(value).encode("ascii")})


# --- value changes on any JSON document ---------------------------------------------------------------

Change = tuple[str, Any]    # (what was done, the changed document)


@st.composite
def value_of_another_type(draw, doc: Any, where: Optional[list] = None) -> Change:
    path = draw(st.sampled_from(where or paths(doc)))
    value = draw(st.sampled_from(WRONG_TYPES))
    return f"{name_of(path)} = {shown(value)}", replaced(doc, path, value)


@st.composite
def extreme_number(draw, doc: Any, where: Optional[list] = None) -> Change:
    numbers = [p for p in paths(doc) if isinstance(at(doc, p), (int, float)) or at(doc, p) is None]
    path = draw(st.sampled_from(where or numbers or paths(doc)))
    value = draw(st.sampled_from(EXTREME_NUMBERS))
    return f"{name_of(path)} = {shown(value)} (written raw)", replaced(doc, path, value)


@st.composite
def hostile_string(draw, doc: Any, where: Optional[list] = None) -> Change:
    path = draw(st.sampled_from(where or paths(doc)))
    value = draw(st.sampled_from(HOSTILE_STRINGS))
    return f"{name_of(path)} = {shown(value)}", replaced(doc, path, value)


def _object_keys(doc: Any) -> list:
    """Paths of the object members in `doc` (the keys a rename, a removal or a duplicate works on)."""
    return [p for p in paths(doc) if isinstance(p[-1], str)]


@st.composite
def key_edit(draw, doc: Any, where: Optional[list] = None) -> Change:
    """A key removed, given twice (with its value or another), renamed, or a hostile key added."""
    keys = [p for p in where or () if isinstance(p[-1], str)] or _object_keys(doc)
    edit = draw(st.sampled_from(("remove", "twice", "twice, differing", "rename", "add")))
    path = draw(st.sampled_from(keys))
    parent = path[:-1]
    if edit == "remove":
        return f"{name_of(path)} removed", removed(doc, path)
    if edit.startswith("twice"):
        second = at(doc, path) if edit == "twice" else draw(st.sampled_from(WRONG_TYPES))
        pairs = list(at(doc, parent).items()) + [(path[-1], second)]
        return f"{name_of(path)} given twice (again as {shown(second)})", with_pairs(doc, parent, pairs)
    if edit == "rename":
        how, spell = draw(st.sampled_from(RENAMINGS))
        return f"{name_of(path)} renamed with {how}", renamed(doc, path, spell(path[-1]))
    key, value = draw(st.sampled_from(HOSTILE_KEYS)), draw(st.sampled_from(WRONG_TYPES))
    return f"key {shown(key)} = {shown(value)} added to {name_of(parent) or 'the top level'}", \
        replaced(doc, (*parent, key), value)


VALUE_CHANGES = (value_of_another_type, extreme_number, hostile_string, key_edit)


@st.composite
def any_value_change(draw, doc: Any) -> Change:
    return draw(draw(st.sampled_from(VALUE_CHANGES))(doc))


# --- text changes on any file -------------------------------------------------------------------------

@st.composite
def text_change(draw, data: bytes) -> tuple[str, bytes]:
    """The file's bytes cut short, not UTF-8, not JSON, not an object, too deep or too large."""
    edit = draw(st.sampled_from(("cut", "empty", "bad bytes", "bom", "utf-16", "raw control", "trailing", "deep",
                                 "large", "not an object", "comment")))
    where = draw(st.integers(0, max(len(data) - 1, 0)))
    if edit == "cut":
        return f"cut after byte {where} of {len(data)}", data[:where]
    if edit == "empty":
        return "empty", b""
    if edit == "bad bytes":
        bad = draw(st.sampled_from((b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xc0\xaf", b"\x00", b"\xf4\x90\x80\x80")))
        return f"bytes {bad!r} inserted at byte {where}", data[:where] + bad + data[where:]
    if edit == "bom":
        return "a UTF-8 byte order mark first", b"\xef\xbb\xbf" + data
    if edit == "utf-16":
        return "encoded as UTF-16", data.decode("utf-8", "surrogatepass").encode("utf-16")
    if edit == "raw control":
        quote = data.find(b'"', where)
        quote = quote if quote >= 0 else data.find(b'"')
        char = draw(st.sampled_from((b"\x1b[31m", b"\n", b"\x00", b"\x07")))
        return f"raw {char!r} inside the string at byte {quote}", data[:quote + 1] + char + data[quote + 1:]
    if edit == "trailing":
        tail = draw(st.sampled_from((b"}", b"{}", b"x", b"\x00", b" // comment", b"\n\n{\"a\": 1}")))
        return f"{tail!r} after the value", data + tail
    if edit == "deep":
        depth = draw(st.sampled_from((100, 1_000, 100_000)))
        return f"a value nested {depth:,} lists deep", b'{"deep": ' + b"[" * depth + b"]" * depth + b"}"
    if edit == "large":
        size = draw(st.sampled_from((2 << 20, 80 << 20)))
        return f"{size:,} bytes (spaces before the value)", b" " * size + data
    if edit == "not an object":
        value = draw(st.sampled_from((b"[]", b'"config"', b"3", b"null", b"true", b"[" + data + b"]")))
        return f"the value {value[:20]!r} instead of an object", value
    return "a // comment line first", b"// written by hand\n" + data


# --- config.json --------------------------------------------------------------------------------------

def config_group(change: Callable[[dict], Any], name: str = "config.json") -> Callable[[Template], Any]:
    """A group of mutations: each draws one `change` of the template's config.json."""

    @st.composite
    def group(draw, template: Template) -> Mutant:
        what, changed = draw(change(template.json(name)))
        return document(name, changed, what)

    return group


@st.composite
def rope_change(draw, config: dict) -> Change:
    """rope_scaling or rope_parameters replaced, or one of its values changed."""
    current = [k for k in ("rope_scaling", "rope_parameters") if isinstance(config.get(k), dict)]
    key = draw(st.sampled_from(current + ["rope_scaling", "rope_parameters"]))
    if current and key in current and draw(st.booleans()):
        inside = [(key, *p) for p in paths(config[key])] or [(key,)]
        return draw(draw(st.sampled_from(VALUE_CHANGES))(config, inside))
    if draw(st.integers(0, 4)) == 0:
        value = draw(st.sampled_from(WRONG_TYPES))
    else:
        fields = draw(st.lists(st.sampled_from(ROPE_FIELDS[2:]), max_size=4, unique=True))
        value = {draw(st.sampled_from(ROPE_FIELDS[:2])): draw(st.sampled_from(ROPE_TYPES))}
        if key == "rope_parameters":
            value["rope_theta"] = 10000.0
        value.update({f: draw(st.sampled_from(ROPE_VALUES)) for f in fields})
    return f"{key} = {shown(value, 160)}", replaced(config, (key,), value)


@st.composite
def model_type_change(draw, config: dict) -> Change:
    key = draw(st.sampled_from(("model_type", "model_type", "architectures", "auto_map")))
    if key == "model_type":
        value = draw(st.sampled_from(MODEL_TYPES))
    else:
        value = draw(st.sampled_from((["LlamaForCausalLM"], [], ["\u001b[31mX"], "LlamaForCausalLM", None, [1],
                                      {"AutoModelForCausalLM": "../x.Model"}, {})))
    return f"{key} = {shown(value)}", replaced(config, (key,), value)


@st.composite
def size_change(draw, config: dict) -> Change:
    key = draw(st.sampled_from(SIZE_KEYS))
    how, change = draw(st.sampled_from(SIZE_CHANGES))
    value = change(config.get(key))
    return f"{key} = {shown(value)} ({how} of {shown(config.get(key))})", replaced(config, (key,), value)


@st.composite
def special_id_change(draw, config: dict) -> Change:
    key = draw(st.sampled_from(SPECIAL_ID_KEYS))
    value = draw(st.sampled_from(SPECIAL_IDS))
    return f"{key} = {shown(value)}", replaced(config, (key,), value)


@st.composite
def several_changes(draw, config: dict) -> Change:
    """Two or three changes of the kinds above, one after another."""
    kinds = (value_of_another_type, extreme_number, hostile_string, rope_change, model_type_change, size_change,
             special_id_change)
    done = []
    for _ in range(draw(st.integers(2, 3))):
        what, config = draw(draw(st.sampled_from(kinds))(config))
        done.append(what)
    return "; ".join(done), config


@st.composite
def config_text(draw, template: Template) -> Mutant:
    what, data = draw(text_change(template.files["config.json"]))
    return Mutant(f"config.json: {what}", write={"config.json": data})


CONFIG_GROUPS = {
    "config-wrong-type": config_group(value_of_another_type),
    "config-extreme-number": config_group(extreme_number),
    "config-hostile-string": config_group(hostile_string),
    "config-keys": config_group(key_edit),
    "config-rope": config_group(rope_change),
    "config-model-type": config_group(model_type_change),
    "config-sizes": config_group(size_change),
    "config-text": config_text,
    "config-several": config_group(several_changes),
}


# --- tokenizer.json and tokenizer.model ---------------------------------------------------------------

TOKENIZER = "tokenizer.json"


def tokenizer_group(change: Callable[[dict], Any]) -> Callable[[Template], Any]:
    return config_group(change, TOKENIZER)


@st.composite
def vocab_id_change(draw, tokenizer: dict) -> Change:
    vocab = tokenizer["model"]["vocab"]
    words = list(vocab)
    edit = draw(st.sampled_from(("id", "id", "twice", "new word", "empty", "unknown word gone")))
    if edit == "id":
        word = draw(st.sampled_from(words[:3] + words[-3:]))
        value = draw(st.sampled_from(TOKEN_IDS))
        return f"model.vocab[{word}] = {shown(value)}", replaced(tokenizer, ("model", "vocab", word), value)
    if edit == "twice":
        word = draw(st.sampled_from(words[:3]))
        pairs = list(vocab.items()) + [(word, draw(st.sampled_from(TOKEN_IDS)))]
        return f"model.vocab[{word}] given twice", with_pairs(tokenizer, ("model", "vocab"), pairs)
    if edit == "new word":
        word, value = draw(st.sampled_from(HOSTILE_STRINGS)), draw(st.sampled_from(TOKEN_IDS))
        return f"model.vocab[{shown(word)}] = {shown(value)} added", \
            replaced(tokenizer, ("model", "vocab", word), value)
    if edit == "empty":
        return "model.vocab = {}", replaced(tokenizer, ("model", "vocab"), {})
    return "model.vocab without its unk_token w0", removed(tokenizer, ("model", "vocab", "w0"))


@st.composite
def added_token(draw, tokenizer: dict) -> Change:
    """One to three entries appended to added_tokens: ids past the vocabulary, odd contents, fields wrong."""
    entries = []
    for _ in range(draw(st.integers(1, 3))):
        entry = {"id": draw(st.sampled_from(TOKEN_IDS)), "content": draw(st.sampled_from(HOSTILE_STRINGS + ("w1",))),
                 "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
        if draw(st.integers(0, 3)) == 0:
            key = draw(st.sampled_from(list(entry)))
            entry = dict(entry, **{key: draw(st.sampled_from(WRONG_TYPES))}) if draw(st.booleans()) else \
                {k: v for k, v in entry.items() if k != key}
        entries.append(entry)
    return f"added_tokens = {shown(entries, 200)}", replaced(tokenizer, ("added_tokens",), entries)


COMPONENTS: dict[str, tuple] = {
    "model": ({"type": "BPE", "vocab": {"a": 0}, "merges": ["a a"]}, {"type": "Unigram", "vocab": [["a", 1e999]]},
              {"type": "Unigram", "vocab": [], "unk_id": 5}, {"type": "WordPiece", "vocab": {}},
              {"type": "Nope"}, {}),
    "pre_tokenizer": ({"type": "ByteLevel", "add_prefix_space": "yes"}, {"type": "Metaspace", "replacement": ""},
                      {"type": "Sequence", "pretokenizers": [{"type": "Whitespace"}] * 200},
                      {"type": "Digits", "individual_digits": 3}, {"type": "Nope"}),
    "normalizer": ({"type": "NFKC"}, {"type": "Lowercase"}, {"type": "Prepend", "prepend": "\u001b[31m"},
                   {"type": "Replace", "pattern": {"String": ""}, "content": "xx"}, {"type": "Sequence"}),
    "post_processor": ({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}],
                        "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [10**9], "tokens": ["<s>"]}}},
                       {"type": "ByteLevel"}, {"type": "Nope"}),
    "decoder": ({"type": "ByteLevel"}, {"type": "Metaspace"}, {"type": "WordPiece", "prefix": 3}, {"type": "Nope"},
                {"type": "Sequence", "decoders": "x"}),
    "truncation": ({"max_length": -1}, {"max_length": 0, "strategy": "LongestFirst", "stride": 5, "direction": "Up"}),
    "padding": ({"strategy": "BatchLongest", "pad_id": 10**12, "pad_token": "\u0000"},),
    "version": ("9.9", 1, None),
}


@st.composite
def structure_change(draw, tokenizer: dict) -> Change:
    """A component replaced by another kind or a broken one, or any place outside the vocabulary retyped."""
    if draw(st.booleans()):
        key = draw(st.sampled_from(sorted(COMPONENTS)))
        value = draw(st.sampled_from(COMPONENTS[key] + WRONG_TYPES[:8]))
        return f"{key} = {shown(value, 160)}", replaced(tokenizer, (key,), value)
    outside = [p for p in paths(tokenizer) if p[:2] != ("model", "vocab") or len(p) == 2]
    return draw(value_of_another_type(tokenizer, outside))


@st.composite
def regex_change(draw, tokenizer: dict) -> Change:
    regex = draw(st.sampled_from(PATHOLOGICAL_REGEXES + INVALID_REGEXES))
    pattern = {"Regex": regex}
    where = draw(st.sampled_from(("pre_tokenizer", "normalizer", "sequence")))
    if where == "normalizer":
        value = {"type": "Replace", "pattern": pattern, "content": "a"}
    else:
        behavior = draw(st.sampled_from(("Isolated", "Removed", "MergedWithPrevious", "Contiguous", "Nope")))
        value = {"type": "Split", "pattern": pattern, "behavior": behavior, "invert": draw(st.booleans())}
        if where == "sequence":
            where, value = "pre_tokenizer", {"type": "Sequence", "pretokenizers": [{"type": "Whitespace"}, value]}
    return f"{where} = {shown(value, 200)}", replaced(tokenizer, (where,), value)


@st.composite
def tokenizer_text(draw, template: Template) -> Mutant:
    what, data = draw(text_change(template.files[TOKENIZER]))
    return Mutant(f"{TOKENIZER}: {what}", write={TOKENIZER: data})


@st.composite
def sentencepiece_model(draw, template: Template, proto: bytes) -> Mutant:
    """tokenizer.json gone, and a tokenizer.model: a real sentencepiece model, cut, bit-flipped, or not one."""
    edit = draw(st.sampled_from(("valid", "cut", "flipped", "appended", "empty", "json", "text")))
    where = draw(st.integers(0, len(proto) - 1))
    data = {"valid": proto, "cut": proto[:where], "empty": b"", "json": template.files[TOKENIZER],
            "flipped": proto[:where] + bytes([proto[where] ^ 0xFF]) + proto[where + 1:],
            "appended": proto + b"\x08\xff\xff\xff\xff\x0f", "text": b"w0\nw1\n"}[edit]
    what = {"cut": f"cut after byte {where}", "flipped": f"byte {where} flipped"}.get(edit, edit)
    return Mutant(f"tokenizer.json removed; tokenizer.model: sentencepiece model {what}",
                  write={"tokenizer.model": data}, remove=(TOKENIZER,))


def tokenizer_groups(sentencepiece_proto: bytes) -> dict[str, Callable[[Template], Any]]:
    return {
        "tokenizer-vocab-ids": tokenizer_group(vocab_id_change),
        "tokenizer-added-tokens": tokenizer_group(added_token),
        "tokenizer-structure": tokenizer_group(structure_change),
        "tokenizer-regex": tokenizer_group(regex_change),
        "tokenizer-text": tokenizer_text,
        "tokenizer-special-ids": config_group(special_id_change),
        "tokenizer-sentencepiece": lambda template: sentencepiece_model(template, sentencepiece_proto),
    }


# --- a checkpoint's weights: the shard index, the safetensors header, the files themselves ---------------

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
SHARD_NAMES = ("../" + BAIT_NAME, BAIT, "", ".", "..", "/dev/zero", "model.safetensors", "config.json",
               "missing.safetensors", "a/b.safetensors", "x.safetensors\n", "\u001b[31mx.safetensors",
               "x\u0000.safetensors", "C:\\x.safetensors", "\ud800.safetensors")
SAFETENSORS_DTYPES = ("F64", "F16", "BF16", "I64", "I8", "U8", "BOOL", "F8_E4M3", "F8_E5M2", "U64", "C64", "x", "",
                      "f32", None, 4)
SHAPES: tuple = ([], [0], [-1], [2**31, 2**31], [2**62, 4], [2**64], [1] * 1000, [1.5], ["3"], None, 7)


@st.composite
def index_change(draw, template: Template) -> Mutant:
    """model.safetensors.index.json: a tensor placed in a shard out of the directory, in another shard, in
    none; an entry added or removed; values retyped; the text broken."""
    index = template.json(INDEX)
    weight_map = index["weight_map"]
    shards = sorted(set(weight_map.values()))
    tensor = draw(st.sampled_from(sorted(weight_map)))
    edit = draw(st.sampled_from(("shard name", "outside copy", "moved", "removed", "added", "value", "keys", "text")))
    if edit == "text":
        what, data = draw(text_change(template.files[INDEX]))
        return Mutant(f"{INDEX}: {what}", write={INDEX: data})
    if edit == "shard name":
        name = draw(st.sampled_from(SHARD_NAMES))
        what, changed = f"weight_map[{tensor}] = {shown(name)}", replaced(index, ("weight_map", tensor), name)
    elif edit == "outside copy":
        outside = "../outside.safetensors"
        moved = {t: outside if s == shards[0] else s for t, s in weight_map.items()}
        return document(INDEX, replaced(index, ("weight_map",), moved),
                        f"the tensors of {shards[0]} placed in {outside}, a copy of it").also(
            Mutant("", write={outside: template.files[shards[0]]}))
    elif edit == "moved":
        other = next(s for s in shards if s != weight_map[tensor])
        what, changed = f"weight_map[{tensor}] = {other} (not where it is)", \
            replaced(index, ("weight_map", tensor), other)
    elif edit == "removed":
        what, changed = f"weight_map[{tensor}] removed", removed(index, ("weight_map", tensor))
    elif edit == "added":
        name = draw(st.sampled_from(HOSTILE_STRINGS + ("lm_head.weight", "model.extra.weight")))
        what, changed = f"weight_map[{shown(name)}] = {shards[0]} added", \
            replaced(index, ("weight_map", name), shards[0])
    else:
        what, changed = draw((value_of_another_type if edit == "value" else key_edit)(index))
    return document(INDEX, changed, what)


def _split_safetensors(data: bytes) -> tuple[int, dict, bytes]:
    size = int.from_bytes(data[:8], "little")
    return size, json.loads(data[8:8 + size]), data[8 + size:]


@st.composite
def safetensors_header_change(draw, template: Template) -> Mutant:
    """model.safetensors's JSON header: a tensor's dtype, shape or data offsets wrong, other values retyped,
    the header's length field lying, its text broken."""
    data = template.files[SINGLE]
    size, header, body = _split_safetensors(data)
    tensor = draw(st.sampled_from(sorted(k for k in header if k != "__metadata__")))
    start, end = header[tensor]["data_offsets"]
    edit = draw(st.sampled_from(("dtype", "shape", "offsets", "value", "keys", "length", "text")))
    if edit == "length":
        claimed = draw(st.sampled_from((0, 1, size - 1, size + 1, len(data), 2**63, 2**64 - 1)))
        return Mutant(f"{SINGLE}: its header's length given as {claimed} (it is {size})",
                      write={SINGLE: claimed.to_bytes(8, "little") + data[8:]})
    if edit == "text":
        what, text = draw(text_change(data[8:8 + size]))
    else:
        if edit in ("dtype", "shape", "offsets"):
            field_name = {"offsets": "data_offsets"}.get(edit, edit)
            values = {"dtype": SAFETENSORS_DTYPES, "shape": SHAPES,
                      "offsets": ([0, 2**63], [-1, end - start - 1], [end, start], [start, len(body) + 1], [0, 0],
                                  [start, end + 1], [start], [1.5, 2], "0-4", None)}[edit]
            value = draw(st.sampled_from(values))
            what, changed = f"{tensor}.{field_name} = {shown(value)}", replaced(header, (tensor, field_name), value)
        else:
            what, changed = draw((value_of_another_type if edit == "value" else key_edit)(header))
        text = dump(changed).encode("ascii")
    return Mutant(f"{SINGLE} header: {what}", write={SINGLE: len(text).to_bytes(8, "little") + text + body})


@st.composite
def checkpoint_file_replaced(draw, template: Template) -> Mutant:
    return draw(file_replaced(template, sorted(template.files)))


WEIGHT_GROUPS = {
    "checkpoint-index": index_change,
    "safetensors-header": safetensors_header_change,
    "checkpoint-files": checkpoint_file_replaced,
}


# --- a prepared data directory ------------------------------------------------------------------------

MANIFEST = "manifest.json"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def manifest_group(change: Callable[[dict], Any]) -> Callable[[Template], Any]:
    return config_group(change, MANIFEST)


@st.composite
def file_name_change(draw, manifest: dict) -> Change:
    """A file the manifest names given another name: out of the directory, a device, not a name."""
    places = [("streams", s, i) for s, shards in manifest["streams"].items() for i in range(len(shards))]
    places += [("offsets", name) for name in manifest["offsets"]] + [("files", name) for name in manifest["files"]]
    place = draw(st.sampled_from(places + [("streams", "tokens"), ("streams", "source")]))
    name = draw(st.sampled_from(FILE_NAMES))
    if place[0] == "files":
        return f"files[{place[1]}] renamed {shown(name)}", renamed(manifest, place, name)
    if len(place) == 2 and place[0] == "streams":
        shards = draw(st.sampled_from(([], [name], [name, name], (manifest["streams"].get(place[1]) or []) * 2)))
        return f"streams.{place[1]} = {shown(shards)}", replaced(manifest, place, shards)
    return f"{name_of(place)} = {shown(name)}", replaced(manifest, place, name)


@st.composite
def manifest_text(draw, template: Template) -> Mutant:
    what, data = draw(text_change(template.files[MANIFEST]))
    return Mutant(f"{MANIFEST}: {what}", write={MANIFEST: data})


def _rehashed(template: Template, name: str, data: bytes, counts: bool) -> Mutant:
    """`name` replaced by `data`, the manifest's size and hash of it updated (and its counts, with `counts`)."""
    manifest = template.json(MANIFEST)
    if name == "sentencepiece.model":
        manifest["vocabulary"]["sha256"] = sha256(data)
    elif name in manifest["files"]:
        manifest["files"][name] = {"bytes": len(data), "sha256": sha256(data)}
    if counts:
        _recount(manifest, template, name, data)
    return Mutant("", write={name: data, MANIFEST: dump(manifest).encode("ascii")})


def _recount(manifest: dict, template: Template, name: str, data: bytes) -> None:
    """The manifest's counts made to agree with the changed file: ids in a stream, examples of an offsets file."""
    width = 2 if manifest["dtype"] == "uint16" else 4
    for stream, shards in manifest["streams"].items():
        if name in shards:
            manifest["tokens"][stream] += (len(data) - len(template.files[name])) // width
    if name in manifest["offsets"].values():
        manifest["examples"] = max(len(data) // 8 - 1, 0)


@st.composite
def data_file_change(draw, template: Template) -> Mutant:
    """A data file changed and re-hashed (its counts in the manifest too, or not): ids past the vocabulary,
    offsets out of order or past the stream, files cut or grown, another vocabulary."""
    manifest = template.json(MANIFEST)
    shard = draw(st.sampled_from([s for shards in manifest["streams"].values() for s in shards]))
    offsets = draw(st.sampled_from(sorted(manifest["offsets"].values())))
    width = 2 if manifest["dtype"] == "uint16" else 4
    edit = draw(st.sampled_from(("id", "cut shard", "grow shard", "empty shard", "offset", "cut offsets",
                                 "empty offsets", "vocabulary")))
    counts = draw(st.booleans())
    data = template.files
    if edit == "id":
        count = len(data[shard]) // width
        where = draw(st.integers(0, count - 1))
        value = draw(st.sampled_from((manifest["vocabulary"]["pieces"], 2**(8 * width) - 1, 0, 3)))
        changed = data[shard][:where * width] + value.to_bytes(width, "little") + data[shard][(where + 1) * width:]
        name, what = shard, f"id {value} at position {where} of {shard}"
    elif edit in ("cut shard", "grow shard", "empty shard"):
        cut = draw(st.integers(0, len(data[shard])))
        changed = {"cut shard": data[shard][:cut], "empty shard": b"",
                   "grow shard": data[shard] + data[shard][:cut]}[edit]
        name, what = shard, f"{shard}: {len(changed):,} bytes instead of {len(data[shard]):,}"
    elif edit == "offset":
        values = [int.from_bytes(data[offsets][i:i + 8], "little", signed=True)
                  for i in range(0, len(data[offsets]), 8)]
        where = draw(st.integers(0, len(values) - 1))
        value = draw(st.sampled_from((-1, 0, values[-1] + 1, 2**62, -2**63, values[max(where - 1, 0)] - 1)))
        values[where] = value
        changed = b"".join(v.to_bytes(8, "little", signed=True) for v in values)
        name, what = offsets, f"offset {where} of {offsets} = {value}"
    elif edit in ("cut offsets", "empty offsets"):
        cut = draw(st.integers(0, len(data[offsets]))) if edit == "cut offsets" else 0
        changed, name, what = data[offsets][:cut], offsets, f"{offsets} cut to {cut} bytes"
    else:
        proto = data["sentencepiece.model"]
        cut = draw(st.integers(0, len(proto)))
        changed = draw(st.sampled_from((proto[:cut], b"", b"not a model", proto + proto)))
        name, what = "sentencepiece.model", f"sentencepiece.model: {len(changed):,} bytes of its {len(proto):,}"
    mutant = _rehashed(template, name, changed, counts)
    return Mutant(f"{what}, re-hashed{' and counted' if counts else ''}", write=mutant.write)


@st.composite
def file_replaced(draw, template: Template, names: list[str]) -> Mutant:
    """One of `names` replaced by a symlink (out of the directory, to a device, to itself, to another file of
    it), a named pipe or a folder."""
    name = draw(st.sampled_from(names))
    edit = draw(st.sampled_from(("link out", "link out to a copy", "link in", "device", "loop", "dangling", "fifo",
                                 "folder")))
    if edit == "fifo":
        return Mutant(f"{name} made a named pipe", fifos=(name,))
    if edit == "folder":
        return Mutant(f"{name} made a folder", folders=(name,))
    target = {"link out": BAIT, "link out to a copy": f"../copy-of-{name}", "device": "/dev/zero", "loop": name,
              "dangling": "nowhere.bin", "link in": draw(st.sampled_from([n for n in names if n != name]))}[edit]
    copy = {f"../copy-of-{name}": template.files[name]} if edit == "link out to a copy" else {}
    return Mutant(f"{name} made a symlink to {shown(target)}", write=copy, links={name: target})


@st.composite
def data_file_link(draw, template: Template) -> Mutant:
    manifest = template.json(MANIFEST)
    return draw(file_replaced(template, [MANIFEST, "sentencepiece.model"] + sorted(manifest["files"])))


def data_groups() -> dict[str, Callable[[Template], Any]]:
    return {
        "manifest-values": manifest_group(lambda m: st.one_of(value_of_another_type(m), extreme_number(m),
                                                              hostile_string(m))),
        "manifest-keys": manifest_group(key_edit),
        "manifest-file-names": manifest_group(file_name_change),
        "manifest-text": manifest_text,
        "data-files": data_file_change,
        "data-links": data_file_link,
    }


# --- an interrupted prepare's progress record ---------------------------------------------------------

PROGRESS = "progress.json"


@st.composite
def progress_change(draw, template: Template) -> Mutant:
    """progress.json changed (values, names, keys, text), or the files it describes cut, grown or linked out."""
    record = template.json(PROGRESS)
    edit = draw(st.sampled_from(("value", "names", "keys", "text", "shard")))
    if edit == "text":
        what, data = draw(text_change(template.files[PROGRESS]))
        return Mutant(f"{PROGRESS}: {what}", write={PROGRESS: data})
    if edit == "shard":
        shards = sorted(n for n in template.files if n.endswith(".bin"))
        name = draw(st.sampled_from(shards))
        how = draw(st.sampled_from(("cut", "grown", "removed", "linked out", "fifo")))
        if how == "removed":
            return Mutant(f"{name} removed", remove=(name,))
        if how == "linked out":
            return Mutant(f"{name} made a symlink to the bait", links={name: BAIT})
        if how == "fifo":
            return Mutant(f"{name} made a named pipe", fifos=(name,))
        cut = draw(st.integers(0, len(template.files[name])))
        data = template.files[name][:cut] if how == "cut" else template.files[name] + b"\x01\x00" * (cut + 1)
        return Mutant(f"{name} {how} to {len(data):,} bytes", write={name: data})
    if edit == "names":
        places = [p for p in paths(record) if "names" in p[:-1] or p[-1] == "names"]
        path = draw(st.sampled_from(places))
        value = draw(st.sampled_from(FILE_NAMES)) if isinstance(path[-1], int) else \
            draw(st.sampled_from(([], [BAIT], ["../" + BAIT_NAME], ["tokens-00000.bin"] * 2)))
        changed = replaced(record, path, value)
        return document(PROGRESS, changed, f"{name_of(path)} = {shown(value)}")
    change = value_of_another_type if edit == "value" else key_edit
    if edit == "value" and draw(st.booleans()):
        change = extreme_number
    what, changed = draw(change(record))
    return document(PROGRESS, changed, what)
