"""Reading the installed ttnn's docstrings: their "Supported dtypes and layouts" list-tables, and
the dtype and layout names a sentence of prose mentions. The support table (`support.py`) is
written in these terms, and the audit (`audit.py`) reads the docstrings back with them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import ttnn

FLOATS = frozenset({"BFLOAT16", "BFLOAT8_B", "BFLOAT4_B", "FLOAT32"})
DTYPES = frozenset(n for n in dir(ttnn.DataType) if n.isupper() and n != "INVALID")
LAYOUTS = frozenset({"TILE", "ROW_MAJOR"})


@dataclass(frozen=True)
class Supported:
    """One entry of a support table (a row of its docstring's list-table, or a sentence of its
    prose): any of these dtypes, in any of these layouts."""

    dtypes: frozenset[str]
    layouts: frozenset[str]

    def admits(self, dtype: str, layout: str) -> bool:
        return dtype in self.dtypes and layout in self.layouts

    def render(self) -> str:
        return f"{', '.join(sorted(self.dtypes))} in {' or '.join(sorted(self.layouts))}"


def allow(dtypes: str, layouts: str) -> Supported:
    """An entry from the docstring's own spelling, e.g. allow("UINT16, UINT32", "TILE")."""
    return Supported(names(dtypes, DTYPES), names(layouts, LAYOUTS))


@dataclass(frozen=True)
class DocTable:
    caption: str
    """The table's title (`.. list-table:: k, p`), else the sentence just before it."""
    supported: tuple[Supported, ...]


def doc_tables(doc: str) -> list[DocTable]:
    """Every dtype/layout list-table of a docstring, its header row dropped."""
    lines = doc.splitlines()
    tables = []
    for i, line in enumerate(lines):
        match = re.match(r"(\s*)\.\. list-table::\s*(.*)$", line)
        if not match:
            continue
        caption = match.group(2).strip()
        if not caption:
            before = [b.strip() for b in lines[:i] if b.strip()]
            caption = before[-1] if before else ""
        cells: list[list[str]] = []
        for body in lines[i + 1 :]:
            text = body.strip()
            if not text or text.startswith(":"):
                continue
            if text.startswith("* -"):
                cells.append([text[3:].strip()])
            elif text.startswith("-") and cells:
                cells[-1].append(text[1:].strip())
            else:
                break
        entries = tuple(allow(c[0], c[1]) for c in cells[1:] if len(c) >= 2)
        tables.append(DocTable(caption, entries))
    return tables


def names(cell: str, known: frozenset[str]) -> frozenset[str]:
    while re.search(r"\([^()]*\)", cell):
        cell = re.sub(r"\([^()]*\)", "", cell)  # "UINT32 (range: [0, 4294967295])"
    return frozenset(n for n in re.split(r"[,/\s]+", cell.upper()) if n in known)


def tokens(text: str) -> tuple[frozenset[str], frozenset[str]]:
    """The dtype and layout names a sentence mentions (BFLOAT16/FLOAT32 counts both)."""
    words = set(re.split(r"[^A-Z0-9_]+", text.upper()))
    return frozenset(words & DTYPES), frozenset(words & LAYOUTS)


def squash(text: str) -> str:
    """`text` with its whitespace runs as single spaces (docstrings wrap where they like)."""
    return " ".join(text.split())
