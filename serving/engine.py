"""The serving loop: the runner's phases composed into the depth-D pipeline.

One iteration schedules, combines, launches step N+1 and issues its readback, and only then
completes step N's readback and applies it, so at depth 2 the host builds step N+1 before it
knows step N's tokens (the mirror supplies them on device). Stop tokens are checked right after
the apply that delivered them; slots are released as soon as the runner allows.

Subclasses hook in through `_admit` (before each step: which requests enter the runner),
`_before_schedule(rows)` (size the step's prefill chunks) and `_scheduled(q)` (between schedule
and combine: stage what else the step needs); the serving
loop (`batching.py`) uses all three. `drain_on_layout_change` reproduces the TT plugin's policy for
comparison (benchmarks): it retires every step in flight whenever the rows change.

Device faults: a phase whose device call fails leaves the runner as it was (`DeviceFault`); the
engine then fails that step (`Runner.fail_step`): each request with a row in it closes FAILED
with the device's error (`error(req)`), its row in the other in-flight step is dropped, and
the engine goes on serving every other request. Nothing of a failed step is delivered, and its
slot is released as any retired writer's is.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from ..impl.backend import Backend
from ..impl.mutations import NONE, Mutations
from ..impl.probe import ProbeSpec
from ..impl.resolution import SchedulingConfig, resolve
from ..impl.runner import CLOSED, DeviceFault, Runner, RunnerConfig

Order = Callable[[list[int]], Sequence[int]]
"""Chooses the row order of a step from the eligible requests (condense/reorder policy)."""


@dataclass
class _Waiting:
    prompt: int
    max_tokens: int | None
    stop_ids: frozenset[int]


@dataclass
class EngineConfig:
    async_scheduling: str = "auto"
    rows: int = 8
    slots: int = 2
    max_tokens: int = 16
    probe: ProbeSpec = field(default_factory=ProbeSpec)
    trace: bool = False
    guard: bool = True
    preempt_policy: str = "keep"
    """A preempted request's in-flight tokens: "keep" (vLLM's: delivered; it resumes once it owns
    no placeholder) or "drop" (recomputed after the resume)."""
    logprobs: int = 0
    """Top logprobs per row of the logprob ring (0: none; a serving decoder computes them)."""
    record_events: bool = True
    """The runner records every accepted call as the model's action (`impl/events.py`)."""
    readback_timeout_s: float | None = None
    """How long the host waits for a step's readback before it fails the step (None: forever)."""
    mutations: Mutations = NONE
    """Planted bugs (`impl/mutations.py`), handed to the runner; none by default."""
    drain_on_layout_change: bool = False
    """The TT plugin's policy, for comparison only: before a step whose rows differ from the
    previous step's (arrival, finish, preemption, reorder), retire every step in flight. The
    mirror makes this unnecessary; it costs the overlap."""


