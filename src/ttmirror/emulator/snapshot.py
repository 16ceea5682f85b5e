"""Exact copies of emulated-device state, and of whatever holds it (emulated only).

`snapshot(obj)` serialises `obj` and everything it reaches (a runner, its backend, the emulated
device: DRAM bytes, queues of commands held as data, events, traces, hazard and ordering books,
pending readbacks, host tensors) into bytes; `restore(data)` builds a fresh, independent copy,
as often as asked. Sharing inside the copy is kept (a command queued and awaited by an event is
one object in the copy too). It is `pickle` with reducers for what pickle cannot take as is:
torch tensors (each the whole of its storage: a view of part of one is refused), ttnn host
tensors (their bytes, garbage included), memory configs and weak references. A restored device
is open, with its own API object, like the one it copies; `discard` closes one without
completing its queues.

A chip's state cannot be copied: this works on the emulated device only.
"""

from __future__ import annotations

import copyreg
import enum
import io
import pickle
import weakref
from typing import Any

import torch
import ttnn

from .tensors import HostReadback, host_bytes, new_host_tensor


def _tensor(data: bytes, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    flat = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0)
    return flat.view(dtype).reshape(shape) if data else torch.empty(shape, dtype=dtype)


def _reduce_tensor(t: torch.Tensor) -> tuple[Any, ...]:
    whole = t.untyped_storage().nbytes() == t.numel() * t.element_size()
    if not whole or not t.is_contiguous() or t.storage_offset():
        raise pickle.PicklingError(
            f"cannot snapshot a view of another tensor (shape {list(t.shape)}): keep the owner, "
            "or drop the view when the state is copied (a cache)")
    return _tensor, (t.detach().contiguous().view(torch.uint8).reshape(-1).numpy().tobytes()
                     if t.numel() else b"", t.dtype, tuple(t.shape))


def _host(cls: type, data: bytes, shape: tuple[int, ...], dtype: ttnn.DataType) -> ttnn.Tensor:
    host = new_host_tensor(shape, dtype, cls)
    host_bytes(host).copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    return host


def _reduce_host(t: ttnn.Tensor) -> tuple[Any, ...]:
    if t.storage_type() != ttnn.StorageType.HOST:
        raise pickle.PicklingError("cannot snapshot a chip's tensor: only host tensors and "
                                   "emulated device tensors copy")
    shape = tuple(int(d) for d in t.shape)
    return _host, (type(t), host_bytes(t).numpy().tobytes(), shape, t.dtype)


_MEMORY_CONFIGS = {name: getattr(ttnn, name) for name in ("DRAM_MEMORY_CONFIG", "L1_MEMORY_CONFIG")}


def _memory_config(name: str) -> ttnn.MemoryConfig:
    return _MEMORY_CONFIGS[name]  # a value: copies may share it


def _reduce_memory_config(config: ttnn.MemoryConfig) -> tuple[Any, ...]:
    for name, known in _MEMORY_CONFIGS.items():
        if config == known:
            return _memory_config, (name,)
    raise pickle.PicklingError(f"cannot snapshot memory config {config}")


class _Gone:
    """Something to hold a weak reference to for an instant: what a dead reference pointed at."""


def _dead_ref() -> weakref.ref[Any]:
    return weakref.ref(_Gone())  # its referent is freed at once: a dead weak reference


def _reduce_weakref(ref: weakref.ref[Any]) -> tuple[Any, ...]:
    # Held weakly in the copy too: alive there exactly while something in the copy holds it.
    target = ref()
    return (weakref.ref, (target,)) if target is not None else (_dead_ref, ())


_REDUCERS: dict[type, Any] = {
    torch.Tensor: _reduce_tensor,
    ttnn.Tensor: _reduce_host,
    HostReadback: _reduce_host,
    ttnn.MemoryConfig: _reduce_memory_config,
    weakref.ReferenceType: _reduce_weakref,
}


def _reduce_enum(member: enum.Enum) -> Any:
    # By name, as a global (no call when loading); the default reduce calls the class.
    cls = type(member)
    if "<" in cls.__qualname__ or getattr(cls, member.name, None) is not member:
        return member.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
    return f"{cls.__qualname__}.{member.name}"


def _reduce_namedtuple(value: tuple[Any, ...]) -> tuple[Any, ...]:
    # Built by tuple.__new__ when loading (C), not by the class's generated Python __new__.
    return tuple.__new__, (type(value), tuple(value))


def _namedtuple_classes(root: type = tuple) -> list[type]:
    out: list[type] = []
    subclasses: list[type] = root.__subclasses__()
    for sub in subclasses:
        if hasattr(sub, "_fields") and "<" not in sub.__qualname__:
            out.append(sub)
        out += _namedtuple_classes(sub)
    return out


def _enum_classes(root: type = enum.Enum) -> list[type]:
    out: list[type] = []
    subclasses: list[type] = root.__subclasses__()
    for sub in subclasses:
        out.append(sub)
        out += _enum_classes(sub)
    return out


_DISPATCH: dict[type, Any] = {}


def _dispatch() -> dict[type, Any]:
    """The reducers, enum and named-tuple classes included: those defined once the first
    snapshot is taken (one defined later is saved the default way: correct, a little slower)."""
    if not _DISPATCH:
        _DISPATCH.update(copyreg.dispatch_table)
        _DISPATCH.update({cls: _reduce_enum for cls in _enum_classes()})
        _DISPATCH.update({cls: _reduce_namedtuple for cls in _namedtuple_classes()})
        _DISPATCH.update(_REDUCERS)
    return _DISPATCH


def snapshot(obj: object) -> bytes:
    """`obj` and everything it reaches, as bytes that `restore` turns into a copy."""
    out = io.BytesIO()
    pickler = pickle.Pickler(out, protocol=pickle.HIGHEST_PROTOCOL)
    pickler.dispatch_table = _dispatch()
    pickler.dump(obj)
    return out.getvalue()


def restore(data: bytes) -> Any:
    """A fresh copy of what `snapshot` saved (independent of it and of every other copy)."""
    return pickle.loads(data)
