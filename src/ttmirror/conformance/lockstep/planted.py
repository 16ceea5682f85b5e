"""Planted bugs as overrides: each bug of the catalog (`bugs.py`) redefines named decision
methods of `impl/`.

A bug is planted as a value: `overrides(bugs)` gives the subclasses
that plant them, each redefining one decision method of one class of `impl/` (the runner, a
mirror, the combine, the probe model, the verifying launch), and a harness hands that value to
the runner's configuration (`RunnerConfig.overrides`); the runner and its mirror are built with
them (`impl.overrides.built`). The code that runs on a chip names none: it has no planted branch.
The command line reads the bug from ``TTMIRROR_BUG`` (`ttmirror.cli.arguments`); nothing here reads
the environment.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
import ttnn

from ttmirror.conformance.bugs import check
from ttmirror.impl.backend import DraftCopy, StepInputs
from ttmirror.impl.combine import DeviceCombine
from ttmirror.impl.cpu_backend import CpuMirror
from ttmirror.impl.overrides import NONE, Overrides
from ttmirror.impl.ring import DraftSlot, allocate_ids, ids_shape
from ttmirror.impl.rows import Row
from ttmirror.impl.runner import PLACEHOLDER_ID, Phase, Runner, Step
from ttmirror.impl.tt_backend import PendingReadback, TtMirror
from ttmirror.impl.tt_model import TtProbeModel
from ttmirror.impl.tt_verify import DeviceVerify

# --- the runner's decisions ------------------------------------------------------------------


class HostSyncUnguarded(Runner):
    """host-sync-unguarded: a host-sync request is never held for its step in flight."""

    def held_for_host(self, req: int) -> bool:
        return False


class ResumeWithPlaceholder(Runner):
    """resume-with-placeholder: a preempted request resumes while it still owes tokens."""

    def _resume_blocker(self, req: int) -> str | None:
        return None


class LastChunkStaysPartial(Runner):
    """last-chunk-stays-partial: the chunk that ends a prefill is partial too, forever."""

    def _chunk_is_partial(self, partial: bool) -> bool:
        return True


class GuardOff(Runner):
    """guard-off: no previous-row map; in-flight rows combine from host placeholders."""

    def _guarded(self) -> bool:
        return False


class PrevRowNotRemapped(Runner):
    """prev-row-not-remapped: a mapped row keeps its new index (rows assumed not to move)."""

    def _prev_row(self, i: int, prev_row: int | None) -> int | None:
        return None if prev_row is None else i


class ReenteringDraftsFromDevice(Runner):
    """reentering-drafts-from-device: a request re-entering past its prompt is scheduled with K
    placeholder drafts, for a device that holds none for it."""

    def _host_drafts(self, r: int, partial: bool, spec: int) -> tuple[int, tuple[int, ...]]:
        if not spec and self.requests[r].delivered and not partial:
            assert self.config.drafts is not None  # a row with drafts: the runner has them
            k = self.config.drafts.k
            return k, (PLACEHOLDER_ID,) * k
        return super()._host_drafts(r, partial, spec)


class PartialPrefillFeedsMirror(Runner):
    """partial-prefill-feeds-mirror: the map takes a partial-prefill row, whose id is discarded."""

    def _previous_rows(self, prev: Step | None) -> dict[int, int]:
        if prev is None:
            return {}
        return {row.req: i for i, row in enumerate(prev.rows) if row.live}


class PrevRowSkipsDropped(Runner):
    """prev-row-skips-dropped: the map counts only live rows, so a row after a dropped one
    reads its neighbour."""

    def _previous_rows(self, prev: Step | None) -> dict[int, int]:
        if prev is None:
            return {}
        return {row.req: i for i, row in enumerate(r for r in prev.rows if r.live)
                if not row.partial}


class PrevRowByIdRank(Runner):
    """prev-row-by-id-rank: a request's row is its rank by id among the previous step's rows
    (right only while the engine keeps rows in id order)."""

    def _previous_rows(self, prev: Step | None) -> dict[int, int]:
        rows = super()._previous_rows(prev)
        by_id = sorted(row.req for row in prev.rows) if prev is not None else []
        return {r: by_id.index(r) for r in rows}


class PrevRowTwoBack(Runner):
    """prev-row-two-back: each request's row as of the last applied step: two steps back while
    the previous step is in flight."""

    applied: dict[int, int] | None = None

    def _previous_rows(self, prev: Step | None) -> dict[int, int]:
        applied = self.applied or {}
        return {r: applied.get(r, i) for r, i in super()._previous_rows(prev).items()}

    def apply(self) -> dict[int, int]:
        oldest = self.queue[0].rows if self.queue else ()
        delivered = super().apply()
        self.applied = {row.req: i for i, row in enumerate(oldest) if row.live}
        return delivered


class CombineBeforeLaunch(Runner):
    """combine-before-launch: a step combines before the previous step's sampler wrote."""

    def _combine_blocker(self, q: int) -> str | None:
        return None


