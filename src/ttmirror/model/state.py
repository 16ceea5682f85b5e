"""Variables of the model: the bounds, the records that make up a state, and the initial state.

A state is an immutable tree of named tuples, so it hashes and compares by value and the
explorer can store it as a graph node. Token values are abstract: ``(req, pos)`` is the
token at position ``pos`` of request ``req``'s sequence (position 0 is the last prompt
token), so "the newest token" is a number the invariants can compare.
"""

from __future__ import annotations

from enum import IntEnum
from typing import NamedTuple

type Token = tuple[int, int]
"""``(req, pos)``; the two sentinels below are never the newest token of any request."""

PLACEHOLDER: Token = (-1, -1)
"""What the host token table holds at a position whose token is still on the device."""

GARBAGE: Token = (-2, -2)
"""What a read returns from a slot that was never written or was handed back."""

REJECTED: Token = (-3, -3)
"""A draft that verification rejected: the drafter's guess at a position whose token the
target sampled otherwise (spec decoding). Never a token of any sequence."""


class Bounds(NamedTuple):
    """The finite instance to explore: sizes, feature toggles and known-bad variants."""

    depth: int = 2
    """D = max_concurrent_batches: how many steps may be in flight (1 = sync, 2 = async, 3 = as
    vLLM sets it under pipeline parallelism of size 3)."""
    slots: int = 2
    """K: mirror buffers in the ring; step n writes slot n mod K."""
    requests: int = 2
    max_tokens: int = 2
    """Tokens each request generates before it finishes on its own."""
    finish: bool = True
    """Stop tokens: a request may finish early, known only after readback."""
    abort: bool = True
    preempt: bool = True
    preemptions: int = 1
    """How often each request may be preempted (bounds the preempt/resume cycles)."""
    condense: bool = True
    """The scheduler may place rows in any order (condense/reorder), not request order."""
    guard: bool = True
    """The stale-host-ids guard: rows whose newest token is in flight combine from the mirror."""
    release_at: str = "complete"
    """When a slot may be handed back: "complete" (correct) or "issue" (known-bad)."""
    preempt_policy: str = "keep"
    """A preempted request's in-flight tokens: "keep" (vLLM's: applied and delivered, and the
    request resumes only once it owns no placeholder) or "drop" (forgotten, recomputed)."""
    prefill_chunks: int = 1
    """Chunks of each prompt's first prefill: every chunk but the last samples an id that is
    discarded (a partial-prefill row); 1 = no chunking."""
    host_sync: bool = False
    """Request 0 needs its newest token on the host before its next step (a host-side mask,
    as structured output does): it is not scheduled while it has a step in flight."""
    variant: str = ""
    """A known-bad variant of the options above, or "" (see VARIANTS)."""
    max_tokens_of: tuple[int, ...] = ()
    """Per request, the tokens it generates before it finishes on its own, where they differ
    (trace validation of a serving run); () = `max_tokens` for every request."""
    host_sync_of: tuple[int, ...] = ()
    """The host-sync requests, where another than request 0 is (trace validation); () = request
    0 when `host_sync` is on."""
    chunk_per_step: bool = False
    """Prefill chunks sized per step (spec rule 11): the `chunk_prefill` action is enabled. Off
    in every explored bound; on when a recorded serving run that used it is validated."""
    faults: bool = False
    """The device may fail any in-flight step before its readback completes (`fault`): the
    requests with a live row in it fail, and nothing of it is delivered (spec rule 12)."""
    spec_tokens: int = 0
    """K spec tokens (speculative decoding, spec rule 13): a decoding row whose drafts exist
    consumes its newest token and K drafts (any d in 0..K with ``subsets``), and its launch's
    verification accepts a in 0..d of them, yielding a + 1 tokens. 0 = no drafts."""
    state: str = "rows"
    """Where the tokens the host does not know yet live on the device (spec rule 14): "ring"
    (the V1 runner's shape: step n's sampled ids in slot n mod K, the next step's combine reads
    the previous step's slot through the previous-row map) or "rows" (model runner v2's: one
    state row per request, allocated at admission, gathered by each combine through the step's
    ``idx_mapping``, scattered into by each launch's post-update, released after close; the
    slots then only carry each step's output to its readback)."""
    state_rows: int = 0
    """With ``state`` "rows": how many state rows the device holds (vLLM's ``max_num_reqs``);
    0 = one per request. Fewer than the requests makes a closed request's row be reused."""
    subsets: bool = True
    """vLLM's scheduler freedoms: a step holds any non-empty subset of the schedulable
    requests (a token budget leaves some out), and each decoding row with drafts carries any
    d in 0..K of them (fewer near ``max_model_len``, or a budget). At depth 3 and more, a
    request may be in one in-flight step and absent from the next (pipeline batches)."""


