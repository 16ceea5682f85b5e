"""ttnn's device-side calls, routed to the emulated devices while one is open.

`attach(device)` is called by `open_device` (`entry.py`, the only way to obtain an emulated
device): the first attach replaces the routed attributes of the real `ttnn` module (and a few
`ttnn.Tensor` methods) with `RoutedCall`s, and the last `detach` (run when an emulated device
closes) puts the originals back. Importing ttmirror, or building a backend, changes nothing; a
process that never opens an emulated device (one with a chip) runs the real ttnn untouched.

While routing is active it is scoped to emulated objects. A routed call is first bound against the
installed ttnn's own signature, so a call the real API would reject (a wrong keyword, a
keyword-only argument passed by position) raises TypeError here too. Then `ROUTES[name]` says which
argument owns the call: the call goes to the emulated device only when that argument is an
emulated object, and to the real function, unchanged, otherwise.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import ttnn

from ..impl.devices import chip_present
from . import checker, ops, readbacks
from . import device as device_module
from .commands import MeshEvent
from .device import EmulatedMeshDevice
from .signatures import Signature, introspect, introspect_method
from .tensors import DeviceTensor

EMULATED = (DeviceTensor, EmulatedMeshDevice, MeshEvent)
"""The objects that make a call the emulated device's."""
ANY_ARGUMENT = "*"
"""A route's owner when any argument (or a list of tensors) can make the call emulated: the ops."""
NO_OWNER = ""
"""A route's owner when the call names no device object (`command_queue`): always routed."""


@dataclass(frozen=True)
class Call:
    """One call of a routed ttnn function: the real function, the arguments bound by name, and
    the arguments as the caller wrote them."""

    original: Callable[..., Any]
    bound: dict[str, Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def passthrough(self) -> Any:
        return self.original(*self.args, **self.kwargs)


Handler = Callable[[Call], Any]


@dataclass(frozen=True)
class Route:
    """How ttnn.<name> reaches the emulated device."""

    name: str
    owner: str
    """The argument whose value decides, `ANY_ARGUMENT`, or `NO_OWNER`."""
    handler: Handler

    def emulated(self, bound: dict[str, Any]) -> bool:
        """Whether this call belongs to the emulated device."""
        if self.owner == NO_OWNER:
            return True
        values = bound.values() if self.owner == ANY_ARGUMENT else (bound.get(self.owner),)
        for value in values:
            if isinstance(value, EMULATED):
                return True
            if isinstance(value, list | tuple) and any(isinstance(v, DeviceTensor) for v in value):
                return True
        return False


ROUTES: dict[str, Route] = {}
"""ttnn function name -> its route: the table of everything the emulated device answers."""
HOST_CALLS: Counter[str] = Counter()
"""Calls the host made to the emulated device, by ttnn function (what a step costs the host)."""


def routes(name: str, owner: str) -> Callable[[Handler], Handler]:
    """Register the decorated handler for ttnn.<name>, for calls whose `owner` is emulated."""

    def register(handler: Handler) -> Handler:
        ROUTES[name] = Route(name, owner, handler)
        return handler

    return register


class RoutedCall:
    """Stands in for one ttnn callable: checks the real signature, then follows its route.

    Other attributes (e.g. `golden_function`, so `ttnn.get_golden_function` keeps working) come
    from the original.
    """

    def __init__(self, route: Route, original: Any, signature: Signature) -> None:
        self._route = route
        self._original = original
        self._signature = signature
        self.__doc__ = getattr(original, "__doc__", None)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        for device in open_devices():
            device.hazards.raise_deferred()
        call = Call(self._original, self._signature.bind(args, kwargs), args, kwargs)
        if not self._route.emulated(call.bound):
            return call.passthrough()
        HOST_CALLS[self._route.name] += 1
        return self._route.handler(call)

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._original, attribute)

    def __repr__(self) -> str:
        return f"<routed ttnn.{self._route.name} -> emulated device or {self._original!r}>"


# --- command queues ------------------------------------------------------------------------------

_cq_stack = threading.local()


def current_cq() -> int:
    """The thread's default CQ for ops (`with ttnn.command_queue(cq):`), 0 by default."""
    stack = getattr(_cq_stack, "stack", None)
    return stack[-1] if stack else 0


def _cq(value: Any) -> int:
    return current_cq() if value is None else int(value)


@contextlib.contextmanager
def _command_queue(call: Call) -> Iterator[None]:
    cq_id = call.bound["cq_id"]
    if cq_id is None:
        raise ValueError("cq_id cannot be None in command_queue context")
    stack = _cq_stack.__dict__.setdefault("stack", [])
    stack.append(int(cq_id))
    try:
        with call.passthrough() if chip_present() else contextlib.nullcontext():
            yield  # beside a chip, its ops see the queue too
    finally:
        stack.pop()


