"""The `llmengine` command line: one argparse subcommand per verb.

Each verb's module (`generate`, `bench`, `serve`) has a function that adds its parser to the
subparsers and sets `handler` (a callable taking the parsed arguments and returning an exit
code); adding a verb is one such function appended to `SUBCOMMANDS`. The engine's flags are
generated from `EngineConfig` (`options.add_engine_arguments`). Errors a user can cause (bad
numbers, a folder that is not a checkpoint) surface as `ValueError` or `OSError` and are
printed as one line with exit status 2, never as a traceback. What only some verbs need (the
engine, the bench layer, the server) is imported inside their handlers, so that `--help` and
errors stay quick.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from llmengine.cli.bench import add_bench
from llmengine.cli.generate import add_generate
from llmengine.cli.serve import add_serve

EXIT_USAGE = 2
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a filter cut off

SUBCOMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [
    add_generate,
    add_bench,
    add_serve,
]


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every subcommand in `SUBCOMMANDS`."""
    parser = argparse.ArgumentParser(
        prog="llmengine", description="An LLM inference engine built from scratch."
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add_subcommand in SUBCOMMANDS:
        add_subcommand(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` (default: the process arguments), run the subcommand, return its status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except BrokenPipeError:
        # The reader of stdout went away (`| head`): stop quietly, as a Unix filter does.
        return EXIT_BROKEN_PIPE
    except (ValueError, OSError) as error:
        print(f"llmengine {args.command}: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
