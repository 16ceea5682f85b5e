"""The ttnn API of an emulated device: an object passed to the mirror, never a patch of `ttnn`.

The emulated device's provider (`entry.py`) hands the mirror an `EmulatedTtnn` for each device it
opens (`impl/devices.py`: `ttnn_for(device)`), where a chip's provider hands the `ttnn` module
itself. Its attributes are ttnn's. Each function in `ROUTES` is a `RoutedCall`: first bound
against the installed ttnn's own signature, so a call the real API would reject (a wrong keyword,
a keyword-only argument passed by position) raises TypeError here too; then `ROUTES[name]` says
which argument owns the call, and the call goes to the emulated device only when that argument
is an emulated object, to the real function, unchanged, otherwise. Everything else (dtypes,
layouts, `Tensor`, host-only functions) is the `ttnn` module's own attribute. Nothing in `ttnn`
changes, whether or not an emulated device is open.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import ttnn

from . import checker, ops
from .commands import MeshEvent
from .device import EmulatedMeshDevice
from .signatures import Signature, introspect
from .tensors import DeviceTensor

EMULATED = (DeviceTensor, EmulatedMeshDevice, MeshEvent)
"""The objects that make a call the emulated device's."""
ANY_ARGUMENT = "*"
"""A route's owner when any argument (or a list of tensors) can make the call emulated: the ops."""
NO_OWNER = ""
"""A route's owner when the call names no device object (`command_queue`): always routed."""
HOST_READS = ("to_torch",)
"""Reads of a host tensor: reading one a non-blocking readback still fills is a hazard."""


@dataclass(frozen=True)
class Call:
    """One call of a routed ttnn function: the real function, the arguments bound by name, the
    arguments as the caller wrote them, and the API object it was made through."""

    original: Callable[..., Any]
    bound: dict[str, Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    api: EmulatedTtnn

    def passthrough(self) -> Any:
        return self.original(*self.args, **self.kwargs)

    def cq(self, key: str) -> int:
        """The queue argument `key` names, else the innermost `command_queue` block's."""
        value = self.bound.get(key)
        return self.api.current_cq() if value is None else int(value)


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


def routes(name: str, owner: str) -> Callable[[Handler], Handler]:
    """Register the decorated handler for ttnn.<name>, for calls whose `owner` is emulated."""

    def register(handler: Handler) -> Handler:
        ROUTES[name] = Route(name, owner, handler)
        return handler

    return register


class RoutedCall:
    """One ttnn callable of one `EmulatedTtnn`: checks the real signature, then follows its route.

    Other attributes (e.g. `golden_function`, so `ttnn.get_golden_function` keeps working) come
    from the original.
    """

    def __init__(self, api: EmulatedTtnn, route: Route, original: Any,
                 signature: Signature) -> None:
        self._api = api
        self._route = route
        self._original = original
        self._signature = signature
        self.__doc__ = getattr(original, "__doc__", None)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        device = self._api.device
        device.hazards.raise_deferred()
        call = Call(self._original, self._signature.bind(args, kwargs), args, kwargs, self._api)
        if not self._route.emulated(call.bound):
            if self._route.name in HOST_READS:
                record = device.readbacks.lookup(call.bound.get("tensor"))
                if record is not None:
                    device.check_host_read(record)
            return call.passthrough()
        self._api.host_calls[self._route.name] += 1
        return self._route.handler(call)

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._original, attribute)

    def __repr__(self) -> str:
        return f"<ttnn.{self._route.name} of an emulated device, else {self._original!r}>"