class Engine:
    def __init__(
        self, backend: Backend, config: EngineConfig | None = None, order: Order | None = None
    ) -> None:
        self.config = config or EngineConfig()
        self.scheduling: SchedulingConfig = resolve(backend, self.config.async_scheduling)
        c = self.config
        self.runner = Runner(
            backend,
            RunnerConfig(
                depth=self.scheduling.max_concurrent_batches(),
                slots=c.slots,
                rows=c.rows,
                max_tokens=c.max_tokens,
                guard=c.guard,
                probe=c.probe,
                trace=c.trace,
                preempt_policy=c.preempt_policy,
                logprobs=c.logprobs,
                record_events=c.record_events,
                readback_timeout_s=c.readback_timeout_s,
                mutations=c.mutations,
            ),
        )
        self.order: Order = order or (lambda eligible: eligible)
        self.stop_ids: dict[int, frozenset[int]] = {}
        self._waiting: dict[int, _Waiting] = {}  # submitted, not admitted (no row free yet)
        self._layout: tuple[int, ...] = ()  # rows of the last scheduled step
        self.stats: Counter[str] = Counter()
        self.runner.allocate()

    def async_scheduling_enabled(self) -> bool:
        return self.scheduling.async_scheduling_enabled()

    def max_concurrent_batches(self) -> int:
        return self.scheduling.max_concurrent_batches()

    @property
    def last_layout(self) -> tuple[int, ...]:
        """The requests of the last scheduled step, in row order."""
        return self._layout

    # --- requests --------------------------------------------------------------------------------
    def submit(
        self, req: int, prompt: int, *, max_tokens: int | None = None, stop_ids: Iterable[int] = ()
    ) -> None:
        """Queue a request; it arrives in the runner once a row is free for it."""
        if req in self._waiting or req in self.runner.requests:
            raise ValueError(f"request {req} was already submitted")
        self._waiting[req] = _Waiting(prompt, max_tokens, frozenset(stop_ids))

    def abort(self, req: int) -> None:
        if self._waiting.pop(req, None) is None:
            self.runner.abort(req)

    def preempt(self, req: int) -> None:
        self.runner.preempt(req)

    def resume(self, req: int) -> None:
        self.runner.resume(req)

    def error(self, req: int) -> str | None:
        """Why `req` failed (the device's error for its step), or None."""
        r = self.runner.requests.get(req)
        return None if r is None else r.error

    def delivered(self, req: int) -> list[int]:
        r = self.runner.requests.get(req)
        return list(r.delivered) if r is not None else []

    def idle(self) -> bool:
        r = self.runner
        return not self._waiting and not r.queue and not r.eligible()

    # --- the loop --------------------------------------------------------------------------------
    def step(self) -> bool:
        """One iteration; False when there was nothing to launch or retire."""
        self._admit()
        r = self.runner
        launched = False
        if r.can_schedule():
            rows = list(self.order(r.eligible()))
            if self.config.drain_on_layout_change and r.queue and tuple(rows) != self._layout:
                while r.queue:
                    self._retire_oldest()
                self.stats["drains"] += 1
                rows = list(self.order(r.eligible())) if r.can_schedule() else []
            if rows:
                self._before_schedule(rows)
                q = r.schedule(rows)
                self._layout = tuple(rows)
                try:
                    with r.device_call("stage", q):
                        self._scheduled(q)
                    r.combine(q)
                    r.launch(q)
                    r.readback_issue(q)
                    launched = True
                except DeviceFault as fault:
                    self._fail(fault)
        retired = bool(r.queue) and (len(r.queue) >= r.depth or not launched)
        if retired:
            self._retire_oldest()
        return launched or retired

    def _retire_oldest(self) -> None:
        """Complete the oldest step's readback, apply it, stop-check, release what can be."""
        r = self.runner
        try:
            r.readback_complete(0)
        except DeviceFault as fault:
            self._fail(fault)
            return
        tokens = r.apply()
        for req, token in tokens.items():
            # A preempted request's kept token is stop-checked too (it may finish while preempted).
            if token in self.stop_ids.get(req, ()) and r.status(req) not in CLOSED:
                r.finish(req)
        self._release_free_slots()

    def _release_free_slots(self) -> None:
        r = self.runner
        for slot in range(len(r.slots)):
            if r.releasable(slot):
                r.release(slot)

    def _fail(self, fault: DeviceFault) -> None:
        """The device failed step `fault.q`: its requests fail with the error, the rest go on."""
        failed = self.runner.fail_step(fault.q, str(fault))
        self.stats["faults"] += 1
        self.stats[f"faults_at_{fault.phase}"] += 1
        self.stats["failed_requests"] += len(failed)
        self._release_free_slots()

    def _before_schedule(self, rows: list[int]) -> None:
        """Hook right before the step over `rows` is scheduled (none here)."""

    def _scheduled(self, q: int) -> None:
        """Hook between schedule and combine: stage what else the step needs (none here)."""

    def run(self, max_iterations: int = 1_000_000) -> None:
        for _ in range(max_iterations):
            if not self.step() and not self._waiting:
                return
        raise RuntimeError(f"the engine did not go idle within {max_iterations} iterations")

    def close(self) -> None:
        self.runner.close()

    def _admit(self) -> None:
        active = len(self.runner.open_requests())
        for req in list(self._waiting):
            if active >= self.config.rows:
                return
            w = self._waiting.pop(req)
            self.runner.arrive(req, w.prompt, max_tokens=w.max_tokens)
            self.stop_ids[req] = w.stop_ids
            active += 1
