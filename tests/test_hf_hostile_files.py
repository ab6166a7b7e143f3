"""`xspec import` of checkpoint directories whose files are not what they seem: FIFOs, directories and dangling
links in place of files, links leading out of the directory (refused) or into a Hugging Face cache's blobs
(followed), paths under a regular file or holding line breaks, JSON that overflows or repeats a key, config
values of the wrong type or out of range. Each is one message naming the file and key, never a hang, a
traceback or a file read from outside; the cases run through the command line, which never reaches its
internal-error status for them."""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import pytest

import xspec

from hf_checkpoints import saved
from xspec.cli import main

pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")


def copy(name: str, target: Path) -> Path:
    shutil.copytree(saved(name), target)
    return target


def import_error(capsys, source: Path, out: Path) -> str:
    """The one line `xspec import` answers with, checking that it refused and wrote nothing."""
    capsys.readouterr()          # what making the checkpoint printed
    code = main(["import", str(source), "-o", str(out), "--no-verify"])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("xspec: error: ") and err.count("\n") == 1, err
    assert not out.exists() and not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]
    return err.removeprefix("xspec: error: ").rstrip("\n")


def replace_with_fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def replace_with_directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


def replace_with_dangling_link(path: Path) -> None:
    path.unlink()
    path.symlink_to(path.with_name("gone"))


@pytest.mark.parametrize("file", ["model.safetensors", "config.json"])
@pytest.mark.parametrize("change, reason", [
    (replace_with_fifo, "is a FIFO; only regular files are read"),
    (replace_with_directory, "is a directory, not a text file"),
    (replace_with_dangling_link, "a symlink to a missing file"),
])
def test_a_fifo_a_directory_or_a_dangling_link_in_place_of_a_file_is_named(tmp_path, capsys, file, change, reason):
    directory = copy("qwen3", tmp_path / "checkpoint")
    change(directory / file)
    assert import_error(capsys, directory, tmp_path / "out") == f"{directory / file}: {reason}"


def test_a_fifo_shard_is_refused_without_blocking(tmp_path, capsys):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(saved("qwen2"))
    model.save_pretrained(tmp_path / "sharded", max_shard_size="40KB")
    shard = sorted((tmp_path / "sharded").glob("model-*.safetensors"))[1]
    replace_with_fifo(shard)
    message = import_error(capsys, tmp_path / "sharded", tmp_path / "out")
    assert message == f"{shard}: is a FIFO; only regular files are read"


def test_a_link_leading_out_of_the_checkpoint_is_refused_naming_where_it_leads(tmp_path, capsys):
    directory = copy("qwen3", tmp_path / "checkpoint")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    for name in ("config.json", "model.safetensors"):
        (directory / name).rename(outside / name)
        (directory / name).symlink_to(outside / name)
        assert import_error(capsys, directory, tmp_path / "out") == (
            f"{directory / name}: a symlink leading out of {directory} (to {outside / name}); xspec follows links "
            "only inside the directory it is given")
        (directory / name).unlink()
        (outside / name).rename(directory / name)
    (directory / "weights").mkdir()
    (directory / "model.safetensors").rename(directory / "weights" / "model.safetensors")
    (directory / "model.safetensors").symlink_to("weights/model.safetensors")     # inside: followed
    assert main(["import", str(directory), "-o", str(tmp_path / "out"), "--no-verify"]) == 0


