"""The installed ttnn's own call signatures, so every routed call is checked against the real API.

Sources, most precise first: the nanobind signature lines (`__doc__` of a nanobind function, or of
an operation object's `__call__`), then `inspect.signature` for functions written in Python, then
the docstring's `Args:` / `Keyword Args:` sections. Overloads are kept; a call must bind to one.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

TTNN_VERSION = importlib.metadata.version("ttnn")

_EMPTY = inspect.Parameter.empty
_KEYWORD_ONLY = inspect.Parameter.KEYWORD_ONLY


@dataclass(frozen=True)
class Overload:
    """One accepted form of a call: names in order, which are keyword-only, which have defaults."""

    positional: tuple[str, ...]
    keyword_only: tuple[str, ...]
    required: frozenset[str]
    var_positional: bool = False
    var_keyword: bool = False
    names: frozenset[str] = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", frozenset(self.positional) | frozenset(self.keyword_only))

    def render(self, name: str) -> str:
        parts = [p if p in self.required else f"{p}=…" for p in self.positional]
        if self.var_positional:
            parts.append("*args")
        elif self.keyword_only:
            parts.append("*")
        parts += [p if p in self.required else f"{p}=…" for p in self.keyword_only]
        if self.var_keyword:
            parts.append("**kwargs")
        return f"{name}({', '.join(parts)})"

    def bind(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any] | str:
        """The arguments by name, or why this overload does not accept the call."""
        if len(args) > len(self.positional) and not self.var_positional:
            return f"takes at most {len(self.positional)} positional arguments ({len(args)} given)"
        bound: dict[str, Any] = dict(zip(self.positional, args, strict=False))
        for key, value in kwargs.items():
            if key in bound:
                return f"got multiple values for argument '{key}'"
            if key not in self.names and not self.var_keyword:
                return f"got an unexpected keyword argument '{key}'"
            bound[key] = value
        missing = [
            p
            for p in (*self.positional, *self.keyword_only)
            if p in self.required and p not in bound
        ]
        if missing:
            return f"missing required argument '{missing[0]}'"
        return bound


@dataclass(frozen=True)
class Signature:
    """All overloads of one ttnn callable, named as a caller writes it (`ttnn.from_device`)."""

    name: str
    overloads: tuple[Overload, ...]
    source: str

    def bind(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """Bind a call as the installed ttnn would, or raise TypeError naming what is wrong."""
        reasons = []
        for overload in self.overloads:
            bound = overload.bind(args, kwargs)
            if isinstance(bound, dict):
                return bound
            reasons.append(bound)
        unknown = [
            k for k in kwargs if not any(k in o.names or o.var_keyword for o in self.overloads)
        ]
        reason = f"got an unexpected keyword argument '{unknown[0]}'" if unknown else reasons[0]
        forms = "; ".join(o.render(self.name) for o in self.overloads)
        raise TypeError(f"{self.name}() {reason}; ttnn {TTNN_VERSION} accepts {forms}")


# --- parsing -------------------------------------------------------------------------------------


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside brackets (types such as `Sequence[int] | None` contain commas)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _closing_paren(text: str, open_at: int) -> int:
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] in "([{":
            depth += 1
        elif text[i] in ")]}":
            depth -= 1
            if depth == 0:
                return i
    return -1


def _overload_from_params(params: list[str], drop_self: bool) -> Overload:
    positional: list[str] = []
    keyword_only: list[str] = []
    required: set[str] = set()
    var_pos = var_kw = False
    kw_only = False
    for raw in params:
        param = raw.replace("\\*", "*")
        if param == "*":
            kw_only = True
            continue
        if param.startswith("**"):
            var_kw = True
            continue
        if param.startswith("*"):
            var_pos = kw_only = True
            continue
        name = re.split(r"[:=\s]", param, maxsplit=1)[0]
        if drop_self and name == "self" and not positional:
            continue
        has_default = "=" in _strip_brackets(param)
        (keyword_only if kw_only else positional).append(name)
        if not has_default:
            required.add(name)
    return Overload(tuple(positional), tuple(keyword_only), frozenset(required), var_pos, var_kw)


def _strip_brackets(text: str) -> str:
    """The text with bracketed type arguments removed, so `=` inside them is not a default."""
    out, depth = [], 0
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def parse_signature_lines(doc: str, func_name: str, *, drop_self: bool = False) -> list[Overload]:
    """Overloads from the nanobind signature lines `name(a: T, *, b: U = x) -> R` atop a doc."""
    overloads = []
    for line in doc.strip().splitlines():
        line = line.strip()
        if not line.startswith(func_name + "("):
            break
        open_at = len(func_name)
        close_at = _closing_paren(line, open_at)
        if close_at < 0:
            break
        params = _split_top_level(line[open_at + 1 : close_at])
        overloads.append(_overload_from_params(params, drop_self))
    return overloads


_ARGS_HEADER = re.compile(r"^\s*(Args|Arguments|Keyword [Aa]rgs|Keyword Arguments)\s*:\s*$")
_ARG_LINE = re.compile(r"^\s+(?:\* :attr:`)?(\w+)`?\s*(\(([^)]*)\))?:")


def parse_docstring_args(doc: str) -> Overload | None:
    """An overload from a Google-style docstring's `Args:` and `Keyword Args:` sections."""
    positional: list[str] = []
    keyword_only: list[str] = []
    required: set[str] = set()
    section: list[str] | None = None
    indent = -1
    for line in doc.splitlines():
        header = _ARGS_HEADER.match(line)
        if header:
            section = keyword_only if header.group(1).startswith("Keyword") else positional
            indent = -1
            continue
        if section is None:
            continue
        if not line.strip():
            continue
        this_indent = len(line) - len(line.lstrip())
        match = _ARG_LINE.match(line)
        if indent < 0 and match:
            indent = this_indent
        if this_indent < indent or (indent < 0 and not match):
            section = None
            continue
        if match and this_indent == indent:
            name, type_text = match.group(1), match.group(3) or ""
            section.append(name)
            if "optional" not in type_text and "Default" not in line:
                required.add(name)
    if not positional and not keyword_only:
        return None
    return Overload(tuple(positional), tuple(keyword_only), frozenset(required))


