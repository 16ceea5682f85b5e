"""What a Tenstorrent chip accepts: each ttnn op's documented dtypes, layouts and shape rules.

The rows come from the installed ttnn's own docstrings (read by `docstrings.py`). Where a
docstring has a "Supported dtypes and layouts" list-table, a rule names the table by its caption
and holds its rows; where it says it in prose, a rule quotes the sentences and tabulates them by
hand. `audit.py` re-reads the docstrings and reports where a row here and the documentation
disagree (`tests/emulator/test_support.py` requires none), so a new ttnn cannot change the rules
silently.

The emulated device refuses every call outside these rows (`checker.py`), eagerly and inside a
trace capture alike. Ops whose docstrings state no dtype or layout (`documented` is False:
embedding, copy, slice, concat, to_layout) are held only to the rules their docstrings do state;
the mirror path uses none of them (`ttmirror info --backend tt --json` lists its ops).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .docstrings import FLOATS, Supported, allow, squash
from .tensors import DeviceTensor

Bound = Mapping[str, Any]
"""A call's arguments, bound by name against the installed ttnn's signature."""


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
        return "docstring: " + " / ".join(f"'{squash(q)}'" for q in self.quotes)


@dataclass(frozen=True)
class ArgRule:
    """Arguments that must match one of `supported` (when `when` holds for the call)."""

    args: tuple[str, ...]
    supported: tuple[Supported, ...]
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
    allow("BFLOAT16, FLOAT32", "TILE"), allow("UINT16, UINT32", "TILE"), allow("INT32", "TILE")
)
"""gather's input table; its output holds the input's values, so it takes the same rows."""
_TYPECAST = (
    allow("BFLOAT16, BFLOAT8_B, BFLOAT4_B, FLOAT32, UINT32, INT32, UINT16, UINT8, INT8", "TILE"),
    allow("BFLOAT16, FLOAT32, UINT32, INT32, UINT16, UINT8, INT8", "ROW_MAJOR"),
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
                (allow("UINT16, UINT32", "TILE"),),
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
                (allow("BFLOAT16, BFLOAT8_B, BFLOAT4_B, FLOAT32, INT32, UINT32", "TILE"),),
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
            ArgRule(("input_values_tensor",), (allow("BFLOAT16", "TILE"),),
                    Source(table="input_values_tensor")),
            ArgRule(("input_indices_tensor", "k"), (allow("UINT32, INT32", "ROW_MAJOR"),),
                    Source(table="input_indices_tensor, k")),
            ArgRule(("p", "temp"), (allow("BFLOAT16", "ROW_MAJOR"),), Source(table="p, temp")),
            ArgRule(("output_tensor",), (allow("UINT32, INT32", "ROW_MAJOR"),),
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
                (allow("BFLOAT16, BFLOAT8_B, FLOAT32, INT32, UINT32, UINT16", "TILE, ROW_MAJOR"),),
                Source(table="Supported dtypes and layouts:"),
            ),
        ),
    ),
    "add": OpSupport(
        "add",
        rules=(
            ArgRule(
                ("input_tensor_a", "input_tensor_b", "output_tensor"),
                (allow("BFLOAT16, BFLOAT8_B, BFLOAT4_B, FLOAT32, INT32, UINT32, UINT16",
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
                (allow("BFLOAT16, BFLOAT8_B, BFLOAT4_B, FLOAT32, INT32, UINT32, UINT16, UINT8",
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
            ArgRule(("input_tensor_a",),
                    (allow("BFLOAT8_B, BFLOAT4_B, BFLOAT16, FLOAT32", "TILE"),),
                    Source(table="input_tensor_a")),
            ArgRule(("input_tensor_b",),
                    (allow("BFLOAT8_B, BFLOAT4_B, BFLOAT16, FLOAT32", "TILE"),),
                    Source(table="input_tensor_b")),
            ArgRule(
                ("optional_output_tensor",),
                (allow("BFLOAT8_B, BFLOAT4_B, BFLOAT16, FLOAT32", "TILE"),),
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
                (allow(_INT_AND_FLOAT, "ROW_MAJOR"),),
                Source(quotes=("- **dim=None** (reduce all elements): - input layout: "
                               "ROW_MAJOR - dtypes: BFLOAT16/FLOAT32/INT32/UINT32/UINT16",)),
                case="dim=None",
                when=_argmax_case("dim=None"),
            ),
            ArgRule(
                ("input_tensor",),
                (allow(_INT_AND_FLOAT, "ROW_MAJOR"), allow("BFLOAT16/FLOAT32", "TILE")),
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
                (allow("BFLOAT16/FLOAT32", "ROW_MAJOR, TILE"),),
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
                (allow("BFLOAT16/FLOAT32", "ROW_MAJOR, TILE"),),
                Source(quotes=("- BFLOAT16/FLOAT32 only (integer dtypes not supported) - input "
                               "may be ROW_MAJOR or TILE",)),
                case="0 <= dim < rank-2",
                when=_argmax_case("0 <= dim < rank-2"),
            ),
            ArgRule(
                ("output_tensor",),
                (allow("UINT32", "ROW_MAJOR"),),
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
                (allow("INT32, UINT32", "ROW_MAJOR"),),
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
                (allow("BFLOAT16", "ROW_MAJOR"),),
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
                (allow("BFLOAT16", "TILE"),),
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
