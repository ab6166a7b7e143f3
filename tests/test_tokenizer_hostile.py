"""A checkpoint's tokenizer as hostile input, through `import_checkpoint` and the CLI's `import` and `generate`:
regular expressions that backtrack (quadratic, or past the regex engine's retry limit, where the `tokenizers`
library panics) are refused when the tokenizer is made, at import and again at load; a line that still
stalls or breaks it is an error naming the line; special ids and the ids it produces must fit the
vocabulary and the embedding; tokenizer.json must be a readable, regular JSON file inside the checkpoint."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest

from hf_checkpoints import BOS, EOS, saved, word_tokenizer
from xspec.base.errors import UserError
from xspec.cli import INTERNAL_ERROR, main
from xspec.hf.importer import import_checkpoint

pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers  # noqa: E402

ROWS = 300          # the embedding's rows in the checkpoints of hf_checkpoints.py
STALLS = "; refusing a tokenizer that long text would stall"
PANIC = "the tokenizers library panicked: Onig: Regex search error: retry-limit-in-match over"


def checkpoint(tmp_path: Path, tokenizer: Tokenizer | None = None, **config) -> Path:
    """A copy of the small qwen2 checkpoint with `tokenizer` as its tokenizer.json, config.json changed."""
    directory = tmp_path / "checkpoint"
    shutil.copytree(saved("qwen2"), directory)
    if tokenizer is not None:
        tokenizer.save(str(directory / "tokenizer.json"))
    if config:
        values = json.loads((directory / "config.json").read_text())
        values.update(config)
        (directory / "config.json").write_text(json.dumps(values))
    return directory


def refused(directory: Path, out: Path) -> str:
    with pytest.raises(UserError) as error:
        import_checkpoint(directory, out, verify=False, say=lambda _: None)
    assert not out.exists()
    return str(error.value)


def split_on(pattern: str, vocab: int = ROWS) -> Tokenizer:
    tokenizer = word_tokenizer(vocab)
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), "isolated")
    return tokenizer


def with_words(words: dict[str, int], decoder, pre_tokenizer=None) -> Tokenizer:
    """w0 ... w{n} then `words`; `decoder` decodes."""
    vocab = {f"w{i}": i for i in range(ROWS - len(words))} | words
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizer or pre_tokenizers.Whitespace()
    tokenizer.decoder = decoder
    return tokenizer


def normalized_by(pattern: str) -> Tokenizer:
    tokenizer = word_tokenizer(ROWS)
    tokenizer.normalizer = normalizers.Replace(Regex(pattern), "")
    return tokenizer


PROBED = [
    ("a quadratic pre-tokenizer", lambda: split_on(r"\s+\d"),
     r"encoding 4,000 spaces takes \d+ ms, \d+ times as long as 1,000 spaces \([\d.]+ ms\)"),
    ("a quadratic normalizer", lambda: normalized_by(r"[a-z]+[0-9]"),
     r"encoding 4,000 letters takes \d+ ms, \d+ times as long as 1,000 letters \([\d.]+ ms\)"),
    ("a quadratic decoder",
     lambda: with_words({"a": ROWS - 1}, decoders.Sequence([decoders.Fuse(), decoders.Replace(Regex(r"a+\d"), "")]),
                        pre_tokenizers.Split(Regex("."), "isolated")),
     r"decoding the ids of 4,000 letters takes \d+ ms, \d+ times as long as the ids of 1,000 letters \([\d.]+ ms\)"),
]


@pytest.mark.parametrize("make, message", [c[1:] for c in PROBED], ids=[c[0] for c in PROBED])
def test_a_tokenizer_whose_time_grows_quadratically_is_refused_quickly_at_import(tmp_path, make, message):
    directory = checkpoint(tmp_path, make())
    start = time.perf_counter()
    text = refused(directory, tmp_path / "out")
    assert time.perf_counter() - start < 10
    grows = r": its time grows faster than the text \(a regular expression that backtracks\?\)"
    assert re.fullmatch(re.escape(f"{directory}/tokenizer.json: ") + message + grows + re.escape(STALLS), text), text


def test_a_regex_past_the_engines_retry_limit_is_refused_in_one_line_without_the_panics_report(tmp_path, capfd):
    directory = checkpoint(tmp_path, split_on(r"(a+)+b"))
    start = time.perf_counter()
    assert refused(directory, tmp_path / "out") == (f"{directory}/tokenizer.json: encoding 1,000 letters fails "
                                                    f"({PANIC}){STALLS}")
    assert time.perf_counter() - start < 10
    assert "panicked at" not in capfd.readouterr().err      # Rust's report (a backtrace with RUST_BACKTRACE) held back


def test_a_token_the_decoder_takes_long_over_is_refused(tmp_path):
    directory = checkpoint(tmp_path, with_words({"~" * 6000: ROWS - 1}, decoders.Replace(Regex(r"~+\d"), "")))
    text = refused(directory, tmp_path / "out")
    assert re.fullmatch(re.escape(f"{directory}/tokenizer.json: decoding its longest token (id 299, 6,000 characters) "
                                  "takes ") + r"\d+ ms" + re.escape(STALLS), text), text


def test_the_import_cli_refuses_a_backtracking_tokenizer_in_one_line(tmp_path, capfd):
    directory = checkpoint(tmp_path, split_on(r"(a|aa)+b"))
    assert main(["import", str(directory), "-o", str(tmp_path / "out"), "--no-verify"]) == 1
    assert capfd.readouterr().err == (f"xspec: error: {directory}/tokenizer.json: encoding 1,000 letters fails "
                                      f"({PANIC}){STALLS}\n")


# --- lines that stall or break a tokenizer the probe let through ----------------------------------------

@pytest.fixture(scope="module")
def tilde_run(tmp_path_factory) -> Path:
    """An import whose tokenizer is quadratic on runs of "~" and past the retry limit on runs of "§", which
    the probe does not try."""
    tmp = tmp_path_factory.mktemp("tilde")
    tokenizer = word_tokenizer(ROWS)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r"~+\d"), "isolated"),
                                                       pre_tokenizers.Split(Regex(r"(§+)+b"), "isolated"),
                                                       pre_tokenizers.Whitespace()])
    import_checkpoint(checkpoint(tmp, tokenizer), tmp / "run", verify=False, say=lambda _: None)
    return tmp / "run"


def generate(run: Path, *arguments: str) -> int:
    code = main(["generate", str(run), "--max-new-tokens", "2", "--beam", "1", "--device", "cpu", *arguments])
    assert code != INTERNAL_ERROR
    return code


def step_file(run: Path) -> Path:
    return run / "checkpoints" / "step-00000000.safetensors"


def test_a_line_past_the_time_budget_is_an_error_naming_its_file_and_line(tilde_run, tmp_path, monkeypatch, capfd):
    from xspec.runtime import tokenizer

    monkeypatch.setattr(tokenizer, "BUDGET_BASE_S", 0.3)
    monkeypatch.setattr(tokenizer, "BUDGET_PER_CHARACTER_S", 1e-6)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("w3 w4\n" + "~" * 20_000 + "\nw5\n")
    start = time.perf_counter()
    assert generate(tilde_run, "--input", str(prompts)) == 1
    assert time.perf_counter() - start < 15
    assert capfd.readouterr().err == (f"xspec: error: {prompts}:2: {step_file(tilde_run)}: its tokenizer.json: "
                                      "encoding a line of 20,000 characters took more than 0.3 s (its normalizer or "
                                      "pre-tokenizer is too slow on it: a regular expression that backtracks?)\n")


def test_a_line_that_makes_the_tokenizer_panic_is_one_line_naming_it(tilde_run, tmp_path, capfd):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("w3 w4\nw5 " + "§" * 40 + "\n")
    assert generate(tilde_run, "--input", str(prompts)) == 1
    assert capfd.readouterr().err == (f"xspec: error: {prompts}:2: {step_file(tilde_run)}: its tokenizer.json: "
                                      f"cannot encode a line of 43 characters ({PANIC})\n")
    assert generate(tilde_run, "--prompt", "§" * 40) == 1
    assert capfd.readouterr().err == (f"xspec: error: --prompt:1: {step_file(tilde_run)}: its tokenizer.json: "
                                      f"cannot encode a line of 40 characters ({PANIC})\n")


def test_fine_tuning_and_scoring_name_the_text_files_line_the_tokenizer_breaks_on(tilde_run, tmp_path, capfd):
    text = tmp_path / "train.txt"
    text.write_text("w3 w4\n\nw5 w6\nw7 " + "§" * 40 + "\n")
    code = main(["train", "--init", str(tilde_run), "--train", str(text), "--no-test", "-o", str(tmp_path / "tuned"),
                 "--set", "train.max_steps=1", "--device", "cpu"])
    assert code == 1
    assert capfd.readouterr().err.endswith(f"xspec: error: {text}:4: {step_file(tilde_run)}: its tokenizer.json: "
                                           f"cannot encode a line of 43 characters ({PANIC})\n")
    assert main(["eval", str(tilde_run), "--text", str(text), "--device", "cpu"]) == 1
    assert capfd.readouterr().err == (f"xspec: error: {text}:4: {step_file(tilde_run)}: its tokenizer.json: "
                                      f"cannot encode a line of 43 characters ({PANIC})\n")


def test_through_the_api_the_error_shows_the_lines_place_and_start(tilde_run):
    import xspec

    trained = xspec.load(tilde_run, device="cpu")
    with pytest.raises(UserError) as error:
        trained.generate(["w3", "w4", "x" + "§" * 40], max_new_tokens=1)
    assert str(error.value) == (f"{step_file(tilde_run)}: its tokenizer.json: cannot encode a line of 41 characters "
                                f'({PANIC}): line 3 of the text given, "x{"§" * 29}..."')
    assert len(trained.generate(["w3 w4"], max_new_tokens=1)) == 1      # and it goes on working


def test_what_a_call_writes_to_stderr_is_passed_on_unless_the_call_fails(capfd):
    from xspec.runtime.bounded_calls import CallFailed, bounded

    assert bounded(lambda: os.write(2, b"a warning\n"), 1.0) == 10
    assert capfd.readouterr().err == "a warning\n"

    def failing() -> None:
        os.write(2, b"the library's own report\n")
        raise ValueError("broken")

    with pytest.raises(CallFailed, match="^broken$"):
        bounded(failing, 1.0)
    assert capfd.readouterr().err == ""


# --- special ids, and ids past the embedding -----------------------------------------------------------

SPECIAL_CASES = [
    ({"bos_token_id": ROWS}, "bos_token_id 300 is not a token id: {tokenizer} has 300 ids"),
    ({"eos_token_id": [EOS, 5000]}, "eos_token_id[1] 5000 is not a token id: {tokenizer} has 300 ids"),
    ({"eos_token_id": -1}, "eos_token_id -1 is not a token id (an integer from 0)"),
    ({"bos_token_id": True}, "bos_token_id true is not a token id (an integer from 0)"),
    ({"eos_token_id": [EOS, "2"]}, 'eos_token_id[1] "2" is not a token id (an integer from 0)'),
]


@pytest.mark.parametrize("config, message", SPECIAL_CASES, ids=[m.split(" is")[0] for _, m in SPECIAL_CASES])
def test_a_special_id_outside_the_vocabulary_is_refused_naming_config_json_and_its_key(tmp_path, config, message):
    directory = checkpoint(tmp_path, **config)
    assert refused(directory, tmp_path / "out") == (f"{directory}/config.json: "
                                                    + message.format(tokenizer=directory / "tokenizer.json"))


def test_the_vocabulary_itself_bounds_the_special_ids_not_the_embedding(tmp_path):
    directory = checkpoint(tmp_path, word_tokenizer(250), eos_token_id=270)
    assert refused(directory, tmp_path / "out") == (f"{directory}/config.json: eos_token_id 270 is not a token id: "
                                                    f"{directory}/tokenizer.json has 250 ids")


def test_without_a_tokenizer_the_embedding_bounds_the_special_ids(tmp_path):
    directory = checkpoint(tmp_path, eos_token_id=ROWS)
    (directory / "tokenizer.json").unlink()
    assert refused(directory, tmp_path / "out") == (f"{directory}/config.json: eos_token_id 300 is not a token id: "
                                                    "the model's embedding has 300 rows")


def with_added_token(tokenizer: Tokenizer, token: str) -> Tokenizer:
    tokenizer.add_special_tokens([token])
    return tokenizer


BEYOND = [
    ("a larger vocabulary", lambda: word_tokenizer(400), "399"),
    ("an added token", lambda: with_added_token(word_tokenizer(ROWS), "<|extra|>"), "300"),
    ("a gap in the ids", lambda: with_words({"far": 100_000}, decoders.WordPiece()), "100,000"),
]


@pytest.mark.parametrize("make, largest", [c[1:] for c in BEYOND], ids=[c[0] for c in BEYOND])
def test_a_tokenizer_producing_ids_past_the_embedding_is_refused_at_import(tmp_path, make, largest):
    directory = checkpoint(tmp_path, make())
    assert refused(directory, tmp_path / "out") == (
        f"{directory}/tokenizer.json: its ids reach {largest} (with its added tokens), but the model's embedding has "
        "300 rows (config.json's vocab_size); a tokenizer of another model?")


# --- tokenizer.json as a file ------------------------------------------------------------------------

FILE_CASES = [
    ("not UTF-8", lambda p: p.write_bytes(b"\xff{}"), "not UTF-8 (byte 0)"),
    ("not JSON", lambda p: p.write_text('{"model": {'), "not JSON (Expecting property name enclosed in double quotes: "
     "line 1 column 12 (char 11))"),
    ("a key twice", lambda p: p.write_text('{"model": {}, "model": {}}'),
     "not JSON xspec reads (the key 'model' is given twice in one object)"),
    ("NaN", lambda p: p.write_text('{"model": {"dropout": NaN}}'), "not JSON xspec reads (NaN is not a JSON number)"),
    ("a list", lambda p: p.write_text("[]"),
     'not a tokenizers tokenizer (expected a JSON object with a "model" object)'),
    ("a model of the wrong type", lambda p: p.write_text('{"model": 5}'),
     'not a tokenizers tokenizer (expected a JSON object with a "model" object)'),
    ("a vocabulary of the wrong type", lambda p: p.write_text('{"model": {"type": "WordLevel", "vocab": 5}}'),
     "not a tokenizers tokenizer ("),
    ("empty", lambda p: p.write_bytes(b""), "not JSON (Expecting value: line 1 column 1 (char 0))"),
    ("a FIFO", lambda p: (p.unlink(), os.mkfifo(p)), "is a FIFO; only regular files are read"),
    ("a directory", lambda p: (p.unlink(), p.mkdir()), "is a directory, not a text file"),
    ("a dangling symlink", lambda p: (p.unlink(), p.symlink_to(p.parent / "gone.json")), "a symlink to a missing file"),
    ("a panic while reading it", lambda p: p.write_text(json.dumps({"model": {"type": "BPE", "vocab": {"a": 0},
                                                                              "merges": ["a a"]}})),
     "not a tokenizers tokenizer (the tokenizers library panicked: range end index 2 out of range for slice of "
     "length 1)"),
    ("an empty tokenizer.model", lambda p: (p.unlink(), p.with_name("tokenizer.model").write_bytes(b"")),
     "not a sentencepiece tokenizer (an empty file)"),
]


@pytest.mark.parametrize("change, message", [c[1:] for c in FILE_CASES], ids=[c[0] for c in FILE_CASES])
def test_a_tokenizer_file_that_cannot_be_read_is_one_message_naming_it(tmp_path, capfd, change, message):
    directory = checkpoint(tmp_path)
    change(directory / "tokenizer.json")
    text = refused(directory, tmp_path / "out")
    name = "tokenizer.model" if "sentencepiece" in message else "tokenizer.json"
    assert text.startswith(f"{directory}/{name}: {message}"), text
    if not message.endswith("("):
        assert text == f"{directory}/{name}: {message}"
    assert "panicked at" not in capfd.readouterr().err


def test_a_symlink_is_followed_inside_the_checkpoint_and_refused_out_of_it(tmp_path, capfd):
    directory = checkpoint(tmp_path)
    (directory / "tokenizers").mkdir()
    (directory / "tokenizer.json").rename(directory / "tokenizers" / "words.json")
    (directory / "tokenizer.json").symlink_to(Path("tokenizers") / "words.json")
    import_checkpoint(directory, tmp_path / "inside", verify=False, say=lambda _: None)
    elsewhere = tmp_path / "elsewhere.json"
    (directory / "tokenizers" / "words.json").rename(elsewhere)
    (directory / "tokenizer.json").unlink()
    (directory / "tokenizer.json").symlink_to(elsewhere)
    assert main(["import", str(directory), "-o", str(tmp_path / "out"), "--no-verify"]) == 1
    assert capfd.readouterr().err == (f"xspec: error: {directory}/tokenizer.json: a symlink leading out of {directory} "
                                      f"(to {elsewhere}); xspec follows links only inside the directory it is given\n")


# --- a checkpoint's tokenizer, checked again when it is loaded ------------------------------------------

@pytest.fixture(scope="module")
def plain_run(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("plain")
    import_checkpoint(saved("qwen2"), tmp / "run", verify=False, say=lambda _: None)
    return tmp / "run"


def tampered(run: Path, tmp_path: Path, change) -> Path:
    """A copy of `run` whose checkpoint's metadata `change` edited; its checkpoint file."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    path = step_file(copy)
    with safe_open(str(path), "pt") as f:
        metadata, tensors = f.metadata(), {name: f.get_tensor(name) for name in f.keys()}
    change(metadata)
    save_file(tensors, str(path), metadata=metadata)
    return path


