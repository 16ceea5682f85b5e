"""The emulated device's check of every op call against the support table (`support.py`): a
call a chip refuses raises here, with tt-metal's wording (a `TT_FATAL` RuntimeError naming the
op, the argument, what it got and what is supported), eagerly and inside a trace capture alike.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .docstrings import squash
from .support import TABLE, Bound
from .tensors import DeviceTensor

if TYPE_CHECKING:
    from .device import EmulatedMeshDevice


class OpNotSupported(RuntimeError):
    """A call a chip refuses: outside the op's documented dtypes, layouts or shapes."""


@dataclass
class Satisfied:
    """How one call met the table: per tensor argument, its spec and the rule it matched."""

    op: str
    args: dict[str, dict[str, Any]] = field(default_factory=dict)
    documented: bool = False
    """Every tensor argument matched a documented row (and the op has a documented table)."""


@contextlib.contextmanager
def recording(device: EmulatedMeshDevice) -> Iterator[list[Satisfied]]:
    """Collect how every call on `device` that passed the check met the table, for the block
    (what `ttmirror info` lists); the list is the device's, so another device's calls stay out."""
    previous, device.checked_calls = device.checked_calls, []
    try:
        yield device.checked_calls
    finally:
        device.checked_calls = previous


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
                r.admits(*arg.spec_names) for r in rule.supported
            ):
                supported = "; ".join(r.render() for r in rule.supported)
                where = f" when {rule.case}" if rule.case else ""
                _fail(op, name, arg, supported + where, rule.source.cite())
    for shape in support.shapes:
        problem = shape.problem(bound)
        if problem is not None:
            raise OpNotSupported(
                f"TT_FATAL @ ttnn.{op} (emulated device): {problem}\ninfo:\n"
                f"ttnn.{op}: docstring: '{squash(shape.quote)}'"
            )
    device = next((value.device() for _, value in _tensors(bound)), None)
    if device is not None and device.checked_calls is not None:
        device.checked_calls.append(satisfied(op, bound))


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
            matched = next(r for r in rule.supported if r.admits(*value.spec_names))
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