def _from_python(func: Callable[..., Any]) -> Overload:
    positional: list[str] = []
    keyword_only: list[str] = []
    required: set[str] = set()
    var_pos = var_kw = False
    for p in inspect.signature(func).parameters.values():
        if p.kind is inspect.Parameter.VAR_POSITIONAL:
            var_pos = True
        elif p.kind is inspect.Parameter.VAR_KEYWORD:
            var_kw = True
        else:
            (keyword_only if p.kind is _KEYWORD_ONLY else positional).append(p.name)
            if p.default is _EMPTY:
                required.add(p.name)
    return Overload(tuple(positional), tuple(keyword_only), frozenset(required), var_pos, var_kw)


def _unique(overloads: list[Overload]) -> tuple[Overload, ...]:
    """Overloads that differ only in parameter types bind the same way; keep one of each."""
    return tuple(dict.fromkeys(overloads))


def introspect(obj: Any, name: str) -> Signature:
    """The installed signature of `obj`, a ttnn function, FastOperation or nanobind method."""
    short = name.rsplit(".", 1)[-1]
    func = getattr(obj, "function", obj)  # FastOperation wraps the real callable
    if inspect.isfunction(func):
        return Signature(name, (_from_python(func),), "python signature")
    doc = getattr(func, "__doc__", None) or ""
    overloads = parse_signature_lines(doc, short)
    if overloads:
        return Signature(name, _unique(overloads), "nanobind signature")
    call_doc = getattr(type(func).__call__, "__doc__", None) or ""
    overloads = parse_signature_lines(call_doc, "__call__", drop_self=True)
    if overloads:
        return Signature(name, _unique(overloads), "nanobind __call__ signature")
    from_doc = parse_docstring_args(doc)
    if from_doc is not None:
        return Signature(name, (from_doc,), "docstring Args")
    raise LookupError(f"no signature found for {name}")


def introspect_method(cls: type, method: str) -> Signature:
    """A nanobind method's signature without `self`, e.g. `Tensor.cpu`."""
    doc = getattr(cls, method).__doc__ or ""
    overloads = parse_signature_lines(doc, method, drop_self=True)
    if not overloads:
        raise LookupError(f"no signature found for {cls.__name__}.{method}")
    return Signature(f"{cls.__name__}.{method}", _unique(overloads), "nanobind signature")
