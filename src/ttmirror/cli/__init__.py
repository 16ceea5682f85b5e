"""The `ttmirror` command line: `main` parses and runs one subcommand (`core.py`); each other
module here adds the subcommands of one concern (`arguments.py` holds what they share)."""

from ttmirror.cli.core import build_parser, main, run

__all__ = ["build_parser", "main", "run"]
