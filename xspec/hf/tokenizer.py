"""Finding a Hugging Face checkpoint directory's tokenizer (tokenizer.json preferred, else tokenizer.model,
Marian's or M2M100's files, or BERT's vocab.txt, RoBERTa's merges.txt or T5's spiece.model made into a
tokenizer.json) and its special ids; the tokenizer itself is runtime/tokenizer.py's, which a loaded checkpoint
uses too.

What the directory says is checked against what it is: config.json's bos_token_id and eos_token_id must be
ids of the tokenizer's vocabulary, and every id the tokenizer produces a row of the model's embedding."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from xspec.base.errors import UserError
from xspec.base.input_dir import InputDirectory
from xspec.base.text import shown
from xspec.hf.config_reader import refuse, render
from xspec.hf.slow_tokenizers import SLOW_TOKENIZERS, Settings
from xspec.runtime.tokenizer import FILES, KINDS, M2M100, MARIAN, NONE, CheckpointTokenizer
from xspec.runtime.tokenizer_files import (M2M100_FILES, M2M100_LANGUAGES, MARIAN_FILES, MARIAN_TARGET_VOCAB,
                                           MAX_MADEUP_WORDS, kept_files)

MAX_TOKENIZER_BYTES = 64 << 20
MAX_TOKENIZER_CONFIG_BYTES = 4 << 20     # chat templates make some a few hundred KiB
CONFIG = "config.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
GENERATION_CONFIG = "generation_config.json"
CHAT_TEMPLATE = "chat_template.jinja"      # transformers' save_pretrained writes the template here (4.49 on)
CHECKPOINT = "a Hugging Face save_pretrained directory"


def special_ids(config: dict, origin: str = CONFIG) -> tuple[int | None, list[int]]:
    """config.json's bos_token_id and eos_token_id (one id, or a list of them); `origin` names the file."""
    bos, eos = config.get("bos_token_id"), config.get("eos_token_id")
    for key, value in _special_keys(config, pad=True):
        if type(value) is not int or value < 0:
            raise UserError(f"{origin}: {key} {render(value)} is not a token id (an integer from 0)")
    return bos, eos if isinstance(eos, list) else [] if eos is None else [eos]


def _special_keys(config: dict, pad: bool = False) -> list[tuple[str, object]]:
    """(key as config.json spells it, value) of each special id given: bos, eos (one or a list) and, with
    `pad`, pad_token_id, which xspec does not use but transformers' class does (a row of its embedding,
    which some checkpoints reserve beyond the tokenizer's ids)."""
    names = ("bos_token_id", "pad_token_id") if pad else ("bos_token_id",)
    keys = [(key, config[key]) for key in names if config.get(key) is not None]
    eos = config.get("eos_token_id")
    if isinstance(eos, list):
        return keys + [(f"eos_token_id[{i}]", value) for i, value in enumerate(eos)]
    return keys + ([("eos_token_id", eos)] if eos is not None else [])


def find_tokenizer(directory: Path | InputDirectory, config: dict, more_eos: Sequence[int] = (),
                   generation: dict | None = None) -> CheckpointTokenizer:
    """The directory's tokenizer (tokenizer.json preferred), or one of kind "none" when it has none.
    A file that is there is read as every file of the checkpoint is (xspec/base/input_dir.py: regular files
    inside the directory only), made and probed (runtime/tokenizer.py), and config.json's special ids, and
    `more_eos` (generation_config.json's), must be in its vocabulary. tokenizer_config.json's add_bos_token
    and add_eos_token say what a sentencepiece tokenizer adds to a text (tokenizer.json's post-processor
    says it for its own). The directory's config.json (`config`), tokenizer_config.json,
    special_tokens_map.json and generation_config.json (`generation`) are kept with the tokenizer, for an
    export to write back."""
    folder = directory if isinstance(directory, InputDirectory) else InputDirectory.open(directory, CHECKPOINT)
    bos, eos = special_ids(config, shown(folder.file(CONFIG)))
    eos += [e for e in more_eos if e not in eos]
    kept = {CONFIG: config, **({GENERATION_CONFIG: generation} if generation is not None else {})}
    for name in (TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP):
        if folder.has(name):
            kept[name] = _json_object(folder, name)
    if folder.has(CHAT_TEMPLATE):       # which transformers reads in place of tokenizer_config.json's
        kept[TOKENIZER_CONFIG] = {**kept.get(TOKENIZER_CONFIG, {}), "chat_template": _text(folder, CHAT_TEMPLATE)}
    if all(folder.has(name) for name in MARIAN_FILES):
        return _marian(folder, config, bos, eos, kept, more_eos)
    add_bos, add_eos = _added_tokens(kept.get(TOKENIZER_CONFIG, {}), shown(folder.file(TOKENIZER_CONFIG)))
    for name, kind in KINDS.items():
        if folder.has(name):
            path = shown(folder.file(name))
            tokenizer = CheckpointTokenizer(kind, folder.read(name, MAX_TOKENIZER_BYTES), bos, eos, path, add_bos,
                                            add_eos, kept, _settings_origin(folder))
            _check_special_ids(config, folder, len(tokenizer), f"{path} has {len(tokenizer):,} ids", more_eos)
            return tokenizer
    if all(folder.has(name) for name in M2M100_FILES):
        return _m2m100(folder, config, bos, eos, kept, more_eos)
    for name, make in SLOW_TOKENIZERS.items():
        if folder.has(name):
            return _slow(folder, name, make, config, bos, eos, kept, more_eos)
    return CheckpointTokenizer(NONE, b"", bos, eos, f"{shown(folder.path)}: its tokenizer", hf_files=kept,
                               settings_origin=_settings_origin(folder))