RING = Bounds(state="ring", subsets=False)
"""The V1 runner's shape (spec rules 1 to 13): a per-step ring read through the previous-row
map, every eligible request in every step with all K drafts. The defaults before rule 14: a
trace or a recorded run that names no ``state`` is an instance of it."""


VARIANTS: dict[str, str] = {
    "resume-with-placeholder": "a preempted request (keep) resumes while it owns a placeholder",
    "partial-prefill-feeds-mirror": "a partial-prefill row's id feeds the previous-row map",
    "host-sync-unguarded": "a host-sync request is scheduled while its step is in flight",
    "fault-spares-later-rows": "a fault fails its step's requests but leaves their rows in the "
    "other in-flight step live",
    "positions-advance-by-spec": "the device advances a row's position by the 1 + K tokens it "
    "was scheduled, not by the a + 1 it accepted",
    "rejected-draft-newest": "the device keeps the first rejected draft as the row's newest "
    "token instead of the token the target sampled there",
    "reentering-drafts-from-device": "a re-entering request is scheduled with K placeholder "
    "drafts for the device to fill; the device holds none for it",
    "placeholders-drain-by-one": "the host drains a row's placeholders by 1 at apply, not by "
    "the a + 1 tokens it accepted (rejected ones still roll back)",
    "state-row-reused-in-flight": "a closed request's state row is released, and so reused, "
    "while a step of its old owner is in flight",
    "idx-from-previous-order": "a step's idx_mapping is the previous step's (each batch row "
    "gathers the state row the request at that row had there)",
    "draft-count-of-another-row": "the device takes every row's draft count from the step's "
    "first row, not the row's own",
    "skipped-from-previous-step": "the host looks for a request's in-flight token in the "
    "previous step only: one absent from it combines from host ids",
}
"""Known-bad variants selected by ``Bounds.variant``, and what each does wrong."""

SPEC_VARIANTS = ("positions-advance-by-spec", "rejected-draft-newest",
                 "reentering-drafts-from-device", "placeholders-drain-by-one")
"""The known-bad variants of speculative decoding (they need ``spec_tokens`` >= 1)."""

ROWS_VARIANTS = ("state-row-reused-in-flight", "idx-from-previous-order",
                 "draft-count-of-another-row", "skipped-from-previous-step")
"""The known-bad variants of per-request state rows (they need ``state`` "rows")."""

HOST_SYNC_REQUEST = 0
"""The request that is host-sync when ``Bounds.host_sync`` is on."""


class Status(IntEnum):
    """Lifecycle of one request."""

    ABSENT = 0  # not arrived yet
    WAITING = 1  # arrived or resumed: its next step prefills from host ids
    RUNNING = 2
    PREEMPTED = 3
    FINISHED = 4
    ABORTED = 5
    FAILED = 6  # a step of it failed on the device


CLOSED = frozenset({Status.FINISHED, Status.ABORTED, Status.FAILED})


class Phase(IntEnum):
    """Progress of one in-flight step, in the order the runner drives it."""

    SCHEDULED = 0  # rows chosen, previous-row map built on the host
    COMBINED = 1  # input ids built on device from host ids and the previous slot
    LAUNCHED = 2  # forward + sample ran, writing this step's slot
    READBACK_ISSUED = 3  # non-blocking copy of the slot to the host enqueued
    READBACK_DONE = 4  # its event completed: the host copy is valid


class Row(NamedTuple):
    """One row of a step: which request it serves and where its input comes from."""

    req: int
    pos: int
    """Position of the input token the row must consume (the request's newest). Without drafts
    the host knows it when it schedules; with drafts it is fixed once the steps before have
    launched (their accepted counts decided), so it is set at the combine (-1 until then)."""
    prev_row: int | None
    """Row of ``req`` in the previous step's slot (the previous-row map); None = host ids."""
    consumed: Token | None
    """What the combine put into the input ids; None until combined."""
    live: bool
    """False once the request finished, aborted or was preempted (drop): its token is dropped."""
    partial: bool = False
    """A partial-prefill row: it consumes a prompt chunk and its sampled id is discarded."""
    spec: int = 0
    """Drafts scheduled after the newest token: K for a decoding row that was in the previous
    step, else 0 (new, resumed, re-entering, prefill). The host knows it when it schedules."""
    placed: int | None = None
    """With drafts: the position the step's positions input gives the newest token (the host's
    for a host row, the device's for a mirror row); None without drafts (the host's ``pos``)."""
    drafts: tuple[Token, ...] = ()
    """With drafts: what the combine wrote into the row's draft inputs; ``(r, p)`` is the
    drafter's proposal for position p of request r, PLACEHOLDER a host placeholder (-1)."""
    idx: int = -1
    """With state rows: the row's entry of the step's ``idx_mapping``, the state row its combine
    gathers from and its launch's post-update scatters into (kept by a dropped row: the device
    still writes there); -1 with the ring."""


