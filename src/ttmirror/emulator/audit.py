"""Where the support table (`support.py`) and the installed ttnn's docstrings disagree: what
keeps a new ttnn from changing the emulated device's rules unseen (`tests/emulator/test_support.py`
requires the audit to find nothing, and plants disagreements it must find).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import ttnn

from .docstrings import Supported, doc_tables, squash, tokens
from .support import TABLE, ArgRule, OpSupport


def audit(table: Mapping[str, OpSupport] | None = None) -> list[str]:
    """Where `table` and the installed ttnn's docstrings disagree (empty: they agree).

    A table rule must hold exactly the rows of the docstring table it names. A prose rule's
    quotes must appear in the docstring, and name exactly the dtypes and layouts of its rows
    (one quote per row, or all quotes for all rows), save what its `implied` note adds.
    """
    found: list[str] = []
    for op, support in (TABLE if table is None else table).items():
        doc = getattr(getattr(ttnn, op, None), "__doc__", None)
        if not doc:
            found.append(f"{op}: ttnn.{op} has no docstring")
            continue
        text = squash(doc)
        tables = {t.caption: t.supported for t in doc_tables(doc)}
        for rule in support.rules:
            where = f"{op} {rule.args}" + (f" ({rule.case})" if rule.case else "")
            found += [f"{where}: {p}" for p in _rule_disagrees(rule, text, tables)]
        for shape in support.shapes:
            if squash(shape.quote) not in text:
                found.append(f"{op}: shape rule quote not in the docstring: {shape.quote!r}")
    return found


def _rule_disagrees(rule: ArgRule, text: str,
                    tables: Mapping[str, tuple[Supported, ...]]) -> list[str]:
    source = rule.source
    if source.table is not None:
        if source.table not in tables:
            return [f"no docstring table captioned {source.table!r}"]
        if tables[source.table] != rule.supported:
            return [f"rows {[r.render() for r in rule.supported]} != documented "
                    f"{[r.render() for r in tables[source.table]]}"]
        return []
    problems = [f"quote not in the docstring: {q!r}" for q in source.quotes
                if squash(q) not in text]
    extra_dtypes, extra_layouts = tokens(source.implied)
    for quoted in re.findall(r'"([^"]+)"', source.implied):
        if squash(quoted) not in text:
            problems.append(f"implied note quotes what the docstring does not say: {quoted!r}")
    pairs = (
        list(zip(source.quotes, rule.supported, strict=True))
        if len(source.quotes) == len(rule.supported)
        else [(" ".join(source.quotes), Supported(
            frozenset().union(*(r.dtypes for r in rule.supported)),
            frozenset().union(*(r.layouts for r in rule.supported)),
        ))]
    )
    for quote, r in pairs:
        dtypes, layouts = tokens(quote)
        if not dtypes <= r.dtypes or not r.dtypes <= dtypes | extra_dtypes:
            problems.append(f"row dtypes {sorted(r.dtypes)} != quoted {sorted(dtypes)}")
        if not layouts <= r.layouts or not r.layouts <= layouts | extra_layouts:
            problems.append(f"row layouts {sorted(r.layouts)} != quoted {sorted(layouts)}")
    return problems
