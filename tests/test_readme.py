"""The README's commands run as written: every command of its ```bash blocks and every command line quoted in
its prose, in a temporary working directory with the files its placeholders name, in process (xspec.cli.main)
and shrunk by a few --set keys so that each takes seconds. A command that cannot run here is listed with the
reason; one the README gains that is neither run nor listed fails the first test, so the README cannot drift
from what runs. Then the README's data pair in depth: a prepared vocabulary sizes the model."""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import io
import os
import random
import re
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from toy_text import WORDS
from xspec.cli import main
from xspec.runtime import demo_data
from xspec.runtime.demo_data import generate_split

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
LM = str(ROOT / "specs" / "lm.xspec")
TINY = str(ROOT / "specs" / "tiny.xspec")
# What some commands need besides xspec: CI has both (graphviz; transformers, a test extra, makes the small
# Hugging Face checkpoints), so there a missing one is a failure; elsewhere its commands are left out.
AVAILABLE = {"dot": shutil.which("dot") is not None or bool(os.environ.get("CI")),
             "transformers": importlib.util.find_spec("transformers") is not None or bool(os.environ.get("CI"))}


# --- the README's commands ------------------------------------------------------------------------

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
PROGRAMS = ("xspec", "python", "python3", "pip", "apt-get", "torchrun", "tensorboard", "ruff", "mypy")


