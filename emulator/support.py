"""What a Tenstorrent chip accepts: each ttnn op's documented dtypes, layouts and shape rules.

The rows come from the installed ttnn's own docstrings. Where a docstring has a "Supported dtypes
and layouts" list-table, a rule names the table by its caption and holds its rows; where it says
it in prose, a rule quotes the sentences and tabulates them by hand. `tests/device/test_support.py`
re-reads the docstrings and fails when a row here and the documentation disagree, so a new ttnn
cannot change the rules silently.

The emulated device refuses every call outside these rows (`check`), eagerly and inside a trace
capture alike, with tt-metal's wording: a `TT_FATAL` RuntimeError naming the op, the argument,
what it got and what is supported. Ops whose docstrings state no dtype or layout (`documented` is
False: embedding, copy, slice, concat, to_layout) are held only to the rules their docstrings do
state; the mirror path uses none of them (`ttmirror info --backend tt --json` lists its ops).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import ttnn

from .tensors import DeviceTensor

FLOATS = frozenset({"BFLOAT16", "BFLOAT8_B", "BFLOAT4_B", "FLOAT32"})
DTYPES = frozenset(n for n in dir(ttnn.DataType) if n.isupper() and n != "INVALID")
LAYOUTS = frozenset({"TILE", "ROW_MAJOR"})
Bound = Mapping[str, Any]


class OpNotSupported(RuntimeError):
    """A call a chip refuses: outside the op's documented dtypes, layouts or shapes."""


# --- the docstrings' list-tables -----------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One row of a support table: any of these dtypes, in any of these layouts."""

    dtypes: frozenset[str]
    layouts: frozenset[str]

    def admits(self, dtype: str, layout: str) -> bool:
        return dtype in self.dtypes and layout in self.layouts

    def render(self) -> str:
        return f"{', '.join(sorted(self.dtypes))} in {' or '.join(sorted(self.layouts))}"


def row(dtypes: str, layouts: str) -> Row:
    """A row from the docstring's own spelling, e.g. row("UINT16, UINT32", "TILE")."""
    return Row(_names(dtypes, DTYPES), _names(layouts, LAYOUTS))


@dataclass(frozen=True)
class DocTable:
    caption: str
    """The table's title (`.. list-table:: k, p`), else the sentence just before it."""
    rows: tuple[Row, ...]


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
        rows = tuple(row(c[0], c[1]) for c in cells[1:] if len(c) >= 2)
        tables.append(DocTable(caption, rows))
    return tables


def _names(cell: str, known: frozenset[str]) -> frozenset[str]:
    while re.search(r"\([^()]*\)", cell):
        cell = re.sub(r"\([^()]*\)", "", cell)  # "UINT32 (range: [0, 4294967295])"
    return frozenset(n for n in re.split(r"[,/\s]+", cell.upper()) if n in known)


def tokens(text: str) -> tuple[frozenset[str], frozenset[str]]:
    """The dtype and layout names a sentence mentions (BFLOAT16/FLOAT32 counts both)."""
    words = set(re.split(r"[^A-Z0-9_]+", text.upper()))
    return frozenset(words & DTYPES), frozenset(words & LAYOUTS)


# --- the rules -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """Where a rule comes from in the op's docstring."""

    table: str | None = None
    """The caption of the list-table holding exactly the rule's rows."""
    quotes: tuple[str, ...] = ()
    """Sentences of the docstring (whitespace aside) that state the rule in prose."""
    implied: str = ""
    """Names a rule holds that its quotes leave to inference, and why ("a quote" of its own)."""

    def cite(self) -> str:
        if self.table is not None:
            return f"docstring table '{self.table}'"
        return "docstring: " + " / ".join(f"'{_squash(q)}'" for q in self.quotes)


@dataclass(frozen=True)
class ArgRule:
    """Arguments that must match one of `rows` (when `when` holds for the call)."""

    args: tuple[str, ...]
    rows: tuple[Row, ...]
    source: Source
    case: str = ""
    """When the rule applies, in words (e.g. "dim = rank-1"); empty: always."""
    when: Callable[[Bound], bool] | None = None


@dataclass(frozen=True)
class ShapeRule:
    """A documented rule on shapes or on how arguments relate; `problem` says what is wrong."""

    quote: str
    problem: Callable[[Bound], str | None]


