"""The runner: the pipeline of the mirrored sampled ids (steps, their phases, the release
rules), one method per phase, each checked; the requests it serves are its request table's
(`requests.py`).

Phases and request events correspond one to one to the model's actions (same names, same
preconditions); a phase whose precondition does not hold raises `PhaseError` and changes
nothing, so a conformance driver can try any interleaving. The device work is the backend
mirror's (`backend.Mirror`); the runner decides what it does and when.

    allocate                       load: the ring and every persistent tensor (before any trace)
    arrive(r, prompt)              r is WAITING: its next step prefills from host ids
    schedule(order, drafts) -> q   a step over the eligible requests in `order` (every one, or
                                   any with `subsets`), each decoding row's drafts
    combine(q)                     stage host ids + previous-row map + mask; combine on device
    launch(q)                      forward + sample into the step's slot
    readback_issue(q)              non-blocking copy of the slot to the host, with its event
    readback_complete(q)           event synchronised: the host copy is valid
    apply()                        retire the oldest step, delivering its live rows' tokens
    release(slot)                  hand a slot back once its writer retired and no combine reads it
    release_row(idx)               state rows: hand a closed request's state row back once no
                                   in-flight step scatters into it
    fail_step(q, reason)           the device failed step q: its requests fail, nothing of it is
                                   delivered, its slot goes back through release as usual
    finish(r) / abort(r) / preempt(r) / resume(r)
    chunk_prefill(r, partial)      the serving loop's chunking: is r's next row a partial prefill

A phase whose device call fails raises `DeviceFault` and changes nothing either (every
submission is atomic); the caller then decides, with `fail_step`, what the failure costs.

`abstract()` returns an immutable snapshot of everything an abstraction function needs, and
`events` records every accepted call as the model's action (`events.py`). A step's rows are
`rows.Row` records throughout. Each decision a caller may specialise is a method of its own
(`_previous_rows`, `_release_blocker`, ...): an override (`overrides.py`) redefines one, and
`make_runner` builds the runner with the overrides its configuration names.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import IntEnum
from types import MappingProxyType
from typing import Any, NamedTuple

from .backend import Backend, DraftCopy, Mirror, MirrorSpec, StepInputs, TokenLogprobs
from .drafts import DraftSpec
from .events import EventLog
from .overrides import NONE, Overrides, built
from .probe import ProbeSpec
from .requests import CLOSED, Request, RequestTable, Status
from .rows import Row

PLACEHOLDER_ID = -1
"""What the host token table holds where the newest token is still on the device."""


class Phase(IntEnum):
    """Progress of one in-flight step (the model's numbering)."""

    SCHEDULED = 0
    COMBINED = 1
    LAUNCHED = 2
    READBACK_ISSUED = 3
    READBACK_DONE = 4


class PhaseError(RuntimeError):
    """A phase or request event was called while its precondition does not hold."""


class SlotBusyError(PhaseError):
    """A launch would rewrite a slot whose readback or next combine is still to happen."""


class DeviceFault(RuntimeError):
    """The device refused or failed a phase's call; the runner's state is as before the call."""

    def __init__(self, phase: str, q: int, cause: BaseException) -> None:
        super().__init__(f"{phase}(q={q}): {cause}" if q >= 0 else f"{phase}: {cause}")
        self.phase = phase
        self.q = q


@dataclass(frozen=True)
class RunnerConfig:
    depth: int = 2
    """max_concurrent_batches: how many steps may be in flight (1 = sync, 2 = async, 3 and 4 as
    vLLM sets it under pipeline parallelism)."""
    slots: int = 2
    """K: ring slots; step n writes slot n mod K. K >= depth keeps every launch legal."""
    rows: int = 8
    """Most requests one step can hold; every eligible request must fit."""
    max_tokens: int = 16
    """Default tokens a request generates before it finishes on its own."""
    guard: bool = True
    """The stale-host-ids guard: rows whose newest token is in flight combine from the mirror.
    False reproduces the bug class (host placeholders reach the model); never serve with it."""
    probe: ProbeSpec = field(default_factory=ProbeSpec)
    trace: bool = False
    preempt_policy: str = "keep"
    """A preempted request's in-flight tokens: "keep" (vLLM's: delivered at apply; it resumes
    only once it owns no placeholder) or "drop" (never delivered; recomputed after resume)."""
    prefill_chunks: int = 1
    """Chunks of each request's first prefill: all but the last are partial-prefill rows, whose
    sampled id is discarded and never mirrored (1 = no chunking)."""
    logprobs: int = 0
    """Top logprobs per row the mirror's logprob ring holds (0: no logprob ring); each delivered
    token then carries its `TokenLogprobs`, read back under the ids' event."""
    record_events: bool = True
    """Record every accepted call in `Runner.events` (one tuple append each)."""
    readback_timeout_s: float | None = None
    """How long `readback_complete` waits for the copy's event before it raises `DeviceFault`
    (None: as long as it takes)."""
    overrides: Overrides = NONE
    """Decision overrides (`overrides.py`) of the runner and its mirror; none by default (the
    conformance suite plants its bugs as overrides). The runner hands them to its mirror."""
    drafts: DraftSpec | None = None
    """Speculative decoding (spec rule 13): K drafts per decoding row that was in the previous
    step, verified on the device; None = no drafts."""
    subsets: bool = False
    """vLLM's scheduler freedoms (spec rule 14): a step holds any non-empty subset of the
    eligible requests, and each decoding row whose drafts exist any number of them (the
    caller's `schedule(order, drafts)`); False: every eligible request, K drafts each."""
    state: str = "ring"
    """Where the tokens the host does not know yet live on the device (spec rule 14): "ring"
    (each step's slot, read by the next combine through the previous-row map) or "rows" (a
    state row per request, allocated at arrival, gathered through each step's idx_mapping,
    scattered into by each launch's post-update, released by `release_row`)."""
    state_rows: int = 0
    """With state rows: how many the device holds (vLLM's max_num_reqs); 0 = `rows`."""

    def __post_init__(self) -> None:
        if self.logprobs < 0:
            raise ValueError(f"logprobs must be 0 or more, got {self.logprobs}")
        if not 1 <= self.depth <= 4:
            raise ValueError(
                f"depth (max_concurrent_batches) must be between 1 and 4, got {self.depth}")
        if self.state not in ("ring", "rows"):
            raise ValueError(f"state must be 'ring' or 'rows', got {self.state!r}")
        if self.state_rows and self.state != "rows":
            raise ValueError("state_rows needs state='rows'")
        if self.state_rows < 0:
            raise ValueError(f"state_rows must be 0 or more, got {self.state_rows}")
        if self.state == "ring" and self.subsets and self.depth >= 3:
            raise ValueError(
                "the ring cannot serve subsets at depth 3 or more (a request left out of the "
                "previous step has its newest token in an older slot): use state='rows'")
        if self.preempt_policy not in ("keep", "drop"):
            raise ValueError(
                f"preempt_policy must be 'keep' or 'drop', got {self.preempt_policy!r}"
            )
        if self.prefill_chunks < 1:
            raise ValueError(f"prefill_chunks must be 1 or more, got {self.prefill_chunks}")

    @property
    def table_rows(self) -> int:
        """With state rows: how many the device holds; 0 with the ring."""
        return (self.state_rows or self.rows) if self.state == "rows" else 0


# --- read-only views (what abstract() returns) ----------------------------------------------------


class StepView(NamedTuple):
    n: int
    """The step's number since load (step n writes slot n mod K)."""
    slot: int
    src_slot: int | None
    """The previous step's slot, read by this step's combine; None when no row uses it."""
    phase: Phase
    rows: tuple[Row, ...]
    host_copy: tuple[int, ...] | None
    """Sampled ids per row, once the readback completed."""
    host_counts: tuple[int, ...] = ()
    """With drafts: the counts read back with the ids (a + 1 per row)."""


class SlotView(NamedTuple):
    written: bool
    """A launch has written it (the model: content is not None)."""
    released: bool
    writer: int | None
    """Index of the step that wrote it last."""


class RequestView(NamedTuple):
    status: Status
    prompt: int
    delivered: tuple[int, ...]
    closed_at: int | None
    unchecked: bool
    """A token was delivered and its stop check is not resolved yet (finish is allowed)."""
    preemptions: int
    max_tokens: int
    prefill_left: int = 0
    """Partial-prefill chunks of its first prefill still to schedule."""
    host_sync: bool = False
    """It needs its newest token on the host before its next step."""
    error: str | None = None
    """Why it failed (FAILED): the device's error for the step that failed it."""
    placeholders: int = 0
    """With drafts: the output placeholders it owes (drained at apply)."""
    drafts_ready: bool = False
    """With drafts: it was in the last scheduled step past its prompt."""
    state_row: int = -1
    """With state rows: the state row it holds (-1: none)."""


class RunnerView(NamedTuple):
    allocated: bool
    depth: int
    next_slot: int
    queue: tuple[StepView, ...]
    """In-flight steps, oldest first (queue position q = index in this tuple)."""
    slots: tuple[SlotView, ...]
    requests: Mapping[int, RequestView]
    """Every request that arrived; one that never arrived is ABSENT."""
    table: tuple[int, ...] = ()
    """With state rows: each state row's owner (-1: free); () with the ring."""


# --- mutable host state -----------------------------------------------------------------------


@dataclass
class Step:
    index: int
    slot: int
    src_slot: int | None
    rows: tuple[Row, ...]
    phase: Phase = Phase.SCHEDULED
    pending: Any = None  # the mirror's readback handle, held until its event is synchronised
    host_copy: tuple[int, ...] | None = None
    logprobs: tuple[tuple[TokenLogprobs, ...], ...] | None = None
    """With the host copy, when the ring has them: per row, each lane's entry (`Runner._lanes`)."""
    drafts: DraftCopy | None = None  # with the host copy, when the mirror carries drafts


@dataclass
class _Slot:
    written: bool = False
    released: bool = False
    writer: int | None = None


def make_runner(backend: Backend, config: RunnerConfig | None = None) -> Runner:
    """A runner over `backend`: a `Runner`, with the overrides `config` names."""
    config = config or RunnerConfig()
    return built(Runner, config.overrides)(backend, config)


class Runner:
    """Host state and phases of the mirrored sampled ids on one backend."""

    def __init__(self, backend: Backend, config: RunnerConfig | None = None) -> None:
        self.backend = backend
        self.config = config or RunnerConfig()
        self.mirror: Mirror | None = None
        self.next_slot = 0
        self.queue: list[Step] = []
        self.slots = [_Slot() for _ in range(self.config.slots)]
        self.requests = RequestTable(self.config.table_rows)
        """Every request that arrived, and the state rows' owners (`requests.py`)."""
        self.steps = 0  # steps scheduled since load
        self.last_runs: dict[int, tuple[int, ...]] = {}
        """With drafts: the tokens each request got from the last apply, in order."""
        self.events = EventLog(self.config.record_events)
        """Every call accepted, as the model's action with its parameters."""
        self.stats: Counter[str] = Counter()
        """What happened: launches, overlapped_launches, mirror_rows, host_decode_rows, row_moves,
        slot_reuses,
        dropped_rows, finish_in_flight, abort_in_flight, preempt_in_flight, resumed_prefills,
        partial_rows, preempted_delivered, host_sync_held."""

    # --- derived values --------------------------------------------------------------------------
    @property
    def allocated(self) -> bool:
        return self.mirror is not None

    @property
    def depth(self) -> int:
        return self.config.depth

    def live_rows(self, req: int) -> int:
        """In-flight rows of `req` that will deliver a token: its placeholders."""
        return sum(
            row.live and not row.partial and row.req == req
            for step in self.queue for row in step.rows
        )

    def owed(self, req: int) -> int:
        """The output placeholders `req` owns: its counter with drafts (1 + spec per row, an
        upper bound until applied), else its live rows (one token each)."""
        if self.config.drafts is not None:
            return self.requests[req].placeholders
        return self.live_rows(req)

    def has_step_in_flight(self, req: int) -> bool:
        """Some in-flight step holds a live row of `req`, partial-prefill rows included."""
        return any(row.live and row.req == req for step in self.queue for row in step.rows)

    def held_for_host(self, req: int) -> bool:
        """A host-sync request waits for its step in flight to be applied."""
        return self.requests[req].host_sync and self.has_step_in_flight(req)

    def next_pos(self, req: int) -> int:
        """Position of `req`'s newest token: delivered ones plus those still in flight. With
        drafts, the fewest it can be: each in-flight step yields at least one token."""
        return len(self.requests[req].delivered) + self.live_rows(req)

    @property
    def table(self) -> list[int]:
        """With state rows: each state row's owner (-1: free); empty with the ring."""
        return self.requests.owners

    def open_requests(self) -> list[int]:
        """Requests not closed, in id order."""
        return self.requests.open()

    def eligible(self) -> list[int]:
        """Requests the next step must hold: active, with budget left."""
        requests = self.requests
        return [
            r
            for r in self.open_requests()
            if requests[r].status in (Status.WAITING, Status.RUNNING)
            and self.next_pos(r) < requests[r].max_tokens and not self.held_for_host(r)
        ]

    def can_schedule(self) -> bool:
        return self.allocated and len(self.queue) < self.depth and bool(self.eligible())

    def host_token(self, req: int, pos: int) -> int:
        """The host token table at `pos`: authoritative if delivered, else a placeholder."""
        r = self.requests[req]
        if pos == 0:
            return r.prompt
        return r.delivered[pos - 1] if pos <= len(r.delivered) else PLACEHOLDER_ID

    def releasable(self, slot: int) -> bool:
        return self._release_blocker(slot) is None

    def releasable_row(self, idx: int) -> bool:
        """State row `idx` may go back now (`release_row`)."""
        return 0 <= idx < len(self.table) and self._row_release_blocker(idx) is None

    def status(self, req: int) -> Status:
        r = self.requests.get(req)
        return Status.ABSENT if r is None else r.status

    # --- load and request events -----------------------------------------------------------------
    def allocate(self) -> None:
        """Load: allocate the ring and every persistent tensor (and capture traces)."""
        if self.allocated:
            raise PhaseError("allocate: the ring is already allocated (allocate happens once)")
        c = self.config
        failure = None
        try:
            self.mirror = self.backend.open_mirror(
                MirrorSpec(rows=c.rows, slots=c.slots, probe=c.probe, trace=c.trace,
                           logprobs=c.logprobs, readback_timeout_s=c.readback_timeout_s,
                           overrides=c.overrides, report=self._device_event, drafts=c.drafts,
                           state_rows=c.table_rows)
            )
        except (PhaseError, NotImplementedError):  # a refusal of ours, or no such path here
            raise
        except RuntimeError as error:
            failure = DeviceFault("allocate", -1, error)
        if failure is not None:
            # Raised outside the handler, with no cause: no frame of the failed load (and so
            # none of the tensors it allocated) outlives it.
            raise failure
        # With drafts the model instance has K spec tokens (absent: none, as before drafts).
        spec: dict[str, Any] = {"spec_tokens": c.drafts.k} if c.drafts is not None else {}
        if c.subsets:  # absent: every eligible request in every step (as before subsets)
            spec["subsets"] = True
        if c.state == "rows":  # absent: the ring
            spec.update(state="rows", state_rows=c.table_rows)
        self.events.record("allocate", depth=c.depth, slots=c.slots, guard=c.guard,
                           preempt_policy=c.preempt_policy, prefill_chunks=c.prefill_chunks,
                           device_waits=self.backend.reports_device_waits, **spec)

    def arrive(self, req: int, prompt: int, *, max_tokens: int | None = None,
               host_sync: bool = False, prefill_chunks: int | None = None,
               seed: int | None = None) -> None:
        """Request `req` arrives with the last prompt token `prompt`; it waits for a step.
        `host_sync`: it needs its newest token on the host before each next step;
        `prefill_chunks`: steps its first prefill takes (default: the config's); `seed`: the
        seed the engine drew for it (a sampled request without one of its own), recorded so
        that the run's events say what it drew with."""
        self._need_allocated("arrive")
        if req in self.requests:
            status = self.requests[req].status.name
            raise PhaseError(f"arrive(r{req}): it already arrived ({status})")
        if not 0 <= prompt < self.config.probe.vocab:
            raise ValueError(f"arrive(r{req}): prompt token {prompt} is outside the vocabulary")
        budget = self.config.max_tokens if max_tokens is None else max_tokens
        if not 1 <= budget < self.config.probe.max_positions:
            raise ValueError(
                f"arrive(r{req}): max_tokens {budget} must be in [1, probe.max_positions)"
            )
        chunks = self.config.prefill_chunks if prefill_chunks is None else prefill_chunks
        if chunks < 1:
            raise ValueError(f"arrive(r{req}): prefill_chunks must be 1 or more, got {chunks}")
        state_row = -1
        if self.config.state == "rows":  # the lowest free state row; none: it must wait
            free = self.requests.free_row()
            if free is None:
                raise PhaseError(f"arrive(r{req}): every state row ({len(self.table)}) is held; "
                                 "release a closed request's first (release_row)")
            state_row = free
        self.requests.admit(req, Request(prompt=prompt, max_tokens=budget,
                                         prefill_left=chunks - 1, host_sync=host_sync,
                                         state_row=state_row))
        drawn = {} if seed is None else {"seed": seed}
        self.events.record("arrive", (req,), prompt=prompt, max_tokens=budget,
                           host_sync=host_sync, prefill_chunks=chunks, **drawn)

    def _device_event(self, what: str, slot: int) -> None:
        """The mirror waited on a device completion or read a host copy (`MirrorSpec.report`)."""
        self.events.record(what, (slot,))

    def finish(self, req: int, keep: int | None = None) -> None:
        """The newest delivered token was a stop token: finish, dropping in-flight rows. With
        drafts, `keep`: the stop token was the keep-th of the last apply's run (`last_runs`),
        and the tokens after it are cut."""
        r = self._request("finish", req)
        if r.status in CLOSED or not r.unchecked:
            raise PhaseError(
                f"finish(r{req}): needs a delivered token not yet stop-checked "
                f"(status {r.status.name}, unchecked {r.unchecked}); a stop is known only "
                "right after the apply that delivered it"
            )
        if keep is not None:
            run = self.last_runs.get(req, ())
            if not 1 <= keep <= len(run):
                raise PhaseError(f"finish(r{req}, keep={keep}): its last run has {len(run)} "
                                 "token(s)")
            del r.delivered[len(r.delivered) - len(run) + keep:]
            if self.config.logprobs:  # one entry per delivered token: cut with them
                del r.logprobs[len(r.delivered):]
            self.stats["stops_inside_run"] += keep < len(run)
        self._drop(req, "finish_in_flight")
        r.status, r.closed_at, r.unchecked = Status.FINISHED, len(r.delivered), False
        self.events.record("finish", (req,))

    def abort(self, req: int, reason: str | None = None) -> None:
        """The user aborts, or the engine refuses to go on with it (`reason`, recorded): nothing
        more is delivered, in-flight rows are dropped."""
        r = self._request("abort", req)
        if r.status not in (Status.WAITING, Status.RUNNING, Status.PREEMPTED):
            raise PhaseError(f"abort(r{req}): it is already {r.status.name}")
        self._drop(req, "abort_in_flight")
        r.status, r.closed_at, r.unchecked = Status.ABORTED, len(r.delivered), False
        r.error = reason
        self.events.record("abort", (req,), **({} if reason is None else {"reason": reason}))

    def refuse(self, req: int, reason: str) -> None:
        """The engine refused request `req` before it arrived (nothing of it ran): recorded, so
        that a run's events account for every request its scheduler sent."""
        if req in self.requests:
            raise PhaseError(f"refuse(r{req}): it arrived; abort it instead")
        self.events.record("refuse", (req,), reason=reason)

    def preempt(self, req: int) -> None:
        """Preempted: its in-flight tokens are delivered when applied (keep) or never read from
        the ring (drop); it will prefill again in one step."""
        r = self._request("preempt", req)
        if r.status != Status.RUNNING:
            raise PhaseError(
                f"preempt(r{req}): only RUNNING requests can be; it is {r.status.name}"
            )
        # Counted before a drop takes the rows: they were in flight when it hit.
        self.stats["preempt_with_drafts_in_flight"] += any(
            row.live and row.req == req and row.spec for step in self.queue for row in step.rows)
        if self.config.preempt_policy == "drop":
            self._drop(req, "preempt_in_flight")
        elif self.has_step_in_flight(req):
            self.stats["preempt_in_flight"] += 1
        r.status, r.unchecked, r.prefill_left = Status.PREEMPTED, False, 0
        r.drafts_ready = False  # it re-enters without drafts
        r.preemptions += 1
        self.events.record("preempt", (req,))

    def resume(self, req: int) -> None:
        """A preempted request waits again, once it owns no placeholder (keep); it restarts
        from the host's delivered tokens."""
        r = self._request("resume", req)
        if r.status != Status.PREEMPTED:
            raise PhaseError(f"resume(r{req}): it is {r.status.name}, not PREEMPTED")
        blocker = self._resume_blocker(req)
        if blocker is not None:
            raise PhaseError(f"resume(r{req}): {blocker}")
        r.status = Status.WAITING
        self.events.record("resume", (req,))

    def _resume_blocker(self, req: int) -> str | None:
        """Why preempted `req` may not wait again yet: placeholders it still owns (keep)."""
        owed = self.owed(req)
        if owed:
            return (f"it still owns {owed} placeholder(s): its in-flight token is delivered "
                    "first (apply), or its prefill would read a placeholder")
        return None

    def chunk_prefill(self, req: int, partial: bool) -> None:
        """Whether `req`'s next row is a partial-prefill row (its id discarded) or ends its
        prefill: a serving loop that sizes chunks per step (a token budget) says so before each
        schedule. Only while its newest token is on the host (no placeholder), as a partial row
        reads host ids; a row of the next step is then partial exactly as after `arrive` with
        chunks."""
        r = self._request("chunk_prefill", req)
        if r.status not in (Status.WAITING, Status.RUNNING):
            raise PhaseError(f"chunk_prefill(r{req}): it is {r.status.name}")
        owed = self.owed(req)
        if owed:
            raise PhaseError(f"chunk_prefill(r{req}): it owns {owed} placeholder(s); a prefill "
                             "chunk reads host ids, which lack its newest token")
        r.prefill_left = int(self._chunk_is_partial(partial))
        self.events.record("chunk_prefill", (req, int(partial)))

    def _chunk_is_partial(self, partial: bool) -> bool:
        """Whether the next chunk is a partial-prefill row: as the serving loop says."""
        return partial

    # --- step phases -----------------------------------------------------------------------------
    def schedule(self, order: Sequence[int] | None = None,
                 drafts: Sequence[int] | None = None) -> int:
        """Schedule a step over the eligible requests in `order` (default: every one, by id;
        with `subsets` any non-empty subset), with `drafts[i]` drafts on row i where the
        scheduler chooses them (`subsets` and drafts; default: all it has).

        Builds the previous-row map: a request with a live row in the previous in-flight step
        reads its newest token from that step's slot at that row. Returns the queue position.
        """
        self._need_allocated("schedule")
        rows_order = self._step_order(order)
        due = [self.spec_due(r, self.requests[r].prefill_left > 0) for r in rows_order]
        counts = self._draft_counts(rows_order, drafts, due)
        if self.config.subsets:
            self._count_freedoms(rows_order, counts, due)
        prev = self.queue[-1] if self.queue else None
        rows = self._rows(rows_order, prev, counts)
        step = Step(
            index=self.steps,
            slot=self.next_slot,
            src_slot=prev.slot if (prev is not None and self.config.state == "ring"
                                   and any(r.from_mirror for r in rows)) else None,
            rows=rows,
        )
        self._count_scheduled(rows)  # before the step joins the queue and its requests run
        self.queue.append(step)
        self.steps += 1
        self.next_slot = (self.next_slot + 1) % self.config.slots
        for r in rows_order:
            req = self.requests[r]
            req.status, req.unchecked = Status.RUNNING, False
            req.prefill_left = max(req.prefill_left - 1, 0)
        if self.config.drafts is not None:
            self._owe(rows)
        self.events.record("schedule", tuple(rows_order), slot=step.slot, rows=rows)
        return len(self.queue) - 1

    def _owe(self, rows: tuple[Row, ...]) -> None:
        """With drafts: each row that will yield owes 1 + spec placeholders, and the drafter
        proposes after the newest token of this step's rows past their prompt; a request the
        scheduler left out (`subsets`) keeps its own: in its state row (state rows), or with
        the ring read back by its next step at depth 2."""
        scheduled = {row.req: row for row in rows}
        keeps = self.config.subsets or self.config.state == "rows"
        for r in self.open_requests():
            req, row = self.requests[r], scheduled.get(r)
            if row is not None and not row.partial:
                req.placeholders += 1 + row.spec
            if row is not None or not keeps:
                req.drafts_ready = row is not None and not row.partial

    def _step_order(self, order: Sequence[int] | None) -> list[int]:
        """The next step's rows, in order: every eligible request once, within depth and rows."""
        if len(self.queue) >= self.depth:
            raise PhaseError(
                f"schedule: {len(self.queue)} steps in flight, the depth is {self.depth}; "
                "apply the oldest first"
            )
        todo = self.eligible()
        if not todo:
            raise PhaseError("schedule: no request is eligible (WAITING/RUNNING with budget)")
        rows_order = list(todo if order is None else order)
        if self.config.subsets:
            if not rows_order or len(set(rows_order)) != len(rows_order) or not set(
                    rows_order) <= set(todo):
                raise PhaseError(
                    f"schedule{tuple(rows_order)}: the order must hold eligible requests, each "
                    f"once, at least one: {todo}")
        elif sorted(rows_order) != todo:
            raise PhaseError(
                f"schedule{tuple(rows_order)}: the order must hold every eligible request "
                f"exactly once: {todo}"
            )
        if len(rows_order) > self.config.rows:
            raise PhaseError(
                f"schedule: {len(rows_order)} eligible requests but steps hold {self.config.rows} "
                "rows; admit fewer requests or raise rows"
            )
        return rows_order

    def _count_freedoms(self, rows_order: list[int], counts: list[int],
                        due: list[int]) -> None:
        """What the scheduler's freedoms did in this step (rule 14): eligible requests left out
        (those with a step in flight apart), decoding rows with fewer drafts than they have
        (`due`), a row with none of its drafts beside one with all K."""
        left = set(self.eligible()) - set(rows_order)
        self.stats["skipped_rows"] += len(left)
        self.stats["skipped_in_flight"] += sum(self.has_step_in_flight(r) for r in left)
        if self.config.drafts is None:
            return
        self.stats["fewer_drafts"] += sum(d < top for d, top in zip(counts, due, strict=True))
        k = self.config.drafts.k
        self.stats["none_beside_all"] += (
            any(d == 0 < top for d, top in zip(counts, due, strict=True)) and k in counts)

    def _draft_counts(self, rows_order: list[int], drafts: Sequence[int] | None,
                      due: list[int]) -> list[int]:
        """Each row's drafts: those the caller chose (`subsets`: any up to `due`, the drafts it
        has), else all it has."""
        if drafts is None:
            return due
        if not self.config.subsets or self.config.drafts is None:
            raise PhaseError("schedule: drafts per row are the scheduler's choice only with "
                             "subsets and drafts")
        if len(drafts) != len(rows_order):
            raise PhaseError(f"schedule: {len(drafts)} draft count(s) for {len(rows_order)} "
                             "row(s)")
        for r, d, top in zip(rows_order, drafts, due, strict=True):
            if not 0 <= d <= top:
                raise PhaseError(f"schedule: request {r}'s row carries {d} draft(s); it has "
                                 f"{top} (rule 13)")
        return list(drafts)

    def _rows(self, rows_order: list[int], prev: Step | None,
              counts: list[int]) -> tuple[Row, ...]:
        """The rows of a step over `rows_order`: each request's position, and where its newest
        token is read from (the guard: while it is in flight, the previous step's slot, or with
        state rows its own state row, whichever in-flight step wrote it)."""
        rows_mode = self.config.state == "rows"
        prev_rows = self._previous_rows(prev)
        on_device = self._device_rows() if rows_mode else set()
        guard = self._guarded()
        rows = []
        for i, r in enumerate(rows_order):
            req = self.requests[r]
            # Arrived and resumed requests prefill from host ids, and a host-sync request's next
            # input is built on the host: none of them reads the mirror.
            from_host = req.status == Status.WAITING or req.host_sync
            idx = self._state_row(i, r, prev) if rows_mode else -1
            source = (idx if r in on_device else None) if rows_mode else prev_rows.get(r)
            if rows_mode and source is not None and guard and not from_host and (
                    r not in prev_rows):
                self.stats["rows_from_older_step"] += 1  # the ring's previous step lacks it
            prev_row = self._prev_row(i, source) if guard and not from_host else None
            partial = req.prefill_left > 0
            if self.config.drafts is None:
                row = Row(req=r, pos=self.next_pos(r), prev_row=prev_row, partial=partial)
            else:
                row = self._drafted_row(r, prev_row, partial, counts[i])
            rows.append(row._replace(idx=idx))
        return tuple(rows)

    def _state_row(self, i: int, r: int, prev: Step | None) -> int:
        """Row i's `idx_mapping` entry (state rows): its request's own state row."""
        return self.requests[r].state_row

    def _device_rows(self) -> set[int]:
        """With state rows: the requests whose newest token is in flight, in any in-flight step
        (a live row whose id is its next token): their state row will hold it when the next
        combine runs, whichever step wrote it last."""
        return {r for step in self.queue for r in self._previous_rows(step)}

    def _guarded(self) -> bool:
        """The stale-host-ids guard: rows whose newest token is in flight read the mirror."""
        return self.config.guard

    def _prev_row(self, i: int, prev_row: int | None) -> int | None:
        """Row i's entry of the previous-row map: its request's row in the previous step (with
        state rows its state row)."""
        return prev_row

    def _drafted_row(self, r: int, prev_row: int | None, partial: bool, spec: int) -> Row:
        """A row with `spec` drafts (rule 13; at most K, those the drafter proposed after its
        newest token). A mirror row's newest token, position and drafts are on the device; a
        host row's position is the host's count of computed tokens (delivered plus owed), its
        drafts the first `spec` of those read back."""
        req = self.requests[r]
        if prev_row is not None:
            return Row(req=r, pos=-1, prev_row=prev_row, partial=partial, spec=spec)
        spec, drafts = self._host_drafts(r, partial, spec)
        return Row(req=r, pos=len(req.delivered) + req.placeholders, prev_row=None,
                   partial=partial, spec=spec, drafts=drafts)

    def _host_drafts(self, r: int, partial: bool, spec: int) -> tuple[int, tuple[int, ...]]:
        """A host row's drafts: the first `spec` of those read back (none re-entering)."""
        return spec, (self.requests[r].host_drafts[:spec] if spec else ())

    def spec_due(self, req: int, partial: bool = False) -> int:
        """Drafts `req`'s row of the next step may carry (rule 13): K if the drafter proposed
        them (it was in the last scheduled step past its prompt, or with `subsets` its own last
        step was, and is not re-entering), else 0; 0 for a prefill chunk, and without drafts."""
        r, drafts = self.requests[req], self.config.drafts
        ready = r.drafts_ready and r.status != Status.WAITING and not partial
        return drafts.k if drafts is not None and ready else 0

    def _previous_rows(self, prev: Step | None) -> dict[int, int]:
        """The previous-row map's source: each request's row in the previous in-flight step,
        where that row will have sampled its newest token."""
        if prev is None:
            return {}
        # A partial row's id is discarded: it feeds nothing.
        return {row.req: i for i, row in enumerate(prev.rows) if row.live and not row.partial}

    def _count_scheduled(self, rows: tuple[Row, ...]) -> None:
        """What a new step's rows did: moved, re-entered, held back for the host."""
        for i, row in enumerate(rows):
            if row.prev_row is not None and row.prev_row != i:
                self.stats["row_moves"] += 1
            req = self.requests[row.req]
            if req.status == Status.WAITING and req.delivered:
                self.stats["resumed_prefills"] += 1
        # Those held back from the step (never eligible).
        self.stats["host_sync_held"] += sum(
            self.requests[r].status in (Status.WAITING, Status.RUNNING) and self.held_for_host(r)
            for r in self.open_requests()
        )

    def combine(self, q: int) -> None:
        """Stage step q's host ids, previous-row map and mask, then combine on device."""
        step = self._step("combine", q, Phase.SCHEDULED)
        blocker = self._combine_blocker(q)
        if blocker is not None:
            raise PhaseError(f"combine(q={q}): {blocker}")
        if step.src_slot is not None and self.slots[step.src_slot].released:
            raise PhaseError(f"combine(q={q}): slot {step.src_slot} was released under it")
        rows = tuple(self._staged(row) for row in step.rows)
        assert self.mirror is not None
        with self.device_call("combine", q):
            self.mirror.stage(StepInputs(rows))
            self.mirror.combine(step.slot)
        self.stats.update(+Counter(  # counted only once the device accepted it all
            partial_rows=sum(r.live and r.partial for r in rows),
            host_decode_rows=sum(r.host_pos is not None and r.pos > 0 for r in rows),
            mirror_rows=sum(r.from_mirror for r in rows)))
        step.rows = rows
        step.phase = Phase.COMBINED
        self._record_phase("combine", step, q, rows=rows)

    def _combine_blocker(self, q: int) -> str | None:
        """Why step q may not combine yet: the previous step's sampler has not written."""
        if q > 0 and self.queue[q - 1].phase < Phase.LAUNCHED:
            return (f"the previous step is {self.queue[q - 1].phase.name}; its sampler must "
                    "have written its slot (launch it first)")
        return None

    def _staged(self, row: Row) -> Row:
        """`row` as the combine stages it: a live row reading host ids takes the host token table's
        id at its position (a dropped row's output is never delivered: it stages nothing)."""
        if not row.live or row.prev_row is not None:
            return row
        pos = self._host_pos(row)
        return row._replace(host_pos=pos, host_id=self.host_token(row.req, pos))

    def _host_pos(self, row: Row) -> int:
        """Where a host row's input id is in its request's host token table: its position."""
        return row.pos

    def launch(self, q: int) -> None:
        """Forward + sample for step q; the sampler writes the step's slot."""
        step = self._step("launch", q, Phase.COMBINED)
        blocker = self._reader_outstanding(step.slot, q)
        if blocker is not None:
            raise SlotBusyError(f"launch(q={q}): slot {step.slot} {blocker}; raise K (slots)")
        self._launch_on_device(step, q)
        slot = self.slots[step.slot]
        if slot.written:
            self.stats["slot_reuses"] += 1
        if any(other.phase >= Phase.LAUNCHED for other in self.queue):
            self.stats["overlapped_launches"] += 1  # another step is still on the device
        slot.written, slot.released, slot.writer = True, False, step.index
        step.phase = Phase.LAUNCHED
        self.stats["launches"] += 1
        self._record_phase("launch", step, q)

    def _launch_on_device(self, step: Step, q: int) -> None:
        """The launch's device call (its event is recorded once it happened)."""
        assert self.mirror is not None
        with self.device_call("launch", q):
            self.mirror.launch(step.slot)

    def _record_phase(self, action: str, step: Step, q: int, **detail: Any) -> None:
        """A step phase's event, with the step's phase as the runner's state shows it."""
        self.events.record(action, (q,), phase=step.phase.name.lower(), **detail)

    def readback_issue(self, q: int) -> None:
        """Enqueue the non-blocking copy of step q's slot to a host tensor, and its event."""
        step = self._step("readback_issue", q, Phase.LAUNCHED)
        assert self.mirror is not None
        with self.device_call("readback_issue", q):
            step.pending = self.mirror.readback_issue(step.slot)
        step.phase = Phase.READBACK_ISSUED
        self._record_phase("readback_issue", step, q)

    def readback_complete(self, q: int) -> None:
        """Synchronise step q's readback event; only then is the host copy read."""
        step = self._step("readback_complete", q, Phase.READBACK_ISSUED)
        assert self.mirror is not None
        with self.device_call("readback_complete", q):
            ids = self.mirror.readback_complete(step.pending)
            logprobs = (  # the same event covered the logprob ring's copy
                self._lanes(self.mirror.readback_logprobs(step.pending), len(step.rows))
                if self.config.logprobs else None
            )
            drafts = (self.mirror.readback_drafts(step.pending)
                      if self.config.drafts is not None else None)
        step.logprobs = logprobs
        step.drafts = drafts
        step.pending = None  # synchronised: the host tensor may go now
        step.host_copy = tuple(ids[: len(step.rows)])
        step.phase = Phase.READBACK_DONE
        # With drafts, what each row's verification accepted (read back with the ids): the
        # model's launch of this step takes it as its verdict.
        counts: dict[str, Any] = (
            {"counts": drafts.counts[: len(step.rows)]} if drafts is not None else {})
        self._record_phase("readback_complete", step, q, **counts)

    def _lanes(self, entries: list[TokenLogprobs], rows: int
               ) -> tuple[tuple[TokenLogprobs, ...], ...]:
        """The logprob ring's host copy per row: its lanes' entries (one lane without drafts;
        with K drafts, lane j of row i at j * width + i: the entry of each token it may yield)."""
        lanes = 1 + (self.config.drafts.k if self.config.drafts is not None else 0)
        width = len(entries) // lanes
        return tuple(tuple(entries[j * width + i] for j in range(lanes)) for i in range(rows))

    def apply(self) -> dict[int, int]:
        """Retire the oldest step: deliver each live row's token; returns {req: token}."""
        self._need_allocated("apply")
        if not self.queue or self.queue[0].phase != Phase.READBACK_DONE:
            state = self.queue[0].phase.name if self.queue else "nothing in flight"
            raise PhaseError(f"apply: the oldest step's readback is not complete ({state})")
        step = self.queue.pop(0)
        assert step.host_copy is not None
        self.last_runs = {}
        delivered = {}
        for i, (row, token) in enumerate(zip(step.rows, step.host_copy, strict=True)):
            if row.partial:
                continue  # a partial prefill's id is no token of the sequence
            if not self._delivers(row):
                continue  # finished, aborted or preempted (drop) since scheduling: dropped
            r = self.requests[row.req]
            if row.live and r.status == Status.PREEMPTED:
                self.stats["preempted_delivered"] += 1  # keep: computed before the preemption
            if step.drafts is not None:
                token = self._deliver_run(row, r, step.drafts, i)
            else:
                r.delivered.append(token)
            if step.logprobs is not None:  # one entry per token delivered: the run's lanes
                r.logprobs.extend(step.logprobs[i][: len(self.last_runs.get(row.req, (token,)))])
            delivered[row.req] = token
            if len(r.delivered) >= r.max_tokens:
                r.status, r.closed_at, r.unchecked = Status.FINISHED, len(r.delivered), False
                if step.drafts is not None and self.has_step_in_flight(row.req):
                    self._drop(row.req, "finish_in_flight")  # a later row is past its budget
            else:
                r.unchecked = True
        self.events.record("apply", (), step=step.index, delivered=tuple(sorted(delivered.items())),
                           counts=tuple(sorted((req, len(self.requests[req].delivered))
                                               for req in delivered)))
        return delivered

    def _delivers(self, row: Row) -> bool:
        """Whether apply delivers a (not partial) row's token: only while it is live."""
        return row.live

    def _deliver_run(self, row: Row, r: Request, copy: DraftCopy, i: int) -> int:
        """With drafts: deliver row i's run (its accepted drafts and the target's token after
        them, cut at max tokens), drain its placeholders, keep its drafts; returns its newest."""
        count = copy.counts[i]
        if not 1 <= count <= row.spec + 1:
            raise RuntimeError(f"apply: row {i} read back count {count}, scheduled "
                               f"{row.spec} draft(s): the readback is corrupt")
        run = copy.tokens[i][:count][: max(r.max_tokens - len(r.delivered), 0)]
        r.delivered.extend(run)
        self.last_runs[row.req] = run
        # Drained by the a + 1 it yielded, rolled back by the spec - a it rejected.
        r.placeholders = max(r.placeholders - (1 + row.spec), 0)
        r.host_drafts = copy.drafts[i]
        self.stats[f"accepted_{count - 1}"] += row.spec > 0
        self.stats["drafted_rows"] += row.spec > 0
        return run[-1]

    def release(self, slot: int) -> None:
        """Hand `slot` back: its writer retired and no scheduled combine will read it."""
        self._need_allocated("release")
        if not 0 <= slot < len(self.slots):
            raise PhaseError(f"release(slot{slot}): there are {len(self.slots)} slots")
        blocker = self._release_blocker(slot)
        if blocker is not None:
            raise PhaseError(f"release(slot{slot}): {blocker}")
        self.slots[slot].released = True
        self.events.record("release", (slot,))

    def release_row(self, idx: int) -> None:
        """With state rows: hand state row `idx` back once its owner closed and no in-flight
        step scatters into it; the next arrival may take it."""
        self._need_allocated("release_row")
        if not 0 <= idx < len(self.table):
            raise PhaseError(f"release_row({idx}): there are {len(self.table)} state rows")
        blocker = self._row_release_blocker(idx)
        if blocker is not None:
            raise PhaseError(f"release_row({idx}): {blocker}")
        self.requests.release_row(idx)
        self.events.record("release_row", (idx,))

    def _row_release_blocker(self, idx: int) -> str | None:
        """Why state row `idx` may not go back yet: free, its owner open, or a step of its
        owner in flight still scatters into it."""
        owner = self.table[idx]
        if owner < 0:
            return "it is free"
        if self.requests[owner].status not in CLOSED:
            return f"its owner, request {owner}, is {self.requests[owner].status.name}"
        step = self._row_writer(idx)
        if step is not None:
            return (f"step {step.index} still scatters into it (a row of request {owner}, "
                    "dropped or not: the device writes it all the same)")
        return None

    def _row_writer(self, idx: int) -> Step | None:
        """The oldest in-flight step with a row, live or dropped, naming state row `idx`."""
        return next((step for step in self.queue if any(row.idx == idx for row in step.rows)),
                    None)

    def fail_step(self, q: int, reason: str) -> list[int]:
        """The device failed step q before its readback completed: every request with a live
        row in it fails (FAILED, with `reason`) and its rows in the other in-flight step are
        dropped; the step leaves the queue and nothing of it is delivered. Its slot, if the
        launch wrote it, goes back through `release` as any retired writer's. Returns the
        failed requests."""
        self._need_allocated("fail_step")
        if not 0 <= q < len(self.queue):
            raise PhaseError(f"fail_step(q={q}): {len(self.queue)} steps in flight")
        step = self.queue[q]
        if step.phase == Phase.READBACK_DONE:
            raise PhaseError(f"fail_step(q={q}): its readback completed; apply it")
        failed = sorted({row.req for row in step.rows if row.live})
        for req in failed:
            self._drop_failed(step, req)
            r = self.requests[req]
            r.status, r.closed_at, r.unchecked, r.error = (
                Status.FAILED, len(r.delivered), False, reason)
        if step.pending is not None:
            self._abandon_copy(step)
        step.pending = None
        del self.queue[q]
        if q == len(self.queue):
            self._rewind_ring(step)
        self.stats["faults"] += 1
        self.stats["failed_requests"] += len(failed)
        self.events.record("fault", (q,), phase=step.phase.name.lower(), failed=tuple(failed))
        return failed

    def _drop_failed(self, step: Step, req: int) -> None:
        """A failed request's rows go, in every in-flight step."""
        self._drop(req, "fault_in_flight")

    def _abandon_copy(self, step: Step) -> None:
        """A failed step's readback copy may still land: the mirror keeps its host tensor."""
        assert self.mirror is not None
        self.mirror.abandon(step.pending)

    def _rewind_ring(self, step: Step) -> None:
        """The newest step failed: the ring position goes back to its slot."""
        self.next_slot = step.slot

    def close(self) -> None:
        if self.mirror is not None:
            self.mirror.close()

    # --- the abstraction's input -----------------------------------------------------------------
    def abstract(self) -> RunnerView:
        return RunnerView(
            allocated=self.allocated,
            depth=self.depth,
            next_slot=self.next_slot,
            queue=tuple(
                StepView(
                    n=s.index,
                    slot=s.slot,
                    src_slot=s.src_slot,
                    phase=s.phase,
                    rows=s.rows,
                    host_copy=s.host_copy,
                    host_counts=s.drafts.counts[: len(s.rows)] if s.drafts is not None else (),
                )
                for s in self.queue
            ),
            slots=tuple(SlotView(s.written, s.released, s.writer) for s in self.slots),
            requests=MappingProxyType(
                {
                    i: RequestView(
                        r.status,
                        r.prompt,
                        tuple(r.delivered),
                        r.closed_at,
                        r.unchecked,
                        r.preemptions,
                        r.max_tokens,
                        r.prefill_left,
                        r.host_sync,
                        r.error,
                        r.placeholders,
                        r.drafts_ready,
                        r.state_row,
                    )
                    for i, r in sorted(self.requests.items())
                }
            ),
            table=tuple(self.table),
        )

    def describe(self) -> dict[str, Any]:
        """Counters of the runner and its mirror."""
        return {**dict(self.stats), **(self.mirror.describe() if self.mirror else {})}

    # --- helpers ---------------------------------------------------------------------------------
    @contextmanager
    def device_call(self, phase: str, q: int) -> Iterator[None]:
        """A phase's device calls: a RuntimeError from the device becomes a DeviceFault (the
        caller has changed nothing yet, and what was recorded inside the call is forgotten);
        the runner's own refusals and a NotImplementedError (a RuntimeError too, but no fault:
        the path does not exist here) pass through, as does anything else (a hazard the
        emulated device raises: what the mirror reported of the call did happen)."""
        recorded = len(self.events)
        try:
            yield
        except (PhaseError, NotImplementedError):
            raise
        except RuntimeError as error:
            self.events.forget(recorded)  # an event means its action happened: this one did not
            raise DeviceFault(phase, q, error) from error

    def _need_allocated(self, name: str) -> None:
        if not self.allocated:
            raise PhaseError(f"{name}: call allocate() first (the ring exists only after load)")

    def _request(self, name: str, req: int) -> Request:
        self._need_allocated(name)
        r = self.requests.get(req)
        if r is None:
            raise PhaseError(f"{name}(r{req}): it never arrived")
        return r

    def _step(self, name: str, q: int, phase: Phase) -> Step:
        self._need_allocated(name)
        if not 0 <= q < len(self.queue):
            raise PhaseError(f"{name}(q={q}): {len(self.queue)} steps in flight")
        step = self.queue[q]
        if step.phase != phase:
            raise PhaseError(f"{name}(q={q}): the step is {step.phase.name}, needs {phase.name}")
        return step

    def _drop(self, req: int, stat: str) -> None:
        """`req`'s in-flight rows stop being live: their tokens are never delivered."""
        dropped = 0
        for step in self.queue:
            hits = sum(row.live and row.req == req for row in step.rows)
            if hits:
                step.rows = tuple(r._replace(live=False) if r.live and r.req == req else r
                                  for r in step.rows)
                dropped += hits
        if dropped:
            self.stats["dropped_rows"] += dropped
            self.stats[stat] += 1
        if self.config.drafts is not None:  # its placeholders go with its rows
            self.requests[req].placeholders, self.requests[req].drafts_ready = 0, False

    def _reader_outstanding(self, slot: int, q: int) -> str | None:
        """Why step q may not write `slot` now: its writer's readback or a later combine."""
        for j, step in enumerate(self.queue):
            if step.slot == slot and Phase.LAUNCHED <= step.phase < Phase.READBACK_DONE:
                return f"still has step {step.index}'s readback outstanding"
            # The step right after q reads what q is about to write: that read is the point.
            if j != q + 1 and step.src_slot == slot and step.phase == Phase.SCHEDULED:
                return f"still has step {step.index}'s combine to read it"
        return None

    def _release_blocker(self, slot: int) -> str | None:
        if not self.allocated:
            return "the ring is not allocated"
        s = self.slots[slot]
        if not s.written:
            return "it was never written"
        if s.released:
            return "it is already released"
        for step in self.queue:
            if step.slot == slot and self._writer_holds(step):
                return f"its writer, step {step.index}, has not been applied"
            if step.src_slot == slot and self._combine_reads(step):
                return f"step {step.index}'s combine still reads it"
        return None

    def _writer_holds(self, step: Step) -> bool:
        """In-flight step holds the slot it wrote until it is applied."""
        return step.phase >= Phase.LAUNCHED

    def _combine_reads(self, step: Step) -> bool:
        """In-flight step still reads its source slot: until its combine ran."""
        return step.phase == Phase.SCHEDULED
