"""The commands that read files besides specs, on mutated copies of valid ones (inputs.py): `xspec import`
of a checkpoint whose config.json, tokenizer.json, tokenizer.model, shard index, safetensors header or
files are hostile (then `xspec generate` with its tokenizer, where the import of a mutated tokenizer
succeeds), `xspec data show` and `xspec train --data` of a prepared
directory whose manifest or files are, and `xspec data prepare` resuming from a hostile progress record.
Every command keeps command.py's contract; a test runs all its cases and then lists every class of
failure with its simplest reproduction."""

from __future__ import annotations

import functools
import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from xspec.cli import main

from .command import Place, Result
from .config import fuzz_settings
from .input_cases import Cases, materialize
from .inputs import CONFIG_GROUPS, FAMILIES, INDEX, PROGRESS, PROMPTS, SINGLE, WEIGHT_GROUPS, Template, data_groups, \
    progress_change, tokenizer_groups

pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore")

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--set", "d_model=16", "--set", "d_ff=32", "--set", "heads=2", "--set", "layers=1", "--set", "vocab=64"]
TRAIN = {"text": [str(ROOT / "specs" / "lm.xspec"), *SMALL, "--set", "train.batch_tokens=64",
                  "--set", "data.block_size=8"],
         "parallel": [str(ROOT / "specs" / "tiny.xspec"), *SMALL, "--set", "train.batch_tokens=128"]}
ONE_STEP = ["--set", "train.max_steps=1", "--no-test", "--no-progress", "--no-tensorboard", "--device", "cpu"]
PREPARE = ["--vocab-size", "60", "--workers", "1", "--no-progress"]

# Cases per test in CI (XSPEC_FUZZ_EXAMPLES scales them): an import costs about 0.1 s, a generate 0.2 s,
# a data show 0.03 s, a training step 0.4 s (a language model) to 1 s (a translation model).
CHECKPOINT_CASES = 20
TOKENIZER_CASES = 20
DATA_CASES = 25
PROGRESS_CASES = 20

def groups(names) -> list:
    return [pytest.param(name, id=name) for name in names]