class StaleHostIdOnResume(Runner):
    """stale-host-id-on-resume: a resumed request's host id is one position stale."""

    def _host_pos(self, row: Row) -> int:
        stale = row.pos > 0 and self.requests[row.req].preemptions
        return row.pos - 1 if stale else row.pos


class EventBeforeDeviceCall(Runner):
    """event-before-device-call: the launch event is recorded before the device call, so a
    launch the device refused leaves an event for a step that never ran."""

    def _launch_on_device(self, step: Step, q: int) -> None:
        self._record_phase("launch", step, q)
        super()._launch_on_device(step, q)

    def _record_phase(self, action: str, step: Step, q: int, **detail: object) -> None:
        if action == "launch" and step.phase == Phase.LAUNCHED:
            return  # recorded already, before the device call
        super()._record_phase(action, step, q, **detail)


class DeliverDropped(Runner):
    """deliver-dropped: tokens of rows dropped by finish, abort or preemption are delivered."""

    def _delivers(self, row: Row) -> bool:
        return True


class FaultSparesLaterRows(Runner):
    """fault-spares-later-rows: only the failed step's rows go; the requests' rows in the other
    in-flight step stay live."""

    def _drop_failed(self, step: Step, req: int) -> None:
        step.rows = tuple(r._replace(live=False) if r.live and r.req == req else r
                          for r in step.rows)


class FaultDropsPendingCopy(Runner):
    """fault-drops-pending-copy: the failed step's readback copy is dropped, not left to the
    mirror, while the device may still write into it."""

    def _abandon_copy(self, step: Step) -> None:
        pass


class FaultKeepsRingPosition(Runner):
    """fault-keeps-ring-position: a failed newest step does not give its slot back to the ring
    position."""

    def _rewind_ring(self, step: Step) -> None:
        pass


class ReleaseAtIssue(Runner):
    """release-at-issue: a slot is handed back once its readback is only issued."""

    def _writer_holds(self, step: Step) -> bool:
        return Phase.LAUNCHED <= step.phase < Phase.READBACK_ISSUED


class ReleaseWhenDraining(Runner):
    """release-when-draining: while nothing is eligible, a slot is handed back once its
    readback is only issued."""

    def _writer_holds(self, step: Step) -> bool:
        if not self.eligible():
            return Phase.LAUNCHED <= step.phase < Phase.READBACK_ISSUED
        return super()._writer_holds(step)


class ReleaseUnderCombine(Runner):
    """release-under-combine: a slot is handed back while the next combine still reads it."""

    def _combine_reads(self, step: Step) -> bool:
        return False


# --- the tt mirror's decisions (its queues, events and ring) ----------------------------------


class RingReuseK1(TtMirror):
    """ring-reuse-k1: the sampler always writes ring slot 0 (K=1 reuse, no check)."""

    def _written_slot(self, slot: int) -> int:
        return 0


class DraftPartPreviousSlot(TtMirror):
    """draft-part-previous-slot: the draft part is written into the slot the combine just read."""

    def _draft_part(self, slot: int) -> int:
        return self.ring.source_of(slot)


class GatherCurrentSlot(TtMirror):
    """gather-current-slot: the combine gathers from the slot its step is about to write."""

    def _source(self, slot: int) -> int:
        return slot


class ReadbackCq1NoWait(TtMirror):
    """readback-cq1-no-wait: CQ1 copies the slot without waiting for the launch event."""

    def _wait_for_launch(self, slot: int, cq: int) -> None:
        pass


class LogprobsAfterEvent(TtMirror):
    """logprobs-after-event: the logprob part is copied after the event is recorded, so
    synchronising the event does not cover it."""

    def _copy_parts(self, pending: PendingReadback, cq: int) -> None:
        pending.drafts = self._copy_drafts(pending.slot, cq)
        pending.event = self.tt.record_event(self.device, cq_id=cq)
        pending.logprobs = self._copy_logprobs(pending.slot, cq)


class LogprobFenceIdsOnly(TtMirror):
    """logprob-fence-ids-only: the logprob part is copied after the ids' event under an event of
    its own, and the slot's rewrite fence covers the ids only."""

    def _copy_parts(self, pending: PendingReadback, cq: int) -> None:
        pending.drafts = self._copy_drafts(pending.slot, cq)
        pending.event = self.tt.record_event(self.device, cq_id=cq)
        pending.logprobs = self._copy_logprobs(pending.slot, cq)
        if pending.logprobs is not None:
            pending.logprobs_event = self.tt.record_event(self.device, cq_id=cq)