# --- handlers, one per routed function -----------------------------------------------------------


@routes("command_queue", NO_OWNER)
def _command_queue_route(call: Call) -> Any:
    return _command_queue(call)


@routes("close_mesh_device", "mesh_device")
def _close_mesh_device(call: Call) -> Any:
    device: EmulatedMeshDevice = call.bound["mesh_device"]
    device.close()  # detaches it: the last one to close restores ttnn
    device.hazards.raise_deferred()  # what was found while closing must not be lost
    return None


@routes("allocate_tensor_on_device", "mesh_device")
def _allocate_tensor_on_device(call: Call) -> Any:
    b = call.bound
    device: EmulatedMeshDevice = b["mesh_device"]
    if "tensor_spec" in b:
        spec = b["tensor_spec"]
        return device.allocate(tuple(spec.shape), spec.dtype, spec.layout, spec.memory_config)
    return device.allocate(
        tuple(int(d) for d in b["shape"]), b["dtype"], b["layout"], b.get("memory_config")
    )


@routes("deallocate", "tensor")
def _deallocate(call: Call) -> Any:
    tensor: DeviceTensor = call.bound["tensor"]
    return tensor.device().deallocate(tensor, force=bool(call.bound.get("force", True)))


@routes("copy_host_to_device_tensor", "device_tensor")
def _copy_host_to_device_tensor(call: Call) -> Any:
    b = call.bound
    target: DeviceTensor = b["device_tensor"]
    return target.device().write(b["host_tensor"], target, _cq(b.get("cq_id")))


@routes("copy_device_to_host_tensor", "device_tensor")
def _copy_device_to_host_tensor(call: Call) -> Any:
    b = call.bound
    source: DeviceTensor = b["device_tensor"]
    source.device().read(
        source,
        cq=_cq(b.get("cq_id")),
        blocking=bool(b.get("blocking", True)),
        into=b["host_tensor"],
        name="copy_device_to_host_tensor",
    )
    return None


@routes("from_device", "tensor")
def _from_device(call: Call) -> Any:
    b = call.bound
    tensor: DeviceTensor = b["tensor"]
    return tensor.device().read(
        tensor, cq=_cq(b.get("queue_id")), blocking=bool(b.get("blocking", True)),
        name="from_device",
    )


@routes("to_device", "device")
def _to_device(call: Call) -> Any:
    b = call.bound
    host = b["tensor"]
    return b["device"].upload(host, host.layout, _cq(b.get("queue_id")), b.get("memory_config"))


@routes("from_torch", "device")
def _from_torch(call: Call) -> Any:
    b, args = call.bound, call.args
    spec = b.get("spec")
    layout = (spec.layout if spec is not None else b.get("layout")) or ttnn.ROW_MAJOR_LAYOUT
    # The host conversion is real ttnn's (ROW_MAJOR: TILE host tensors need a chip); then upload.
    host_kwargs = {
        k: v
        for k, v in call.kwargs.items()
        if k not in ("device", "layout", "memory_config", "cq_id", "spec")
    }
    if spec is not None:
        host_kwargs["dtype"] = spec.dtype
    host = call.original(*args[:2], **host_kwargs, layout=ttnn.ROW_MAJOR_LAYOUT)
    return b["device"].upload(host, layout, _cq(b.get("cq_id")), b.get("memory_config"))


@routes("to_torch", "tensor")
def _to_torch(call: Call) -> Any:
    b = call.bound
    tensor: DeviceTensor = b["tensor"]
    host = tensor.device().read(tensor, cq=_cq(b.get("cq_id")), blocking=True, name="to_torch")
    rest = {k: v for k, v in call.kwargs.items() if k not in ("tensor", "device", "cq_id")}
    return call.original(host, *call.args[1:], **rest)


@routes("record_event", "mesh_device")
def _record_event(call: Call) -> Any:
    return call.bound["mesh_device"].record_event(_cq(call.bound.get("cq_id")))


@routes("wait_for_event", "mesh_event")
def _wait_for_event(call: Call) -> Any:
    event: MeshEvent = call.bound["mesh_event"]
    return event.device.wait_for_event(_cq(call.bound.get("cq_id")), event)


@routes("event_synchronize", "mesh_event")
def _event_synchronize(call: Call) -> Any:
    event: MeshEvent = call.bound["mesh_event"]
    return event.device.event_synchronize(event)