@dataclass(frozen=True)
class OpSupport:
    op: str
    rules: tuple[ArgRule, ...] = ()
    shapes: tuple[ShapeRule, ...] = ()
    interleaved: bool = True
    """Only INTERLEAVED tensors (the emulated device stores no other)."""

    @property
    def documented(self) -> bool:
        """The docstring states the dtypes and layouts of every tensor argument it rules on."""
        return bool(self.rules)


# --- shape rules ---------------------------------------------------------------------------------


def _shape(value: Any) -> tuple[int, ...] | None:
    return value.dims if isinstance(value, DeviceTensor) else None


def _gather_shapes(b: Bound) -> str | None:
    source, index, dim = _shape(b["input"]), _shape(b["index"]), int(b["dim"])
    if source is None or index is None:
        return None
    if len(source) != len(index):
        return f"input has rank {len(source)}, index has rank {len(index)}"
    axis = dim % len(source)
    for d, (s, i) in enumerate(zip(source, index, strict=True)):
        if d != axis and i > s:
            return f"index {list(index)} exceeds input {list(source)} in dimension {d}"
    return None


def _same_dtype_unless_float(a: str, b: str) -> Callable[[Bound], str | None]:
    def problem(bound: Bound) -> str | None:
        x, y = bound.get(a), bound.get(b)
        if not (isinstance(x, DeviceTensor) and isinstance(y, DeviceTensor)):
            return None
        dx, dy = x.dtype.name, y.dtype.name
        if dx != dy and not (dx in FLOATS and dy in FLOATS):
            return f"{a} is {dx} and {b} is {dy}"
        return None

    return problem


def _typecast_output(b: Bound) -> str | None:
    x, out = b["input_tensor"], b.get("output_tensor")
    if not isinstance(out, DeviceTensor):
        return None
    if _shape(out) != _shape(x) or out.layout != x.layout:
        return (
            f"output_tensor is {list(out.shape)} {out.layout.name}, input_tensor is "
            f"{list(x.shape)} {x.layout.name}"
        )
    return None


def _rank(arg: str, low: int, high: int) -> Callable[[Bound], str | None]:
    def problem(bound: Bound) -> str | None:
        shape = _shape(bound.get(arg))
        if shape is not None and not low <= len(shape) <= high:
            return f"{arg} has rank {len(shape)}"
        return None

    return problem


def _sampling_shapes(b: Bound) -> str | None:
    values = _shape(b["input_values_tensor"])
    if values is None:
        return None
    if len(values) != 4:
        return f"input_values_tensor has rank {len(values)}"
    n, c, users, width = values
    if (n, c) != (1, 1):
        return f"input_values_tensor dims 0 and 1 are {n}, {c}"
    if not 1 <= users <= 32:
        return f"{users} users"
    tiles = width // 32
    if width % 32 or tiles & (tiles - 1):
        return f"last dimension {width} is not a power-of-2 multiple of 32"
    if _shape(b["input_indices_tensor"]) != values:
        return f"input_indices_tensor is {list(b['input_indices_tensor'].shape)}"
    for arg in ("k", "p", "temp"):
        if _shape(b[arg]) not in (None, (users,)):
            return f"{arg} is {list(b[arg].shape)}, not [{users}]"
    return None


def _argmax_dim(b: Bound) -> int | None:
    """argmax's `dim` as a non-negative axis (None: every element)."""
    dim = b.get("dim")
    if dim is None:
        return None
    rank = len(_shape(b["input_tensor"]) or (1,))
    return int(dim) % rank


def _argmax_case(case: str) -> Callable[[Bound], bool]:
    def when(b: Bound) -> bool:
        rank = len(_shape(b["input_tensor"]) or (1,))
        axis = _argmax_dim(b)
        return {
            "dim=None": axis is None,
            "dim = rank-1": axis == rank - 1,
            "dim = rank-2": axis is not None and rank >= 2 and axis == rank - 2,
            "0 <= dim < rank-2": axis is not None and axis < rank - 2,
        }[case]

    return when


# --- the table -----------------------------------------------------------------------------------

