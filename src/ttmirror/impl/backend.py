"""The backend interface: the async capability, and the device half of the runner (the mirror).

A backend advertises `supports_async_sampled_token_readback()` only if it keeps each step's
sampled ids on its device and combines them there into the next step's inputs, so the host
never reads a sampled id between launching step N and combining step N+1. The default is False,
as in the engine's `vt::Backend`: a backend must opt in by providing a real mirror.

The runner (`runner.py`) owns every host-side decision; a backend's `Mirror` only executes them:
stage host inputs, combine, launch (forward + sample into a ring slot), and read a slot back.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from .drafts import DraftSpec
from .overrides import NONE, Overrides
from .probe import ProbeSpec
from .rows import Row

TILE_WIDTH = 32
MAX_STATE_ROWS = 1024
"""The most state rows a mirror allocates (one uint32 per row per tensor: 4 KiB each)."""


def padded_rows(rows: int) -> int:
    """Rows rounded up to a multiple of 32: the width ttnn's tiled kernels (gather, where) work
    in, and the 32-user batch the TT decode stacks pad sampled-id tensors to."""
    return -(-rows // TILE_WIDTH) * TILE_WIDTH


@dataclass(frozen=True)
class MirrorSpec:
    """What a mirror allocates at load: K ring slots of `rows` sampled ids each, and the model."""

    rows: int = 8
    """Rows a step may hold (the decode batch); padded on device, see `padded_rows`."""
    slots: int = 2
    """K: step n's sampler writes slot n mod K."""
    probe: ProbeSpec = field(default_factory=ProbeSpec)
    trace: bool = False
    """Capture the decode step (combine, forward, sample) as a trace at load and replay it."""
    logprobs: int = 0
    """Top logprobs per row that the logprob ring holds beside each slot (0: no logprob ring).
    Slot k's ids and logprobs are one unit: written by the same step, copied by the same
    readback under the same event, released together."""
    readback_timeout_s: float | None = None
    """How long the host waits for a readback's event before it gives the step up as failed
    (`readback_complete` raises); None waits as long as it takes."""
    overrides: Overrides = NONE
    """Decision overrides of the mirror and its parts (`overrides.py`); none by default."""
    drafts: DraftSpec | None = None
    """Speculative decoding (spec rule 13): K drafts per decoding row, verified by the launch,
    and the drafter that proposes them on the device; None = no drafts."""
    state_rows: int = 0
    """Per-request state rows (spec rule 14): how many the device table holds (vLLM's
    `max_num_reqs`); each step's combine gathers from them through its `idx_mapping` and its
    launch's post-update scatters into them. 0: the ring's previous-row map instead."""
    report: Callable[[str, int], None] | None = field(default=None, compare=False)
    """Told of each device completion the host waits on and each host read of a copy, as
    (`device_wait` or `host_read`, slot), by a mirror on a device (the runner records them)."""

    def __post_init__(self) -> None:
        if self.logprobs < 0:
            raise ValueError(f"logprobs must be 0 or more, got {self.logprobs}")
        if self.rows < 1:
            raise ValueError(f"rows must be at least 1, got {self.rows}")
        if self.slots < 1:
            raise ValueError(f"slots (K) must be at least 1, got {self.slots}")
        if self.readback_timeout_s is not None and not self.readback_timeout_s > 0:
            raise ValueError(f"readback_timeout_s must be positive, got {self.readback_timeout_s}")
        if not 0 <= self.state_rows <= MAX_STATE_ROWS:
            raise ValueError(f"state_rows must be between 0 and {MAX_STATE_ROWS}, got "
                             f"{self.state_rows}")

    @property
    def width(self) -> int:
        """The batch's row width on the device: a step's rows, padded."""
        return padded_rows(self.rows)

    @property
    def table_width(self) -> int:
        """The state-row table's width on the device: its rows, padded (a gather's index may be
        longer or shorter than its input along the gathered dimension)."""
        return padded_rows(self.state_rows)