class CountFromWrongRow(TtMirror):
    """count-from-wrong-row: each row's accepted count is read from the next row of the copy."""

    def readback_drafts(self, pending: Any) -> DraftCopy:
        return counts_from_next_row(super().readback_drafts(pending))


class HostReadBeforeEvent(TtMirror):
    """host-read-before-event: the host copy is read before its event."""

    def readback_complete(self, pending: Any) -> list[int]:
        values = self._host_read(pending)
        self._wait(pending)
        return values


# --- the combine's, the probe model's and the verifying launch's (tt) --------------------------


class StageCq1NoEvent(DeviceCombine):
    """stage-cq1-no-event: host inputs are written on CQ1 with no event before the combine."""

    def _stage_cq(self) -> int:
        return self.other_cq if self.other_cq is not None else self.cq


class MaskInverted(DeviceCombine):
    """mask-inverted: the use-mirror mask is staged inverted."""

    def _mask(self, inputs: StepInputs) -> tuple[int, ...]:
        return tuple(1 - m for m in inputs.use_mirror)


class PositionsStale(DeviceCombine):
    """positions-stale: the positions tensor holds the previous step's positions."""

    previous: tuple[int, ...] = ()

    def _positions(self, inputs: StepInputs) -> tuple[int, ...]:
        stale, self.previous = self.previous or inputs.positions, inputs.positions
        return stale


class HostDraftsPlaceholder(DeviceCombine):
    """host-drafts-placeholder: a host row's draft lanes are staged as the async scheduler's -1
    placeholders, not the drafts read back."""

    def _draft_lanes(self, inputs: StepInputs) -> tuple[tuple[int, ...], ...]:
        return placeholder_lanes(inputs, self.k)


class GatherOffByOne(DeviceCombine):
    """gather-off-by-one: the gather index is the previous-row map plus one."""

    def _index_offset(self) -> int:
        return 1


class WhereSwapped(DeviceCombine):
    """where-swapped: mirror rows take host ids, host rows the gathered ids."""

    def _where_operands(self) -> tuple[ttnn.Tensor, ttnn.Tensor]:
        return self.fallback, self.gathered


