"""Tokenizers that checkpoints ship in their original form, before the `tokenizers` library: BERT's WordPiece
vocabulary (vocab.txt), RoBERTa's and BART's byte-level BPE (vocab.json and merges.txt) and T5's sentencepiece
unigram model (spiece.model, mT5's and umT5's too). Each is made into the tokenizer.json transformers makes of
it when it loads one (its BertTokenizer, RobertaTokenizer and T5Tokenizer), so an import keeps, probes, uses and
exports a tokenizer.json like any other.

The files are data: vocab.txt and merges.txt are lines of text, vocab.json strict JSON, spiece.model a protobuf
message read by sentencepiece's own schema. tokenizer_config.json's settings (lower-casing, accents, the special
tokens, T5's sentinel count) are checked by key, and its `added_tokens_decoder`, where it has one, must give each
token the id the vocabulary does."""

from __future__ import annotations

from typing import Callable

from xspec.base.errors import UserError
from xspec.base.input_dir import InputDirectory
from xspec.base.text import printable, shown
from xspec.hf.config_reader import render

MAX_VOCABULARY_BYTES = 64 << 20
# What Rust's str::trim_end strips (Unicode's White_Space), as the tokenizers library reads vocab.txt's lines.
WHITE_SPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a" \
              "\u2028\u2029\u202f\u205f\u3000"
# BertTokenizer's special tokens and their defaults (those a vocabulary lacks take the ids after it, in this order).
BERT_SPECIALS = (("unk_token", "[UNK]"), ("sep_token", "[SEP]"), ("pad_token", "[PAD]"), ("cls_token", "[CLS]"),
                 ("mask_token", "[MASK]"))
T5_SPECIALS = (("eos_token", "</s>"), ("unk_token", "<unk>"), ("pad_token", "<pad>"))
ROBERTA_SPECIALS = (("bos_token", "<s>"), ("eos_token", "</s>"), ("sep_token", "</s>"), ("cls_token", "<s>"),
                    ("unk_token", "<unk>"), ("pad_token", "<pad>"), ("mask_token", "<mask>"))
# The classes whose vocab.json and merges.txt are RoBERTa's byte-level BPE (BART's is RoBERTa's), and the
# model types whose checkpoints use them where tokenizer_config.json names no class.
ROBERTA_CLASSES = ("RobertaTokenizer", "RobertaTokenizerFast", "BartTokenizer", "BartTokenizerFast")
ROBERTA_MODELS = ("roberta", "bart")
# sentencepiece's piece types (sentencepiece_model.proto): UNKNOWN, CONTROL and USER_DEFINED.
UNKNOWN, CONTROL, USER_DEFINED = 2, 3, 4
UNIGRAM = 1                     # TrainerSpec.model_type
ADDED_FLAGS = ("single_word", "lstrip", "rstrip", "normalized", "special")     # an added token's, as saved


