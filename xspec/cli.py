"""`xspec` command line: a thin layer over the public API. Each subcommand lives in xspec/commands/."""

from __future__ import annotations

import argparse
import sys
import traceback
from types import ModuleType

from xspec.commands import (average, classify, data, export, fill, generate, keys, plot, show, train, translate,
                            treebank, viz)
from xspec.commands import compile as compile_command
from xspec.commands import eval as eval_command
from xspec.commands import stats as stats_command
from xspec.commands import import_hf, sweep
from xspec.base.errors import SpecError, UserError, input_of
from xspec.base.text import printable, printable_lines
from xspec.commands.arguments import add_debug_argument, add_process_arguments
from xspec.base.process import apply_threads, reexec_with_tcmalloc

# Each module defines NAME, HELP, DESCRIPTION, add_arguments(parser) and run(args) -> exit status, and
# COMPUTES = True when it runs models (it then takes --threads and --tcmalloc, xspec/base/process.py).
# Importing them must stay cheap (torch and the like are imported inside run()): `xspec --help` and
# argument errors should answer at once.
COMMANDS: tuple[ModuleType, ...] = (compile_command, train, translate, generate, fill, classify, eval_command, average,
                                    viz, stats_command, sweep, plot, show, keys, export, import_hf, treebank, data)

# A bug in xspec, not a mistake of the user's (sysexits.h's EX_SOFTWARE).
INTERNAL_ERROR = 70


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="xspec",
        description="Compile declarative Transformer specs (.xspec) to PyTorch, then train, "
        "decode and evaluate them.",
    )
    parser.add_argument("--debug", action="store_true", help="show a Python traceback on errors")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        sub = subparsers.add_parser(
            command.NAME,
            help=command.HELP,
            description=command.DESCRIPTION,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        add_debug_argument(sub)
        command.add_arguments(sub)
        if getattr(command, "COMPUTES", False):
            add_process_arguments(sub)
        sub.set_defaults(run=command.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """The `xspec` program (argv None: sys.argv), or a command run from Python (`main(["train", ...])`)."""
    args = build_parser().parse_args(argv)
    if argv is None:
        reexec_with_tcmalloc(args)       # returns when it does not apply
    code = _run(args, sys.argv[1:] if argv is None else argv)
    if argv is None:
        _end_rank_process(code)
    return code


def _run(args: argparse.Namespace, argv: list[str]) -> int:
    try:
        apply_threads(args)
        return args.run(args)
    except UserError as error:
        if args.debug:
            traceback.print_exc()
        # Messages quote input: nothing in them a terminal obeys, and a line break from input starts no line
        # (a spec's diagnostics are the one message of several lines, each line escaped).
        if isinstance(error, SpecError):
            print(printable_lines(str(error)), file=sys.stderr)
        else:
            print(f"xspec: error: {printable(str(error))}", file=sys.stderr)
        return error.exit_code
    except BrokenPipeError:  # e.g. `xspec compile ... --json | head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("xspec: interrupted", file=sys.stderr)
        return 130
    except (SystemExit, GeneratorExit):
        raise
    except BaseException as error:  # a bug: one line by default, not a page of traceback
        # BaseException: a native library's panic (pyo3's PanicException) is not an Exception.
        if args.debug:
            traceback.print_exc()
        else:
            print(internal_error_message(error, args.command, argv), file=sys.stderr)
        return INTERNAL_ERROR


def _end_rank_process(code: int) -> None:
    """A program that ran as one rank of a torchrun group ends without the interpreter's finalization
    (runtime/distributed.py, end_rank_process); returns otherwise. Only a module that was imported can
    have made this process a rank, so commands that never import torch stay light."""
    distributed = sys.modules.get("xspec.runtime.distributed")
    if distributed is not None:
        distributed.end_rank_process(code)


MAX_SHOWN = 200     # characters of an exception's text, or of the command line, an internal error quotes


def internal_error_message(error: BaseException, command: str, argv: list[str]) -> str:
    """One line for a failure that is xspec's fault: the exception, the command and what it was processing
    (the input `processing` marked, else the command line's arguments)."""
    detail = _clipped(printable(" ".join(str(error).split())))
    what = f"{type(error).__name__}: {detail}" if detail else type(error).__name__
    where = input_of(error) or " ".join(argv[argv.index(command) + 1:] if command in argv else argv)
    return (f"xspec {command}: internal error while processing {_clipped(printable(where))}: {what} "
            "(run with --debug for the traceback; please report it)")


def _clipped(text: str) -> str:
    return text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN - 3] + "..."


if __name__ == "__main__":
    sys.exit(main())
