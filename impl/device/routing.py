"""The one place where ttnn's device-side calls are routed to the emulated device.

`install()` replaces the device-side attributes of the real `ttnn` module (and a few `ttnn.Tensor`
methods) with checked forwarders, only when no chip is present; on a chip it does nothing, and the
TT code talks to real ttnn. Every forwarded call is first bound against the installed ttnn's own
signature, so a call the real API would reject (a wrong keyword, a keyword-only argument passed
by position) raises TypeError here too. Calls that involve no emulated object (host tensors, host
ops) go to the real function unchanged.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import ttnn

from . import ops, readbacks
from .commands import MeshEvent
from .detect import chip_present
from .device import DEFAULT_DRAM_SIZE, EmulatedMeshDevice
from .hazards import HazardMode
from .schedulers import ManualScheduler, Scheduler
from .signatures import Signature, introspect, introspect_method
from .tensors import DeviceTensor

Handler = Callable[[Callable[..., Any], dict[str, Any], tuple[Any, ...], dict[str, Any]], Any]


@dataclass
class Settings:
    """How `ttnn.open_mesh_device` builds emulated devices."""

    scheduler: Callable[[], Scheduler] = ManualScheduler
    hazard_mode: HazardMode = "raise"
    dram_size: int = DEFAULT_DRAM_SIZE


settings = Settings()
_open: list[EmulatedMeshDevice] = []  # devices opened through ttnn.open_mesh_device, until closed
_originals: dict[str, Any] = {}
_method_originals: dict[str, Any] = {}
_cq_stack = threading.local()


def open_devices() -> list[EmulatedMeshDevice]:
    return list(_open)


def current_cq() -> int:
    """The thread's default CQ for ops (`with ttnn.command_queue(cq):`), 0 by default."""
    stack = getattr(_cq_stack, "stack", None)
    return stack[-1] if stack else 0


@contextlib.contextmanager
def _command_queue(cq_id: int) -> Iterator[None]:
    if cq_id is None:
        raise ValueError("cq_id cannot be None in command_queue context")
    stack = _cq_stack.__dict__.setdefault("stack", [])
    stack.append(int(cq_id))
    try:
        yield
    finally:
        stack.pop()


def _cq(value: Any) -> int:
    return current_cq() if value is None else int(value)


def _emulated(*values: Any) -> bool:
    for value in values:
        if isinstance(value, DeviceTensor | EmulatedMeshDevice | MeshEvent):
            return True
        if isinstance(value, list | tuple) and any(isinstance(v, DeviceTensor) for v in value):
            return True
    return False


class RoutedCall:
    """Stands in for one ttnn callable: checks the real signature, then routes the call.

    Other attributes (e.g. `golden_function`, so `ttnn.get_golden_function` keeps working) come
    from the original.
    """

    def __init__(self, name: str, original: Any, signature: Signature, handler: Handler) -> None:
        self._name = name
        self._original = original
        self._signature = signature
        self._handler = handler
        self.__doc__ = getattr(original, "__doc__", None)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        for device in _open:
            device.hazards.raise_deferred()
        bound = self._signature.bind(args, kwargs)
        return self._handler(self._original, bound, args, kwargs)

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._original, attribute)

    def __repr__(self) -> str:
        return f"<routed {self._name} -> emulated device or {self._original!r}>"


# --- handlers ------------------------------------------------------------------------------------


def _open_mesh_device(
    original: Callable[..., Any], b: dict[str, Any], args: tuple, kwargs: dict
) -> Any:
    device = EmulatedMeshDevice(
        num_command_queues=int(b.get("num_command_queues", 1)),
        trace_region_size=int(b.get("trace_region_size", 0)),
        l1_small_size=int(b.get("l1_small_size", 0)),
        dram_size=settings.dram_size,
        scheduler=settings.scheduler(),
        hazard_mode=settings.hazard_mode,
    )
    _open.append(device)
    return device


def _close_mesh_device(
    original: Callable[..., Any], b: dict[str, Any], args: tuple, kwargs: dict
) -> Any:
    device = b["mesh_device"]
    if not isinstance(device, EmulatedMeshDevice):
        return original(*args, **kwargs)
    if device in _open:
        _open.remove(device)
    device.close()
    device.hazards.raise_deferred()  # what was found while closing must not be lost
    return None


def _allocate_tensor_on_device(
    original: Callable[..., Any], b: dict[str, Any], args: tuple, kwargs: dict
) -> Any:
    device = b["mesh_device"]
    if not isinstance(device, EmulatedMeshDevice):
        return original(*args, **kwargs)
    if "tensor_spec" in b:
        spec = b["tensor_spec"]
        return device.allocate(tuple(spec.shape), spec.dtype, spec.layout, spec.memory_config)
    return device.allocate(
        tuple(int(d) for d in b["shape"]), b["dtype"], b["layout"], b.get("memory_config")
    )


def _deallocate(original: Callable[..., Any], b: dict[str, Any], args: tuple, kwargs: dict) -> Any:
    tensor = b["tensor"]
    if not isinstance(tensor, DeviceTensor):
        return original(*args, **kwargs)
    return tensor.device().deallocate(tensor, force=bool(b.get("force", True)))