class Settings:
    """tokenizer_config.json's values (special_tokens_map.json's special tokens where it lacks them), read by key
    with the file named in every refusal."""

    def __init__(self, config: dict, config_file: str, special_map: dict, special_map_file: str,
                 model_type: object = None) -> None:
        self.config, self.file = config, config_file
        self.special_map, self.special_map_file = special_map, special_map_file
        self.model_type = model_type        # config.json's, which names the tokenizer where the settings do not

    def flag(self, key: str, default: bool | None, none_allowed: bool = False) -> bool | None:
        value = self.config.get(key, default)
        if not (isinstance(value, bool) or (value is None and (none_allowed or default is None))):
            raise UserError(f"{self.file}: {key} {render(value)} is not true or false")
        return value

    def token(self, key: str, default: str) -> str:
        """A special token as either file gives it: a string, or an AddedToken's object with its content."""
        for settings, where in ((self.config, self.file), (self.special_map, self.special_map_file)):
            if key in settings and settings[key] is not None:
                value = settings[key]
                content = value.get("content") if isinstance(value, dict) else value
                if not isinstance(content, str) or not content:
                    raise UserError(f"{where}: {key} {render(value)} is not a token (a string, or an object with "
                                    "its \"content\")")
                return content
        return default

    def count(self, key: str, default: int, most: int) -> int:
        value = self.config.get(key, default)
        if type(value) is not int or not 0 <= value <= most:
            raise UserError(f"{self.file}: {key} {render(value)} is not a count from 0 to {most:,}")
        return value

    def token_list(self, key: str) -> list[str]:
        """A list of tokens as either file gives it (tokenizer_config.json's where both do)."""
        for settings, where in ((self.config, self.file), (self.special_map, self.special_map_file)):
            if settings.get(key) is not None:
                value = settings[key]
                contents = [v.get("content") if isinstance(v, dict) else v for v in value] \
                    if isinstance(value, list) else [None]
                tokens = [content for content in contents if isinstance(content, str) and content]
                if len(tokens) != len(contents):
                    raise UserError(f"{where}: {key} {render(value)} is not a list of tokens")
                return tokens
        return []

    def added_tokens(self) -> list[tuple[int, dict]]:
        """added_tokens_decoder's (id, token) pairs in id order, each token's content and flags checked."""
        value = self.config.get("added_tokens_decoder", {})
        if not isinstance(value, dict):
            raise UserError(f"{self.file}: added_tokens_decoder is not an object of ids and tokens")
        pairs = []
        for key, token in value.items():
            where = f"{self.file}: added_tokens_decoder[\"{printable(key[:20])}\"]"
            if not (key.isascii() and key.isdigit() and len(key) < 10):
                raise UserError(f"{where}: not a token id")
            if not (isinstance(token, dict) and isinstance(token.get("content"), str) and token["content"]
                    and all(isinstance(token.get(flag, False), bool) for flag in ADDED_FLAGS)):
                raise UserError(f"{where}: not a token (its \"content\", and true or false for "
                                f"{', '.join(ADDED_FLAGS)})")
            pairs.append((int(key), token))
        return sorted(pairs, key=lambda pair: pair[0])


def _added(token: dict):
    from tokenizers import AddedToken

    return AddedToken(token["content"], **{flag: token[flag] for flag in ADDED_FLAGS if flag in token})


def _special(content: str):
    from tokenizers import AddedToken

    return AddedToken(content, normalized=False, special=True)


def wordpiece(folder: InputDirectory, name: str, settings: Settings) -> str:
    """BertTokenizer's: vocab.txt a token a line (its line number the id), BERT's normalizer (text cleaned,
    Chinese characters apart, lower-cased and accents stripped as tokenizer_config.json says), its
    pre-tokenizer, and [CLS] text [SEP] (a pair: [CLS] a [SEP] b [SEP], the second of token type 1)."""
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece

    where = shown(folder.file(name))
    lines = _lines(folder, name)
    vocab = {line.removesuffix("\r").rstrip(WHITE_SPACE): index for index, line in enumerate(lines)}
    if not vocab:
        raise UserError(f"{where}: empty, not a WordPiece vocabulary (a token a line)")
    specials = {key: settings.token(key, default) for key, default in BERT_SPECIALS}
    if specials["unk_token"] not in vocab:
        raise UserError(f"{where}: has no {printable(specials['unk_token'])}, which every word it cannot split becomes "
                        f"(the unknown token, {settings.file}'s unk_token)")
    lower = settings.flag("do_lower_case", True)
    tokenizer = Tokenizer(WordPiece(vocab, unk_token=specials["unk_token"]))
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=bool(settings.flag("tokenize_chinese_chars", True)),
        strip_accents=settings.flag("strip_accents", None, none_allowed=True), lowercase=bool(lower))
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    _add_tokens(tokenizer, list(specials.values()), settings)
    cls, sep = specials["cls_token"], specials["sep_token"]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{cls}:0 $A:0 {sep}:0", pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
        special_tokens=[(cls, tokenizer.token_to_id(cls)), (sep, tokenizer.token_to_id(sep))])
    return tokenizer.to_str()


