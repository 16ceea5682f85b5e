"""MkDocs hooks: the pages generated when the site is built, so none is a copy to keep in step.

- `spec.md`: the design spec, `src/ttmirror/specs/mirrored-sampled-ids.md`, as the package ships it;
- `reference/cli.md`: every subcommand's usage, help and options, read from the parser itself;
- `serving-step.svg`: `serving-step.dot` (the architecture page's drawing), drawn by Graphviz.
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

DOCS = Path(__file__).resolve().parent


def on_files(files: Files, config: Any) -> Files:
    from ttmirror.cli import build_parser
    from ttmirror.resources import SPEC

    files.append(File.generated(config, "spec.md", content=SPEC.read_text()))
    files.append(File.generated(config, "reference/cli.md", content=cli_reference(build_parser())))
    drawing = subprocess.run(["dot", "-Tsvg", str(DOCS / "serving-step.dot")],
                             capture_output=True, check=True).stdout
    files.append(File.generated(config, "serving-step.svg", content=drawing))
    return files


def _subcommands(parser: argparse.ArgumentParser
                 ) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, help, parser) of each subcommand: argparse keeps them in its subparsers action."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            return [(name, helps.get(name, ""), sub) for name, sub in action.choices.items()]
    return []


def cli_reference(parser: argparse.ArgumentParser) -> str:
    """The command line, one section per subcommand: its help, usage, and a table of options."""
    parser.prog = "ttmirror"
    out = ["# CLI reference", "",
           "Generated from the parser when the site is built (`ttmirror SUBCOMMAND --help` prints "
           "the same). What each command checks and prints: "
           "[the command line guide](../guide/commands.md).", ""]
    for name, summary, sub in sorted(_subcommands(parser), key=lambda entry: entry[0]):
        sub.prog = f"ttmirror {name}"
        out += [f"## `{name}`", "", summary.strip() or (sub.description or ""), "",
                "```", sub.format_usage().strip(), "```", ""]
        rows = []
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            flags = ", ".join(f"`{f}`" for f in action.option_strings) or f"`{action.dest}`"
            text = (action.help or "").replace("%(default)s", str(action.default))
            text = text.replace("|", "\\|").replace("\n", " ")
            rows.append(f"| {flags} | {text} |")
        if rows:
            out += ["| option | meaning |", "|---|---|", *rows, ""]
    return "\n".join(out) + "\n"