@dataclass(frozen=True)
class StepInputs:
    """The host's part of one step's combine: the step's rows, as the combine staged them. The
    device takes them as columns, one entry per row (a dropped row stages zeros everywhere):

    Row i consumes `slot[src][prev_map[i]]` (with state rows `table[prev_map[i]]`, its own state
    row) when `use_mirror[i]` is 1, else `host_ids[i]`.
    """

    rows: tuple[Row, ...]

    @property
    def host_ids(self) -> tuple[int, ...]:
        return tuple(r.host_id if r.live and r.host_pos is not None else 0 for r in self.rows)

    @property
    def prev_map(self) -> tuple[int, ...]:
        return tuple(r.prev_row if r.live and r.prev_row is not None else 0 for r in self.rows)

    @property
    def use_mirror(self) -> tuple[int, ...]:
        return tuple(int(r.from_mirror) for r in self.rows)

    @property
    def positions(self) -> tuple[int, ...]:
        """Host positions; a mirror row's with drafts is on the device (its `pos` is -1)."""
        return tuple(r.pos if r.live and r.pos >= 0 else 0 for r in self.rows)

    @property
    def spec(self) -> tuple[int, ...]:
        """Drafts scheduled per row (spec rule 13): verification accepts at most these."""
        return tuple(r.spec if r.live else 0 for r in self.rows)

    def host_drafts(self, k: int) -> tuple[tuple[int, ...], ...]:
        """K lanes of host-staged drafts, lane j holding each host row's draft j (else 0)."""
        def staged(r: Row, j: int) -> int:
            if not (r.live and r.prev_row is None):
                return 0
            return r.drafts[j] if j < len(r.drafts) else 0

        return tuple(tuple(staged(r, j) for r in self.rows) for j in range(k))

    @property
    def requests(self) -> tuple[int, ...]:
        """Each row's request id: what a seeded sampler keys its draw on, with the position."""
        return tuple(r.req if r.live else 0 for r in self.rows)

    def scatter(self, state_rows: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """With state rows: the post-update's inverse of the `idx_mapping`, per state row the
        batch row that writes it (0 where none does), and the mask of the written ones. Every
        row writes, dropped ones too: the device does not know the host no longer wants them
        (a step names each state row once at most)."""
        writer, written = [0] * state_rows, [0] * state_rows
        for i, r in enumerate(self.rows):
            if 0 <= r.idx < state_rows:
                writer[r.idx], written[r.idx] = i, 1
        return tuple(writer), tuple(written)


class TokenLogprobs(NamedTuple):
    """What the logprob ring holds for one row: the sampled id's logprob and the top ones."""

    sampled: float
    """Log-probability of the sampled id."""
    top: tuple[tuple[int, float], ...]
    """The most likely (id, logprob) pairs, most likely first (ties: the lower id first)."""


def logprob_rows(values: list[list[float]], ids: list[list[int]]) -> list[TokenLogprobs]:
    """Rows of a logprob slot's host copy: values [rows, 1 + n] (sampled, then the top n) and
    ids [rows, n]."""
    return [
        TokenLogprobs(float(v[0]), tuple((int(t), float(x)) for t, x in zip(i, v[1:], strict=True)))
        for v, i in zip(values, ids, strict=True)
    ]


class DraftCopy(NamedTuple):
    """What a readback with drafts brings back per row (spec rule 13), under the ids' event."""

    tokens: tuple[tuple[int, ...], ...]
    """Per row the target's K + 1 tokens; the first `counts[i]` are the row's yield."""
    counts: tuple[int, ...]
    """Per row a + 1: the accepted drafts and the target's token after them."""
    drafts: tuple[tuple[int, ...], ...]
    """Per row the drafter's K proposals after its newest token."""


class Mirror(Protocol):
    """The device side of the runner: the ring of K slots and the ops that read and write it.

    The runner calls these in its phase order and has checked every precondition; a mirror
    only has to keep the device's own ordering right (queues, events, traces).
    """

    def stage(self, inputs: StepInputs) -> None:
        """Copy the host's part of the combine into persistent device inputs."""

    def combine(self, slot: int) -> None:
        """Build the input ids of the step that will write `slot`, reading slot (slot-1) mod K
        through the previous-row map under the use-mirror mask."""

    def launch(self, slot: int) -> None:
        """Forward + sample; the sampler writes the step's ids straight into `slot`."""

    def readback_issue(self, slot: int) -> Any:
        """Enqueue a non-blocking copy of `slot` to the host; returns the pending handle."""

    def readback_complete(self, pending: Any) -> list[int]:
        """Wait for the copy's event, then return the host copy's ids (all padded rows); a
        mirror on a device reports the wait and the read (`MirrorSpec.report`)."""

    def readback_drafts(self, pending: Any) -> DraftCopy:
        """After `readback_complete(pending)`: the tokens, counts and drafts the step's launch
        wrote (all padded rows), copied under the same event; only for a mirror with drafts."""

    def readback_logprobs(self, pending: Any) -> list[TokenLogprobs]:
        """After `readback_complete(pending)`: the logprob ring's host copy (all padded rows),
        copied under the same event as the ids; only for a mirror opened with logprobs. With K
        drafts, every lane's, lane after lane: lane j of row i at j * padded rows + i (the
        entry of the token the row's lane j sampled)."""

    def abandon(self, pending: Any) -> None:
        """The runner gave up on `pending` (its step failed): keep whatever the copy may still
        write into alive until the device is known to be past it."""

    def describe(self) -> dict[str, Any]:
        """Counters and settings worth reporting (trace captures and replays, queues...)."""

    def close(self) -> None: ...


class Backend(ABC):
    """A place to run decode steps, and what the engine may assume about it."""

    name: str = "?"
    reports_device_waits: bool = False
    """Its mirror reports each device completion the host waits on (`MirrorSpec.report`)."""

    def supports_async_sampled_token_readback(self) -> bool:
        """True only for backends whose mirror combines the previous step's ids on device."""
        return False

    def supports_draft_aware_combine(self) -> bool:
        """True only for backends whose combine also takes each row's newest token, position and
        drafts from the device after verification (spec rule 13); False by default, and for
        every backend here until its mirror carries drafts."""
        return False

    @abstractmethod
    def device_kind(self) -> str:
        """ "chip", "emulated" or "cpu"."""

    @abstractmethod
    def open_mirror(self, spec: MirrorSpec) -> Mirror:
        """Allocate the ring and every persistent tensor (the model's `allocate`)."""

    def info(self) -> dict[str, Any]:
        """Backend-specific facts for `ttmirror info` (device details, versions)."""
        return {}


_REGISTRY: dict[str, tuple[str, str]] = {
    "cpu": ("ttmirror.impl.cpu_backend", "CpuBackend"),
    "tt": ("ttmirror.impl.tt_backend", "TtBackend"),
}


def backend_names() -> list[str]:
    return sorted(_REGISTRY)


def get_backend(name: str, **options: Any) -> Backend:
    """The backend called `name` ("cpu" or "tt"), built with `options`."""
    if name not in _REGISTRY:
        hint = (
            " (no cuda backend is shipped: no GPU was available to run it, and code that never "
            "ran is not shipped)"
            if name == "cuda"
            else ""
        )
        raise ValueError(
            f"unknown backend {name!r}{hint}; choose one of: {', '.join(backend_names())}"
        )
    module_name, class_name = _REGISTRY[name]
    cls = getattr(importlib.import_module(module_name), class_name)
    backend: Backend = cls(**options)
    return backend