def byte_level_bpe(folder: InputDirectory, name: str, settings: Settings) -> str:
    """RobertaTokenizer's (BART's too): vocab.json's tokens and ids, merges.txt's merges in their order (a line
    starting "#version" skipped), GPT-2's byte-level pre-tokenizer and decoder, and <s> text </s> (a pair:
    <s> a </s></s> b </s>)."""
    from tokenizers import Tokenizer, decoders, pre_tokenizers, processors
    from tokenizers.models import BPE

    named = settings.config.get("tokenizer_class")
    if named not in ROBERTA_CLASSES and not (named is None and settings.model_type in ROBERTA_MODELS):
        raise UserError(f"{shown(folder.file(name))}: byte-level BPE files of a {render(named or settings.model_type)} "
                        f"tokenizer are not read (supported: {', '.join(ROBERTA_CLASSES[::2])}'s; another's "
                        "tokenizer.json is)")
    if not folder.has("vocab.json"):
        raise UserError(f"{shown(folder.file(name))}: merges without vocab.json, the tokens' ids")
    where = shown(folder.file("vocab.json"))
    vocab = folder.read_json("vocab.json", MAX_VOCABULARY_BYTES)
    if not (isinstance(vocab, dict) and vocab and all(type(i) is int and 0 <= i < 1 << 31 for i in vocab.values())):
        raise UserError(f"{where}: not a JSON object of tokens and their ids (integers from 0)")
    merges = _merges(folder, name)
    prefix_space = bool(settings.flag("add_prefix_space", False))
    trim_offsets = bool(settings.flag("trim_offsets", True))
    tokenizer = Tokenizer(BPE(vocab, merges, dropout=None, continuing_subword_prefix="", end_of_word_suffix="",
                              fuse_unk=False))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=prefix_space)
    tokenizer.decoder = decoders.ByteLevel()
    specials = {key: settings.token(key, default) for key, default in ROBERTA_SPECIALS}
    _add_tokens(tokenizer, list(specials.values()), settings)
    sep, cls = (specials[key] for key in ("sep_token", "cls_token"))
    sep_id, cls_id = (tokenizer.token_to_id(token) for token in (sep, cls))
    assert sep_id is not None and cls_id is not None     # special tokens, added above
    tokenizer.post_processor = processors.RobertaProcessing((sep, sep_id), (cls, cls_id), trim_offsets, prefix_space)
    return tokenizer.to_str()


def _lines(folder: InputDirectory, name: str) -> list[str]:
    """A text file's lines, as the tokenizers library reads them (split at line feeds, no last empty one)."""
    try:
        text = folder.read(name, MAX_VOCABULARY_BYTES).decode("utf-8")
    except UnicodeDecodeError as error:
        raise UserError(f"{shown(folder.file(name))}: not UTF-8 text (byte {error.start})") from None
    lines = text.split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


def _merges(folder: InputDirectory, name: str) -> list[tuple[str, str]]:
    """merges.txt's pairs, a line each ("a b"), as the tokenizers library reads them."""
    where = shown(folder.file(name))
    lines = _lines(folder, name)
    merges = []
    for number, line in enumerate(lines, 1):
        line = line.removesuffix("\r")
        if line.startswith("#version"):
            continue
        parts = line.split(" ")
        if len(parts) != 2:
            raise UserError(f"{where}:{number}: not a merge (two tokens and a space between)")
        merges.append((parts[0], parts[1]))
    return merges