def _marian(folder: InputDirectory, config: dict, bos: int | None, eos: list[int], kept: dict[str, dict],
            more_eos: Sequence[int]) -> CheckpointTokenizer:
    """MarianTokenizer's source.spm, target.spm and vocab.json, and target_vocab.json where tokenizer_config.json's
    separate_vocabs says the target has a vocabulary of its own: a text is its pieces' ids, then </s>."""
    settings = _settings(folder, kept)
    names: tuple[str, ...] = MARIAN_FILES
    if settings.flag("separate_vocabs", False):
        if not folder.has(MARIAN_TARGET_VOCAB):
            raise UserError(f"{settings.file}: separate_vocabs is true, but {shown(folder.path)} has no "
                            f"{MARIAN_TARGET_VOCAB} (the target's vocabulary)")
        names = (*MARIAN_FILES, MARIAN_TARGET_VOCAB)
    files = {name: folder.read(name, MAX_TOKENIZER_BYTES) for name in names}
    tokenizer = CheckpointTokenizer(MARIAN, kept_files(files), bos, eos, shown(folder.path), add_bos=False,
                                    add_eos=True, hf_files=kept, settings_origin=_settings_origin(folder))
    bound = min(len(tokenizer), tokenizer.target_size)
    _check_special_ids(config, folder, bound, f"{' and '.join(names[2:])} have {bound:,} ids at least", more_eos)
    return tokenizer


def _m2m100(folder: InputDirectory, config: dict, bos: int | None, eos: list[int], kept: dict[str, dict],
            more_eos: Sequence[int]) -> CheckpointTokenizer:
    """M2M100Tokenizer's sentencepiece.bpe.model and vocab.json, with tokenizer_config.json's language_codes
    ("m2m100", fairseq's 100, or "wmt21"), src_lang ("en" where it names none), the special tokens it lists and
    num_madeup_words (ids after the language codes, each an unknown token)."""
    settings = _settings(folder, kept)
    codes = settings.config.get("language_codes", "m2m100")
    if not isinstance(codes, str) or codes not in M2M100_LANGUAGES:
        refuse(f"language_codes {render(codes)}", list(M2M100_LANGUAGES), settings.file)
    source = settings.config.get("src_lang") or "en"
    if source not in M2M100_LANGUAGES[codes]:
        raise UserError(f"{settings.file}: src_lang {render(source)} is not one of the language codes of "
                        f"language_codes \"{codes}\"")
    special = [token for key in ("additional_special_tokens", "extra_special_tokens")
               for token in settings.token_list(key)]
    files = {name: folder.read(name, MAX_TOKENIZER_BYTES) for name in M2M100_FILES}
    madeup = settings.count("num_madeup_words", 8, MAX_MADEUP_WORDS)
    data = kept_files(files, language_codes=codes, source_language=source, special=special, madeup_words=madeup)
    tokenizer = CheckpointTokenizer(M2M100, data, bos, eos, shown(folder.path), add_bos=False, add_eos=True,
                                    hf_files=kept, settings_origin=_settings_origin(folder))
    path = shown(folder.file("vocab.json"))
    _check_special_ids(config, folder, len(tokenizer), f"{path} and its language codes have {len(tokenizer):,} ids",
                       more_eos)
    return tokenizer


