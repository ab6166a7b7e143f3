"""Running a sweep: the variant specs as rows, the corpus, each run trained (or resumed, or read back when
finished) through the runtime, the unigram floors, and the report rewritten after every run."""

from __future__ import annotations

import hashlib
import json
import re
import time
from pathlib import Path
from typing import Any

import xspec
from xspec.base.errors import UserError
from xspec.base.files import read_regular_file, write_atomically, write_bytes_atomically
from xspec.runtime.unigram import token_counts, unigram_perplexity
from xspec.stats.architecture import architecture
from xspec.sweep.paper import COLUMNS
from xspec.sweep.report import fmt_number, write_report
from xspec.sweep.rows import MIN_BLEU, WIDTHS, Corpus, Row, Run, SweepConfig, learning_threshold, seed_runs

CONFIG_FILE = "sweep.json"
UNIGRAM_FILE = "unigram.json"           # OUT/unigram.json: each vocabulary's unigram perplexity, computed once


class UnigramFloors:
    """Each vocabulary's unigram perplexity of the dev targets, computed once and kept in OUT/unigram.json
    (encoding a large training corpus takes minutes; every sitting of a sweep would repeat it)."""

    def __init__(self, corpus: Corpus, out_dir: Path) -> None:
        self.corpus, self.path = corpus, out_dir / UNIGRAM_FILE
        self.known: dict[str, float] = _read_json(self.path, "unigram perplexities") if self.path.exists() else {}

    def of(self, run_dir: Path) -> float | None:
        """The floor in `run_dir`'s own subwords; None when the run has no vocabulary yet."""
        from xspec.runtime.vocab import MODEL_FILE, Vocab

        model = run_dir / MODEL_FILE
        if not model.exists():
            return None
        proto = read_regular_file(model)
        key = hashlib.sha256(proto).hexdigest()
        if key not in self.known:
            self.known[key] = self._compute(Vocab.from_bytes(proto, str(model)))
            write_atomically(self.path, json.dumps(self.known, indent=2) + "\n")
        return float(self.known[key])

    def _compute(self, vocab) -> float:
        from xspec.runtime.corpus import read_lines
        from xspec.runtime.vocab import EOS

        def encoded(path: Path) -> list[list[int]]:
            return [ids + [EOS] for ids in vocab.encode([line for line in read_lines(path) if line.strip()])]

        return unigram_perplexity(token_counts(encoded(self.corpus.train_tgt)), encoded(self.corpus.dev_tgt),
                                  len(vocab))


# --- variants ------------------------------------------------------------------------------------

def find_variants(directory: Path, base: Path) -> tuple[Path, ...]:
    """The base spec, then the folder's specs in natural order (C_dmodel256 before C_dmodel1024)."""
    if not directory.is_dir():
        raise UserError(f"{directory}: not a folder of .xspec files")
    files = sorted(directory.glob("*.xspec"), key=_natural_key)
    if not files:
        raise UserError(f"{directory}: no .xspec files")
    if not base.is_file():
        raise UserError(f"{base}: the base spec does not exist (give one with --base)")
    return (base, *(f for f in files if f.resolve() != base.resolve()))


def _natural_key(path: Path) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.stem)]


def row_label(name: str, is_base: bool) -> str:
    """Files are named after their rows: `A_heads1` is row A; `big` has no letter."""
    if is_base:
        return "base"
    prefix, sep, _ = name.partition("_")
    return prefix if sep and len(prefix) == 1 and prefix.isupper() else name


def shrink(spec_path: Path, overrides: dict[str, Any], divisor: int) -> dict[str, Any]:
    """The overrides that train `spec_path` at 1/divisor of its widths, after the sweep's own overrides."""
    if divisor == 1:
        return dict(overrides)
    params = xspec.compile(str(spec_path), overrides=overrides).params
    shrunk = dict(overrides)
    for name in WIDTHS:
        if name not in params:
            raise UserError(f"{spec_path}: --width-divisor needs a parameter named {name}")
        value = params[name]
        if value % divisor:
            raise UserError(f"{spec_path}: {name} = {value} is not divisible by --width-divisor {divisor}")
        shrunk[name] = value // divisor
    return shrunk


def describe(path: Path, config: SweepConfig, is_base: bool) -> tuple[Row, xspec.CompiledSpec]:
    """The row's columns at the spec's own size, its runs (one per seed), and the spec as the sweep trains it."""
    full = xspec.compile(str(path))
    trained = xspec.compile(str(path), overrides=shrink(path, {**config.overrides, "train.max_steps": config.steps},
                                                        config.width_divisor))
    row = Row(name=path.stem, row=row_label(path.stem, is_base),
              columns={c: getattr(architecture(full), c) for c in COLUMNS},
              trained_columns={c: getattr(architecture(trained), c) for c in COLUMNS},
              spec_parameters=full.parameters, trained_parameters=trained.parameters,
              runs=seed_runs(path.stem, trained.train.seed, config.seeds_of(is_base)))
    return row, trained


