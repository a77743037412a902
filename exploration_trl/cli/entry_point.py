"""`exploration-trl` command line.

The entry point: `train` is handled here (its own parser, see `train_args`); every other subcommand registers itself
from the module named in `SUBCOMMAND_MODULES`. A user's mistake ends as one `error: ...` line and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from ..errors import HookDidNotRunError
from ..io_safety import check_output_dir, os_error_line
from .common import CLIError
from .train import Stage, train_main
from .train_help_text import print_help_all, train_help

SUBCOMMAND_MODULES = (
    "exploration_trl.eval.command",
    "exploration_trl.experiments.research.tree_command",
    "exploration_trl.experiments.research.countdown_tiny_command",
    "exploration_trl.experiments.demo",
    "exploration_trl.experiments.confirmatory",
    "exploration_trl.hub.command",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="exploration-trl")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="Train with a TRL-style YAML (--config) and --key value overrides "
                           "(`exploration-trl train --help`).", add_help=False)
    train.set_defaults(func=None)
    for module in SUBCOMMAND_MODULES:
        try:
            importlib.import_module(module).register(sub)
        except ImportError:
            continue
    # Subcommands that run `train` per job (`confirm`'s `task: train`) get how to call it from here: experiments/ sit
    # below the CLI and never import it.
    for command in sub.choices.values():
        command.set_defaults(train_argv=[sys.executable, "-m", __package__, "train"])
    # Listed from the registered subcommands, so a new one cannot be left out.
    parser.description = f"exploration-trl command line: {', '.join(sub.choices)}."
    return parser


def _train(argv: list[str]) -> int:
    if "--help-all" in argv:
        print_help_all(argv)
        return 0
    if "--help" in argv or "-h" in argv:
        print(train_help())
        return 0
    return train_main(argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "train":
            return _train(argv[1:])
        args = build_parser().parse_args(argv)
        if isinstance(getattr(args, "output", None), str):  # demo, tree, countdown-tiny, curves: before any model
            check_output_dir(args.output, key="--output-dir")
        if getattr(args, "method", None):  # e.g. `push --method`: the methods' records register with the trainers
            from .. import trainers  # noqa: F401
        return int(args.func(args) or 0)
    except (CLIError, ValueError, FileNotFoundError) as e:
        # Raised mid-training, start a fresh line: a progress bar may hold the current one.
        lead = "\n" if Stage.training else ""
        print(f"{lead}error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # `train` printed where it saved; `eval` keeps every finished problem's samples
        if not (argv and argv[0] == "train"):
            print("\ninterrupted: what finished is kept; run the same command again to resume", file=sys.stderr)
        return 130
    except OSError as e:  # a write that failed (disk full, read-only, permission): one line naming the path
        line = os_error_line(e)
        if line is None:
            raise
        print(f"\nerror: {line}", file=sys.stderr)
        return 2
    except HookDidNotRunError as e:  # not a user mistake: one line naming the method, and a non-zero exit
        print(f"\nerror: {e}", file=sys.stderr)
        return 1
    finally:
        Stage.training = False