_INT_AND_FLOAT = "BFLOAT16/FLOAT32/INT32/UINT32/UINT16"
_GATHER_INPUT = (
    row("BFLOAT16, FLOAT32", "TILE"), row("UINT16, UINT32", "TILE"), row("INT32", "TILE")
)
"""gather's input table; its output holds the input's values, so it takes the same rows."""
_TYPECAST = (
    row("BFLOAT16, BFLOAT8_B, BFLOAT4_B, FLOAT32, UINT32, INT32, UINT16, UINT8, INT8", "TILE"),
    row("BFLOAT16, FLOAT32, UINT32, INT32, UINT16, UINT8, INT8", "ROW_MAJOR"),
)
"""typecast's input table; its output has the input's layout and one of these dtypes."""

TABLE: dict[str, OpSupport] = {
    "gather": OpSupport(
        "gather",
        rules=(
            ArgRule(
                ("input",),
                _GATHER_INPUT,
                Source(table="Supported dtypes and layout for input tensor values:"),
            ),
            ArgRule(
                ("index",),
                (row("UINT16, UINT32", "TILE"),),
                Source(table="Supported dtypes and layout for index tensor values:"),
            ),
            ArgRule(
                ("out",),
                _GATHER_INPUT,
                Source(
                    quotes=("The output tensor will have the same shape as the index tensor.",),
                    implied='"The `gather` operation extracts values from the input tensor": '
                    "the output holds the input's values, so it takes the input's table: "
                    "BFLOAT16 FLOAT32 UINT16 UINT32 INT32 TILE",
                ),
            ),
        ),
        shapes=(
            ShapeRule(
                "The input tensor and the index tensor must have the same number of dimensions. "
                "For all dimensions except the specified one (`dim`), the size of the index "
                "tensor must not exceed the size of the input tensor.",
                _gather_shapes,
            ),
            ShapeRule(
                "The output tensor will have the same shape as the index tensor.",
                lambda b: None
                if _shape(b.get("out")) in (None, _shape(b["index"]))
                else f"out is {list(b['out'].shape)}, index is {list(b['index'].shape)}",
            ),
        ),
    ),
    "where": OpSupport(
        "where",
        rules=(
            ArgRule(
                ("predicate", "true_value", "false_value", "output_tensor"),
                (row("BFLOAT16, BFLOAT8_B, BFLOAT4_B, FLOAT32, INT32, UINT32", "TILE"),),
                Source(table="Supported dtypes and layouts:"),
            ),
        ),
    ),
    "typecast": OpSupport(
        "typecast",
        rules=(
            ArgRule(
                ("input_tensor",),
                _TYPECAST,
                Source(table="input_tensor"),
            ),
            ArgRule(
                ("output_tensor",),
                _TYPECAST,
                Source(
                    quotes=("The output tensor will be in the same layout as the input tensor and "
                            "have the given data type.",),
                    implied='"This operations supports tensors according to the following data '
                    'types and layout": the given data type and the layout come from that table: '
                    "BFLOAT16 BFLOAT8_B BFLOAT4_B FLOAT32 UINT32 INT32 UINT16 UINT8 INT8 TILE "
                    "ROW_MAJOR",
                ),
            ),
        ),
        shapes=(
            ShapeRule(
                "If preallocated output tensor is used, it must match the input tensor's shape "
                "and layout.",
                _typecast_output,
            ),
        ),
    ),
    "sampling": OpSupport(
        "sampling",
        rules=(
            ArgRule(("input_values_tensor",), (row("BFLOAT16", "TILE"),),
                    Source(table="input_values_tensor")),
            ArgRule(("input_indices_tensor", "k"), (row("UINT32, INT32", "ROW_MAJOR"),),
                    Source(table="input_indices_tensor, k")),
            ArgRule(("p", "temp"), (row("BFLOAT16", "ROW_MAJOR"),), Source(table="p, temp")),
            ArgRule(("output_tensor",), (row("UINT32, INT32", "ROW_MAJOR"),),
                    Source(table="output_tensor (optional)")),
        ),
        shapes=(
            ShapeRule(
                "Inputs must be 4D tensors with shape [N, C, H, W], and must be located on the "
                "device.",
                _sampling_shapes,
            ),
        ),
    ),
    "fill": OpSupport(
        "fill",
        rules=(
            ArgRule(
                ("input_tensor", "output_tensor"),
                (row("BFLOAT16, BFLOAT8_B, FLOAT32, INT32, UINT32, UINT16", "TILE, ROW_MAJOR"),),
                Source(table="Supported dtypes and layouts:"),
            ),
        ),
    ),
    "add": OpSupport(
        "add",
        rules=(
            ArgRule(
                ("input_tensor_a", "input_tensor_b", "output_tensor"),
                (row("BFLOAT16, BFLOAT8_B, BFLOAT4_B, FLOAT32, INT32, UINT32, UINT16",
                     "TILE, ROW_MAJOR"),),
                Source(table="Supported dtypes and layouts:"),
            ),
        ),
        shapes=(
            ShapeRule(
                "Operands may mix float-family dtypes (BFLOAT16, BFLOAT8_B, BFLOAT4_B, FLOAT32); "
                "all other dtype pairs must match.",
                _same_dtype_unless_float("input_tensor_a", "input_tensor_b"),
            ),
        ),
    ),
    "eq": OpSupport(
        "eq",
        rules=(
            ArgRule(
                ("input_tensor_a", "input_tensor_b", "output_tensor"),
                (row("BFLOAT16, BFLOAT8_B, BFLOAT4_B, FLOAT32, INT32, UINT32, UINT16, UINT8",
                     "TILE, ROW_MAJOR"),),
                Source(table="Supported dtypes and layouts:"),
            ),
        ),
        shapes=(
            ShapeRule(
                "Operands may mix float-family dtypes (BFLOAT16, BFLOAT8_B, BFLOAT4_B, FLOAT32); "
                "all other dtype pairs must match.",
                _same_dtype_unless_float("input_tensor_a", "input_tensor_b"),
            ),
        ),
    ),
    "matmul": OpSupport(
        "matmul",
        rules=(
            ArgRule(("input_tensor_a",), (row("BFLOAT8_B, BFLOAT4_B, BFLOAT16, FLOAT32", "TILE"),),
                    Source(table="input_tensor_a")),
            ArgRule(("input_tensor_b",), (row("BFLOAT8_B, BFLOAT4_B, BFLOAT16, FLOAT32", "TILE"),),
                    Source(table="input_tensor_b")),
            ArgRule(
                ("optional_output_tensor",),
                (row("BFLOAT8_B, BFLOAT4_B, BFLOAT16, FLOAT32", "TILE"),),
                Source(
                    quotes=("optional_output_tensor (ttnn.Tensor, optional): User provided "
                            "on-device output tensor where the result of matmul is to be "
                            "written.",),
                    implied='"The input tensors support the following data types and layouts": '
                    "the result is in the inputs' dtypes and layout: BFLOAT8_B BFLOAT4_B "
                    "BFLOAT16 FLOAT32 TILE",
                ),
            ),
        ),
    ),
    "argmax": OpSupport(
        "argmax",
        rules=(
            ArgRule(
                ("input_tensor",),
                (row(_INT_AND_FLOAT, "ROW_MAJOR"),),
                Source(quotes=("- **dim=None** (reduce all elements): - input layout: "
                               "ROW_MAJOR - dtypes: BFLOAT16/FLOAT32/INT32/UINT32/UINT16",)),
                case="dim=None",
                when=_argmax_case("dim=None"),
            ),
            ArgRule(
                ("input_tensor",),
                (row(_INT_AND_FLOAT, "ROW_MAJOR"), row("BFLOAT16/FLOAT32", "TILE")),
                Source(quotes=(
                    "- ROW_MAJOR input: BFLOAT16/FLOAT32/INT32/UINT32/UINT16 (multi-core by "
                    "default)",
                    "- TILE input: BFLOAT16/FLOAT32 (single-core)",
                )),
                case="dim = rank-1",
                when=_argmax_case("dim = rank-1"),
            ),
            ArgRule(
                ("input_tensor",),
                (row("BFLOAT16/FLOAT32", "ROW_MAJOR, TILE"),),
                Source(
                    quotes=("- **dim = rank-2** (height): - BFLOAT16/FLOAT32 only - ROW_MAJOR "
                            "inputs are internally tilized; this path runs single-core",),
                    implied='TILE: "ROW_MAJOR inputs are internally tilized", so the path '
                    "computes on TILE inputs",
                ),
                case="dim = rank-2",
                when=_argmax_case("dim = rank-2"),
            ),
            ArgRule(
                ("input_tensor",),
                (row("BFLOAT16/FLOAT32", "ROW_MAJOR, TILE"),),
                Source(quotes=("- BFLOAT16/FLOAT32 only (integer dtypes not supported) - input "
                               "may be ROW_MAJOR or TILE",)),
                case="0 <= dim < rank-2",
                when=_argmax_case("0 <= dim < rank-2"),
            ),
            ArgRule(
                ("output_tensor",),
                (row("UINT32", "ROW_MAJOR"),),
                Source(quotes=("Preallocated output (must be UINT32, ROW_MAJOR, INTERLEAVED, "
                               "same device).",)),
            ),
        ),
    ),
    "plus_one": OpSupport(
        "plus_one",
        rules=(
            ArgRule(
                ("input_tensor",),
                (row("INT32, UINT32", "ROW_MAJOR"),),
                Source(quotes=("Input tensor must have INT32 or UINT32 data type, ROW_MAJOR "
                               "layout, and 1 to 4 dimensions.",)),
            ),
        ),
        shapes=(
            ShapeRule(
                "Input tensor must have INT32 or UINT32 data type, ROW_MAJOR layout, and 1 to 4 "
                "dimensions.",
                _rank("input_tensor", 1, 4),
            ),
        ),
    ),
    "tilize": OpSupport(
        "tilize",
        rules=(
            ArgRule(
                ("input_tensor",),
                (row("BFLOAT16", "ROW_MAJOR"),),
                Source(quotes=("Input tensor must be on TT accelerator device, in ROW_MAJOR "
                               "layout, and have BFLOAT16 data type.",)),
            ),
        ),
    ),
    "untilize": OpSupport(
        "untilize",
        rules=(
            ArgRule(
                ("input_tensor",),
                (row("BFLOAT16", "TILE"),),
                Source(quotes=("Input tensor must be on TT accelerator device, in TILE layout, "
                               "and have BFLOAT16 data type.",)),
            ),
        ),
    ),
    "copy": OpSupport(
        "copy",
        shapes=(
            ShapeRule(
                "Both input tensors must be of equal shape.",
                lambda b: None
                if _shape(b["input_a"]) == _shape(b["input_b"])
                else f"input_a is {list(b['input_a'].shape)}, input_b is "
                f"{list(b['input_b'].shape)}",
            ),
        ),
    ),
    "embedding": OpSupport("embedding"),
    "slice": OpSupport("slice"),
    "concat": OpSupport("concat"),
    "to_layout": OpSupport("to_layout"),
}
"""ttnn op name -> what its installed docstring says a chip accepts."""