class Step(NamedTuple):
    """One scheduled step in the in-flight queue."""

    slot: int
    """The ring slot its sampler writes."""
    src_slot: int | None
    """The previous step's slot, read by this step's combine for mirror rows."""
    phase: Phase
    rows: tuple[Row, ...]
    host_copy: tuple[Token, ...] | None
    """The readback's host tensor, valid once the readback completed."""
    accepted: tuple[int, ...] = ()
    """With drafts: per row, the drafts its launch's verification accepted (a), chosen there."""
    host_counts: tuple[int, ...] = ()
    """With drafts: the readback's copy of the slot's counts (a + 1 tokens per row)."""


class Slot(NamedTuple):
    """One mirror buffer of the ring."""

    content: tuple[Token, ...] | None
    """Sampled ids per row as written by the last launch; None = never written; () = released."""
    released: bool
    """Handed back: its writer's readers are done and no later combine will read it."""
    counts: tuple[int, ...] = ()
    """With drafts: per row, the tokens its launch yielded (a + 1; 0 for a row yielding none)."""
    positions: tuple[int, ...] = ()
    """With drafts: per row, the newest token's position as the device advanced it (the next
    step's combine reads it, as it reads ``content``)."""


class Request(NamedTuple):
    """One request as the host sees it."""

    status: Status
    delivered: tuple[Token, ...]
    """Tokens given to the user: also the host token table's authoritative part."""
    closed_at: int | None
    """How many tokens the user had when the request finished or aborted."""
    unchecked: bool
    """A token was delivered and its stop check has not been resolved yet."""
    preemptions: int
    """How often it has been preempted so far."""
    prefill_left: int = 0
    """Partial-prefill chunks of its first prefill still to schedule."""
    placeholders: int = 0
    """With drafts: the host's output placeholders, 1 + spec per scheduled step, drained at
    apply (vLLM's ``num_output_placeholders``). Without drafts it is the live in-flight rows."""
    drafts_ready: bool = False
    """With drafts: the drafter proposed drafts after its newest token: it was in the last
    scheduled step past its prompt (the ring: in that step's slot), or its own last step was
    (state rows: in its state row), or on the host once read back."""
    state_row: int = -1
    """With state rows: the row it was given at admission, held until it closes; -1 = none."""


class StateRow(NamedTuple):
    """One per-request row of device state (model runner v2's request state), with state rows."""

    owner: int
    """The request it is allocated to; -1 = free."""
    newest: Token
    """The newest token, as the last launch that scattered into it wrote it."""
    position: int
    """With drafts: that token's position as the device advanced it (``num_computed_tokens``);
    -1 without drafts (the host knows every position) and where unwritten."""


FREE_ROW = StateRow(owner=-1, newest=GARBAGE, position=-1)
"""A state row no request holds; what it held is forgotten."""


class State(NamedTuple):
    """A state of the whole system."""

    allocated: bool
    """The ring exists (allocated at load, before any trace capture)."""
    next_slot: int
    """The slot the next scheduled step takes."""
    queue: tuple[Step, ...]
    """In-flight steps, oldest first; at most D."""
    slots: tuple[Slot, ...]
    requests: tuple[Request, ...]
    broken: frozenset[str]
    """Ghost: the slot rules an access broke at the moment it happened."""
    table: tuple[StateRow, ...] = ()
    """With state rows: the device's per-request state rows; () with the ring."""


_KEEP = object()


def _fast_replace(cls: type) -> None:
    """Give a record class a ``_replace`` that takes its fields as keyword parameters.

    Behaviour is namedtuple's own (a copy with the named fields changed; an unknown name is a
    TypeError); namedtuple's builds a dict and maps over it per call, and the explorer calls
    this tens of millions of times at a million states. Generated the way namedtuple generates
    its own methods.
    """
    fields: tuple[str, ...] = cls._fields  # type: ignore[attr-defined]
    params = ", ".join(f"{f}=_KEEP" for f in fields)
    values = ", ".join(f"self[{i}] if {f} is _KEEP else {f}" for i, f in enumerate(fields))
    namespace = {"_KEEP": _KEEP, "_new": tuple.__new__, "cls": cls}
    exec(f"def _replace(self, *, {params}):\n    return _new(cls, ({values},))", namespace)
    cls._replace = namespace["_replace"]  # type: ignore[attr-defined]


