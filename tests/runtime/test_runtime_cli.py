"""The commands end to end on specs/tiny.xspec, shrunk by --set so each run takes seconds."""

from __future__ import annotations

import contextlib
import io
import json
import re
import select
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from xspec.cli import main
from xspec.runtime import checkpoint as ckpt
from xspec.runtime.cache import DecoderCache

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "specs" / "tiny.xspec")
SHRINK = ["--set", "d_model=32", "--set", "d_ff=64", "--set", "heads=2", "--set", "layers=1",
          "--set", "vocab=200", "--set", "max_len=128", "--set", "train.batch_tokens=600",
          "--set", "train.warmup_steps=20", "--set", "train.validate_every_steps=4",
          "--set", "train.checkpoint_every_steps=4", "--set", "decode.max_len_a=0", "--set", "decode.max_len_b=10"]


def _data_args(corpus) -> list[str]:
    return ["--train-src", str(corpus.train.src), "--train-tgt", str(corpus.train.tgt),
            "--valid-src", str(corpus.valid.src), "--valid-tgt", str(corpus.valid.tgt),
            "--test-src", str(corpus.test.src), "--test-tgt", str(corpus.test.tgt)]


def _xspec(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def trained_run(small_corpus, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("cli") / "run"
    with contextlib.redirect_stdout(io.StringIO()) as out:
        code = main(["train", TINY, *SHRINK, "--set", "train.max_steps=12", "--set", "train.average_last=3",
                     *_data_args(small_corpus),
                     "--out", str(run), "--no-progress", "--device", "cpu"])
    assert code == 0
    (run / "stdout.txt").write_text(out.getvalue())
    return run


def test_train_prints_bleu_last_and_writes_the_run(trained_run):
    metrics = json.loads((trained_run / "metrics.json").read_text())
    assert metrics["steps"] == 12
    for key in ("bleu", "chrf", "valid_loss", "train_tokens_per_s", "wall_s"):
        assert isinstance(metrics[key], float)
    assert metrics["bleu_signature"].startswith("BLEU|nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert "transformer_tiny" in (trained_run / "spec.xspec").read_text()
    assert len(ckpt.list_checkpoints(trained_run)) == 3


def test_train_last_line_is_the_bleu_signature(trained_run):
    lines = (trained_run / "stdout.txt").read_text().strip().splitlines()
    assert lines[-1].startswith("BLEU|nrefs:1|") and lines[-2].startswith("chrF2|")
    assert lines[0].startswith("train (train.src, train.tgt): ")


def test_translate_stdin_file_beam_one_and_nbest(trained_run, small_corpus, tmp_path, capsys, monkeypatch):
    source = small_corpus.test.src.read_text().splitlines()[:3]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(("\n".join(source) + "\n").encode())))
    code, out, _ = _xspec(capsys, "translate", str(trained_run))
    assert code == 0 and len(out.splitlines()) == 3
    code, greedy, _ = _xspec(capsys, "translate", str(trained_run), "--input", str(small_corpus.test.src),
                             "--beam", "1")
    assert code == 0 and len(greedy.splitlines()) == 8
    code, nbest, _ = _xspec(capsys, "translate", str(ckpt.resolve(trained_run)), "--input",
                            str(small_corpus.test.src), "--nbest", "2", "--beam", "4", "--alpha", "0.6")
    rows = [line.split(" ||| ") for line in nbest.splitlines()]
    assert code == 0 and len(rows) == 16
    assert [int(r[0]) for r in rows] == [i for i in range(8) for _ in range(2)]
    assert all(float(rows[2 * i][2]) >= float(rows[2 * i + 1][2]) for i in range(8))
    # sampled: a line's stream is its seed's and its number's, whatever the window it is read in
    sampled = [_xspec(capsys, "translate", str(trained_run), "--input", str(small_corpus.test.src), "--sample",
                      "--seed", "3", *window)[1] for window in ([], ["--window", "3"])]
    assert sampled[0] == sampled[1] and len(sampled[0].splitlines()) == 8
    code, nbest, _ = _xspec(capsys, "translate", str(trained_run), "--input", str(small_corpus.test.src),
                            "--top-k", "5", "--beam", "3", "--nbest", "3")    # beam sampling's three
    assert code == 0 and len(nbest.splitlines()) == 24
    code, _, err = _xspec(capsys, "translate", str(trained_run), "--input", str(small_corpus.test.src), "--sample",
                          "--nbest", "2")
    assert code != 0 and "nbest 2: sampling draws one translation a line" in err


def test_translate_streams_each_line_before_stdin_closes(trained_run, small_corpus):
    source = small_corpus.test.src.read_text().splitlines()[:2]
    process = subprocess.Popen([sys.executable, "-m", "xspec", "translate", str(trained_run), "--beam", "1",
                                "--device", "cpu"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, cwd=ROOT)
    try:
        answers = []
        for line in source:  # one line typed, one translation back, with stdin still open
            process.stdin.write(line.encode() + b"\n")
            process.stdin.flush()
            ready, _, _ = select.select([process.stdout], [], [], 120)
            assert ready, "no translation while stdin is open"
            answers.append(process.stdout.readline())
        process.stdin.close()
        assert process.wait(60) == 0, process.stderr.read()
    finally:
        process.kill()
    assert len(answers) == 2 and all(a.endswith(b"\n") for a in answers)
    assert process.stdout.read() == b""  # nothing more once stdin closed


@torch.no_grad()
def test_a_compiled_decoder_gives_the_eager_logits_step_by_step(trained_run, capsys):
    """Decoding through torch.compile as `--compile on` loads it (slow to compile on a CPU), which says so."""
    from torch._dynamo.utils import counters

    from xspec.runtime.inference import COMPILING, load, load_ensemble

    eager = load(trained_run, device="cpu", compile="off").model
    assert COMPILING not in capsys.readouterr().err
    # the limit the ensemble raises restored after (pytest's monkeypatch would delete torch's config entry)
    with torch._dynamo.config.patch(recompile_limit=torch._dynamo.config.recompile_limit):
        load_ensemble([trained_run, trained_run, trained_run], device="cpu", compile="on")
    assert capsys.readouterr().err.count(COMPILING) == 1  # an ensemble's members compile alike: said once
    compiled = load(trained_run, device="cpu", compile="on").model
    assert COMPILING in capsys.readouterr().err
    graphs = counters["stats"]["unique_graphs"]
    torch.manual_seed(0)
    src = torch.randint(4, 100, (3, 7))
    tgt = torch.randint(4, 100, (3, 5))
    memory = eager.encode(src)
    caches = DecoderCache(), DecoderCache()
    for step in range(tgt.size(1)):  # the first step fills the caches, the others extend them
        expected = eager.decode(tgt[:, step:step + 1], memory, cache=caches[0])
        actual = compiled.decode(tgt[:, step:step + 1], memory, cache=caches[1])
        # float32, with the compiler free to fuse and reorder: relative to the logits' scale
        torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4 * expected.abs().max().item())
    assert counters["stats"]["unique_graphs"] > graphs  # it did compile


def test_a_line_longer_than_the_positions_is_translated_with_a_warning(trained_run, capsys, tmp_path):
    text = tmp_path / "long.txt"
    text.write_text("short line\n" + " ".join(["word"] * 400) + "\n\nlast\n")
    code, out, err = _xspec(capsys, "translate", str(trained_run), "--input", str(text), "--beam", "1")
    assert code == 0 and len(out.splitlines()) == 4 and out.splitlines()[2] == ""
    assert err.count("warning") == 1
    assert f"{text}:2: warning: " in err and "more than the model's 128 positions: translated from its first 127" \
        in err


def test_eval_prints_chrf_and_bleu_signatures(trained_run, small_corpus, capsys):
    code, out, _ = _xspec(capsys, "eval", str(trained_run), "--src", str(small_corpus.test.src),
                          "--ref", str(small_corpus.test.tgt))
    lines = out.strip().splitlines()
    assert code == 0 and lines[-2].startswith("chrF2|") and lines[-1].startswith("BLEU|nrefs:1|")


def test_average_then_eval(trained_run, small_corpus, tmp_path, capsys):
    averaged = tmp_path / "averaged.safetensors"
    code, out, _ = _xspec(capsys, "average", str(trained_run), "--last", "2", "-o", str(averaged))
    assert code == 0 and "averaged 2 checkpoints" in out
    code, out, _ = _xspec(capsys, "average", str(trained_run), "-o", str(tmp_path / "spec_default.safetensors"))
    assert code == 0 and "averaged 3 checkpoints" in out        # the run's train.average_last
    code, out, _ = _xspec(capsys, "eval", str(averaged), "--src", str(small_corpus.test.src),
                          "--ref", str(small_corpus.test.tgt))
    assert code == 0 and out.strip().splitlines()[-1].startswith("BLEU|")


def test_resume_continues_from_the_last_checkpoint_after_failed_attempts(small_corpus, tmp_path, capsys):
    run = tmp_path / "run"
    common = [*SHRINK, "--no-progress", "--no-test"]
    assert _xspec(capsys, "train", TINY, *common, "--set", "train.max_steps=4", *_data_args(small_corpus),
                  "--out", str(run))[0] == 0
    before = {name: (run / name).read_bytes() for name in ("spec.xspec", "run.json")}
    line = _error(capsys, "train", "--resume", str(run), "--set", "d_model=48", "--no-progress")
    assert "a checkpoint from a different spec (d_model: checkpoint 32, spec 48)" in line
    line = _error(capsys, "train", "--resume", str(run), "--truncate", "--no-progress")
    assert line == (f"xspec: error: --resume {run}: this run was started without --truncate; "
                    "resuming with it would change the training data")
    line = _error(capsys, "train", "--resume", str(run), "--test-src", str(small_corpus.valid.src),
                  "--test-tgt", str(small_corpus.valid.tgt), "--no-progress")
    assert "this run was started with test files" in line and "would change the test data" in line
    assert {name: (run / name).read_bytes() for name in before} == before
    code, out, _ = _xspec(capsys, "train", "--resume", str(run), "--set", "train.max_steps=8", "--no-progress",
                          "--no-test")
    assert code == 0 and "resuming" in out and "at step 4" in out
    assert "stopped at step 8: reached train.max_steps = 8" in out
    assert json.loads((run / "metrics.json").read_text())["steps"] == 8
    recorded = json.loads((run / "run.json").read_text())
    assert recorded["data"] == json.loads(before["run.json"])["data"] and recorded["stopped"]["step"] == 8


# --- bad input: one line on stderr, naming the file (and line), a non-zero exit -------------------

def _error(capsys, *argv: str) -> str:
    code, _, err = _xspec(capsys, *argv)
    assert code != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("xspec: error: "), err
    return lines[0]


def test_missing_training_file(capsys, tmp_path):
    line = _error(capsys, "train", TINY, "--train-src", str(tmp_path / "nope.en"), "--train-tgt",
                  str(tmp_path / "nope.de"), "--out", str(tmp_path / "r"))
    assert "nope.en: no such file" in line


def test_mismatched_line_counts(capsys, tmp_path):
    (tmp_path / "a.en").write_text("one\ntwo\n")
    (tmp_path / "a.de").write_text("eins\n")
    line = _error(capsys, "train", TINY, "--train-src", str(tmp_path / "a.en"), "--train-tgt",
                  str(tmp_path / "a.de"), "--out", str(tmp_path / "r"))
    assert "a.en has 2 lines but" in line and "a.de has 1" in line


def test_invalid_utf8(capsys, tmp_path):
    (tmp_path / "a.en").write_text("one\ntwo\n")
    (tmp_path / "a.de").write_bytes(b"eins\nzw\xc3\n")
    line = _error(capsys, "train", TINY, "--train-src", str(tmp_path / "a.en"), "--train-tgt",
                  str(tmp_path / "a.de"), "--out", str(tmp_path / "r"))
    assert "a.de:2: invalid UTF-8" in line


def test_a_vocabulary_smaller_than_the_text_s_characters(capsys, tmp_path):
    (tmp_path / "a.en").write_text("abc def\nghi\n")
    (tmp_path / "a.de").write_text("jkl\nmno pqr\n")
    line = _error(capsys, "train", TINY, "--set", "data.vocab_size=10", "--train-src", str(tmp_path / "a.en"),
                  "--train-tgt", str(tmp_path / "a.de"), "--out", str(tmp_path / "r"))
    # 18 letters, the word mark and 4 special pieces: sentencepiece's count
    assert "data.vocab_size 10: too few pieces for the training text" in line and "need 23;" in line, line


def test_only_one_side_given(capsys, tmp_path):
    line = _error(capsys, "train", TINY, "--train-src", "x.en", "--out", str(tmp_path / "r"))
    assert "--train-src and --train-tgt go together" in line


def test_resume_with_a_different_spec(trained_run, small_corpus, capsys, tmp_path):
    run = tmp_path / "copy"
    shutil.copytree(trained_run, run)
    line = _error(capsys, "train", TINY, *SHRINK, "--set", "d_model=48", "--resume", str(run), "--no-progress")
    assert "a checkpoint from a different spec (" in line and "d_model: checkpoint 32, spec 48" in line


def test_init_starts_a_variant_with_the_same_weights_and_names_the_tensor_a_variant_changes(
        trained_run, small_corpus, capsys, tmp_path):
    """--init compares weights, not parameters: a spec that only changes what adds no weight (dropout here;
    a schedule parameter) starts from the run; one that changes a weight's shape is refused naming it."""
    common = [*SHRINK, "--no-progress", "--no-test", "--no-tensorboard", "--set", "train.max_steps=1",
              *_data_args(small_corpus)]
    code, out, err = _xspec(capsys, "train", TINY, *common, "--set", "dropout=0.3", "--init", str(trained_run),
                            "-o", str(tmp_path / "variant"))
    assert code == 0, err
    assert f"starting from the weights of {ckpt.resolve(trained_run)}" in out
    line = _error(capsys, "train", TINY, *common, "--set", "d_ff=96", "--init", str(trained_run),
                  "-o", str(tmp_path / "wider"))
    assert line.endswith(": tensor decoder.layers.0.ffn.w_1.bias has shape (64,); the model of transformer_tiny has "
                         "(96,) (--init starts from weights of the same names and shapes)"), line


def test_truncated_checkpoint(trained_run, capsys, tmp_path):
    data = ckpt.resolve(trained_run).read_bytes()
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(data[: len(data) // 3])
    line = _error(capsys, "translate", str(broken), "--input", str(broken))
    assert "broken.safetensors: corrupt or truncated checkpoint" in line


def test_translate_without_a_run(capsys, tmp_path):
    line = _error(capsys, "translate", str(tmp_path / "nowhere"))
    assert "no such run directory or checkpoint" in line


def test_nbest_larger_than_beam(trained_run, small_corpus, capsys):
    line = _error(capsys, "translate", str(trained_run), "--input", str(small_corpus.test.src),
                  "--nbest", "5", "--beam", "2")
    assert "nbest (5) cannot exceed beam (2)" in line


def test_a_run_spec_that_imports_is_refused_on_resume(trained_run, capsys, tmp_path):
    run = tmp_path / "copy"
    shutil.copytree(trained_run, run)
    (run / "spec.xspec").write_text('import "../../specs/tiny.xspec"\nmodel x extends transformer_tiny {}\n')
    code, _, err = _xspec(capsys, "train", "--resume", str(run), "--no-progress")
    assert code == 2 and "import-refused" in err


# --- output paths are checked before any work ---------------------------------------------------

def test_output_paths_are_checked_first(capsys, tmp_path):
    blocker = tmp_path / "file.txt"
    blocker.write_text("")
    nowhere = str(tmp_path / "no-such-run")          # never loaded: the output is refused first
    line = _error(capsys, "translate", nowhere, "-o", str(blocker / "out.txt"))
    assert line == f"xspec: error: --output {blocker / 'out.txt'}: {blocker} is not a directory"
    line = _error(capsys, "eval", nowhere, "--src", "a", "--ref", "b", "-o", str(tmp_path))
    assert line == f"xspec: error: --output {tmp_path}: is a directory; give a file name"
    line = _error(capsys, "average", nowhere, "-o", str(tmp_path))
    assert "--output" in line and "is a directory" in line
    line = _error(capsys, "train", TINY, "--out", str(blocker))
    assert line == f"xspec: error: --output {blocker}: {blocker} is not a directory"
    line = _error(capsys, "sweep", nowhere, "--steps", "1", "--data", "demo", "--report", str(blocker / "r"))
    assert line == f"xspec: error: --report {blocker / 'r'}: {blocker} is not a directory"
    line = _error(capsys, "compile", TINY, "-o", str(blocker))
    assert line == f"xspec: error: --output {blocker}: {blocker} is not a directory"
    (tmp_path / "out" / "graph.json").mkdir(parents=True)
    line = _error(capsys, "compile", TINY, "-o", str(tmp_path / "out"))   # none of its files written
    assert line == f"xspec: error: --output {tmp_path / 'out' / 'graph.json'}: is a directory; give a file name"
    assert [path.name for path in (tmp_path / "out").iterdir()] == ["graph.json"]
    line = _error(capsys, "viz", TINY, "-o", str(blocker / "tiny.svg"))
    assert line == f"xspec: error: --output {blocker / 'tiny.svg'}: {blocker} is not a directory"
    (tmp_path / "drawn.svg").mkdir()
    line = _error(capsys, "viz", TINY, "-o", str(tmp_path / "drawn.svg"))
    assert line == f"xspec: error: --output {tmp_path / 'drawn.svg'}: is a directory; give a file name"
    assert not list(tmp_path.glob(".*.tmp"))


def test_translate_output_into_new_folders(trained_run, small_corpus, tmp_path, capsys):
    output = tmp_path / "new" / "folder" / "out.de"
    code, _, _ = _xspec(capsys, "translate", str(trained_run), "--input", str(small_corpus.test.src), "-o",
                        str(output), "--beam", "1")
    assert code == 0 and len(output.read_text().splitlines()) == 8


# --- numeric options: argparse names the option, exit status 2 ----------------------------------

@pytest.mark.parametrize("argv, message", [
    (["translate", "RUN", "--beam", "0"], "argument --beam: must be at least 1, got 0"),
    (["translate", "RUN", "--nbest", "0"], "argument --nbest: must be at least 1, got 0"),
    (["translate", "RUN", "--alpha", "-0.5"], "argument --alpha: must be at least 0, got -0.5"),
    (["translate", "RUN", "--alpha", "nan"], "argument --alpha: must be a finite number"),
    (["eval", "RUN", "--src", "a", "--ref", "b", "--max-len-b", "-1"], "argument --max-len-b: must be at least 0"),
    (["eval", "RUN", "--src", "a", "--ref", "b", "--batch-tokens", "x"], "argument --batch-tokens: expected a whole"),
    (["average", "RUN", "-o", "x", "--last", "0"], "argument --last: must be at least 1, got 0"),
    (["sweep", "DIR", "--data", "demo", "--steps", "0"], "argument --steps: must be at least 1, got 0"),
    (["sweep", "DIR", "--data", "demo", "--steps", "1", "--width-divisor", "0"], "argument --width-divisor: must"),
    (["sweep", "DIR", "--data", "demo", "--steps", "1", "--threads", "-2"], "argument --threads: must be at least 1"),
    (["sweep", "DIR", "--data", "demo", "--steps", "1", "--dev-lines", "0"], "argument --dev-lines: must be at least"),
])
def test_bad_numbers_name_the_option(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_command_modules_import_nothing_heavy():
    """`xspec --help` builds every command's parser: importing the modules must stay cheap."""
    code = ("import sys, xspec.commands.train, xspec.commands.translate, xspec.commands.eval, "
            "xspec.commands.average, xspec.commands.sweep\n"
            "heavy = ('torch', 'sacrebleu', 'sentencepiece', 'safetensors', 'tqdm', 'xspec.sweep', 'xspec.runtime')\n"
            "print(sorted(m for m in sys.modules for h in heavy if m == h or m.startswith(h + '.')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]"


def test_the_spec_saved_into_a_run_is_the_spec_trained(trained_run):
    """The corpus is too small for the spec's data.vocab_size = 1000 pieces: the run's spec and its
    checkpoints' say how many the model was trained with."""
    import sentencepiece as spm

    import xspec

    from xspec.runtime import checkpoint as ckpt
    from xspec.runtime.inference import compile_checkpoint_spec

    pieces = spm.SentencePieceProcessor(model_file=str(trained_run / "sentencepiece.model")).get_piece_size()
    assert pieces < 1000
    saved = xspec.compile(trained_run / "spec.xspec")
    assert saved.data.vocab_size == pieces
    assert compile_checkpoint_spec(ckpt.load_weights(ckpt.resolve(trained_run))).data.vocab_size == pieces


def test_show_describes_the_run_and_what_to_run_next(trained_run, small_corpus, capsys, tmp_path):
    code, out, _ = _xspec(capsys, "show", str(trained_run))
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == f"run {trained_run}"
    assert re.match(r"  spec        transformer_tiny \(translation\), [\d,]+ parameters$", lines[1])
    assert f"  data        train: {small_corpus.train.src.resolve()}, {small_corpus.train.tgt.resolve()}" in lines
    assert "  stopped     reached train.max_steps at step 12" in lines
    assert any(re.match(r"  validation  last: loss [\d.]+ \(ppl [\d.]+\) at step 12$", line) for line in lines)
    assert any(line.startswith("  test        bleu ") for line in lines)
    assert f"  resume      xspec train --resume {trained_run} --set train.max_steps=24" in lines
    assert (f"  evaluate    xspec eval {trained_run} --src {small_corpus.test.src.resolve()} "
            f"--ref {small_corpus.test.tgt.resolve()}") in lines
    code, out, _ = _xspec(capsys, "show", str(trained_run), "--json")
    shown = json.loads(out)
    assert shown["training"]["steps"] == 12 and shown["stopped"]["reason"] == "max_steps"
    assert shown["checkpoints"]["kept"][-1] == "step-00000012.safetensors"
    assert _error(capsys, "show", str(tmp_path)) == \
        f"xspec: error: {tmp_path}: not an xspec run directory (no run.json)"


@pytest.mark.parametrize("file, edit, message", [
    ("metrics.jsonl", lambda text: text + '{"step": "x", "loss": "y"}\n',
     'metrics.jsonl:{n}: "step" is not a step number'),
    ("metrics.jsonl", lambda text: text + '{"step": 3, "loss": [1]}\n', 'metrics.jsonl:{n}: "loss" is not a number'),
    ("metrics.json", lambda text: json.dumps({**json.loads(text), "best": 5}),
     "metrics.json: not the final figures xspec writes (best is not a record)"),
    ("metrics.json", lambda text: json.dumps({**json.loads(text), "best": {"step": "x"}}),
     'metrics.json: not the final figures xspec writes (step "x")'),
    ("metrics.json", lambda text: json.dumps({**json.loads(text), "test_loss": [1]}),
     "metrics.json: not the final figures xspec writes (test_loss [1])"),
    ("run.json", lambda text: json.dumps({**json.loads(text), "stopped": {"reason": "max_steps", "step": "x"}}),
     "run.json: not a run description xspec wrote (stopped is not a stop record)")])
def test_show_names_a_run_file_xspec_did_not_write(trained_run, capsys, tmp_path, file, edit, message):
    """A figure of another type is refused by file (and line), never printed as it is or failed on."""
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    path = run / file
    path.write_text(edit(path.read_text()))
    lines = path.read_text().count("\n")
    assert _error(capsys, "show", str(run)) == f"xspec: error: {run}/{message.format(n=lines)}"


def test_viz_and_stats_take_a_trained_run_directory(trained_run, capsys, tmp_path):
    """As they take an imported one: the run's own spec (spec.xspec), as it trained."""
    from xspec.runtime.run_dir import SPEC_FILE

    code, out, _ = _xspec(capsys, "viz", str(trained_run), "-o", str(tmp_path / "run.dot"))
    assert code == 0 and (tmp_path / "run.dot").read_text().startswith("digraph")
    code, out, _ = _xspec(capsys, "stats", str(trained_run))
    assert code == 0 and out.startswith(f"transformer_tiny ({trained_run / SPEC_FILE})")


def test_eval_refuses_references_that_hold_no_text(trained_run, capsys, tmp_path):
    """sacrebleu has nothing to score: it failed with an IndexError."""
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert _error(capsys, "eval", str(trained_run), "--src", str(empty), "--ref", str(empty)) == \
        f"xspec: error: {empty}: no reference to score against (every line is empty)"
    (tmp_path / "blank.txt").write_text("\n\n")
    (tmp_path / "two.txt").write_text("a b\nc d\n")
    assert _error(capsys, "eval", str(trained_run), "--src", str(tmp_path / "two.txt"), "--ref",
                  str(tmp_path / "blank.txt")).endswith("no reference to score against (every line is empty)")


def test_show_reads_a_run_without_validation(trained_run, capsys, tmp_path):
    """Its metrics.json has valid_loss null (nothing measured), which is no figure of another type."""
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    metrics = json.loads((run / "metrics.json").read_text())
    (run / "metrics.json").write_text(json.dumps({**metrics, "valid_loss": None}))
    code, out, _ = _xspec(capsys, "show", str(run))
    assert code == 0 and out.startswith(f"run {run}\n")
