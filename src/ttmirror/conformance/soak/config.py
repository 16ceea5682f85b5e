"""What a soak run is asked for (`soak.py`), checked before any work: no torch, no ttnn here,
so a bad argument costs nothing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Clock = Literal["simulated", "threaded"]
CLOCKS: tuple[Clock, ...] = ("simulated", "threaded")
Where = Literal["host", "process"]
WHERES: tuple[Where, ...] = ("host", "process")


@dataclass(frozen=True)
class SoakConfig:
    steps: int = 2_000
    """Steps to schedule; then arrivals stop and the engine drains."""
    fault_rate: float = 0.01
    """Chance, before each engine iteration, that one device fault is armed."""
    seed: int = 0
    model: str = "probe"
    rows: int = 6
    kv_tokens: int = 48
    """The KV budget: tight enough that full rows of long requests must preempt."""
    trace: bool = False
    """Replay the decode step as a captured trace (its refusal joins the faults)."""
    readback_timeout_s: float = 1.0
    """The engine's readback deadline (wall-clock, as on a chip). A late read lands once the host
    gave up on it (simulated clock), or `stall_factor` times the deadline after issue (threaded)."""
    stall_factor: float = 1.5
    """Between 1 (the host gives up first) and 2 (the next wait, queued behind, does not)."""
    logprobs: int = 3
    """Top logprobs a request may ask for (the logprob ring's width; about half the requests
    ask for 0 to this many); 0: the engine has no logprob ring and no request asks."""
    clock: Clock = "simulated"
    """simulated: the device completes commands on a simulated clock (`TimedScheduler`, seeded
    by `seed`), in the host's thread, so a seed replays the run exactly, interleavings and late
    reads included; threaded: a worker thread per command queue, real concurrency, which the
    seed does not replay."""
    device: Where = "host"
    """Where the emulated device's queues and kernels run: the host's process, or a device
    process of their own (simulated clock: gated, each command run there when the clock
    completes it, so the seed still replays; threaded: free-running there)."""

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"--steps must be 1 or more, got {self.steps}")
        if not 0 <= self.fault_rate <= 1:
            raise ValueError(f"--fault-rate must be in [0, 1], got {self.fault_rate}")
        if not self.readback_timeout_s > 0:
            raise ValueError(f"--timeout must be positive, got {self.readback_timeout_s}")
        if not 1 < self.stall_factor < 2:
            raise ValueError(f"the stall factor must be in (1, 2), got {self.stall_factor}")
        if self.logprobs < 0:
            raise ValueError(f"--logprobs must be 0 or more, got {self.logprobs}")
        if self.clock not in CLOCKS:
            raise ValueError(f"--clock must be one of {', '.join(CLOCKS)}, got {self.clock!r}")
        if self.device not in WHERES:
            raise ValueError(f"--device must be one of {', '.join(WHERES)}, got {self.device!r}")
        if self.rows < 1 or self.kv_tokens < 1:
            raise ValueError("rows and the KV budget must be 1 or more")