def _slow(folder: InputDirectory, name: str, make: Callable[[InputDirectory, str, Settings], str], config: dict,
          bos: int | None, eos: list[int], kept: dict[str, dict], more_eos: Sequence[int]) -> CheckpointTokenizer:
    """BERT's vocab.txt, RoBERTa's merges.txt (with vocab.json) or T5's spiece.model, made into the tokenizer.json
    transformers makes of it."""
    settings = _settings(folder, kept, config.get("model_type"))
    path = shown(folder.file(name))
    tokenizer = CheckpointTokenizer("tokenizers", make(folder, name, settings).encode("utf-8"), bos, eos, path,
                                    hf_files=kept, settings_origin=_settings_origin(folder))
    _check_special_ids(config, folder, len(tokenizer), f"{path} has {len(tokenizer):,} ids", more_eos)
    return tokenizer


def _settings(folder: InputDirectory, kept: dict[str, dict], model_type: object = None) -> Settings:
    """tokenizer_config.json's and special_tokens_map.json's settings as the import kept them, read by key."""
    return Settings(kept.get(TOKENIZER_CONFIG, {}), shown(folder.file(TOKENIZER_CONFIG)),
                    kept.get(SPECIAL_TOKENS_MAP, {}), shown(folder.file(SPECIAL_TOKENS_MAP)), model_type)


def _settings_origin(folder: InputDirectory) -> str:
    """Where the chat template came from, for its errors."""
    return shown(folder.file(CHAT_TEMPLATE if folder.has(CHAT_TEMPLATE) else TOKENIZER_CONFIG))


def _text(folder: InputDirectory, name: str) -> str:
    try:
        return folder.read(name, MAX_TOKENIZER_CONFIG_BYTES).decode("utf-8")
    except UnicodeDecodeError as error:
        raise UserError(f"{shown(folder.file(name))}: not UTF-8 text (byte {error.start})") from None


def _json_object(folder: InputDirectory, name: str) -> dict:
    value = folder.read_json(name, MAX_TOKENIZER_CONFIG_BYTES)
    if not isinstance(value, dict):
        raise UserError(f"{shown(folder.file(name))}: not a JSON object")
    return value


def _added_tokens(settings: dict, where: str) -> tuple[bool, bool]:
    """tokenizer_config.json's add_bos_token and add_eos_token (LlamaTokenizer's defaults: true, false)."""
    flags = []
    for key, default in (("add_bos_token", True), ("add_eos_token", False)):
        value = settings.get(key, default)
        if value is None:
            value = default
        if not isinstance(value, bool):
            raise UserError(f"{where}: {key} {render(value)} is not true or false")
        flags.append(value)
    return flags[0], flags[1]


def check_fits(tokenizer: CheckpointTokenizer, config: dict, directory: Path | InputDirectory,
               rows: int, more_eos: Sequence[int] = (), target_rows: int | None = None) -> None:
    """Every id the tokenizer produces, each of config.json's special ids and `more_eos` (generation_config.json's)
    must be a row of the model's embedding (`rows`, the tensor's, as the import checked its shape), and every id
    of a translation's output one of the `target_rows` its decoder scores."""
    folder = directory if isinstance(directory, InputDirectory) else InputDirectory.open(directory, CHECKPOINT)
    if tokenizer.kind != NONE and len(tokenizer) > rows:
        raise UserError(f"{shown(folder.file(FILES[tokenizer.kind]))}: its ids reach {len(tokenizer) - 1:,} (with "
                        f"its added tokens), but the model's embedding has {rows:,} rows (config.json's "
                        "vocab_size); a tokenizer of another model?")
    if tokenizer.kind == MARIAN and target_rows is not None and tokenizer.target_size > target_rows:
        raise UserError(f"{shown(folder.file(MARIAN_TARGET_VOCAB))}: its ids reach {tokenizer.target_size - 1:,}, but "
                        f"the decoder scores {target_rows:,} tokens (config.json's decoder_vocab_size)")
    _check_special_ids(config, folder, rows, f"the model's embedding has {rows:,} rows", more_eos, pad=True)


def _check_special_ids(config: dict, folder: InputDirectory, bound: int, holder: str, more_eos: Sequence[int] = (),
                       pad: bool = False) -> None:
    """Each of config.json's special ids, and generation_config.json's eos ids `more_eos`, below `bound`;
    `holder` ("the model's embedding has 300 rows") says whose bound it is."""
    for key, value in _special_keys(config, pad):
        if isinstance(value, int) and value >= bound:
            raise UserError(f"{shown(folder.file(CONFIG))}: {key} {value} is not a token id: {holder}")
    for value in more_eos:
        if value >= bound:
            raise UserError(f"{shown(folder.file(GENERATION_CONFIG))}: eos_token_id {value} is not a token id: "
                            f"{holder}")