# --- data ----------------------------------------------------------------------------------------

def prepare_corpus(config: SweepConfig) -> Corpus:
    """The demo task (generated once into OUT/data) or a folder with train.SRC/TGT and val.SRC/TGT."""
    if config.data == "demo":
        from xspec.runtime.demo_data import write_demo_data

        folder = config.out_dir / "data"
        if not (folder / "valid.tgt").exists():
            write_demo_data(folder)
        train_src, train_tgt = folder / "train.src", folder / "train.tgt"
        dev_src, dev_tgt = folder / "valid.src", folder / "valid.tgt"
        description = "the built-in demo task (xspec.runtime.demo_data)"
    else:
        folder = Path(config.data)
        train_src = _corpus_file(folder, "train", config.src_lang)
        train_tgt = _corpus_file(folder, "train", config.tgt_lang)
        dev_src, dev_tgt = _dev_file(folder, config.src_lang), _dev_file(folder, config.tgt_lang)
        description = f"{folder} ({config.src_lang}->{config.tgt_lang})"
    if config.dev_lines is not None:
        dev_src, dev_tgt = (_head(f, config.dev_lines, config.out_dir / "dev") for f in (dev_src, dev_tgt))
        description += f", dev = the first {config.dev_lines} lines of {dev_src.name}"
    return Corpus(train_src, train_tgt, dev_src, dev_tgt, description)


def _corpus_file(folder: Path, split: str, lang: str) -> Path:
    path = folder / f"{split}.{lang}"
    if not path.is_file():
        raise UserError(f"{path}: missing; --data FOLDER needs train.SRC, train.TGT, val.SRC and val.TGT "
                        "(languages from --src-lang/--tgt-lang)")
    return path


def _dev_file(folder: Path, lang: str) -> Path:
    for split in ("val", "valid", "dev"):
        if (folder / f"{split}.{lang}").is_file():
            return folder / f"{split}.{lang}"
    return _corpus_file(folder, "val", lang)


def _head(path: Path, lines: int, folder: Path) -> Path:
    """The first `lines` lines of a dev file, written into the sweep directory (not the corpus)."""
    from xspec.runtime.corpus import read_lines

    return write_atomically(folder / path.name, "".join(line + "\n" for line in read_lines(path)[:lines]))


# --- training ------------------------------------------------------------------------------------

def train_variant(spec, corpus: Corpus, vocab_file: Path | None, run_dir: Path,
                  config: SweepConfig) -> dict[str, Any]:
    """Trains one run to the budget (or resumes it); returns the runtime's final figures.

    `vocab_file`: a sentencepiece model to reuse (the runtime keeps a run directory's vocabulary),
    so that every run reads the same subwords; None lets the runtime train one.
    """
    from xspec.runtime import checkpoint
    from xspec.runtime.run_dir import METRICS_FILE, DataFiles, Split
    from xspec.runtime.train import RunOptions, train
    from xspec.runtime.vocab import MODEL_FILE

    finished = run_dir / METRICS_FILE
    if finished.exists():
        return _read_json(finished, "the final figures of a run")
    if vocab_file is not None and not (run_dir / MODEL_FILE).exists():
        # The runtime reuses a run's vocabulary.
        write_bytes_atomically(run_dir / MODEL_FILE, read_regular_file(vocab_file))
    dev = Split(corpus.dev_src, corpus.dev_tgt)
    data = DataFiles(train=Split(corpus.train_src, corpus.train_tgt), valid=dev, test=dev)
    options = RunOptions(out_dir=run_dir, data=data, device=config.device, compile="off",
                         resume=bool(checkpoint.list_checkpoints(run_dir)), progress=config.progress)
    return train(spec, options)