def cli(*argv: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        status = main(list(argv))
    return status, out.getvalue() + err.getvalue()


def template(path: Path, family: str) -> Template:
    return Template(path, {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.is_file()}, family)


@functools.cache
def checkpoint(family: str) -> Template:
    from hf_checkpoints import saved

    return template(saved(family), family)


def finish(cases: Cases) -> None:
    report = cases.report()
    if report:
        pytest.fail(report, pytrace=False)


# --- fixtures: valid inputs, each checked once ----------------------------------------------------------

@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("inputs")


@pytest.fixture(scope="module")
def texts(workspace) -> Path:
    from xspec.runtime.demo_data import generate_split

    folder = workspace / "texts"
    folder.mkdir()
    pairs = generate_split("train", 200)
    (folder / "a.txt").write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
    (folder / "s.txt").write_text("".join(s + "\n" for s, _ in pairs[:100]), encoding="utf-8")
    (folder / "t.txt").write_text("".join(t + "\n" for _, t in pairs[:100]), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def prepared(workspace, texts) -> dict[str, Template]:
    """A prepared text and a prepared translation corpus, each shown and trained on for a step."""
    made = {}
    for kind, inputs in (("text", [str(texts / "a.txt")]),
                         ("parallel", ["--src", str(texts / "s.txt"), "--tgt", str(texts / "t.txt")])):
        out = workspace / kind
        for argv in (["data", "prepare", *inputs, "-o", str(out), *PREPARE], ["data", "show", str(out)],
                     ["train", *TRAIN[kind], *ONE_STEP, "--data", str(out), "-o", str(workspace / f"{kind}-run")]):
            status, said = cli(*argv)
            assert status == 0, f"xspec {' '.join(argv)}: the unmutated case fails\n{said}"
        made[kind] = template(out, kind)
    return made


@pytest.fixture(scope="module")
def interrupted(workspace, texts, prepared) -> Template:
    """The folder a prepare of texts/a.txt leaves when interrupted after its fifth chunk, with its progress."""
    from prepare_interruption import stop_after

    out = workspace / "interrupted" / "out"
    out.parent.mkdir()
    with pytest.MonkeyPatch.context() as patch:
        stop_after(patch, 5)
        status, said = cli("data", "prepare", str(texts / "a.txt"), "-o", str(out), *PREPARE)
    partial = out.parent / f".{out.name}.partial"
    assert status == 130 and (partial / PROGRESS).is_file(), f"no interrupted prepare (exit status {status}): {said}"
    return template(partial, "text")


@pytest.fixture(scope="module")
def warm(workspace):
    """An unmutated import, verified, and a generate from it: the baseline, and the first imports paid."""
    out = workspace / "warm-import"
    generate = ["generate", str(out), "--prompt", "w1 w2", "--max-new-tokens", "2", "--beam", "1", "--device", "cpu"]
    for argv in (["import", str(checkpoint("mistral").path), "-o", str(out), "--device", "cpu"], generate):
        status, said = cli(*argv)
        assert status == 0, f"xspec {' '.join(argv)}: the unmutated case fails\n{said}"


@pytest.fixture(scope="module")
def sharded(workspace, warm) -> Template:
    """mistral's checkpoint with its weights in two shards and model.safetensors.index.json, as
    save_pretrained writes a large model's."""
    from safetensors.torch import load_file, save_file

    folder = workspace / "sharded"
    single = checkpoint("mistral")
    folder.mkdir()
    for name, data in single.files.items():
        if name != SINGLE:
            (folder / name).write_bytes(data)
    tensors = load_file(single.path / SINGLE)
    names = sorted(tensors)
    shards = {f"model-0000{i + 1}-of-00002.safetensors": names[i::2] for i in range(2)}
    for shard, members in shards.items():
        save_file({n: tensors[n] for n in members}, folder / shard, metadata={"format": "pt"})
    weight_map = {n: shard for shard, members in shards.items() for n in members}
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (folder / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    status, said = cli("import", str(folder), "-o", str(workspace / "sharded-import"), "--no-verify")
    assert status == 0, f"the sharded checkpoint does not import\n{said}"
    return template(folder, "mistral, sharded")


def watched(tmp_path: Path, workspace: Path) -> tuple[Path, ...]:
    from hf_checkpoints import ROOT as CHECKPOINTS

    return (tmp_path, workspace, CHECKPOINTS)


# --- a checkpoint's config.json, tokenizer.json and tokenizer.model -------------------------------------

def import_case(cases: Cases, template: Template, mutant, verify: bool, prompt: str) -> None:
    folder = cases.folder()
    source, out = folder / "checkpoint", folder / "run"
    baits = tuple(materialize(template, mutant, source))
    argv = ["import", str(source), "-o", str(out), "--device", "cpu", *([] if verify else ["--no-verify"])]
    place = Place(cases.watched, reads=(source, out), writes=(out,), baits=baits)
    result = cases.check(argv, place, f"{template.family}: {mutant.what}", folder, after=import_promises(out))
    if result.status == 0 and prompt is not None:
        argv = ["generate", str(out), "--prompt", prompt, "--max-new-tokens", "2", "--beam", "1", "--device", "cpu"]
        cases.check(argv, Place(cases.watched, reads=(out,), writes=(), baits=baits),
                    f"{template.family}: {mutant.what}; then generate --prompt {ascii(prompt)}", folder,
                    quiet_stdout=False)
    cases.done(folder)


def import_promises(out: Path):
    """An import that succeeded wrote a whole run directory; one that failed wrote nothing."""
    def promises(result: Result) -> list[str]:
        if result.status == 0 and not (out / "import.json").is_file():
            return ["incomplete output: succeeded without writing import.json"]
        if result.status != 0 and out.exists():
            return ["incomplete output: failed, but left its output directory"]
        return []

    return promises


@pytest.mark.parametrize("group", groups(CONFIG_GROUPS))
def test_import_of_a_mutated_config(group, tmp_path, workspace, warm):
    cases = Cases(group, tmp_path, watched(tmp_path, workspace))

    @fuzz_settings(CHECKPOINT_CASES)
    @given(st.data())
    def case(data):
        family = data.draw(st.sampled_from(FAMILIES), label="family")
        mutant = data.draw(CONFIG_GROUPS[group](checkpoint(family)), label="mutant")
        verify = data.draw(st.sampled_from((False, False, False, True)), label="verify")
        import_case(cases, checkpoint(family), mutant, verify, prompt=None)

    case()
    finish(cases)


@pytest.mark.parametrize("group", groups(WEIGHT_GROUPS))
def test_import_of_mutated_weights(group, tmp_path, workspace, warm, sharded):
    cases = Cases(group, tmp_path, watched(tmp_path, workspace))

    @fuzz_settings(CHECKPOINT_CASES)
    @given(st.data())
    def case(data):
        if group == "checkpoint-index":
            chosen = sharded
        else:
            family = data.draw(st.sampled_from(FAMILIES + (("sharded",) if group == "checkpoint-files" else ())),
                               label="family")
            chosen = sharded if family == "sharded" else checkpoint(family)
        mutant = data.draw(WEIGHT_GROUPS[group](chosen), label="mutant")
        verify = data.draw(st.sampled_from((False, False, False, True)), label="verify")
        import_case(cases, chosen, mutant, verify, prompt=None)

    case()
    finish(cases)


@pytest.mark.parametrize("group", groups(tokenizer_groups(b"")))
def test_import_and_generate_of_a_mutated_tokenizer(group, tmp_path, workspace, warm, prepared):
    cases = Cases(group, tmp_path, watched(tmp_path, workspace))
    mutations = tokenizer_groups(prepared["text"].files["sentencepiece.model"])[group]

    @fuzz_settings(TOKENIZER_CASES)
    @given(st.data())
    def case(data):
        family = data.draw(st.sampled_from(FAMILIES), label="family")
        mutant = data.draw(mutations(checkpoint(family)), label="mutant")
        prompt = data.draw(st.sampled_from(PROMPTS), label="prompt")
        import_case(cases, checkpoint(family), mutant, verify=False, prompt=prompt)

    case()
    finish(cases)


# --- a prepared data directory --------------------------------------------------------------------------

@pytest.mark.parametrize("group", groups(data_groups()))
def test_data_show_and_train_on_mutated_prepared_data(group, tmp_path, workspace, prepared):
    cases = Cases(group, tmp_path, watched(tmp_path, workspace))

    @fuzz_settings(DATA_CASES)
    @given(st.data())
    def case(data):
        kind = data.draw(st.sampled_from(("text", "parallel")), label="kind")
        mutant = data.draw(data_groups()[group](prepared[kind]), label="mutant")
        train = data.draw(st.sampled_from((False,) * 5 + (True,)), label="train")
        folder = cases.folder()
        source = folder / "data"
        baits = tuple(materialize(prepared[kind], mutant, source))
        what = f"prepared {kind}: {mutant.what}"
        show = ["data", "show", str(source), *(["--json"] if data.draw(st.booleans(), label="json") else [])]
        cases.check(show, Place(cases.watched, reads=(source,), writes=(), baits=baits), what, folder)
        if train:
            out = folder / "run"
            argv = ["train", *TRAIN[kind], *ONE_STEP, "--data", str(source), "-o", str(out)]
            cases.check(argv, Place(cases.watched, reads=(source, out), writes=(out,), baits=baits), what, folder)
        cases.done(folder)

    case()
    finish(cases)


@pytest.mark.parametrize("group", groups(["progress-record"]))
def test_a_prepare_resuming_from_a_mutated_progress_record(group, tmp_path, workspace, texts, prepared,
                                                           interrupted):
    """A resume either starts over or goes on; either way the directory it writes is the one an uninterrupted
    prepare writes, byte for byte (but the manifest's time and command)."""
    cases = Cases(group, tmp_path, watched(tmp_path, workspace))
    whole = prepared["text"]

    @fuzz_settings(PROGRESS_CASES)
    @given(st.data())
    def case(data):
        mutant = data.draw(progress_change(interrupted), label="mutant")
        folder = cases.folder()
        out = folder / "out"
        baits = tuple(materialize(interrupted, mutant, folder / ".out.partial"))
        argv = ["data", "prepare", str(texts / "a.txt"), "-o", str(out), *PREPARE]
        place = Place(cases.watched, reads=(texts / "a.txt", out), writes=(out,), baits=baits)
        result = cases.check(argv, place, f"interrupted prepare: {mutant.what}", folder,
                             after=lambda result: same_as(out, whole) if result.status == 0 else [])
        if result.status == 0:
            cases.check(["data", "show", str(out)], Place(cases.watched, reads=(out,), writes=(), baits=baits),
                        f"interrupted prepare: {mutant.what}; then data show", folder)
        cases.done(folder)

    case()
    finish(cases)


def same_as(out: Path, whole: Template) -> list[str]:
    """What differs between the prepared directory `out` and the uninterrupted one (nothing, normally)."""
    names = sorted(p.name for p in out.iterdir())
    if names != sorted(whole.files):
        return [f"wrong result: files {names}, an uninterrupted prepare writes {sorted(whole.files)}"]
    differ = [name for name in names if name != "manifest.json" and (out / name).read_bytes() != whole.files[name]]
    manifest, expected = json.loads((out / "manifest.json").read_text()), whole.json("manifest.json")
    differ += [f"manifest.json's {k}" for k in sorted(set(manifest) | set(expected))
               if k != "created" and manifest.get(k) != expected.get(k)]
    return [f"wrong result: {', '.join(differ)} differ from an uninterrupted prepare's"] if differ else []