def _copy_host_to_device_tensor(
    original: Callable[..., Any], b: dict[str, Any], args: tuple, kwargs: dict
) -> Any:
    target = b["device_tensor"]
    if not isinstance(target, DeviceTensor):
        return original(*args, **kwargs)
    return target.device().write(b["host_tensor"], target, _cq(b.get("cq_id")))


def _copy_device_to_host_tensor(
    original: Callable[..., Any], b: dict[str, Any], args: tuple, kwargs: dict
) -> Any:
    source = b["device_tensor"]
    if not isinstance(source, DeviceTensor):
        return original(*args, **kwargs)
    source.device().read(
        source,
        cq=_cq(b.get("cq_id")),
        blocking=bool(b.get("blocking", True)),
        into=b["host_tensor"],
        name="copy_device_to_host_tensor",
    )
    return None


def _from_device(original: Callable[..., Any], b: dict[str, Any], args: tuple, kwargs: dict) -> Any:
    tensor = b["tensor"]
    if not isinstance(tensor, DeviceTensor):
        return original(*args, **kwargs)
    return tensor.device().read(
        tensor,
        cq=_cq(b.get("queue_id")),
        blocking=bool(b.get("blocking", True)),
        name="from_device",
    )


def _to_device(original: Callable[..., Any], b: dict[str, Any], args: tuple, kwargs: dict) -> Any:
    device = b["device"]
    if not isinstance(device, EmulatedMeshDevice):
        return original(*args, **kwargs)
    host = b["tensor"]
    return device.upload(host, host.layout, _cq(b.get("queue_id")), b.get("memory_config"))


def _from_torch(original: Callable[..., Any], b: dict[str, Any], args: tuple, kwargs: dict) -> Any:
    device = b.get("device")
    if not isinstance(device, EmulatedMeshDevice):
        return original(*args, **kwargs)
    spec = b.get("spec")
    layout = (spec.layout if spec is not None else b.get("layout")) or ttnn.ROW_MAJOR_LAYOUT
    # The host conversion is real ttnn's (ROW_MAJOR: TILE host tensors need a chip); then upload.
    host_kwargs = {
        k: v
        for k, v in kwargs.items()
        if k not in ("device", "layout", "memory_config", "cq_id", "spec")
    }
    if spec is not None:
        host_kwargs["dtype"] = spec.dtype
    host = original(*args[:2], **host_kwargs, layout=ttnn.ROW_MAJOR_LAYOUT)
    return device.upload(host, layout, _cq(b.get("cq_id")), b.get("memory_config"))


def _to_torch(original: Callable[..., Any], b: dict[str, Any], args: tuple, kwargs: dict) -> Any:
    tensor = b["tensor"]
    if not isinstance(tensor, DeviceTensor):
        return original(*args, **kwargs)
    host = tensor.device().read(tensor, cq=_cq(b.get("cq_id")), blocking=True, name="to_torch")
    rest = {k: v for k, v in kwargs.items() if k not in ("tensor", "device", "cq_id")}
    return original(host, *args[1:], **rest)


def _record_event(
    original: Callable[..., Any], b: dict[str, Any], args: tuple, kwargs: dict
) -> Any:
    device = b["mesh_device"]
    if not isinstance(device, EmulatedMeshDevice):
        return original(*args, **kwargs)
    return device.record_event(_cq(b.get("cq_id")))


def _wait_for_event(
    original: Callable[..., Any], b: dict[str, Any], args: tuple, kwargs: dict
) -> Any:
    event = b["mesh_event"]
    if not isinstance(event, MeshEvent):
        return original(*args, **kwargs)
    return event.device.wait_for_event(_cq(b.get("cq_id")), event)


def _event_synchronize(
    original: Callable[..., Any], b: dict[str, Any], args: tuple, kwargs: dict
) -> Any:
    event = b["mesh_event"]
    if not isinstance(event, MeshEvent):
        return original(*args, **kwargs)
    return event.device.event_synchronize(event)


def _synchronize_device(
    original: Callable[..., Any], b: dict[str, Any], args: tuple, kwargs: dict
) -> Any:
    device = b["device"]
    if not isinstance(device, EmulatedMeshDevice):
        return original(*args, **kwargs)
    cq = b.get("cq_id")
    return device.synchronize(None if cq is None else int(cq))


def _trace_call(method: str) -> Handler:
    def handler(original: Callable[..., Any], b: dict[str, Any], args: tuple, kwargs: dict) -> Any:
        device = b["mesh_device"]
        if not isinstance(device, EmulatedMeshDevice):
            return original(*args, **kwargs)
        if method == "begin_trace_capture":
            return device.begin_trace_capture(_cq(b.get("cq_id")))
        if method == "end_trace_capture":
            return device.end_trace_capture(b["trace_id"], _cq(b.get("cq_id")))
        if method == "execute_trace":
            return device.execute_trace(
                b["trace_id"], _cq(b.get("cq_id")), bool(b.get("blocking", True))
            )
        return device.release_trace(b["trace_id"])

    return handler