class SamplerKeyedByRow(TtProbeModel):
    """sampler-keyed-by-row: the seeded draw is keyed by the batch row, not the request."""

    def __init__(self, device: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(device, *args, **kwargs)
        width = self.index.shape[-1]
        self.row_ids = self.tt.from_torch(
            torch.arange(width, dtype=torch.int32).reshape(ids_shape(width)), dtype=ttnn.uint32,
            layout=ttnn.ROW_MAJOR_LAYOUT, device=device, cq_id=self.cq)

    def _sampling_key(self, positions: ttnn.Tensor) -> tuple[Any, ttnn.Tensor]:
        return self.row_ids, positions


class SamplerKeyedByStep(TtProbeModel):
    """sampler-keyed-by-step: the seeded draw is keyed by a device step counter, not the
    position."""

    def __init__(self, device: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(device, *args, **kwargs)
        width = self.index.shape[-1]
        self.steps = self.tt.from_torch(torch.zeros(ids_shape(width), dtype=torch.int32),
                                     dtype=ttnn.uint32, layout=ttnn.ROW_MAJOR_LAYOUT,
                                     device=device, cq_id=self.cq)

    def _sampling_key(self, positions: ttnn.Tensor) -> tuple[Any, ttnn.Tensor]:
        tt: Any = self.tt  # plus_one: a ttnn op the mirror itself never calls
        tt.plus_one(self.steps)
        return self.requests, self.steps


class BonusTokenDropped(DeviceVerify):
    """bonus-token-dropped: the count is the accepted drafts alone."""

    def _write_count(self, accepted: ttnn.Tensor, slot: DraftSlot) -> None:
        self.tt.add(accepted, 0, output_tensor=slot.count)


class PositionsAdvanceBySpec(DeviceVerify):
    """positions-advance-by-spec: the position advances by the 1 + spec tokens scheduled."""

    def __init__(self, device: Any, k: int, width: int, *args: Any, **kwargs: Any) -> None:
        super().__init__(device, k, width, *args, **kwargs)
        self.spare = allocate_ids(device, width, ttnn.TILE_LAYOUT)

    def _advance(self, base: ttnn.Tensor, slot: DraftSlot) -> None:
        assert self.combine.spec is not None
        self.tt.add(self.combine.spec, 1, output_tensor=self.spare)
        self.tt.add(base, self.spare, output_tensor=slot.position)


class RejectedDraftDelivered(DeviceVerify):
    """rejected-draft-delivered: the run's draft lanes are rewritten from the draft inputs (the
    target's token only after the last), so a rejected draft is delivered."""

    def __init__(self, device: Any, k: int, width: int, *args: Any, **kwargs: Any) -> None:
        super().__init__(device, k, width, *args, **kwargs)
        self.spare = allocate_ids(device, width, ttnn.TILE_LAYOUT)

    def _write_ids(self, ids: ttnn.Tensor, slot: DraftSlot) -> None:
        # Lane j where a draft was scheduled (spec > j: not eq(spec, 0), eq(spec, 2)) takes the
        # draft input, the target's token elsewhere.
        lanes, tok = self.combine.lanes, self.tokens
        masks = [(self.spec_zero, tok[0], lanes[1])]
        if self.k == 2:
            masks.append((self.second[0], lanes[2], tok[1]))
        for j, (mask, chosen, other) in enumerate(masks):
            self.tt.where(mask, chosen, other, output_tensor=self.spare)
            self.tt.add(self.spare, 0, output_tensor=slot.tokens[j])
        super()._write_ids(ids, slot)


# --- the cpu mirror's --------------------------------------------------------------------------


class CpuHostDraftsPlaceholder(CpuMirror):
    """host-drafts-placeholder on the cpu mirror."""

    def _draft_lanes(self, inputs: StepInputs) -> tuple[tuple[int, ...], ...]:
        return placeholder_lanes(inputs, self.k)


class CpuBonusTokenDropped(CpuMirror):
    """bonus-token-dropped on the cpu mirror."""

    def _counted(self, accepted: torch.Tensor) -> torch.Tensor:
        return accepted


class CpuPositionsAdvanceBySpec(CpuMirror):
    """positions-advance-by-spec on the cpu mirror."""

    def _advanced(self, base: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
        return base + self._spec + 1


class CpuRejectedDraftDelivered(CpuMirror):
    """rejected-draft-delivered on the cpu mirror."""

    def _run(self, tokens: torch.Tensor) -> torch.Tensor:
        lanes = torch.arange(self.k).unsqueeze(1)
        drafted = torch.where(lanes < self._spec.unsqueeze(0), self.input_lanes[1:], tokens[:-1])
        return torch.cat([drafted, tokens[-1:]])


class CpuDraftPartPreviousSlot(CpuMirror):
    """draft-part-previous-slot on the cpu mirror."""

    def _draft_part(self, slot: int) -> int:
        return (slot - 1) % self.spec.slots


class CpuCountFromWrongRow(CpuMirror):
    """count-from-wrong-row on the cpu mirror."""

    def readback_drafts(self, pending: Any) -> DraftCopy:
        return counts_from_next_row(super().readback_drafts(pending))


class DraftCountOfAnotherRow(DeviceCombine):
    """draft-count-of-another-row: every row's scheduled drafts are staged as the first
    row's."""

    def _spec_column(self, inputs: StepInputs) -> tuple[int, ...]:
        return first_row_count(inputs)


class CpuDraftCountOfAnotherRow(CpuMirror):
    """draft-count-of-another-row on the cpu mirror."""

    def _spec_column(self, inputs: StepInputs) -> tuple[int, ...]:
        return first_row_count(inputs)


class SkippedFromPreviousStep(Runner):
    """skipped-from-previous-step: a request the previous step left out is mapped to its row in
    the last step that held it, and combined from the previous step's slot at that row."""

    held: dict[int, int] | None = None

    def _previous_rows(self, prev: Step | None) -> dict[int, int]:
        if prev is None:
            return {}
        return {**(self.held or {}), **super()._previous_rows(prev)}

    def schedule(self, order: Sequence[int] | None = None,
                 drafts: Sequence[int] | None = None) -> int:
        q = super().schedule(order, drafts)
        self.held = {**(self.held or {}),
                     **{row.req: i for i, row in enumerate(self.queue[q].rows) if row.live}}
        return q


class StateRowReusedInFlight(Runner):
    """state-row-reused-in-flight: a closed request's state row goes back while a step of its
    owner (a dropped row of it) is still in flight and will scatter into it."""

    def _row_writer(self, idx: int) -> Step | None:
        return None


class IdxFromPreviousOrder(Runner):
    """idx-from-previous-order: each batch row's idx_mapping entry is the state row the
    previous step's row at that place named (right only while rows keep their places)."""

    def _state_row(self, i: int, r: int, prev: Step | None) -> int:
        if prev is not None and i < len(prev.rows):
            return prev.rows[i].idx
        return super()._state_row(i, r, prev)


def counts_from_next_row(copy: DraftCopy) -> DraftCopy:
    """`copy` with each row's count taken from the next row's."""
    return copy._replace(counts=copy.counts[1:] + copy.counts[:1])


def first_row_count(inputs: StepInputs) -> tuple[int, ...]:
    """The first row's scheduled drafts, for every row."""
    spec = inputs.spec
    return tuple(spec[0] for _ in spec) if spec else spec


def placeholder_lanes(inputs: StepInputs, k: int) -> tuple[tuple[int, ...], ...]:
    """K host draft lanes with -1, the async scheduler's placeholder, in place of each host
    row's scheduled drafts (never filled)."""
    return tuple(
        tuple(-1 if r.live and r.prev_row is None and j < r.spec else draft
              for r, draft in zip(inputs.rows, lane, strict=True))
        for j, lane in enumerate(inputs.host_drafts(k)))


PLANTED: dict[str, tuple[type, ...]] = {
    "host-sync-unguarded": (HostSyncUnguarded,),
    "resume-with-placeholder": (ResumeWithPlaceholder,),
    "last-chunk-stays-partial": (LastChunkStaysPartial,),
    "guard-off": (GuardOff,),
    "prev-row-not-remapped": (PrevRowNotRemapped,),
    "reentering-drafts-from-device": (ReenteringDraftsFromDevice,),
    "partial-prefill-feeds-mirror": (PartialPrefillFeedsMirror,),
    "prev-row-skips-dropped": (PrevRowSkipsDropped,),
    "prev-row-by-id-rank": (PrevRowByIdRank,),
    "prev-row-two-back": (PrevRowTwoBack,),
    "combine-before-launch": (CombineBeforeLaunch,),
    "stale-host-id-on-resume": (StaleHostIdOnResume,),
    "event-before-device-call": (EventBeforeDeviceCall,),
    "deliver-dropped": (DeliverDropped,),
    "fault-spares-later-rows": (FaultSparesLaterRows,),
    "fault-drops-pending-copy": (FaultDropsPendingCopy,),
    "fault-keeps-ring-position": (FaultKeepsRingPosition,),
    "release-at-issue": (ReleaseAtIssue,),
    "release-when-draining": (ReleaseWhenDraining,),
    "release-under-combine": (ReleaseUnderCombine,),
    "ring-reuse-k1": (RingReuseK1,),
    "draft-part-previous-slot": (DraftPartPreviousSlot, CpuDraftPartPreviousSlot),
    "gather-current-slot": (GatherCurrentSlot,),
    "readback-cq1-no-wait": (ReadbackCq1NoWait,),
    "logprobs-after-event": (LogprobsAfterEvent,),
    "logprob-fence-ids-only": (LogprobFenceIdsOnly,),
    "count-from-wrong-row": (CountFromWrongRow, CpuCountFromWrongRow),
    "host-read-before-event": (HostReadBeforeEvent,),
    "stage-cq1-no-event": (StageCq1NoEvent,),
    "mask-inverted": (MaskInverted,),
    "positions-stale": (PositionsStale,),
    "host-drafts-placeholder": (HostDraftsPlaceholder, CpuHostDraftsPlaceholder),
    "gather-off-by-one": (GatherOffByOne,),
    "where-swapped": (WhereSwapped,),
    "sampler-keyed-by-row": (SamplerKeyedByRow,),
    "sampler-keyed-by-step": (SamplerKeyedByStep,),
    "bonus-token-dropped": (BonusTokenDropped, CpuBonusTokenDropped),
    "positions-advance-by-spec": (PositionsAdvanceBySpec, CpuPositionsAdvanceBySpec),
    "rejected-draft-delivered": (RejectedDraftDelivered, CpuRejectedDraftDelivered),
    "draft-count-of-another-row": (DraftCountOfAnotherRow, CpuDraftCountOfAnotherRow),
    "skipped-from-previous-step": (SkippedFromPreviousStep,),
    "state-row-reused-in-flight": (StateRowReusedInFlight,),
    "idx-from-previous-order": (IdxFromPreviousOrder,),
}
"""Bug id -> the overrides that plant it (one per class it lives in: the tt and the cpu mirror
each have their own)."""


def overrides(bugs: Iterable[str | None] = ()) -> Overrides:
    """The overrides that plant `bugs` (None entries ignored), or ValueError naming an unknown
    one."""
    chosen = [b for b in bugs if b is not None]
    check(chosen)
    return tuple(o for b in dict.fromkeys(chosen) for o in PLANTED[b]) or NONE