def readme_commands(text: str) -> list[str]:
    """Every command of the README in its order, as written: each line of its ```bash blocks (continued lines
    joined, comments dropped, `a && b` as two commands), then each command line its prose quotes."""
    commands: list[str] = []
    for block in (m.group(2) for m in FENCE.finditer(text) if m.group(1) == "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"(^|\s)#.*", "", line).strip()
            commands += [" ".join(part.split()) for part in line.split("&&") if part.strip()]
    prose = FENCE.sub("", text)
    for span in re.findall(r"`([^`]+)`", prose):
        span = " ".join(span.split())          # a span may wrap onto the next line
        if _is_command(span):
            commands.append(span)
    return list(dict.fromkeys(commands))


def _is_command(span: str) -> bool:
    """A program with arguments (`xspec keys`, not `torchrun` named alone), or a script (`bench/x.py`)."""
    words = re.sub(r"^([A-Z_]+=\S+ )+", "", span).split()
    if words and words[0].startswith(("bench/", ".ci/")):
        return True
    return len(words) > 1 and words[0] in PROGRAMS


@dataclass(frozen=True)
class Run:
    """How the test runs one README command."""

    shows: str = ""                     # printed by the command (a part of a line)
    replace: tuple[tuple[str, str], ...] = ()   # words of the README's command given other values here
    typed: str = ""                     # a file whose lines are typed into it (stdin)
    needs: tuple[str, ...] = ()         # keys of AVAILABLE


# The README's commands that run here, with what the output must hold. Placeholders: runs/<run>, runs/<a> and
# runs/<b> are the main job's run; ~/models/Qwen3-0.6B a small random Qwen3 checkpoint, ~/models/opus-mt-en-de a
# small random Marian with its tokenizer; SPEC specs/base.xspec.
RUN = {
    "xspec train specs/tiny.xspec": Run("BLEU|nrefs:1|"),
    "xspec show runs/<run>": Run("xspec train --resume runs/"),
    "xspec plot runs/<run> -o curves.png": Run(),
    "xspec translate runs/<run> < input.txt > output.txt": Run(),
    "xspec translate runs/<run>": Run(typed="input.txt"),
    "xspec translate runs/<a> runs/<b> < input.txt": Run(),
    "xspec eval runs/<run> --src test.src --ref test.tgt": Run("BLEU|nrefs:1|"),
    "xspec average runs/<run> --last 5 -o averaged.safetensors": Run("averaged 5 checkpoints"),
    "xspec export runs/<run> -o exported/": Run("encoder.pt2"),
    "xspec export runs/<run> --format hf -o marian/": Run("as a Hugging Face checkpoint to marian"),
    "xspec train --resume runs/<run> --set train.max_steps=3000":
        Run("resuming runs/", replace=(("train.max_steps=3000", "train.max_steps=7"),)),
    "xspec train specs/lm.xspec": Run("test perplexity"),
    "xspec train specs/lm.xspec --train train.txt --valid valid.txt --test test.txt -o runs/lm": Run("test perplexity"),
    'xspec generate runs/lm --prompt "the cat" --max-new-tokens 30': Run(),
    "xspec generate runs/lm --top-p 0.9 --temperature 0.8 --seed 7 < prompts.txt": Run(),
    "xspec eval runs/lm --text test.txt": Run("perplexity"),
    "xspec compile specs/base.xspec": Run("total                         63,082,496"),
    "xspec compile specs/base.xspec --set heads=16 --json": Run('"parameters": 63082496'),
    "xspec compile specs/base.xspec --standalone": Run("total                         63,082,496"),
    "xspec viz specs/base.xspec": Run(needs=("dot",)),
    "xspec viz specs/table3/E_learned_positions.xspec --diff specs/base.xspec -o diff.svg": Run(needs=("dot",)),
    "xspec stats specs/big.xspec": Run("update of 25,000 tokens as about"),
    "xspec import ~/models/Qwen3-0.6B -o runs/qwen3": Run("KL", needs=("transformers",)),
    "xspec show runs/qwen3": Run(needs=("transformers",)),
    "xspec viz runs/qwen3 --diff runs/llama -o diff.svg": Run(needs=("dot", "transformers")),
    'xspec generate runs/qwen3 --prompt "The capital of France is" --beam 1': Run(needs=("transformers",)),
    "xspec train --init runs/qwen3 --train my.txt --valid my-valid.txt -o runs/qwen3-tuned":
        Run("starting from the weights of runs/qwen3", needs=("transformers",)),
    "xspec export runs/qwen3-tuned --format hf -o exported/qwen3-tuned": Run(needs=("transformers",)),
    "xspec import ~/models/opus-mt-en-de -o runs/en-de": Run("KL", needs=("transformers",)),
    "xspec translate runs/en-de < news.en > news.de": Run(needs=("transformers",)),
    "xspec import ~/models/bert-base-uncased -o runs/bert": Run("KL", needs=("transformers",)),
    'xspec fill runs/bert --text "the house is [MASK]."': Run("the house is ", needs=("transformers",)),
    "xspec train --init runs/bert --train notes.txt --valid notes-valid.txt -o runs/bert-tuned":
        Run("starting from the weights of runs/bert", needs=("transformers",)),
    ("xspec train --init runs/bert --set num_labels=2 --train notes.txt --train-labels notes.labels "
     "-o runs/bert-classes"):
        Run("the classifier's own tensors start fresh", needs=("transformers",)),
    "xspec classify runs/bert-classes < notes.txt": Run(needs=("transformers",)),
    ("xspec train --init runs/bert --set num_labels=3 --train notes.txt --train-pair notes.pair --train-labels "
     "nli.labels -o runs/nli"):
        Run("train (notes.txt, nli.labels, notes.pair): 60 texts", needs=("transformers",)),
    "xspec classify runs/nli -i notes.txt --input-pair notes.pair": Run(needs=("transformers",)),
    "xspec train specs/modern/bert.xspec --train train.txt --valid valid.txt --test test.txt -o runs/mlm":
        Run("masked-token loss"),
    "xspec eval runs/mlm --text test.txt": Run("masked-token loss"),
    "xspec data prepare corpus/*.txt -o data/web --vocab-size 32000": Run("data/web: "),
    "xspec train specs/lm.xspec --data data/web --valid valid.txt": Run("would set it: the model's embedding takes"),
    "xspec keys": Run("train.max_steps"),
    "xspec viz specs/base.xspec -o docs/images/base.svg": Run(needs=("dot",)),
    "xspec stats SPEC": Run("transformer_base (specs/base.xspec)", replace=(("SPEC", "specs/base.xspec"),)),
    "xspec --help": Run("usage: xspec"),
}

_SETUP = "makes a virtual environment and installs into it (network, minutes): the setup every other command needs"
_BENCH = "a benchmark behind a figure of the README: it measures for minutes, on data or hardware the test lacks"
_PROSE = "the command's name in a sentence, not a command line"
NOT_RUN = {
    "python3 -m venv .venv": _SETUP,
    ". .venv/bin/activate": _SETUP,
    "pip install torch==2.13.0": _SETUP,
    "pip install -e .": _SETUP,
    "pip install -e '.[test]'": _SETUP,
    "pip install 'xspec[hf]'": _SETUP,
    "ruff check .": "the linter, which CI runs before the tests",
    "mypy": "the type check, which CI runs before the tests",
    "python -m pytest -q": "the test suite, which this test is part of",
    'python -m pytest -q -m "not slow"': "the fast subset of the test suite, which this test is part of",
    ".ci/check-wheel": "builds the wheel and installs it into a new virtual environment (network, minutes)",
    "apt-get install libtcmalloc-minimal4": "installs a system package",
    "tensorboard --logdir runs": "a server, which runs until it is stopped",
    "xspec train specs/big.xspec": "the big model, 213M parameters: each 25,000-token update takes minutes and "
                                   "gigabytes on a CPU (its memory plan: tests/runtime/test_memory_plan.py)",
    "xspec sweep specs/table3/ --steps 2000 --data ../shared/data/multi30k-en-de ...":
        "trains every Table 3 variant on Multi30k, which is not in the checkout (tests/test_sweep.py sweeps small "
        "specs)",
    "xspec sweep specs/table3/ ...": "the same sweep",
    "xspec export runs/<run> -o exported/ --format onnx": "torch.onnx.export takes about 15 s here "
                                                        "(tests/runtime/test_export.py exports ONNX and runs it)",
    "torchrun --nproc_per_node=8 -m xspec train ...": "eight processes, one a GPU "
                                                      "(tests/runtime/test_distributed.py runs two CPU processes)",
    "xspec train": _PROSE,
    "xspec compile": _PROSE,
    "xspec treebank": _PROSE,
    "python -c pass": "the baseline of the start-up figure, not an xspec command",
    "bench/table3.sh": _BENCH,
    "bench/parsing.sh": _BENCH,
    "bench/decode.py": _BENCH,
    "bench/decode_lm.py": _BENCH,
    "bench/speed.py": _BENCH,
    "bench/lm_multi30k.sh": _BENCH,
    "MINUTES=45 WARMUP=1000 bench/multi30k.sh": _BENCH,
    "bench/compile_time.py": _BENCH,
    "bench/startup.py": _BENCH,
    "bench/compare_versions.py": _BENCH,
    "bench/scaling.py": _BENCH,
    "bench/gpu.py": _BENCH,
    "bench/cuda_decode.py": _BENCH,
    "bench/gpu_check.sh": _BENCH,
}


def expanded(command: str) -> list[str]:
    """A command with an optional option in brackets (`[--format onnx]`; not `'.[test]'`): without it, then
    with it."""
    optional = re.search(r"\s+\[(--[^\]]+)\]", command)
    if optional is None:
        return [command]
    without = command[:optional.start()] + command[optional.end():]
    return [without, f"{without} {optional.group(1)}"]


def test_every_readme_command_is_run_or_listed():
    commands = [c for command in readme_commands(README.read_text(encoding="utf-8")) for c in expanded(command)]
    unknown = [c for c in commands if c not in RUN and c not in NOT_RUN]
    assert not unknown, f"README commands this test neither runs nor lists (add them to RUN or NOT_RUN): {unknown}"
    gone = [c for c in [*RUN, *NOT_RUN] if c not in commands]
    assert not gone, f"commands this test knows that the README no longer has: {gone}"
    assert all(reason for reason in NOT_RUN.values())


def test_the_reading_of_the_readme_finds_blocks_continuations_chains_and_prose():
    text = ("Run `xspec keys` or `xspec` alone, `xspec.load`, `torchrun`, `bench/x.py`.\n"
            "```bash\nxspec a  # a comment\nxspec b \\\n  --c d && pip install e\n```\n"
            "```\nxspec not-bash\n```\n`xspec wrapped\nspan`")
    assert readme_commands(text) == ["xspec a", "xspec b --c d", "pip install e", "xspec keys", "bench/x.py",
                                     "xspec wrapped span"]
    assert expanded("xspec export R -o e/ [--format onnx]") == ["xspec export R -o e/",
                                                                "xspec export R -o e/ --format onnx"]


# --- running them ---------------------------------------------------------------------------------

# Added after the command's name (the README's own options come after them, and win): a few small updates, a
# checkpoint each, short decoding and generating, one tokenizing process.
SHRINK_TRAIN = ["--set", "train.max_steps=5", "--set", "train.batch_tokens=512", "--set",
                "train.checkpoint_every_steps=1", "--set", "decode.max_len_a=0", "--set", "decode.max_len_b=8",
                "--set", "decode.max_new_tokens=8", "--no-progress"]
SHRINK = {("train",): SHRINK_TRAIN, ("data", "prepare"): ["--workers", "1"], ("generate",): ["--max-new-tokens", "8"]}
# The built-in demo task, smaller: the main job's data is written by the run, at these sizes.
DEMO_SIZES = {"train": 2000, "valid": 40, "test": 20}


def _words(count: int, seed: int) -> list[str]:
    draw = random.Random(seed)
    return ["".join(draw.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(draw.randint(2, 9)))
            for _ in range(count)]


def _lines(words: list[str], count: int, seed: int) -> str:
    draw = random.Random(seed)
    return "".join(" ".join(draw.choice(words) for _ in range(draw.randint(4, 14))) + "\n" for _ in range(count))


def make_workspace(directory: Path) -> None:
    """The files the README's commands name, in `directory` (its working directory)."""
    (directory / "specs").symlink_to(ROOT / "specs")
    (directory / "docs" / "images").mkdir(parents=True)
    test_pairs = generate_split("test", 10)
    (directory / "test.src").write_text("".join(s + "\n" for s, _ in test_pairs))
    (directory / "test.tgt").write_text("".join(t + "\n" for _, t in test_pairs))
    (directory / "input.txt").write_text("".join(s + "\n" for s, _ in test_pairs[:3]))
    for split, size in (("train", 300), ("valid", 20), ("test", 20)):
        (directory / f"{split}.txt").write_text("".join(s + "\n" for s, _ in generate_split(split, size)))
    (directory / "prompts.txt").write_text("the cat\nsome dogs\n")
    vocabulary = [f"w{i}" for i in range(3, 200)]         # the small checkpoints' word-level tokenizer
    (directory / "my.txt").write_text(_lines(vocabulary, 60, 1))
    (directory / "my-valid.txt").write_text(_lines(vocabulary, 10, 2))
    (directory / "notes.txt").write_text(_lines(WORDS, 60, 3))      # the small BERT's words
    (directory / "notes-valid.txt").write_text(_lines(WORDS, 10, 4))
    (directory / "notes.labels").write_text("yes\nno\n" * 30)      # a class of each of notes.txt's lines
    (directory / "notes.pair").write_text(_lines(WORDS, 60, 5))     # the second text of each line's pair
    (directory / "nli.labels").write_text("entailment\nneutral\ncontradiction\n" * 20)   # a class of each pair
    (directory / "corpus").mkdir()
    words = _words(1500, 3)        # more pieces than lm.xspec's 1000-row embedding: the README pair's case
    for k in range(2):
        (directory / "corpus" / f"part{k}.txt").write_text(_lines(words, 300, 10 + k))


@dataclass
class Outcome:
    code: int
    output: str


def run_command(command: str, spec: Run, placeholders: dict[str, str]) -> Outcome:
    """`command` as a shell would run it in the working directory (placeholders, globs, < and >), in process."""
    words = [placeholders.get(w, w) for w in shlex.split(command)]
    words = [dict(spec.replace).get(w, w) for w in words]
    stdin, stdout = spec.typed or None, None
    if "<" in words:
        at = words.index("<")
        stdin, words = words[at + 1], words[:at] + words[at + 2:]
    if ">" in words:
        at = words.index(">")
        stdout, words = words[at + 1], words[:at] + words[at + 2:]
    words = [match for w in words for match in (sorted(glob.glob(w)) if "*" in w else [w])]
    assert words[0] == "xspec", command
    argv = words[1:]
    for command_words, added in SHRINK.items():
        if tuple(argv[:len(command_words)]) == command_words:
            argv = [*command_words, *added, *argv[len(command_words):]]
    out, err = io.StringIO(), io.StringIO()
    typed = io.TextIOWrapper(io.BytesIO(Path(stdin).read_bytes() if stdin else b""), encoding="utf-8")
    saved_stdin, sys.stdin = sys.stdin, typed
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as stop:          # --help
                code = int(stop.code or 0)
    finally:
        sys.stdin = saved_stdin
    if stdout is not None:
        Path(stdout).write_text(out.getvalue())
    return Outcome(code, out.getvalue() + err.getvalue())


@pytest.fixture
def one_thread():
    """The models are tiny: on a busy 2-core machine a second intra-op thread only slows them down."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _runnable(spec: Run) -> bool:
    return all(AVAILABLE[need] for need in spec.needs)


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning")
def test_the_readme_commands_run(tmp_path, monkeypatch, one_thread):
    monkeypatch.chdir(tmp_path)
    for split, size in DEMO_SIZES.items():
        monkeypatch.setitem(demo_data.SPLIT_SIZES, split, size)
    make_workspace(tmp_path)
    placeholders: dict[str, str] = {}
    if AVAILABLE["transformers"]:
        from hf_checkpoints import saved

        placeholders["~/models/Qwen3-0.6B"] = str(saved("qwen3"))
        from test_hf_marian import LINES, with_tokenizer     # a small random Marian with its tokenizer

        placeholders["~/models/opus-mt-en-de"] = str(with_tokenizer())
        from test_hf_bert import with_tokenizer as bert_with_tokenizer     # a small random BERT with its WordPiece

        placeholders["~/models/bert-base-uncased"] = str(bert_with_tokenizer())
        Path("news.en").write_text("".join(line + "\n" for line in LINES))
        # What the README's Hugging Face block imported before: another checkpoint to compare with.
        assert run_command(f"xspec import {saved('llama3')} -o runs/llama", Run(), {}).code == 0
    readme = README.read_text(encoding="utf-8")
    commands = [c for command in readme_commands(readme) for c in expanded(command)]
    ran = []
    for command in (c for c in commands if c in RUN and _runnable(RUN[c])):
        spec = RUN[command]
        outcome = run_command(command, spec, placeholders)
        assert outcome.code == 0, f"{command}: exit status {outcome.code}\n{outcome.output[-3000:]}"
        assert spec.shows in outcome.output, f"{command}: no {spec.shows!r} in its output\n{outcome.output[-3000:]}"
        ran.append(command)
        if command == "xspec train specs/tiny.xspec":        # the main job's run, which the next block uses
            (run,) = glob.glob("runs/transformer_tiny-*")
            placeholders |= {"runs/<run>": run, "runs/<a>": run, "runs/<b>": run}
        if command == "xspec compile specs/base.xspec":
            assert outcome.output == _shown_after(readme, "`xspec compile specs/base.xspec` prints:")
    assert len(Path("output.txt").read_text().splitlines()) == 3
    if AVAILABLE["transformers"]:
        assert len(Path("news.de").read_text().splitlines()) == len(LINES)
    assert sorted(ran) == sorted(c for c in RUN if _runnable(RUN[c]))


IMPORT_DOC = ROOT / "docs" / "import.md"
WALKTHROUGH = "## Walkthrough: import, chat, LoRA fine-tune, export"


@pytest.mark.skipif(not AVAILABLE["transformers"], reason="the walkthrough imports a checkpoint transformers writes")
@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning")
def test_the_import_walkthrough_runs(tmp_path, monkeypatch, one_thread):
    """docs/import.md's walkthrough, as written: its commands in order on a small random Qwen3 with a chat
    template (shrunk as the README's are), then its Python, which loads the export with transformers."""
    from test_hf_chat import chat_checkpoint

    monkeypatch.chdir(tmp_path)
    make_workspace(tmp_path)
    text = IMPORT_DOC.read_text(encoding="utf-8")
    section = text[text.index(WALKTHROUGH):]
    section = section[:section.find("\n## ", 1) if "\n## " in section[1:] else len(section)]
    commands = readme_commands(section)
    assert [c.split()[1] for c in commands] == ["import", "generate", "train", "generate", "export"]
    placeholders = {"~/models/Qwen3-0.6B": str(chat_checkpoint(tmp_path / "checkpoint"))}
    for command in commands:
        outcome = run_command(command, Run(), placeholders)
        assert outcome.code == 0, f"{command}: exit status {outcome.code}\n{outcome.output[-3000:]}"
        if " --set train.lora_rank=8 " in command:
            assert "LoRA: rank 8, alpha 16, on 21 linear layers" in outcome.output
    (python,) = [m.group(2) for m in FENCE.finditer(section) if m.group(1) == "python"]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(python, f"{IMPORT_DOC}:walkthrough", "exec"), {})
    assert printed.getvalue().strip()       # the reply, decoded


def _shown_after(readme: str, sentence: str) -> str:
    """The fenced block that follows `sentence` in the README."""
    return FENCE.search(readme, readme.index(sentence)).group(2)


# --- the README's data pair: a prepared vocabulary sizes the model --------------------------------------

SMALL = ["--set", "d_model=32", "--set", "d_ff=64", "--set", "heads=2", "--set", "layers=1", "--set",
         "train.batch_tokens=256", "--set", "data.block_size=16", "--set", "train.checkpoint_every_steps=1",
         "--set", "train.max_steps=2", "--no-test", "--no-progress", "--no-tensorboard"]


def _xspec(*argv: str) -> Outcome:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = main(list(argv))
    return Outcome(code, out.getvalue())


def _pieces(directory: Path) -> int:
    from xspec.runtime.vocab import Vocab

    return len(Vocab.load(directory / "sentencepiece.model"))


def _run_vocab(run: Path) -> tuple[int, int]:
    """A run's `vocab` and embedding rows, as its spec.xspec and its last checkpoint say."""
    import xspec
    from xspec.runtime import checkpoint as ckpt

    spec = xspec.compile(str(run / "spec.xspec"))
    assert ckpt.load_weights(ckpt.list_checkpoints(run)[-1]).params["vocab"] == spec.params["vocab"]
    return spec.params["vocab"], spec.vocab_size


@pytest.fixture(scope="module")
def text_data(tmp_path_factory) -> Path:
    """Prepared text whose vocabulary has more pieces than lm.xspec's 1000-row embedding."""
    directory = tmp_path_factory.mktemp("prepared")
    (directory / "corpus.txt").write_text(_lines(_words(1500, 5), 500, 6))
    (directory / "valid.txt").write_text(_lines(_words(1500, 5), 10, 7))
    assert _xspec("data", "prepare", str(directory / "corpus.txt"), "-o", str(directory / "web"), "--vocab-size",
                  "32000", "--workers", "1", "--no-progress").code == 0
    assert _pieces(directory / "web") > 1000
    return directory


def _adopted_line(data: Path, was: int) -> str:
    pieces = _pieces(data)
    return (f"vocab = {pieces} (the spec says {was}), as --set vocab={pieces} would set it: the model's embedding "
            f"takes the prepared data's vocabulary, {data / 'sentencepiece.model'}, of {pieces} pieces")


def test_a_prepared_vocabulary_sizes_the_model_and_resuming_keeps_it(text_data, tmp_path, one_thread):
    web, run = text_data / "web", tmp_path / "run"
    data = ["--data", str(web), "--valid", str(text_data / "valid.txt")]
    outcome = _xspec("train", LM, *SMALL, *data, "-o", str(run))
    assert outcome.code == 0, outcome.output
    assert outcome.output.splitlines()[0] == _adopted_line(web, 1000)
    assert _run_vocab(run) == (_pieces(web), _pieces(web))
    outcome = _xspec("train", "--resume", str(run), "--set", "train.max_steps=3", "--no-progress")
    assert outcome.code == 0 and "resuming" in outcome.output and "vocab = " not in outcome.output, outcome.output
    # The command a restarting launcher repeats: the spec file again, resized again to continue the run.
    outcome = _xspec("train", LM, *SMALL, *data, "-o", str(run), "--resume", "auto", "--set", "train.max_steps=4")
    assert outcome.code == 0 and f"resuming {run} at step 3" in outcome.output, outcome.output
    assert _adopted_line(web, 1000) in outcome.output
    assert _run_vocab(run) == (_pieces(web), _pieces(web))


def test_an_explicit_vocab_must_hold_every_prepared_piece(text_data, tmp_path, one_thread):
    web, pieces = text_data / "web", _pieces(text_data / "web")
    outcome = _xspec("train", LM, *SMALL, "--set", f"vocab={pieces - 1}", "--data", str(web), "-o", str(tmp_path / "a"))
    assert outcome.code == 1 and outcome.output.splitlines() == [
        f"xspec: error: {web / 'sentencepiece.model'}: the prepared data's vocabulary has {pieces} pieces, but the "
        f"model's embedding has {pieces - 1} rows; prepare it with --vocab-size <= {pieces - 1}, or drop --set "
        f"vocab={pieces - 1} (the model then takes the prepared vocabulary's size)"]
    assert not (tmp_path / "a" / "spec.xspec").exists()
    outcome = _xspec("train", LM, *SMALL, "--set", f"vocab={pieces + 8}", "--data", str(web), "-o", str(tmp_path / "b"))
    assert outcome.code == 0 and "vocab = " not in outcome.output, outcome.output
    assert _run_vocab(tmp_path / "b") == (pieces + 8, pieces + 8)


def test_a_spec_whose_embedding_no_vocab_parameter_sizes_is_refused_naming_both_sizes(text_data, tmp_path):
    import xspec

    # lm.xspec with its `vocab` parameter named otherwise (`vocab_size` and the like are other words)
    source = re.sub(r"\bvocab\b", "words", xspec.compile(LM).resolved_source)
    (tmp_path / "renamed.xspec").write_text(source)
    web, pieces = text_data / "web", _pieces(text_data / "web")
    outcome = _xspec("train", str(tmp_path / "renamed.xspec"), *SMALL, "--data", str(web), "-o", str(tmp_path / "r"))
    assert outcome.code == 1 and outcome.output.splitlines() == [
        f"xspec: error: {web / 'sentencepiece.model'}: the prepared data's vocabulary has {pieces} pieces, but the "
        f"model's embedding has 1000 rows, and transformer_lm has no `vocab` parameter that sizes it; prepare it with "
        f"--vocab-size <= 1000, or set the parameter that sizes the embedding with --set NAME={pieces}"]
    outcome = _xspec("train", str(tmp_path / "renamed.xspec"), *SMALL, "--set", f"words={pieces}", "--data", str(web),
                     "-o", str(tmp_path / "s"))
    assert outcome.code == 0, outcome.output


def test_prepared_sentence_pairs_size_a_translation_model(tmp_path, one_thread):
    pairs = generate_split("train", 300)
    (tmp_path / "train.en").write_text("".join(s + "\n" for s, _ in pairs))
    (tmp_path / "train.de").write_text("".join(t + "\n" for _, t in pairs))
    wmt = tmp_path / "wmt"
    assert _xspec("data", "prepare", "--src", str(tmp_path / "train.en"), "--tgt", str(tmp_path / "train.de"),
                  "-o", str(wmt), "--vocab-size", "200", "--workers", "1", "--no-progress").code == 0
    assert _pieces(wmt) < 1000              # a smaller vocabulary than tiny.xspec's: the embedding shrinks to it
    outcome = _xspec("train", TINY, *SMALL, "--data", str(wmt), "-o", str(tmp_path / "run"))
    assert outcome.code == 0, outcome.output
    assert outcome.output.splitlines()[0] == _adopted_line(wmt, 1000)
    assert _run_vocab(tmp_path / "run") == (_pieces(wmt), _pieces(wmt))


def test_init_keeps_the_size_of_the_run_it_starts_from(text_data, tmp_path, one_thread):
    """A run that starts from other weights keeps their vocabulary, and the size their embedding has."""
    web, pieces = text_data / "web", _pieces(text_data / "web")
    first, tuned = tmp_path / "first", tmp_path / "tuned"
    assert _xspec("train", LM, *SMALL, "--set", f"vocab={pieces + 8}", "--data", str(web), "-o", str(first)).code == 0
    outcome = _xspec("train", "--init", str(first), *SMALL, "--data", str(web), "-o", str(tuned))
    assert outcome.code == 0 and "vocab = " not in outcome.output, outcome.output
    assert _run_vocab(tuned) == (pieces + 8, pieces + 8)
    outcome = _xspec("train", "--resume", str(tuned), "--set", "train.max_steps=3", "--no-progress")
    assert outcome.code == 0 and "vocab = " not in outcome.output, outcome.output
