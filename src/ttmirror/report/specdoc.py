"""Keep the generated parts of specs/ and of the command line guide (docs/guide/commands.md)
up to date: the slot lifecycle, the tables of results (from `specs/manifest.json`), the list of
known-bad variants and the TLC configs.

`python -m ttmirror.report.specdoc` (`make spec`) rewrites each block between its markers; a
test fails when a committed copy differs from what the model and the manifest generate.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ttmirror import manifest
from ttmirror.model.explore import Exploration, explore
from ttmirror.model.state import RING
from ttmirror.report.render import to_mermaid
from ttmirror.report.views import project
from ttmirror.tlc import write_configs

ROOT = Path(__file__).resolve().parents[3]  # src/ttmirror/report/specdoc.py: the source tree
SPEC = ROOT / "src" / "ttmirror" / "specs" / "mirrored-sampled-ids.md"
COMMANDS = ROOT / "docs" / "guide" / "commands.md"
"""The command line's guide: its list of known-bad variants is generated."""


def markers(name: str) -> tuple[str, str]:
    """The begin and end markers of the generated block ``name``."""
    return (f"<!-- BEGIN GENERATED {name} (python -m ttmirror.report.specdoc) -->",
            f"<!-- END GENERATED {name} -->")


def block(ex: Exploration) -> str:
    """The Mermaid block for slot 0 at the given exploration's bounds."""
    return _wrap("slot-lifecycle", f"```mermaid\n{to_mermaid(project(ex, 'slot', 0))}```\n")


def current(text: str, name: str = "slot-lifecycle") -> str:
    """The generated block ``name`` as committed in ``text``."""
    begin, end = markers(name)
    start, stop = text.index(begin), text.index(end) + len(end)
    return text[start:stop]


def _wrap(name: str, body: str) -> str:
    begin, end = markers(name)
    return f"{begin}\n{body}{end}"


def _command(e: manifest.Entry) -> str:
    return f"`{e.flags}`" if e.flags else "`ttmirror check`"


def results_table(entries: list[manifest.Entry]) -> str:
    """The spec's table of bounds that pass, with their states and transitions."""
    lines = ["| bounds | command | states | transitions |", "|---|---|---|---|"]
    lines += [f"| {e.about}{' (`make bench-check` only)' if e.size == 'large' else ''} | "
              f"{_command(e)} | {e.states:,} | {e.transitions:,} |"
              for e in entries if e.size in ("default", "large") and e.violated is None]
    return _wrap("results", "\n".join(lines) + "\n")


def known_bad_table(entries: list[manifest.Entry]) -> str:
    """The spec's table of known-bad variants, each with its violation and shortest length."""
    lines = ["| variant | command | violated | steps |", "|---|---|---|---|"]
    lines += [f"| {e.about} | {_command(e)} | `{e.violated}` | {e.length} |"
              for e in entries if e.size == "default" and e.violated is not None]
    return _wrap("known-bad", "\n".join(lines) + "\n")


def small_table(entries: list[manifest.Entry]) -> str:
    """The spec's table of the small bounds that CI checks with both the explorer and TLC."""
    lines = ["| bounds | command | states | result |", "|---|---|---|---|"]
    for e in entries:
        if e.size == "small":
            result = "passes" if e.violated is None else f"`{e.violated}`, {e.length} steps"
            lines.append(f"| {e.about} | {_command(e)} | {e.states:,} | {result} |")
    return _wrap("small", "\n".join(lines) + "\n")


def variants(entries: list[manifest.Entry]) -> str:
    """The command line guide's `ttmirror check` commands that fail, each with what and how soon."""
    bad = [e for e in entries if e.size == "default" and e.violated is not None]
    width = max(len(f"ttmirror check {e.flags}") for e in bad)
    lines = ["```"]
    lines += [f"{'ttmirror check ' + e.flags:<{width}}  # {e.violated}, {e.length} steps"
              for e in bad]
    lines.append("```")
    return _wrap("variants", "\n".join(lines) + "\n")


def spec_blocks(ex: Exploration, entries: list[manifest.Entry]) -> dict[str, str]:
    """Every generated block of the spec, by name."""
    return {"slot-lifecycle": block(ex), "results": results_table(entries),
            "known-bad": known_bad_table(entries), "small": small_table(entries)}


def guide_blocks(entries: list[manifest.Entry]) -> dict[str, str]:
    """Every generated block of the command line guide, by name."""
    return {"variants": variants(entries)}


def rewrite(path: Path, blocks: dict[str, str]) -> None:
    text = path.read_text()
    for name, fresh in blocks.items():
        text = text.replace(current(text, name), fresh)
    path.write_text(text)


def main() -> int:
    entries = manifest.load()
    rewrite(SPEC, spec_blocks(explore(RING), entries))
    print(f"updated {SPEC}")
    rewrite(COMMANDS, guide_blocks(entries))
    print(f"updated {COMMANDS}")
    for path in write_configs():
        print(f"updated {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