@routes("synchronize_device", "device")
def _synchronize_device(call: Call) -> Any:
    cq = call.bound.get("cq_id")
    return call.bound["device"].synchronize(None if cq is None else int(cq))


@routes("begin_trace_capture", "mesh_device")
def _begin_trace_capture(call: Call) -> Any:
    return call.bound["mesh_device"].begin_trace_capture(_cq(call.bound.get("cq_id")))


@routes("end_trace_capture", "mesh_device")
def _end_trace_capture(call: Call) -> Any:
    b = call.bound
    return b["mesh_device"].end_trace_capture(b["trace_id"], _cq(b.get("cq_id")))


@routes("execute_trace", "mesh_device")
def _execute_trace(call: Call) -> Any:
    b = call.bound
    return b["mesh_device"].execute_trace(
        b["trace_id"], _cq(b.get("cq_id")), bool(b.get("blocking", True))
    )


@routes("release_trace", "mesh_device")
def _release_trace(call: Call) -> Any:
    return call.bound["mesh_device"].release_trace(call.bound["trace_id"])


def _op_route(name: str) -> Handler:
    plan = ops.OPS[name]

    def handler(call: Call) -> Any:
        checker.check(name, call.bound)  # what a chip refuses, refused here: eager or captured
        return plan(call.bound, current_cq())

    return handler


for _name in ops.OPS:
    routes(_name, ANY_ARGUMENT)(_op_route(_name))

# Real signatures, read before anything is patched.
SIGNATURES: dict[str, Signature] = {
    name: introspect(getattr(ttnn, name), f"ttnn.{name}") for name in ROUTES
}

# --- ttnn.Tensor methods --------------------------------------------------------------------------

_TENSOR_TO = introspect_method(ttnn.Tensor, "to")
_HOST_READS = ("to_torch", "to_numpy", "to_list", "item")
"""Host tensor methods that read values: a pending non-blocking readback must not be read."""


def _routed_to(original: Callable[..., Any]) -> Callable[..., Any]:
    def to(self: ttnn.Tensor, *args: Any, **kwargs: Any) -> Any:
        bound = _TENSOR_TO.bind(args, kwargs)
        device = bound.get("device")
        if isinstance(device, EmulatedMeshDevice):
            return device.upload(
                self, self.layout, _cq(bound.get("cq_id")), bound.get("mem_config")
            )
        return original(self, *args, **kwargs)

    to.__doc__ = original.__doc__
    return to


def _checked_host_read(original: Callable[..., Any]) -> Callable[..., Any]:
    def read(self: ttnn.Tensor, *args: Any, **kwargs: Any) -> Any:
        record = readbacks.lookup(self)
        if record is not None:
            record.owner.check_host_read(record)
        return original(self, *args, **kwargs)

    read.__doc__ = original.__doc__
    return read


# --- attaching and detaching ---------------------------------------------------------------------

_lock = threading.RLock()
_attached: list[EmulatedMeshDevice] = []
_saved: list[tuple[Any, str, Any]] = []
"""(owner, attribute, original) for every patched attribute, while routing is active."""


def open_devices() -> list[EmulatedMeshDevice]:
    """The emulated devices open now (routing is active exactly while this is not empty)."""
    with _lock:
        return list(_attached)


def active() -> bool:
    """Whether ttnn's routed attributes point at the emulated device now."""
    with _lock:
        return bool(_saved)


def attach(device: EmulatedMeshDevice) -> None:
    """Route ttnn to emulated devices (from the first attached) until `device` closes."""
    with _lock:
        if not _attached:
            _patch()
        _attached.append(device)
    device.on_close.append(detach)


def detach(device: EmulatedMeshDevice) -> None:
    """`device` has closed; the last one to close restores the real ttnn."""
    with _lock:
        if device in _attached:
            _attached.remove(device)
        if not _attached:
            _restore()


device_module.ON_RESTORE.append(attach)


def _patch() -> None:
    for name, route in ROUTES.items():
        original = getattr(ttnn, name)
        _saved.append((ttnn, name, original))
        setattr(ttnn, name, RoutedCall(route, original, SIGNATURES[name]))
    _saved.append((ttnn.Tensor, "to", ttnn.Tensor.to))
    ttnn.Tensor.to = _routed_to(ttnn.Tensor.to)
    for method in _HOST_READS:
        original = getattr(ttnn.Tensor, method)
        _saved.append((ttnn.Tensor, method, original))
        setattr(ttnn.Tensor, method, _checked_host_read(original))


def _restore() -> None:
    while _saved:
        owner, attribute, original = _saved.pop()
        setattr(owner, attribute, original)