def _op(name: str) -> Handler:
    plan = ops.OPS[name]

    def handler(original: Callable[..., Any], b: dict[str, Any], args: tuple, kwargs: dict) -> Any:
        if not _emulated(*b.values()):
            return original(*args, **kwargs)
        return plan(b, current_cq())

    return handler


def _command_queue_handler(
    original: Callable[..., Any], b: dict[str, Any], args: tuple, kwargs: dict
) -> Any:
    return _command_queue(b["cq_id"])


HANDLERS: dict[str, Handler] = {
    "open_mesh_device": _open_mesh_device,
    "close_mesh_device": _close_mesh_device,
    "allocate_tensor_on_device": _allocate_tensor_on_device,
    "deallocate": _deallocate,
    "copy_host_to_device_tensor": _copy_host_to_device_tensor,
    "copy_device_to_host_tensor": _copy_device_to_host_tensor,
    "from_device": _from_device,
    "to_device": _to_device,
    "from_torch": _from_torch,
    "to_torch": _to_torch,
    "record_event": _record_event,
    "wait_for_event": _wait_for_event,
    "event_synchronize": _event_synchronize,
    "synchronize_device": _synchronize_device,
    "command_queue": _command_queue_handler,
    **{
        name: _trace_call(name)
        for name in ("begin_trace_capture", "end_trace_capture", "execute_trace", "release_trace")
    },
    **{name: _op(name) for name in ops.OPS},
}

# Real signatures, read before anything is patched.
SIGNATURES: dict[str, Signature] = {
    name: introspect(getattr(ttnn, name), f"ttnn.{name}") for name in HANDLERS
}
_TENSOR_TO = introspect_method(ttnn.Tensor, "to")
_HOST_READS = ("to_torch", "to_numpy", "to_list", "item")


def _check_host_read(tensor: Any) -> None:
    record = readbacks.lookup(tensor)
    if record is not None:
        record.owner.check_host_read(record)


def _patched_to(original: Callable[..., Any]) -> Callable[..., Any]:
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


def _patched_host_read(original: Callable[..., Any]) -> Callable[..., Any]:
    def read(self: ttnn.Tensor, *args: Any, **kwargs: Any) -> Any:
        _check_host_read(self)
        return original(self, *args, **kwargs)

    read.__doc__ = original.__doc__
    return read


# --- installing ----------------------------------------------------------------------------------


def installed() -> bool:
    return bool(_originals)


def install(
    *,
    force: bool = False,
    scheduler: Callable[[], Scheduler] | None = None,
    hazard_mode: HazardMode | None = None,
    dram_size: int | None = None,
) -> bool:
    """Route ttnn's device-side calls to emulated devices; returns whether routing is active.

    Does nothing on a machine with a chip unless `force`. Settings apply to devices opened later
    through `ttnn.open_mesh_device`.
    """
    if scheduler is not None:
        settings.scheduler = scheduler
    if hazard_mode is not None:
        settings.hazard_mode = hazard_mode
    if dram_size is not None:
        settings.dram_size = dram_size
    if _originals:
        return True
    if chip_present() and not force:
        return False
    for name, handler in HANDLERS.items():
        _originals[name] = getattr(ttnn, name)
        setattr(ttnn, name, RoutedCall(f"ttnn.{name}", _originals[name], SIGNATURES[name], handler))
    _method_originals["to"] = ttnn.Tensor.to
    ttnn.Tensor.to = _patched_to(ttnn.Tensor.to)
    for method in _HOST_READS:
        _method_originals[method] = getattr(ttnn.Tensor, method)
        setattr(ttnn.Tensor, method, _patched_host_read(_method_originals[method]))
    return True


def uninstall() -> None:
    """Restore the real ttnn attributes and close the emulated devices still open."""
    for device in open_devices():
        device.close()
    _open.clear()
    for name, original in _originals.items():
        setattr(ttnn, name, original)
    for method, original in _method_originals.items():
        setattr(ttnn.Tensor, method, original)
    _originals.clear()
    _method_originals.clear()
    settings.__init__()  # type: ignore[misc]


@contextlib.contextmanager
def emulation(
    *,
    force: bool = False,
    scheduler: Callable[[], Scheduler] | None = None,
    hazard_mode: HazardMode | None = None,
    dram_size: int | None = None,
) -> Iterator[bool]:
    """`with emulation():` routes for the block (if no chip) and restores ttnn afterwards."""
    active = install(force=force, scheduler=scheduler, hazard_mode=hazard_mode, dram_size=dram_size)
    try:
        yield active
    finally:
        if active:
            uninstall()


def bind_sampling_identity(device: Any, request_ids: Any, positions: Any) -> None:
    """Tell an emulated device which request and position each sampling row holds (device
    tensors it reads when `ttnn.sampling` runs). On a chip this is a no-op."""
    if isinstance(device, EmulatedMeshDevice):
        device.bind_sampling_identity(request_ids, positions)
