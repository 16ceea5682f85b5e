"""Device faults on the emulated device, armed at run time (emulated only: a chip fails alone).

A chip reports a failed call by raising `RuntimeError` (TT_THROW / TT_FATAL) from the ttnn call,
or by never signalling an event. The injector makes the emulated device do the same, at the
moment a test or the soak chooses:

- `arm(call)`: the next matching host call raises, and enqueues nothing. `call` is one of
  `CALLS`; for `"op"`, `op` narrows it to programs of that name. `skip` lets that many
  matching calls through first.
- `arm("read", stall_s=S)`: the next non-blocking read is accepted, but its copy completes late:
  its event does not fire in time, so a host that waits with a deadline gives up first.
  Everything behind it on its queue waits too, in order. How late is the scheduler's
  (`Scheduler.stall`): S seconds after it was enqueued by the wall clock, or, on the
  `TimedScheduler`'s simulated clock, at the host's first call after it gave up waiting.
- `lose(reason)`: the device is gone (closed under its user): every later call raises, until
  its owner closes it.

With nothing armed every check is one failed truth test. Which call fails is decided by the
caller's seed (the soak's RNG), never by the injector, so a seed replays the same faults.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

CALLS = ("allocate", "write", "op", "execute_trace", "read", "event", "sync")
"""Host calls a fault can hit: allocation, host-to-device writes, programs (ops), trace replays,
device-to-host reads, event record/wait, and host synchronisation."""


class InjectedFault(RuntimeError):
    """What an armed call raises: a RuntimeError, as a chip's TT_THROW is."""


@dataclass
class Armed:
    call: str
    op: str | None = None
    skip: int = 0
    stall_s: float | None = None

    def matches(self, call: str, name: str) -> bool:
        return call == self.call and (self.op is None or self.op == name)


class FaultInjector:
    def __init__(self) -> None:
        self.armed: list[Armed] = []
        self.lost: str | None = None
        self.injected: Counter[str] = Counter()
        """Faults that fired, by call ("stall" for stalled reads, "lost" for refused calls)."""

    @property
    def active(self) -> bool:
        return bool(self.armed) or self.lost is not None

    def arm(self, call: str, *, op: str | None = None, skip: int = 0,
            stall_s: float | None = None) -> None:
        """Fail the (skip+1)-th next host call of kind `call` (a program named `op`, if given)."""
        if call not in CALLS:
            raise ValueError(f"unknown call {call!r}; choose one of: {', '.join(CALLS)}")
        if stall_s is not None and (call != "read" or stall_s <= 0):
            raise ValueError("stall_s: a positive delay, for a read only")
        if skip < 0:
            raise ValueError(f"skip must be 0 or more, got {skip}")
        self.armed.append(Armed(call, op, skip, stall_s))

    def disarm(self) -> None:
        """Forget every armed fault that has not fired."""
        self.armed.clear()

    def lose(self, reason: str = "the device was closed", *, injected: bool = True) -> None:
        """Every later call raises (the owner's close still works); `injected`: the loss was
        the caller's doing (a test's), not the device's own failure."""
        self.lost = reason + (" (injected)" if injected else "")

    def check(self, call: str, name: str) -> float | None:
        """Raise if `call` (`name`: the op or command) must fail now; a stall's seconds for a
        read that must complete late; else None."""
        if self.lost is not None:
            self.injected["lost"] += 1
            raise InjectedFault(f"TT_FATAL: {name}: {self.lost}")
        for i, armed in enumerate(self.armed):
            if not armed.matches(call, name):
                continue
            if armed.skip:
                armed.skip -= 1
                return None
            del self.armed[i]
            if armed.stall_s is not None:
                self.injected["stall"] += 1
                return armed.stall_s
            self.injected[call] += 1
            raise InjectedFault(f"TT_THROW: {name} failed on device 0 (injected {call} fault)")
        return None