def tokenizer_file(tokenizer: Tokenizer):
    def change(metadata: dict) -> None:
        metadata["xspec.sentencepiece"] = base64.b64encode(tokenizer.to_str().encode()).decode()
    return change


def description(value) -> object:
    def change(metadata: dict) -> None:
        metadata["xspec.tokenizer"] = value if isinstance(value, str) else json.dumps(value)
    return change


LOAD_CASES = [
    ("a quadratic tokenizer", tokenizer_file(split_on(r"\s+\d")),
     r"its tokenizer\.json: encoding 4,000 spaces takes \d+ ms, \d+ times as long as 1,000 spaces \([\d.]+ ms\): its "
     r"time grows faster than the text \(a regular expression that backtracks\?\)" + re.escape(STALLS)),
    ("a tokenizer past the retry limit", tokenizer_file(split_on(r"(a+)+b")),
     re.escape(f"its tokenizer.json: encoding 1,000 letters fails ({PANIC}){STALLS}")),
    ("more ids than rows", tokenizer_file(word_tokenizer(400)),
     re.escape("its tokenizer.json produces ids up to 399, but the model's embedding has 300 rows")),
    ("an eos id past the vocabulary", description({"kind": "tokenizers", "bos_id": BOS, "eos_ids": [EOS, 5000]}),
     re.escape("not a checkpoint xspec wrote (metadata xspec.tokenizer: eos_ids[1] 5000 is not a token id: its "
               "tokenizer.json has 300 ids)")),
    ("a negative bos id", description({"kind": "tokenizers", "bos_id": -3, "eos_ids": [EOS]}),
     re.escape("not a checkpoint xspec wrote (metadata xspec.tokenizer: bos_id -3 is not a token id: its "
               "tokenizer.json has 300 ids)")),
    ("no tokenizer and a bos id past the embedding", description({"kind": "none", "bos_id": 300, "eos_ids": []}),
     re.escape("not a checkpoint xspec wrote (metadata xspec.tokenizer: bos_id 300 is not a token id: the model's "
               "embedding has 300 rows)")),
    ("a description that is not JSON", description("{kind"), re.escape("metadata xspec.tokenizer: not JSON (")),
    ("a description of another form", description({"kind": "tokenizers", "bos_id": "1", "eos_ids": [EOS]}),
     re.escape("not a checkpoint xspec wrote (metadata xspec.tokenizer: not a tokenizer description)")),
    ("a tokenizer file that is not UTF-8",
     lambda m: m.update({"xspec.sentencepiece": base64.b64encode(b"\xff").decode()}),
     re.escape("its tokenizer.json: not UTF-8 (byte 0)")),
]