# --- checking a call -----------------------------------------------------------------------------


@dataclass
class Satisfied:
    """How one call met the table: per tensor argument, its spec and the rule it matched."""

    op: str
    args: dict[str, dict[str, Any]] = field(default_factory=dict)
    documented: bool = False
    """Every tensor argument matched a documented row (and the op has a documented table)."""


_recorders: list[list[Satisfied]] = []


@contextlib.contextmanager
def recording() -> Iterator[list[Satisfied]]:
    """Collect how every checked call met the table, for the block (what `ttmirror info` lists)."""
    calls: list[Satisfied] = []
    _recorders.append(calls)
    try:
        yield calls
    finally:
        _recorders.remove(calls)


def check(op: str, bound: Bound) -> None:
    """Refuse a call outside `op`'s documented rows, as the chip would (on every op call: lean)."""
    support = TABLE.get(op)
    if support is None:
        raise OpNotSupported(
            f"TT_FATAL @ ttnn.{op} (emulated device): no support table for this op; the "
            "emulated device runs only ops whose documented rules it enforces"
        )
    if support.interleaved:
        for name, value in _tensors(bound):
            if not value.interleaved:
                _fail(op, name, value, "INTERLEAVED memory",
                      "the emulated device stores interleaved tensors only")
    for rule in support.rules:
        if rule.when is not None and not rule.when(bound):
            continue
        for name in rule.args:
            arg = bound.get(name)
            if isinstance(arg, DeviceTensor) and not any(
                r.admits(*arg.spec_names) for r in rule.rows
            ):
                supported = "; ".join(r.render() for r in rule.rows)
                where = f" when {rule.case}" if rule.case else ""
                _fail(op, name, arg, supported + where, rule.source.cite())
    for shape in support.shapes:
        problem = shape.problem(bound)
        if problem is not None:
            raise OpNotSupported(
                f"TT_FATAL @ ttnn.{op} (emulated device): {problem}\ninfo:\n"
                f"ttnn.{op}: docstring: '{_squash(shape.quote)}'"
            )
    if _recorders:
        met = satisfied(op, bound)
        for calls in _recorders:
            calls.append(met)


