"""xspec's own vocabulary (the sentencepiece model a run trains, runtime/vocab.py) as an export writes it: a
tokenizer.json of the `tokenizers` library that encodes a text to the ids xspec's encoding gives it, framed as
xspec frames a text for the model's kind, with the tokenizer_config.json that names its special tokens.

sentencepiece's encoding is rebuilt from the model's own settings: its normalization (the precompiled
character map, extra spaces removed, spaces escaped as "▁" with one before the text), its pieces (BPE merges
ranked by the merged piece's score, or the unigram model's scores), a run of unknown characters read as one
<unk>, and user-defined pieces (a masked language model's <mask>) kept whole. The framing: a language model
reads a document from its start token (EOS, xspec's document boundary) and the text; an encoder reads the text
then EOS, and a pair of texts as the first, EOS, the second, EOS, of token types 0, then 1."""

from __future__ import annotations

import re

from xspec.base.errors import UserError
from xspec.base.text import printable
from xspec.runtime.tasks import max_sequence_tokens
from xspec.runtime.vocab import BOS, EOS, MASK_PIECE, PAD, UNK, Vocab

# sentencepiece's TrainerSpec.model_type and piece types (sentencepiece_model.proto)
UNIGRAM, BPE = 1, 2
USER_DEFINED = 4
SPACE = "\u2581"
PIECES = {PAD: "pad_token", UNK: "unk_token", BOS: "bos_token", EOS: "eos_token"}


def tokenizer_json(vocab: Vocab, starts_documents: bool, where: str) -> bytes:
    """The tokenizer.json of `vocab`; `starts_documents`: a language model's (a text after the start token),
    else an encoder's (a text, then EOS). A vocabulary of settings it does not rebuild (one a user brought), or
    whose rebuilt encoding differs from its own on a probe text, is refused, `where` naming it."""
    from sentencepiece import sentencepiece_model_pb2
    from tokenizers import Tokenizer

    proto = sentencepiece_model_pb2.ModelProto()  # type: ignore[attr-defined]  # generated, without stubs
    proto.ParseFromString(vocab.model_proto)     # the run's own, read by Vocab already
    trainer, normalizer = proto.trainer_spec, proto.normalizer_spec
    unsupported = [name for name, value in (("model_type", trainer.model_type not in (UNIGRAM, BPE)),
                                            ("byte_fallback", trainer.byte_fallback),
                                            ("treat_whitespace_as_suffix", trainer.treat_whitespace_as_suffix),
                                            ("split_by_whitespace", not trainer.split_by_whitespace),
                                            ("escape_whitespaces", not normalizer.escape_whitespaces)) if value]
    if unsupported:
        raise UserError(f"{where}: a sentencepiece model whose {unsupported[0]} setting the exported tokenizer.json "
                        "does not rebuild (xspec trains none such)")
    made = _built(proto, vocab, starts_documents)
    check = Tokenizer.from_str(made)
    for probe in PROBES + ([f"a {MASK_PIECE} b"] if vocab.mask_id is not None else []):
        if check.encode(probe, add_special_tokens=False).ids != vocab.encode([probe])[0]:
            raise UserError(f"{where}: the exported tokenizer.json would encode \"{printable(probe)}\" otherwise than "
                            "the vocabulary does")
    return made.encode("utf-8")


# Texts the rebuilt encoding must encode as the vocabulary does: spaces, whitespace, characters the
# normalization maps, scripts, numbers, unknown characters.
PROBES = ["the quick brown fox .", "  two  spaces  ", "tab\tand\nnewline", "ﬁ ＡＢＣ café naïve Ærø",
          "日本語のテキスト 😀", "123 4567.89", "x" * 40, "\u200bzero width"]