@pytest.mark.parametrize("change, message", [c[1:] for c in LOAD_CASES], ids=[c[0] for c in LOAD_CASES])
def test_a_checkpoints_tokenizer_is_checked_again_when_generate_loads_it(plain_run, tmp_path, capfd, change, message):
    path = tampered(plain_run, tmp_path, change)
    assert generate(path.parent.parent, "--prompt", "w3") == 1
    err = capfd.readouterr().err
    assert re.match(re.escape(f"xspec: error: {path}: ") + message, err) and err.count("\n") == 1, err


def test_an_untampered_checkpoint_generates_and_its_ids_stay_in_the_vocabulary(plain_run, capfd):
    assert generate(plain_run, "--prompt", "w3 w4") == 0
    words = capfd.readouterr().out.split()
    assert 1 <= len(words) <= 2 and all(re.fullmatch(r"w\d+", w) and int(w[1:]) < ROWS for w in words), words


# --- a realistic tokenizer passes --------------------------------------------------------------------

def test_a_byte_level_tokenizer_with_llama_3s_pattern_passes_the_probe_and_round_trips(tmp_path):
    from tokenizers import trainers

    from xspec.runtime.tokenizer import CheckpointTokenizer

    pattern = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), "isolated"),
                                                       pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                                use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    text = [f"The {i} quick brown foxes jump over {i * 7} lazy dogs; naïve café 中文 🙂\n" for i in range(300)]
    tokenizer.train_from_iterator(text, trainers.BpeTrainer(vocab_size=ROWS, show_progress=False,
                                                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    made = CheckpointTokenizer("tokenizers", tokenizer.to_str().encode(), None, [0], "tokenizer.json")
    line = "Sixteen   spaces,\ttabs and 12345 digits: naïve café 中文 🙂!"
    assert made.decode(made.encode([line])[0]) == line