def satisfied(op: str, bound: Bound) -> Satisfied:
    """How a call that passed `check` met the table: per tensor argument, the row it matched."""
    support = TABLE[op]
    met = Satisfied(op)
    for rule in support.rules:
        if rule.when is not None and not rule.when(bound):
            continue
        for name in rule.args:
            value = bound.get(name)
            if not isinstance(value, DeviceTensor):
                continue
            matched = next(r for r in rule.rows if r.admits(*value.spec_names))
            met.args[name] = {
                "dtype": value.spec_names[0],
                "layout": value.spec_names[1],
                "shape": list(value.dims),
                "row": matched.render(),
                "rule": (f"{rule.case}: " if rule.case else "") + rule.source.cite(),
            }
    for name, value in _tensors(bound):
        met.args.setdefault(name, {"dtype": value.spec_names[0], "layout": value.spec_names[1],
                                   "shape": list(value.dims), "row": None, "rule": None})
    met.documented = support.documented and all(a["rule"] for a in met.args.values())
    return met


def _tensors(bound: Bound) -> Iterable[tuple[str, DeviceTensor]]:
    for name, value in bound.items():
        if isinstance(value, DeviceTensor):
            yield name, value
        elif isinstance(value, list | tuple):
            for i, item in enumerate(value):
                if isinstance(item, DeviceTensor):
                    yield f"{name}[{i}]", item