def _built(proto, vocab: Vocab, starts_documents: bool) -> str:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE as BpeModel, Unigram

    pieces = [(piece.piece, piece.score, piece.type) for piece in proto.pieces]
    defined = [piece for piece, _, kind in pieces if kind == USER_DEFINED and piece != MASK_PIECE]
    model: Unigram | BpeModel
    if proto.trainer_spec.model_type == UNIGRAM:
        model = Unigram([(piece, score) for piece, score, _ in pieces], unk_id=UNK, byte_fallback=False)
    else:
        model = BpeModel({piece: index for index, (piece, _, _) in enumerate(pieces)}, _merges(pieces),
                         unk_token=pieces[UNK][0], fuse_unk=True, byte_fallback=False,
                         ignore_merges=bool(defined))   # a user-defined piece is a word of the vocabulary
    tokenizer = Tokenizer(model)
    spec = proto.normalizer_spec
    steps: list[normalizers.Normalizer] = \
        [normalizers.Precompiled(spec.precompiled_charsmap)] if spec.precompiled_charsmap else []
    if spec.remove_extra_whitespaces:     # spaces only: sentencepiece leaves other whitespace to the map
        steps += [normalizers.Replace(Regex(r"\A +| +\z"), ""), normalizers.Replace(Regex(" {2,}"), " ")]
    if spec.add_dummy_prefix:
        steps.append(normalizers.Prepend(" "))
    steps.append(normalizers.Replace(" ", SPACE))
    tokenizer.normalizer = normalizers.Sequence(steps)
    # Words start at each "▁" (sentencepiece splits there before merging); user-defined pieces stand alone.
    splits: list[pre_tokenizers.PreTokenizer] = [
        pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="never", split=True)]
    if defined:
        pattern = "|".join(re.escape(piece) for piece in sorted(defined, key=len, reverse=True))
        splits.append(pre_tokenizers.Split(Regex(pattern), behavior="isolated"))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(splits)
    # sentencepiece's decoding drops every space before the text's first character, not the first alone
    tokenizer.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.Fuse(),
                                           decoders.Replace(Regex(r"\A +"), "")])
    tokenizer.add_special_tokens([AddedToken(pieces[index][0], special=True, normalized=False) for index in PIECES])
    if vocab.mask_id is not None:   # the text on either side a text of its own, as Vocab.encode reads it
        tokenizer.add_special_tokens([AddedToken(MASK_PIECE, special=True, normalized=False)])
    eos = pieces[EOS][0]
    if starts_documents:
        tokenizer.post_processor = processors.TemplateProcessing(single=[eos, "$A"], special_tokens=[(eos, EOS)])
    else:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=["$A", eos], pair=["$A", eos, "$B:1", f"{eos}:1"], special_tokens=[(eos, EOS)])
    return tokenizer.to_str(pretty=True)


def tokenizer_settings(vocab: Vocab, spec) -> dict:
    """tokenizer_config.json for the model `spec` compiles: the special tokens by their pieces (a language
    model's BOS is EOS, where its documents start), the mask where the vocabulary has one, the token types
    where the model reads them, its positions, and, without a mask, special tokens' text read as text."""
    names = {key: vocab.sp.id_to_piece(index) for index, key in PIECES.items()}
    if not spec.has_encoder:
        names["bos_token"] = names["eos_token"]
    if vocab.mask_id is not None:
        names["mask_token"] = MASK_PIECE
    inputs = ["input_ids", *(["token_type_ids"] if spec.token_types is not None else []), "attention_mask"]
    settings = {"tokenizer_class": "PreTrainedTokenizerFast", **names, "model_input_names": inputs,
                "model_max_length": max_sequence_tokens(spec)}
    # xspec reads a text's "</s>" as characters, never as the token. transformers matches special tokens in
    # text unless told to split them, and then splits its mask too, which xspec reads as the token.
    if vocab.mask_id is None:
        settings["split_special_tokens"] = True
    return settings


def _merges(pieces: list[tuple[str, float, int]]) -> list[tuple[str, str]]:
    """BPE's merges from sentencepiece's pieces: every split of a normal piece into two normal pieces, the
    merged piece's score ranking it (a higher score merges first, as sentencepiece merges), its id breaking
    ties."""
    normal = {piece: (score, index) for index, (piece, score, kind) in enumerate(pieces) if kind == 1}
    ranked = sorted((-score, index, piece[:cut], piece[cut:]) for piece, (score, index) in normal.items()
                    for cut in range(1, len(piece)) if piece[:cut] in normal and piece[cut:] in normal)
    return [(left, right) for _, _, left, right in ranked]