class EmulatedTtnn:
    """The ttnn API as the mirror calls it, for one emulated device (and any emulated object a
    call is given): the routed functions, and the `ttnn` module's other attributes."""

    def __init__(self, device: EmulatedMeshDevice) -> None:
        self.device = device
        self.host_calls: Counter[str] = Counter()
        """Calls the host made through this API to an emulated device, by ttnn function (what a
        step costs the host)."""
        self._queues = threading.local()

    def current_cq(self) -> int:
        """The thread's default CQ for ops (`with api.command_queue(cq):`), 0 by default."""
        stack = getattr(self._queues, "stack", None)
        return stack[-1] if stack else 0

    @contextlib.contextmanager
    def queue(self, cq_id: int) -> Iterator[None]:
        """What `command_queue(cq_id)` returns: ops in the block go to `cq_id`."""
        stack = self._queues.__dict__.setdefault("stack", [])
        stack.append(cq_id)
        try:
            yield
        finally:
            stack.pop()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("device", "host_calls", "_queues"):
            raise AttributeError(name)  # copy and pickle look for these before they exist
        route = ROUTES.get(name)
        if route is None:
            return getattr(ttnn, name)  # dtypes, layouts, types, host-only functions
        routed = RoutedCall(self, route, getattr(ttnn, name), SIGNATURES[name])
        self.__dict__[name] = routed  # built once per API object
        return routed

    def __getstate__(self) -> dict[str, Any]:
        return {"device": self.device, "host_calls": self.host_calls}  # no calls, no queues

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._queues = threading.local()

    def __repr__(self) -> str:
        return f"<the ttnn API of emulated device {id(self.device):#x}>"


# --- handlers, one per routed function -----------------------------------------------------------


@routes("command_queue", NO_OWNER)
def _command_queue(call: Call) -> Any:
    cq_id = call.bound["cq_id"]
    if cq_id is None:
        raise ValueError("cq_id cannot be None in command_queue context")
    return call.api.queue(int(cq_id))


@routes("close_mesh_device", "mesh_device")
def _close_mesh_device(call: Call) -> Any:
    device: EmulatedMeshDevice = call.bound["mesh_device"]
    device.close()
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
    return target.device().write(b["host_tensor"], target, call.cq("cq_id"))


@routes("copy_device_to_host_tensor", "device_tensor")
def _copy_device_to_host_tensor(call: Call) -> Any:
    b = call.bound
    source: DeviceTensor = b["device_tensor"]
    source.device().read(
        source,
        cq=call.cq("cq_id"),
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
        tensor, cq=call.cq("queue_id"), blocking=bool(b.get("blocking", True)),
        name="from_device",
    )


@routes("to_device", "device")
def _to_device(call: Call) -> Any:
    b = call.bound
    host = b["tensor"]
    return b["device"].upload(host, host.layout, call.cq("queue_id"), b.get("memory_config"))


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
    return b["device"].upload(host, layout, call.cq("cq_id"), b.get("memory_config"))


@routes("to_torch", "tensor")
def _to_torch(call: Call) -> Any:
    b = call.bound
    tensor: DeviceTensor = b["tensor"]
    host = tensor.device().read(tensor, cq=call.cq("cq_id"), blocking=True, name="to_torch")
    rest = {k: v for k, v in call.kwargs.items() if k not in ("tensor", "device", "cq_id")}
    return call.original(host, *call.args[1:], **rest)


@routes("record_event", "mesh_device")
def _record_event(call: Call) -> Any:
    return call.bound["mesh_device"].record_event(call.cq("cq_id"))


@routes("wait_for_event", "mesh_event")
def _wait_for_event(call: Call) -> Any:
    event: MeshEvent = call.bound["mesh_event"]
    return event.device.wait_for_event(call.cq("cq_id"), event)


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
    return call.bound["mesh_device"].begin_trace_capture(call.cq("cq_id"))


@routes("end_trace_capture", "mesh_device")
def _end_trace_capture(call: Call) -> Any:
    b = call.bound
    return b["mesh_device"].end_trace_capture(b["trace_id"], call.cq("cq_id"))


@routes("execute_trace", "mesh_device")
def _execute_trace(call: Call) -> Any:
    b = call.bound
    return b["mesh_device"].execute_trace(
        b["trace_id"], call.cq("cq_id"), bool(b.get("blocking", True))
    )


@routes("release_trace", "mesh_device")
def _release_trace(call: Call) -> Any:
    return call.bound["mesh_device"].release_trace(call.bound["trace_id"])


def _op_route(name: str) -> Handler:
    plan = ops.OPS[name]

    def handler(call: Call) -> Any:
        checker.check(name, call.bound)  # what a chip refuses, refused here: eager or captured
        return plan(call.bound, call.api.current_cq())

    return handler


for _name in ops.OPS:
    routes(_name, ANY_ARGUMENT)(_op_route(_name))

# Real signatures: the installed ttnn's, which nothing here changes.
SIGNATURES: dict[str, Signature] = {
    name: introspect(getattr(ttnn, name), f"ttnn.{name}") for name in ROUTES
}

