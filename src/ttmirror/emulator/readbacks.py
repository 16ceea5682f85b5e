"""Non-blocking readbacks still pending on the host side, one table per emulated device.

A non-blocking read returns a host tensor at once; the device fills it when the read command
completes. Until the host has synchronised with that completion (an event recorded after the read,
`synchronize_device`, or a later blocking read on the queue), reading the tensor is a hazard, and
so is dropping it (upstream once freed such a tensor under an in-flight copy). The device owns its
table (`EmulatedMeshDevice.readbacks`) and its API object (`api.py`) consults it when the host
reads a tensor. Keyed by object id because ttnn host tensors cannot be weak-referenced;
`HostReadback` can.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ttnn

from .commands import Command


@dataclass(eq=False)
class PendingReadback:
    owner: Any  # the EmulatedMeshDevice
    command: Command
    host: Callable[[], ttnn.Tensor | None]  # a weakref, or a closure pinning the tensor

    @property
    def synchronised(self) -> bool:
        return self.owner.ordering.host_has_seen(self.command.cq, self.command.index)


class PendingReadbacks:
    """The readbacks of one device whose host tensors the host has not synchronised with."""

    def __init__(self, owner: Any) -> None:
        self.owner = owner
        self._pending: dict[int, PendingReadback] = {}
        self._lock = threading.Lock()

    def register(self, command: Command, host: ttnn.Tensor, *,
                 on_drop: Callable[[PendingReadback], None] | None) -> None:
        key = id(host)
        if on_drop is not None:
            # Weakly held: dropping the tensor must be observable, not prevented.
            def dropped(_: object) -> None:
                with self._lock:
                    record = self._pending.pop(key, None)
                if record is not None:
                    on_drop(record)

            ref: Callable[[], ttnn.Tensor | None] = weakref.ref(host, dropped)
        else:
            # A plain ttnn.Tensor cannot be weakly held: pin it until synchronised, as upstream
            # does.
            def ref() -> ttnn.Tensor | None:
                return host

        with self._lock:
            self._pending[key] = PendingReadback(self.owner, command, ref)

    def lookup(self, host: Any) -> PendingReadback | None:
        """The unsynchronised readback filling `host`, if any; forgets synchronised ones."""
        with self._lock:
            record = self._pending.get(id(host))
            if record is None:
                return None
            if record.host() is not host or record.synchronised:
                del self._pending[id(host)]
                return None
            return record

    def forget_synchronised(self) -> None:
        """Drop the records (and pins) of readbacks the host has now synchronised with."""
        with self._lock:
            for key in [k for k, r in self._pending.items() if r.synchronised]:
                del self._pending[key]

    def pending(self) -> list[PendingReadback]:
        with self._lock:
            return list(self._pending.values())

    def forget_all(self) -> None:
        with self._lock:
            self._pending.clear()