def _fail(op: str, arg: str, value: DeviceTensor, supported: str, source: str) -> None:
    raise OpNotSupported(
        f"TT_FATAL @ ttnn.{op} (emulated device): {arg} is {value.dtype.name} "
        f"{value.layout.name}; supported: {supported}\ninfo:\n"
        f"ttnn.{op} does not support {arg} as {value.dtype.name} {value.layout.name} "
        f"(shape {list(value.shape)}); {source}"
    )


def _squash(text: str) -> str:
    return " ".join(text.split())


# --- agreement with the installed documentation --------------------------------------------------


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
        text = _squash(doc)
        tables = {t.caption: t.rows for t in doc_tables(doc)}
        for rule in support.rules:
            where = f"{op} {rule.args}" + (f" ({rule.case})" if rule.case else "")
            found += [f"{where}: {p}" for p in _rule_disagrees(rule, text, tables)]
        for shape in support.shapes:
            if _squash(shape.quote) not in text:
                found.append(f"{op}: shape rule quote not in the docstring: {shape.quote!r}")
    return found


def _rule_disagrees(rule: ArgRule, text: str, tables: Mapping[str, tuple[Row, ...]]) -> list[str]:
    source = rule.source
    if source.table is not None:
        if source.table not in tables:
            return [f"no docstring table captioned {source.table!r}"]
        if tables[source.table] != rule.rows:
            return [f"rows {[r.render() for r in rule.rows]} != documented "
                    f"{[r.render() for r in tables[source.table]]}"]
        return []
    problems = [f"quote not in the docstring: {q!r}" for q in source.quotes
                if _squash(q) not in text]
    extra_dtypes, extra_layouts = tokens(source.implied)
    for quoted in re.findall(r'"([^"]+)"', source.implied):
        if _squash(quoted) not in text:
            problems.append(f"implied note quotes what the docstring does not say: {quoted!r}")
    pairs = (
        list(zip(source.quotes, rule.rows, strict=True))
        if len(source.quotes) == len(rule.rows)
        else [(" ".join(source.quotes), Row(
            frozenset().union(*(r.dtypes for r in rule.rows)),
            frozenset().union(*(r.layouts for r in rule.rows)),
        ))]
    )
    for quote, r in pairs:
        dtypes, layouts = tokens(quote)
        if not dtypes <= r.dtypes or not r.dtypes <= dtypes | extra_dtypes:
            problems.append(f"row dtypes {sorted(r.dtypes)} != quoted {sorted(dtypes)}")
        if not layouts <= r.layouts or not r.layouts <= layouts | extra_layouts:
            problems.append(f"row layouts {sorted(r.layouts)} != quoted {sorted(layouts)}")
    return problems
