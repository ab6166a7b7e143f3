"""`xspec train`: train a spec with the paper's recipe, on a corpus or on the built-in demo task."""

from __future__ import annotations

import argparse
from pathlib import Path

import xspec
from xspec.commands.arguments import add_device_argument, add_set_argument, float_at_least, parse_overrides
from xspec.base.errors import UserError
from xspec.base.files import check_output_dir
from xspec.base.text import printable, shown

NAME = "train"
COMPUTES = True
HELP = "train a spec (with no data given: the built-in demo task)"
DESCRIPTION = """\
Trains a compiled spec with the paper's recipe (§5): shared sentencepiece BPE vocabulary, batches by
token count, Adam with the warmup/inverse-square-root schedule, label smoothing, checkpoints.

A translation model (encoder and decoder) reads aligned --train-src/--train-tgt files (and valid,
test), then decodes the test split with beam search and prints its sacreBLEU score (the last line).
A language model (a decoder alone) reads text files, one document a line (--train, --valid, --test),
packed into blocks or a line per example (the spec's data.examples), then prints the test split's
perplexity (the last line) and a few sampled continuations.

With no data (neither flags nor the spec's `data` section), trains on the built-in demo task, a
generated artificial language pair (a language model: its English-like side).

--data DIR trains on a corpus that `xspec data prepare` wrote, with its vocabulary: the model's `vocab`
is set to that vocabulary's number of pieces, as --set vocab=N would set it (one line says so; the run's
spec keeps it). An explicit --set vocab=N must hold every piece.

--init RUN starts from the weights of RUN's latest checkpoint (an `xspec import`, or any run) and keeps
its vocabulary (an import's own tokenizer): fine-tuning. Without a spec, the spec is RUN's own; with one,
its model parameters must be RUN's. The optimizer and the learning-rate schedule start anew, with the
fine-tuning recipe in place of the from-scratch one (`xspec keys` lists it): AdamW with weight decay
0.01, a learning rate of 5e-5 reached over the first 3% of the steps and decayed on a cosine, no label
smoothing, the gradient norm clipped at 1, one pass over the data (train.epochs). --set overrides any.
A multilingual checkpoint whose tokenizer frames each text with a language code (NLLB's) takes the
targets' with --tgt-lang CODE; an encoder alone trains as a masked language model on --train FILE, or,
with --set num_labels=N, as a classifier on --train FILE --train-labels FILE. A classifier of sentence
pairs (MNLI's, QQP's) also takes --train-pair FILE (and --valid-pair, --test-pair): the second text of each
pair, the line of the same number as its first in --train; a pair is framed as the tokenizer frames two
texts (BERT's [CLS] a [SEP] b [SEP], with token types 0, then 1).

--resume RUN continues RUN from its last checkpoint with the data and --truncate it was started
with (recorded in RUN/run.json); data files or --truncate given with it must be the same. Section
values may change (--set train.max_steps=...); the model's parameters may not. --resume auto, with
--output, continues --output if it has checkpoints and starts it otherwise: the one command a restarting
launcher (torchrun --max-restarts) can repeat.

Several processes: torchrun starts one per GPU (or CPU process); each update is split among them, and
with --set train.sharding=fsdp the parameters are sharded over them too. On several machines, every
machine needs the data files at the same paths; checkpoints are written by rank 0 (docs/runtime.md).

examples:
  xspec train specs/tiny.xspec
  xspec train specs/lm.xspec --train train.txt --valid valid.txt --test test.txt -o runs/lm
  xspec data prepare corpus/*.txt -o data/web && xspec train specs/lm.xspec --data data/web --valid valid.txt
  xspec train specs/base.xspec --train-src train.en --train-tgt train.de \\
      --valid-src valid.en --valid-tgt valid.de --test-src test.en --test-tgt test.de -o runs/base
  xspec train --resume runs/base
  xspec train --init runs/qwen3-import --train my.txt --valid my-valid.txt -o runs/qwen3-tuned
  torchrun --nproc_per_node=8 -m xspec train specs/big.xspec -o runs/big --resume auto ...
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", nargs="?", help="the .xspec file (optional with --resume: the run's own spec)")
    for split in ("train", "valid", "test"):
        parser.add_argument(f"--{split}-src", metavar="FILE", help=f"{split} source text, one sentence a line")
        parser.add_argument(f"--{split}-tgt", metavar="FILE", help=f"{split} target text, aligned with --{split}-src")
    for split in ("train", "valid", "test"):
        parser.add_argument(f"--{split}", metavar="FILE", dest=f"{split}_text",
                            help=f"language model: {split} text, one document a line" +
                                 ("" if split == "train" else "; either task: a prepared data directory"))
    for split in ("train", "valid", "test"):
        parser.add_argument(f"--{split}-labels", metavar="FILE",
                            help=f"classifier: the class of each line of --{split}, one a line")
    for split in ("train", "valid", "test"):
        parser.add_argument(f"--{split}-pair", metavar="FILE",
                            help=f"sentence-pair classifier: the second text of each pair, aligned with --{split} "
                                 "(its first)")
    parser.add_argument("--tgt-lang", metavar="CODE",
                        help="with --init: the targets' language, by a multilingual checkpoint's code (NLLB's "
                             "fra_Latn), which starts each training target and each translation")
    parser.add_argument("--src-lang", metavar="CODE",
                        help="with --init: the sources' language, by a multilingual checkpoint's code (NLLB's "
                             "deu_Latn), in place of the one its tokenizer frames a source with")
    parser.add_argument("--data", metavar="DIR[:W][,DIR:W...]",
                        help="training data prepared by xspec data prepare, read as needed (memory does not grow "
                             "with the corpus), whose vocabulary sizes the model; several directories mixed by "
                             "weight, e.g. web:0.7,books:0.3")
    parser.add_argument("--vocab", metavar="FILE",
                        help="a sentencepiece model to use instead of training one (ids 0-3: pad, unk, bos, eos)")
    parser.add_argument("-o", "--output", "--out", metavar="DIR", dest="output",
                        help="the run directory (default: runs/NAME-DATE-TIME)")
    parser.add_argument("--resume", metavar="RUN|auto",
                        help="continue RUN from its last checkpoint; 'auto' (with --output): continue --output if it "
                             "has checkpoints, else start it (for torchrun --max-restarts)")
    parser.add_argument("--init", metavar="RUN_OR_CHECKPOINT",
                        help="start from the weights and vocabulary of a run or checkpoint (e.g. an `xspec import`): "
                             "fine-tuning")
    add_set_argument(parser)
    add_device_argument(parser)
    parser.add_argument("--compile", choices=("auto", "on", "off"), default="auto",
                        help="torch.compile the training step (auto: on for CUDA, off on CPU)")
    # None when not given: a resumed run then truncates as it was started.
    parser.add_argument("--truncate", action="store_const", const=True, default=None,
                        help="truncate training sentences longer than data.max_tokens instead of skipping them")
    parser.add_argument("--dist-timeout", type=float_at_least(1), default=60, metavar="MINUTES",
                        help="with torchrun: how long a process waits for the others, e.g. while rank 0 "
                             "trains the vocabulary (default: 60)")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                        help="a progress bar when stderr is a terminal (otherwise, plain lines every "
                             "train.report_every_steps updates); default: on")
    parser.add_argument("--tensorboard", action=argparse.BooleanOptionalAction, default=True,
                        help="write TensorBoard event files into RUN/tensorboard (default: on)")
    parser.add_argument("--no-test", action="store_true", help="skip decoding the test split at the end")


def _data_files(args: argparse.Namespace, spec, spec_dir: Path | None):
    """Command-line paths first (relative to the working directory), then the spec's `data` section
    (relative to the spec file); every path absolute. Nothing at all means the demo task (or, with
    --resume, the run's own files)."""
    from xspec.runtime.run_dir import DataFiles

    names = ("train", "valid", "test")
    parallel = {name: (getattr(args, f"{name}_src"), getattr(args, f"{name}_tgt")) for name in names}
    texts = {name: getattr(args, f"{name}_text") for name in names}
    prepared = _prepared_splits(args, texts)
    if "train" in prepared and (texts["train"] or any(parallel["train"])):
        flag = "--train" if texts["train"] else "--train-src/--train-tgt"
        raise UserError(f"--data and {flag} both give the training data: give one")
    texts = {name: None if name in prepared else path for name, path in texts.items()}
    if spec.has_encoder and spec.has_decoder:
        given = [f"--{name}" for name, path in texts.items() if path is not None]
        if given:
            raise UserError(f"{given[0]} FILE gives a language model's text; {spec.name} translates: "
                            f"give --{given[0][2:]}-src and --{given[0][2:]}-tgt")
        files = DataFiles(*(_parallel_split(name, parallel[name], spec, spec_dir) for name in names))
    else:
        given = [f"--{name}-{side}" for name, pair in parallel.items() for side, p in zip(("src", "tgt"), pair) if p]
        if given:
            kind = "a masked language model" if spec.masked_lm else "a language model"
            raise UserError(f"{given[0]} gives a translation model's data; {spec.name} is {kind}: "
                            f"give --{given[0][2:].split('-')[0]} FILE, one document a line")
        files = DataFiles(*(_text_split(name, texts[name], spec, spec_dir) for name in names))
    files = _with_labels(args, spec, files)
    if prepared:
        files = DataFiles(**{name: prepared.get(name, split) for name, split in files.splits().items()})
    if files.train is None and (files.valid or files.test) and not args.resume:
        raise UserError("validation or test files were given without training files")
    return files


def _prepared_splits(args: argparse.Namespace, texts: dict[str, str | None]) -> dict:
    """--data (training), and --valid / --test naming a directory: prepared splits."""
    from xspec.runtime.prepared.examples import parse_data_argument
    from xspec.runtime.run_dir import PreparedSplit

    splits = {}
    if args.data is not None:
        parts = parse_data_argument(args.data)
        splits["train"] = PreparedSplit(tuple(_absolute(Path.cwd(), str(d), "--data") for d, _ in parts),
                                        tuple(w for _, w in parts))
    for name in ("valid", "test"):
        path = texts[name]
        if path is not None and Path(path).is_dir():
            splits[name] = PreparedSplit((_absolute(Path.cwd(), path, f"--{name}"),), (1.0,))
    return splits


def _with_labels(args: argparse.Namespace, spec, files):
    """A classifier's splits: each text file with its --SPLIT-labels file (and, for sentence pairs, its
    --SPLIT-pair file, given for every split or none); the flags refused for other models."""
    from xspec.runtime.run_dir import DataFiles, Split

    names = ("train", "valid", "test")
    labels = {name: getattr(args, f"{name}_labels") for name in names}
    pairs = {name: getattr(args, f"{name}_pair") for name in names}
    if spec.classes is None:
        flag = next((f"--{name}-{kind}" for name in names for kind, paths in (("labels", labels), ("pair", pairs))
                     if paths[name] is not None), None)
        if flag is not None:
            what = "a classifier's classes" if flag.endswith("labels") else "a sentence-pair classifier's texts"
            raise UserError(f"{flag} gives {what}; {spec.name} is no classifier (an encoder alone whose head scores "
                            "num_labels classes: --set num_labels=N)")
        return files
    paired, given = {}, [name for name in names if pairs[name] is not None]
    for name, split in files.splits().items():
        path = labels[name]
        if (split is None) != (path is None):
            flag = f"--{name}-labels" if path is None else f"--{name}"
            raise UserError(f"a classifier's {name} split is a text file and its labels: give {flag} too")
        if split is None and pairs[name] is not None:
            raise UserError(f"--{name}-pair gives the second texts of --{name}'s pairs: give --{name} too")
        if split is not None and pairs[name] is None and given:
            raise UserError(f"--{given[0]}-pair makes a sentence-pair classifier, each of whose splits is pairs: "
                            f"give --{name}-pair too")
        second = _absolute(Path.cwd(), pairs[name], f"--{name}-pair") if pairs[name] is not None else None
        paired[name] = None if split is None else Split(split.src, _absolute(Path.cwd(), path, f"--{name}-labels"),
                                                        second)
    return DataFiles(**paired)


# What to do with a file of a format train does not read (runtime/prepared/sources.py plain_text).
PREPARE_HINT = "`xspec data prepare FILE -o DIR` reads it (--field: the text's), then `xspec train --data DIR`"


def _text_split(name: str, path: str | None, spec, spec_dir: Path | None):
    from xspec.runtime.prepared.sources import plain_text
    from xspec.runtime.run_dir import Split

    if path is not None:
        return Split(plain_text(_absolute(Path.cwd(), path, f"--{name}"), f"--{name}", PREPARE_HINT))
    in_spec = getattr(spec.data, f"{name}_text")
    if in_spec is None or spec_dir is None:
        return None
    return Split(plain_text(_absolute(spec_dir, in_spec, f"the spec's data.{name}_text"), f"data.{name}_text",
                            PREPARE_HINT))


def _parallel_split(name: str, given: tuple[str | None, str | None], spec, spec_dir: Path | None):
    from xspec.runtime.prepared.sources import plain_text
    from xspec.runtime.run_dir import Split

    (src, tgt), base, where = given, Path.cwd(), f"--{name}-src/--{name}-tgt"
    if (src is None) != (tgt is None):
        raise UserError(f"--{name}-src and --{name}-tgt go together (only one was given)")
    if src is None and spec_dir is not None:
        src, tgt = getattr(spec.data, f"{name}_src"), getattr(spec.data, f"{name}_tgt")
        base, where = spec_dir, f"the spec's data.{name}_src/{name}_tgt"
        if (src is None) != (tgt is None):
            raise UserError(f"the spec's data section sets only one of {name}_src and {name}_tgt")
    if src is None or tgt is None:          # neither (one alone is refused above)
        return None
    return Split(plain_text(_absolute(base, src, where), where, PREPARE_HINT),
                 plain_text(_absolute(base, tgt, where), where, PREPARE_HINT))



def _vocab_file(args: argparse.Namespace, spec, spec_dir: Path | None) -> Path | None:
    """--vocab (relative to the working directory), else the spec's data.vocab_file (relative to the spec)."""
    if args.vocab is not None:
        return _absolute(Path.cwd(), args.vocab, "--vocab")
    if spec.data.vocab_file is not None and spec_dir is not None:
        return _absolute(spec_dir, spec.data.vocab_file, "the spec's data.vocab_file")
    return None


def _absolute(base: Path, path: str, where: str) -> Path:
    if "\0" in path:
        raise UserError(f"{where} {path!r}: a path cannot contain a NUL byte")
    return (base / path).resolve()


def _resumed_run(args: argparse.Namespace) -> str | None:
    """The run to continue: --resume RUN, or with --resume auto, --output when it holds checkpoints."""
    if args.resume != "auto":
        return args.resume
    from xspec.runtime.checkpoint import list_checkpoints

    if not args.output:
        raise UserError("--resume auto needs --output DIR: the run to continue if it has checkpoints, else to start")
    if not args.spec:
        raise UserError("--resume auto needs the spec, to start the run when --output has no checkpoints yet")
    return args.output if list_checkpoints(Path(args.output)) else None


def run(args: argparse.Namespace) -> int:
    from xspec.runtime.run_dir import SPEC_FILE, default_run_dir, read_run_spec
    from xspec.runtime.train import RunOptions, train

    from xspec.compiler.sections import FINE_TUNING

    given = parse_overrides(args.overrides)
    args.resume = _resumed_run(args)
    fine_tuning = bool(args.init) and not args.resume
    overrides = {**{k: v for k, v in FINE_TUNING.items() if k not in given}, **given} if fine_tuning else given
    if args.resume:
        run_dir = Path(args.resume)
        if not (run_dir / SPEC_FILE).is_file():
            raise UserError(f"--resume {run_dir}: no {SPEC_FILE} there; not an xspec run directory")
        if args.output and Path(args.output).resolve() != run_dir.resolve():
            raise UserError("--resume continues in the run's own directory; drop --output")
    if args.spec:
        spec = xspec.compile(args.spec, overrides=overrides)
        spec_dir = Path(args.spec).resolve().parent
    elif args.init and not args.resume:
        spec = _init_spec(Path(args.init), overrides, args.tgt_lang, args.src_lang)
        spec_dir = None
    elif args.resume:
        # The run's own spec is checked like any spec file, and must be self-contained.
        spec = xspec.compile_source(read_run_spec(run_dir), name=str(run_dir / SPEC_FILE), overrides=overrides,
                                    allow_imports=False)
        spec_dir = None
    else:
        raise UserError("which spec? e.g. xspec train specs/tiny.xspec (or --resume RUN, or --init RUN)")
    if args.init and args.resume:
        raise UserError("--init starts a new run from another's weights; --resume continues a run: give one")
    for flag, code in (("--tgt-lang", args.tgt_lang), ("--src-lang", args.src_lang)):
        if code is not None and (args.spec or not args.init):
            raise UserError(f"{flag} names a language to a multilingual checkpoint's tokenizer: give it with "
                            "--init RUN alone (a resumed run keeps its own: decode.forced_bos, decode.source_code)")
    if fine_tuning:
        spec = _fine_tuning(spec, given)
    data = _data_files(args, spec, spec_dir)
    out = Path(args.resume) if args.resume else Path(args.output) if args.output else default_run_dir(spec.name)
    check_output_dir(out, "--resume" if args.resume else "--output")
    options = RunOptions(out_dir=out, data=data, device=args.device, compile=args.compile,
                         resume=bool(args.resume), truncate=args.truncate, progress=args.progress,
                         tensorboard=args.tensorboard,
                         evaluate=not args.no_test, dist_timeout_minutes=args.dist_timeout,
                         vocab_file=_vocab_file(args, spec, spec_dir),
                         init=Path(args.init) if args.init else None,
                         threads=getattr(args, "thread_choice", None))
    train(spec, options)
    return 0


def _fine_tuning(spec, given: dict):
    """The spec under --init's recipe (compiler/sections.py's FINE_TUNING, with LoRA's learning rate where
    train.lora_rank is set) and the --set values `given`; the recipe said in one line."""
    from xspec.compiler.sections import FINE_TUNING, LORA_LR

    if spec.train.lora_rank and "train.lr" not in given:
        spec = spec.with_overrides({"train.lr": LORA_LR})
    chosen = [key for key in FINE_TUNING if key not in given]
    if chosen:
        values = spec.train.model_dump()
        listed = ", ".join(f"{key.removeprefix('train.')} {_shown(values[key.removeprefix('train.')])}"
                           for key in chosen)
        print(f"fine-tuning recipe (--init): {listed}; --set train.KEY=VALUE changes any")
    return spec


def _shown(value: object) -> str:
    return ", ".join(map(str, value)) if isinstance(value, tuple) else str(value)


def _init_spec(init: Path, overrides: dict, target_language: str | None = None,
               source_language: str | None = None):
    """The spec of the run or checkpoint training starts from (compiled like any spec file, imports refused);
    with `target_language` (--tgt-lang), its tokenizer's code for it as decode.forced_bos, which frames the
    training targets and starts translations; with `source_language` (--src-lang), decode.source_code, which
    frames the sources."""
    from xspec.runtime import checkpoint as ckpt
    from xspec.runtime.inference import checkpoint_vocab

    saved = ckpt.load_weights(ckpt.resolve(init))
    name = f"{saved.path}:spec.xspec"
    if target_language is not None or source_language is not None:
        spec = xspec.compile_source(saved.spec_source, name=name, overrides=overrides, allow_imports=False)
        vocab = checkpoint_vocab(saved, spec)
        if target_language is not None:
            language = vocab.target_language(target_language)
            if language.forced_bos is None:
                raise UserError(f"--tgt-lang {printable(target_language)}: {shown(init)}'s tokenizer asks for a "
                                "target language in the source (Marian's >>xx<<): write it before each source line "
                                "instead")
            overrides = {**overrides, "decode.forced_bos": language.forced_bos}
        if source_language is not None:
            overrides = {**overrides, "decode.source_code": vocab.language_code(source_language)}
    return xspec.compile_source(saved.spec_source, name=name, overrides=overrides, allow_imports=False)