def test_a_hugging_face_cache_snapshot_imports_through_its_links_into_blobs(tmp_path, capsys):
    """models--ORG--NAME/snapshots/REV/FILE -> ../../blobs/HASH, as huggingface_hub lays a download out."""
    model = tmp_path / "hub" / "models--org--tiny"
    snapshot = model / "snapshots" / "0123abcd"
    (model / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for index, file in enumerate(sorted(saved("qwen3").iterdir())):
        shutil.copyfile(file, model / "blobs" / f"blob{index}")
        (snapshot / file.name).symlink_to(Path("..", "..", "blobs", f"blob{index}"))
    assert main(["import", str(snapshot), "-o", str(tmp_path / "out"), "--no-verify"]) == 0
    assert "imported qwen3 as m_0123abcd" in capsys.readouterr().out


def test_a_checkpoint_path_under_a_regular_file_is_named(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("x")
    assert import_error(capsys, tmp_path / "notes.txt" / "checkpoint", tmp_path / "out") == (
        f"{tmp_path / 'notes.txt' / 'checkpoint'}: {tmp_path / 'notes.txt'} is a file, not a directory (a Hugging Face "
        "save_pretrained directory is expected)")


def test_a_path_with_a_line_break_stays_inside_the_generated_comment(tmp_path, capsys):
    """A directory name that tries to add an `import` line to the generated spec: shown escaped instead."""
    (tmp_path / "secret.xspec").write_text("top secret first line\n")
    name = f'x\nimport "{tmp_path / "secret.xspec"}"\n'
    directory = copy("qwen3", tmp_path / name)
    out = tmp_path / "out"
    assert main(["import", str(directory), "-o", str(out), "--no-verify"]) == 0
    captured = capsys.readouterr()
    assert "top secret" not in captured.out + captured.err
    lines = (out / "model.xspec").read_text().split("\n")
    assert lines[0].startswith(f"# Imported by `xspec import` from {tmp_path}/x\\nimport \"")
    assert not any(line.startswith("import") and "secret" in line for line in lines)


def test_a_directory_named_as_the_family_model_imports_under_another_name(tmp_path, capsys):
    directory = copy("llama3", tmp_path / "llama")
    assert main(["import", str(directory), "-o", str(tmp_path / "out"), "--no-verify"]) == 0
    assert "imported llama as llama_import" in capsys.readouterr().out


def write_config_text(directory: Path, text: str) -> None:
    (directory / "config.json").write_text(text)


def raw_edit(old: str, new: str):
    """An edit of config.json's text (for what json.dumps cannot write: 1e999, a repeated key)."""
    def change(directory: Path) -> None:
        text = (directory / "config.json").read_text()
        assert old in text
        write_config_text(directory, text.replace(old, new, 1))
    return change


def set_value(key: str, value):
    def change(directory: Path) -> None:
        config = json.loads((directory / "config.json").read_text())
        node = config
        *path, last = key.split(".")
        for part in path:
            node = node[part]
        node[last] = value
        write_config_text(directory, json.dumps(config))
    return change


CONFIG_TEXT_CASES = [
    ("qwen3", raw_edit('"rms_norm_eps": 1e-06', '"rms_norm_eps": 1e999'),
     "config.json: not JSON xspec reads (the number 1e999 is too large for a 64-bit float)"),
    ("qwen3", raw_edit('"vocab_size": 300', '"vocab_size": -Infinity'),
     "config.json: not JSON xspec reads (-Infinity is not a JSON number)"),
    ("qwen3", raw_edit('"vocab_size": 300', '"vocab_size": 300, "vocab_size": 3'),
     "config.json: not JSON xspec reads (the key 'vocab_size' is given twice in one object)"),
    ("qwen3", lambda d: (d / "config.json").write_bytes(b'{"model_type": "qwen3\xff"}'),
     "config.json: not UTF-8 (byte 21)"),
    ("qwen3", lambda d: write_config_text(d, "[" * 100_000), "config.json: not JSON xspec reads (nested too deeply)"),
    ("qwen3", set_value("vocab_size", 2**64), "config.json: vocab_size 18446744073709551616 is not an integer between "
                                              "1 and 9,223,372,036,854,775,807"),
    ("qwen3", set_value("num_hidden_layers", 10**9), "config.json: num_hidden_layers 1000000000 is not an integer "
                                                     "between 1 and 10,000"),
    ("qwen3", set_value("model_type", ["qwen3"]), 'config.json: model_type ["qwen3"] is not a string'),
    ("qwen3", set_value("rms_norm_eps", "1e-6"), 'config.json: rms_norm_eps "1e-6" is not a number >= 0'),
    ("llama3", set_value("rope_parameters.factor", "8"), 'config.json: rope_parameters.factor "8" is not a number > 0'),
    ("llama3", set_value("rope_parameters.original_max_position_embeddings", 8.5),
     "config.json: rope_parameters.original_max_position_embeddings 8.5 is not an integer >= 1"),
    ("llama3", set_value("rope_parameters.low_freq_factor", None),
     "config.json: rope_parameters.low_freq_factor null is not a number > 0"),
    ("gemma3", set_value("sliding_window_pattern", [6]),
     "config.json: sliding_window_pattern [6] is not an integer >= 1"),
    ("gemma3", set_value("rope_parameters", 5), "config.json: rope_parameters 5 is not an object or null"),
    ("phi3", set_value("partial_rotary_factor", "half"), 'config.json: partial_rotary_factor "half" is not a number'),
    ("phi3", set_value("partial_rotary_factor", 2.0),
     "config.json: partial_rotary_factor 2.0 is not a number in (0, 1]"),
    ("gpt_oss", set_value("num_experts_per_tok", [2]), "config.json: num_experts_per_tok [2] is not an integer"),
    ("qwen3", set_value("\x1b[31mshiny", 1), "config.json: attribute \\x1b[31mshiny (1) is not one xspec maps"),
]


@pytest.mark.parametrize("name, change, message", CONFIG_TEXT_CASES,
                         ids=[f"{n}-{m.split(':', 1)[1][:50].strip()}" for n, _, m in CONFIG_TEXT_CASES])
def test_config_values_are_type_and_range_checked_naming_the_key(tmp_path, capsys, name, change, message):
    directory = copy(name, tmp_path / "checkpoint")
    change(directory)
    assert import_error(capsys, directory, tmp_path / "out").startswith(f"{directory}/{message}")


def test_what_an_import_record_holds_reaches_the_terminal_escaped(tmp_path, capsys):
    directory = copy("qwen3", tmp_path / "checkpoint")
    out = tmp_path / "out"
    assert main(["import", str(directory), "-o", str(out), "--no-verify"]) == 0
    record = json.loads((out / "import.json").read_text())
    record["source"] = "/models/\x1b[2J\nverified    yes"
    record["not_architectural"] = {"\x1b]0;title\x07": "why"}
    (out / "import.json").write_text(json.dumps(record))
    capsys.readouterr()
    assert main(["show", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "\x1b" not in shown and "\x07" not in shown
    assert "  from        /models/\\x1b[2J\\nverified    yes (model_type qwen3)\n" in shown
    assert "  unchanged   \\x1b]0;title\\x07: why\n" in shown


def import_verified_error(capsys, source: Path, out: Path) -> str:
    capsys.readouterr()
    code = main(["import", str(source), "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("xspec: error: ") and err.count("\n") == 1, err
    assert not out.exists()
    return err.removeprefix("xspec: error: ").rstrip("\n")


def test_what_transformers_cannot_run_while_verifying_is_one_message(tmp_path, capsys):
    directory = copy("qwen3", tmp_path / "checkpoint")
    set_value("dtype", "{0}")(directory)
    assert import_verified_error(capsys, directory, tmp_path / "out").startswith(
        f"{directory}: transformers' Qwen3ForCausalLM cannot run this checkpoint to verify the import (AttributeError:")


def test_generation_config_is_read_as_every_file_of_the_checkpoint_is(tmp_path, capsys):
    """The import reads generation_config.json itself (the decode section): through a link inside the
    directory, never one leading out of it, which transformers would follow."""
    directory = copy("qwen3", tmp_path / "checkpoint")
    (tmp_path / "elsewhere.json").write_text('{"do_sample": true}')
    (directory / "generation_config.json").unlink(missing_ok=True)
    (directory / "generation_config.json").symlink_to(tmp_path / "elsewhere.json")
    assert import_error(capsys, directory, tmp_path / "out") == (
        f"{directory}/generation_config.json: a symlink leading out of {directory} (to {tmp_path}/elsewhere.json); "
        "xspec follows links only inside the directory it is given")
    (directory / "generation_config.json").unlink()
    (directory / "kept.json").write_text('{"do_sample": true, "top_k": 7}')
    (directory / "generation_config.json").symlink_to(directory / "kept.json")
    assert main(["import", str(directory), "-o", str(tmp_path / "out")]) == 0
    assert "verified against transformers' Qwen3ForCausalLM" in capsys.readouterr().out
    assert xspec.compile(tmp_path / "out").decode.top_k == 7


def rewrite_header(change):
    def rewrite(directory: Path) -> None:
        path = directory / "model.safetensors"
        data = path.read_bytes()
        (length,) = struct.unpack("<Q", data[:8])
        header, length = change(data[8:8 + length].decode(), length)
        path.write_bytes(struct.pack("<Q", length) + header.encode() + data[8 + len(header):])
    return rewrite


def test_a_header_length_that_is_off_or_a_key_given_twice_is_a_lying_file(tmp_path, capsys):
    directory = copy("olmo2", tmp_path / "a")
    rewrite_header(lambda header, length: (header, length - 1))(directory)      # the padding's last space
    assert "its tensors end at byte" in import_error(capsys, directory, tmp_path / "out")
    directory = copy("olmo2", tmp_path / "b")
    rewrite_header(lambda header, length: (header.replace('"dtype":"F32"', '"dtype":"F32","dtype":"F32"', 1),
                                           length + 15))(directory)
    assert "its header is not JSON xspec reads (the key 'dtype' is given twice in one object)" in \
        import_error(capsys, directory, tmp_path / "out")


def test_a_pad_id_beyond_the_embedding_and_a_key_with_a_line_break_are_one_line(tmp_path, capsys):
    directory = copy("qwen3", tmp_path / "a")
    set_value("pad_token_id", 4294967296)(directory)
    assert import_error(capsys, directory, tmp_path / "out") == (
        f"{directory}/config.json: pad_token_id 4294967296 is not a token id: the model's embedding has 300 rows")
    directory = copy("qwen3", tmp_path / "b")
    set_value("rope_parameters.hidden_size\n", [1])(directory)
    assert import_error(capsys, directory, tmp_path / "out").startswith(
        f"{directory}/config.json: rope_parameters.hidden_size\\n ([1]) is not supported with rope_type")
