"""The ``turboinfer`` command line: argument parsing and error reporting only."""

from __future__ import annotations

import argparse
import enum
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from turboinfer import __version__
from turboinfer.commands import discover
from turboinfer.errors import TurboinferError


class DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default, written as the user would type it.

    Options without a default to show (``None``, a flag, an empty list) keep their help
    as written: there the help text says what happens instead.
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "%(default)" in text or not _shows_default(action):
            return text
        # The help is expanded with ``%`` formatting: a ``%`` in the default must not count.
        default = format_default(action.default).replace("%", "%%")
        return f"{text} (default: {default})"


def _shows_default(action: argparse.Action) -> bool:
    default = action.default
    # A flag (no value) is off unless given; its help says what it turns on.
    if action.nargs == 0 or default is None or default is argparse.SUPPRESS:
        return False
    if isinstance(default, list | tuple) and not default:
        return False
    return bool(action.option_strings) or action.nargs in (argparse.OPTIONAL,
                                                           argparse.ZERO_OR_MORE)


def format_default(default: Any) -> str:
    """``(1, 4, 16)`` as ``1,4,16`` (how comma-list options are typed), enums by value."""
    if isinstance(default, list | tuple):
        return ",".join(format_default(item) for item in default)
    if isinstance(default, enum.Enum):
        return str(default.value)
    return str(default)


class Parser(argparse.ArgumentParser):
    """An argument parser whose help shows defaults; nested subcommands inherit it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="turboinfer",
        description="Measure, optimize, serve and load-test model inference.",
    )
    parser.add_argument("-V", "--version", action="version", version=f"turboinfer {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in discover():
        cmd = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.add_arguments(cmd)
        cmd.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args._run(args))
    except TurboinferError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (e.g. `| head`); silence the flush at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