def run_sweep(config: SweepConfig, say=print) -> list[Row]:
    """Trains every row's runs in order, base's seeds first (its noise band is known early); finished runs
    are read, not retrained. After a base run that did not learn, the variants are not trained."""
    recorded = _settings_checked(config)
    if config.threads is not None:
        import torch

        torch.set_num_threads(config.threads)
    corpus = prepare_corpus(config)
    floors = UnigramFloors(corpus, config.out_dir)
    described = [describe(path, config, is_base=i == 0) for i, path in enumerate(config.variants)]
    if not recorded:    # the data read and every spec compiled: a mistyped --data leaves nothing behind
        write_atomically(config.out_dir / CONFIG_FILE, json.dumps(config.fingerprint(), indent=2) + "\n")
    rows = [row for row, _ in described]
    runs = [(run, spec) for row, spec in described for run in row.runs]
    say(f"sweep: {len(rows)} models, {len(runs)} runs, {config.steps} steps each, on {corpus.description}")
    base_spec, base_dir = described[0][1], config.out_dir / "runs" / rows[0].name
    skipped = 0
    for index, (run, spec) in enumerate(runs, start=1):
        run_dir = config.out_dir / "runs" / run.name
        if not (run_dir / "metrics.json").exists() and _hopeless(rows[0], config):
            skipped += 1
            continue
        vocab = _shared_vocabulary(spec, base_spec, base_dir, run_dir)
        tag = f"[{index}/{len(runs)}] {run.name}"
        seconds = _train_run(run, spec, run_dir, vocab, tag, corpus, config, say)
        if run.finished:
            run.unigram_ppl = floors.of(run_dir)
            say(f"{tag}: {_run_line(run)} ({seconds:.0f} s)")
        write_report(rows, config, corpus)
    if skipped:
        say(f"{rows[0].name} did not learn: {skipped} runs not trained, since nothing could be compared with it "
            "(--keep-going trains them anyway)")
    return rows


def _train_run(run: Run, spec, run_dir: Path, vocab: Path | None, tag: str, corpus: Corpus, config: SweepConfig,
               say) -> float:
    """Fills `run.metrics` (trained, resumed or read back), or `run.error` when the runtime refuses or fails;
    returns the seconds it took."""
    from xspec.runtime.train import Interrupted

    if (run_dir / "metrics.json").exists():
        say(f"{tag}: finished earlier, not retrained")
    else:
        say(f"{tag}: training {config.steps} steps, seed {run.seed} ({spec.parameters:,} parameters)")
    seeded = spec if run.seed == spec.train.seed else spec.with_overrides({"train.seed": run.seed})
    started = time.time()
    try:
        run.metrics = train_variant(seeded, corpus, vocab, run_dir, config)
    except Interrupted as interrupted:
        # Ctrl-C: the run wrote a checkpoint; the sweep stops here, and goes on from it when run again.
        interrupted.args = (f"{tag}: " + interrupted.continued_by(f"the same command ({config.command})"),)
        raise
    except UserError as error:
        # One run that diverges (or lacks memory) must not cost the others theirs; the report shows it,
        # and re-running the sweep tries it again.
        run.error = str(error)
        say(f"{tag}: failed: {error}")
    return time.time() - started


def _hopeless(base: Row, config: SweepConfig) -> bool:
    """A finished base run that did not learn makes the base row unlearned whatever its other seeds do:
    the rest of the sweep (hours, at a real scale) could not be judged."""
    return not config.keep_going and any(run.finished and not run.learned for run in base.runs)


def _run_line(run: Run) -> str:
    line = f"dev ppl {fmt_number(run.ppl)}, dev BLEU {run.bleu:.2f}"
    if run.unigram_ppl is None:
        return line
    verdict = "learned" if run.learned else "DID NOT LEARN"
    return (f"{line}; {verdict} (needs ppl <= {learning_threshold(run.unigram_ppl):.2f}, "
            f"the square root of the unigram ppl {run.unigram_ppl:.1f}, and BLEU >= {MIN_BLEU:g})")


def _shared_vocabulary(spec, base_spec, base_dir: Path, run_dir: Path) -> Path | None:
    """§5.1: one shared vocabulary. The base model's first run trains it; every other run of the same
    vocabulary size reuses it, so their perplexities count the same subwords."""
    from xspec.runtime.vocab import MODEL_FILE

    same = (spec.data.vocab_size, spec.data.vocab_model) == (base_spec.data.vocab_size, base_spec.data.vocab_model)
    shared = base_dir / MODEL_FILE
    return shared if same and run_dir != base_dir and shared.exists() else None


def _settings_checked(config: SweepConfig) -> bool:
    """Whether the sweep directory records this sweep's settings (False: none yet, recorded once the sweep's
    data and specs are read). A sweep directory continues only the sweep that made it: mixed budgets would
    make the table lie."""
    path = config.out_dir / CONFIG_FILE
    if not path.exists():
        return False
    wanted = config.fingerprint()
    recorded = _read_json(path, "a sweep's settings")
    if recorded != json.loads(json.dumps(wanted)):
        differing = sorted(k for k in wanted if recorded.get(k) != json.loads(json.dumps(wanted[k])))
        raise UserError(f"{config.out_dir} holds a sweep with different settings ({', '.join(differing)}); "
                        "use another --output, or the same settings to continue it")
    return True


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        value = json.loads(read_regular_file(path).decode("utf-8"))
    except (ValueError, RecursionError):
        value = None
    if not isinstance(value, dict):
        raise UserError(f"{path}: not {what} as xspec writes them (not a JSON object)")
    return value