def t5_unigram(folder: InputDirectory, name: str, settings: Settings) -> str:
    """T5Tokenizer's: spiece.model's pieces and scores as a unigram model, `extra_ids` sentinels after them
    (<extra_id_0> last), the model's own normalization (its precompiled character map), words split at
    whitespace, each starting with "▁", and </s> after a text."""
    from sentencepiece import sentencepiece_model_pb2
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import Unigram

    where = shown(folder.file(name))
    data = folder.read(name, MAX_VOCABULARY_BYTES)
    proto = sentencepiece_model_pb2.ModelProto()  # type: ignore[attr-defined]  # generated, without stubs
    try:
        proto.ParseFromString(data)
    except Exception:       # protobuf's DecodeError, or whatever a malformed message makes its parser raise
        raise UserError(f"{where}: not a sentencepiece model") from None
    if not proto.pieces:
        raise UserError(f"{where}: not a sentencepiece model (it has no pieces)")
    if proto.trainer_spec.model_type != UNIGRAM:
        raise UserError(f"{where}: a sentencepiece model of type {proto.trainer_spec.model_type}, where T5's "
                        "tokenizer reads a unigram model (type 1)")
    unknown = [i for i, piece in enumerate(proto.pieces) if piece.type == UNKNOWN]
    if unknown != [2]:
        raise UserError(f"{where}: its unknown piece is {'id ' + str(unknown[0]) if unknown else 'missing'}, where "
                        "T5's tokenizer takes id 2 as unknown")
    extra_ids = settings.count("extra_ids", 100, 10_000)
    listed = [token for key in ("additional_special_tokens", "extra_special_tokens")
              for token in settings.token_list(key) if token.startswith("<extra_id_")]
    if listed and extra_ids and len(set(listed)) != extra_ids:
        raise UserError(f"{settings.file}: extra_ids {extra_ids}, but its special tokens list {len(set(listed))} "
                        "<extra_id_N> sentinels (transformers' T5Tokenizer refuses the two apart)")
    sentinels = [f"<extra_id_{i}>" for i in range(extra_ids - 1, -1, -1)]
    vocab = [(piece.piece, piece.score) for piece in proto.pieces] + [(token, 0.0) for token in sentinels]
    tokenizer = Tokenizer(Unigram(vocab, unk_id=2, byte_fallback=False))
    if proto.normalizer_spec.precompiled_charsmap:
        tokenizer.normalizer = normalizers.Precompiled(proto.normalizer_spec.precompiled_charsmap)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")])
    tokenizer.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    controls = [piece.piece for piece in proto.pieces if piece.type in (CONTROL, UNKNOWN)]
    specials = [settings.token(key, default) for key, default in T5_SPECIALS]
    _add_tokens(tokenizer, [*controls, *specials, *sentinels], settings)
    tokenizer.add_tokens([_added({"content": piece.piece, "normalized": False})
                          for piece in proto.pieces if piece.type == USER_DEFINED])
    eos = specials[0]
    if tokenizer.token_to_id(eos) is None:
        raise UserError(f"{where}: has no {printable(eos)}, the end token T5's tokenizer puts after a text")
    tokenizer.post_processor = processors.TemplateProcessing(
        single=["$A", eos], pair=["$A", eos, "$B", eos], special_tokens=[(eos, tokenizer.token_to_id(eos))])
    return tokenizer.to_str()


def _add_tokens(tokenizer, specials: list[str], settings: Settings) -> None:
    """The special tokens (given an id after the vocabulary's where it lacks them), then tokenizer_config.json's
    added_tokens_decoder, each of whose ids must be the one its token has."""
    tokenizer.add_special_tokens([_special(token) for token in dict.fromkeys(specials)])
    for index, token in settings.added_tokens():
        tokenizer.add_tokens([_added(token)])
        found = tokenizer.token_to_id(token["content"])
        if found != index:
            raise UserError(f"{settings.file}: added_tokens_decoder[\"{index}\"] {render(token['content'])}: the "
                            f"vocabulary gives it id {found}")


# The files, in the order they are looked for after tokenizer.json, with what makes each a tokenizer.json.
SLOW_TOKENIZERS: dict[str, Callable[[InputDirectory, str, Settings], str]] = {
    "vocab.txt": wordpiece, "merges.txt": byte_level_bpe, "spiece.model": t5_unigram}