for _record in (Row, Step, Slot, Request, StateRow, State):
    _fast_replace(_record)


def initial_state(bounds: Bounds) -> State:
    """Before load: no ring, no requests arrived, nothing in flight."""
    return State(
        allocated=False,
        next_slot=0,
        queue=(),
        slots=tuple(Slot(content=None, released=False) for _ in range(bounds.slots)),
        requests=tuple(
            Request(
                status=Status.ABSENT, delivered=(), closed_at=None, unchecked=False, preemptions=0,
                prefill_left=bounds.prefill_chunks - 1,
            )
            for _ in range(bounds.requests)
        ),
        broken=frozenset(),
        table=(FREE_ROW,) * state_row_count(bounds) if bounds.state == "rows" else (),
    )


def state_row_count(bounds: Bounds) -> int:
    """How many state rows the device holds (with state rows)."""
    return bounds.state_rows or bounds.requests


def validate_bounds(bounds: Bounds) -> None:
    """Reject bounds the model cannot mean, with a message fit for one line."""
    if not 1 <= bounds.depth <= 4:
        raise ValueError(
            f"--depth must be between 1 and 4 (max_concurrent_batches), got {bounds.depth}")
    if not 1 <= bounds.slots <= 4:
        raise ValueError(f"--slots must be between 1 and 4, got {bounds.slots}")
    if not 1 <= bounds.requests <= 3:
        raise ValueError(f"--requests must be between 1 and 3, got {bounds.requests}")
    if not 1 <= bounds.max_tokens <= 4:
        raise ValueError(f"--max-tokens must be between 1 and 4, got {bounds.max_tokens}")
    if bounds.release_at not in ("complete", "issue"):
        raise ValueError(f"--release-at must be 'complete' or 'issue', got {bounds.release_at!r}")
    if bounds.preempt_policy not in ("keep", "drop"):
        raise ValueError(
            f"--preempt-policy must be 'keep' or 'drop', got {bounds.preempt_policy!r}"
        )
    if not 1 <= bounds.prefill_chunks <= 3:
        raise ValueError(f"--prefill-chunks must be between 1 and 3, got {bounds.prefill_chunks}")
    if not 0 <= bounds.spec_tokens <= 4:
        raise ValueError(f"--spec-tokens must be between 0 and 4, got {bounds.spec_tokens}")
    if bounds.state not in ("ring", "rows"):
        raise ValueError(f"--state must be 'ring' or 'rows', got {bounds.state!r}")
    if bounds.state_rows and bounds.state != "rows":
        raise ValueError("--state-rows needs --state rows")
    if not 0 <= bounds.state_rows <= bounds.requests:
        raise ValueError(
            f"--state-rows must be between 1 and --requests ({bounds.requests}), "
            f"got {bounds.state_rows}")
    if bounds.variant and bounds.variant not in VARIANTS:
        raise ValueError(
            f"--variant {bounds.variant!r} is unknown; choose one of: {', '.join(VARIANTS)}"
        )
    needs = {
        "resume-with-placeholder": (
            bounds.preempt and bounds.preempt_policy == "keep", "--preempt-policy keep"),
        "partial-prefill-feeds-mirror": (bounds.prefill_chunks >= 2, "--prefill-chunks 2 or more"),
        "host-sync-unguarded": (bounds.host_sync, "--host-sync"),
        "fault-spares-later-rows": (bounds.faults, "--faults"),
        **{v: (bounds.spec_tokens >= 1, "--spec-tokens 1 or more") for v in SPEC_VARIANTS},
        "state-row-reused-in-flight": (bounds.state == "rows", "--state rows"),
        "idx-from-previous-order": (
            bounds.state == "rows" and bounds.requests >= 2 and (bounds.condense or bounds.subsets),
            "--state rows, two requests, and --condense or --subsets"),
        "draft-count-of-another-row": (
            bounds.state == "rows" and bounds.subsets and bounds.spec_tokens >= 1
            and bounds.requests >= 2,
            "--state rows, --subsets, --spec-tokens 1 or more and two requests"),
        "skipped-from-previous-step": (
            bounds.state == "rows" and bounds.subsets and bounds.depth >= 3,
            "--state rows, --subsets and --depth 3 or more"),
    }
    if bounds.variant == "reentering-drafts-from-device" and bounds.spec_tokens >= 1:
        # A request re-enters after a preemption, or a host-sync one after a skipped step.
        needs[bounds.variant] = (bounds.preempt or bounds.host_sync, "--preempt or --host-sync")
    if bounds.variant and not needs[bounds.variant][0]:
        raise ValueError(f"--variant {bounds.variant} needs {needs[bounds.variant][1]}")
