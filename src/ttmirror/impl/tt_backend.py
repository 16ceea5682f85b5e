"""The tt backend: the mirror on a Tenstorrent device through ttnn (a chip, else the emulated one).

Queues: compute (host input writes, combine, forward, sample) runs on CQ0 in order, so a slot's
next combine always runs after its writer and before any later rewrite. The readback runs on
`readback_cq` (CQ1 when the device has two), ordered by events both ways:

    CQ0: launch(slot) -> launched = record_event(CQ0)
    CQ1: wait_for_event(launched) -> slot.cpu(blocking=False) -> read = record_event(CQ1)
    CQ0: before the next launch into the same slot: wait_for_event(read)

so a slot is rewritten only after both its readers (the next combine, by queue order; its own
readback, by the event) are done. The host copy stays referenced until `event_synchronize(read)`
(upstream once freed it under the copy). With a readback timeout, the host waits for that event
in a helper thread with a deadline (ttnn has no event query); a copy whose step was given up
(`abandon`, or a readback refused half-way) keeps its host tensors here until a later readback's
event, recorded after it on the same queue, was synchronised. With logprobs, each slot's
logprob part (`Ring`) is written by the same forward and copied by the same readback before
`read` is recorded, so one event covers both payloads and one release hands both back. With
drafts (spec rule 13) the same holds for each slot's draft part: the launch that verifies
(`tt_verify.py`) writes the newest tokens into the slot and the target's tokens, the counts, the
positions and the drafts into its draft part; the readback copies the tokens, the counts and the
drafts before `read`; the next combine reads newest token, position and drafts through the map.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as WaitTimeout
from dataclasses import dataclass
from typing import Any

import ttnn

from .backend import (
    Backend,
    DraftCopy,
    Mirror,
    MirrorSpec,
    StepInputs,
    TokenLogprobs,
    logprob_rows,
)
from .combine import DeviceCombine
from .devices import DeviceProvider, default_provider, device_info, provider_of, ttnn_for
from .drafts import draft_table
from .overrides import built
from .ring import Ring
from .state_rows import StateTable
from .trace import DecodeTraces
from .tt_model import TtProbeModel
from .tt_verify import DeviceVerify, HeadDrafter, ProbeLanes

COMPUTE_CQ = 0
DEFAULT_TRACE_REGION = 1 << 20


@dataclass
class PendingReadback:
    """A non-blocking copy in flight: the host tensor must outlive the copy, so it lives here."""

    slot: int
    host: ttnn.Tensor | None
    event: Any
    logprobs: tuple[tuple[ttnn.Tensor, ttnn.Tensor], ...] | None = None
    """Host copies of the slot's logprob part (values, ids), under the same event: one pair,
    or with drafts one per lane."""
    logprobs_event: Any = None
    """The logprob copies' own event, where a mirror records one (none does by default: one
    event covers the ids and the logprob part)."""
    issued: int = 0
    """Its place among the readbacks issued on the readback queue (they complete in order)."""
    drafts: tuple[ttnn.Tensor, ...] | None = None
    """Host copies of the slot's draft part (K + 1 tokens, count, K drafts), under the event."""


class TtMirror:
    def __init__(
        self, device: Any, spec: MirrorSpec, readback_cq: int, model: Any = None
    ) -> None:
        """`model`: the forward + sampler (`forward(input_ids, positions, slot)` enqueuing device
        ops on CQ0 that write the slot); default the probe. The serving loop passes its decoder."""
        self.tt = ttnn_for(device)
        self.device = device
        self.spec = spec
        self.readback_cq = readback_cq
        if spec.logprobs and model is None:
            raise ValueError("the probe forward computes no logprobs: open the mirror with "
                             "logprobs=0, or serve a decoder model (ServingBackend)")
        k = spec.drafts.k if spec.drafts is not None else 0
        self.ring = Ring(device, spec.width, spec.slots, spec.logprobs, drafts=k)
        self.table = (StateTable(device, spec.table_width, spec.state_rows, spec.width, k)
                      if spec.state_rows else None)
        other = readback_cq if readback_cq != COMPUTE_CQ else None
        seeded = model is None and spec.probe.sampling is not None
        self.combiner = built(DeviceCombine, spec.overrides)(
            device, self.ring.width, COMPUTE_CQ, other, identity=seeded, drafts=k,
            table=self.table)
        self.model = (
            model
            if model is not None
            else built(TtProbeModel, spec.overrides)(
                device, spec.probe, self.ring.width, COMPUTE_CQ, requests=self.combiner.requests)
        )
        self.verify = self._verifier(device, model) if spec.drafts is not None else None
        self._launched: list[Any] = [None] * spec.slots  # CQ0 event after the slot's writer
        self._read: list[Any] = [None] * spec.slots  # readback_cq event after the slot's copy
        self._issued = 0  # a plain int: the backend's state copies as data
        self._abandoned: list[PendingReadback] = []  # copies that may still land
        self._unfenced: set[int] = set()  # slots copied by a readback that recorded no event
        self._waiter: ThreadPoolExecutor | None = None  # waits with a deadline, in order
        self.launches = 0
        self.timeouts = 0
        self.traces: DecodeTraces | None = None
        if spec.trace:
            self.traces = DecodeTraces(device, spec.slots, COMPUTE_CQ)
            self.traces.capture(self._decode_step)
            self.ring.seal()
        # Load is complete before the first step: every zero-fill, table upload and warm-up
        # has run, so no step's work ever queues behind load.
        self.tt.synchronize_device(device)

    def _verifier(self, device: Any, model: Any) -> DeviceVerify:
        """The launch with drafts: the probe's lanes and draft table, or a serving decoder that
        runs its own lanes and drafter (`LaneTarget`, `Drafter`)."""
        assert self.spec.drafts is not None
        width, k = self.ring.width, self.spec.drafts.k
        verify = built(DeviceVerify, self.spec.overrides)
        if model is not None:
            return verify(device, k, width, self.combiner, model, model, COMPUTE_CQ)
        drafter = HeadDrafter(device, draft_table(self.spec.probe, self.spec.drafts), width,
                              COMPUTE_CQ)
        return verify(device, k, width, self.combiner, ProbeLanes(self.model), drafter,
                      COMPUTE_CQ)

    def _next_issue(self) -> int:
        self._issued += 1
        return self._issued

    def _decode_step(self, slot: int) -> None:
        """The device work of one step: combine from the previous slot (or the state rows),
        forward, sample (and with state rows the post-update)."""
        self._combine(slot)
        self._forward(slot)

    def _combine(self, slot: int) -> None:
        """The combine's device ops for `slot`, from the previous slot (and its draft part), or
        with state rows from the table."""
        if self.table is not None:
            self.combiner.enqueue(None)
            return
        source = self._source(slot)
        self.combiner.enqueue(self.ring[source], self.ring.drafts[source] if self.verify else None)

    def _forward(self, slot: int) -> None:
        """Forward + sample into the slot (and its logprob part, when the ring has one); with
        drafts, the launch that verifies and drafts, writing the slot and its draft part; with
        state rows, then the post-update from what the launch wrote."""
        target = self._written_slot(slot)
        part = self.ring.logprobs[target] if self.ring.logprobs else None
        draft = None
        if self.verify is not None:
            draft = self.ring.drafts[self._draft_part(target)]
            lanes = (part, *draft.logprobs) if part is not None else None
            self.verify.enqueue(self.ring[target], draft, lanes)
        else:
            self.model.forward(self.combiner.input_ids, self.combiner.positions,
                               self.ring[target], logprobs=part)
        if self.table is not None:
            self.table.post_update(self.ring[target], draft, COMPUTE_CQ)

    def _written_slot(self, slot: int) -> int:
        """The slot a launch into `slot` writes: that one."""
        return slot

    def _draft_part(self, slot: int) -> int:
        """Whose draft part the launch that writes `slot` writes: that slot's."""
        return slot

    def _source(self, slot: int) -> int:
        """The slot the combine for `slot` reads: the previous step's."""
        return self.ring.source_of(slot)

    # --- the Mirror protocol ---------------------------------------------------------------------
    def stage(self, inputs: StepInputs) -> None:
        self.combiner.stage(inputs)

    def combine(self, slot: int) -> None:
        if self.traces is None:
            self._combine(slot)
        # Traced: the staged inputs are all the host does; the combine ops replay at launch.

    def launch(self, slot: int) -> None:
        if self.readback_cq != COMPUTE_CQ and slot in self._unfenced:
            # A refused readback left a copy of this slot with no event: fence it now.
            self._read[slot] = self.tt.record_event(self.device, cq_id=self.readback_cq)
            self._unfenced.discard(slot)
        if self.readback_cq != COMPUTE_CQ and self._read[slot] is not None:
            # The slot's previous readback ran on the other queue: rewrite only after it.
            self.tt.wait_for_event(COMPUTE_CQ, self._read[slot])
        if self.traces is not None:
            self.traces.replay(slot)
        else:
            self._forward(slot)
        if self.readback_cq != COMPUTE_CQ:
            self._launched[slot] = self.tt.record_event(self.device, cq_id=COMPUTE_CQ)
        self.launches += 1

    def readback_issue(self, slot: int) -> PendingReadback:
        cq = self.readback_cq
        pending = PendingReadback(slot, None, None, issued=self._next_issue())
        try:
            if cq != COMPUTE_CQ:
                self._wait_for_launch(slot, cq)
            pending.host = self.ring[slot].cpu(blocking=False, cq_id=cq)
            self._copy_parts(pending, cq)
        except RuntimeError:
            if pending.host is not None:  # a copy was enqueued: its host tensor must outlive it
                self._abandoned.append(pending)
                if pending.event is None:
                    self._unfenced.add(slot)  # no event orders the slot's next write after it
            raise
        self._read[slot] = pending.event
        return pending

    def _wait_for_launch(self, slot: int, cq: int) -> None:
        """On the readback queue: the copy starts after the slot's sampler (its event)."""
        self.tt.wait_for_event(cq, self._launched[slot])

    def _copy_parts(self, pending: PendingReadback, cq: int) -> None:
        """The slot's logprob and draft parts, copied before the one event: the ids and their
        parts are one unit, which the host waits on and the slot's next write is fenced by."""
        pending.logprobs = self._copy_logprobs(pending.slot, cq)
        pending.drafts = self._copy_drafts(pending.slot, cq)
        pending.event = self.tt.record_event(self.device, cq_id=cq)

    def _copy_logprobs(self, slot: int, cq: int
                       ) -> tuple[tuple[ttnn.Tensor, ttnn.Tensor], ...] | None:
        """Non-blocking copies of the slot's logprob part (with drafts, every lane's), on the
        ids' queue."""
        if not self.ring.logprobs:
            return None
        lanes = (self.ring.logprobs[slot], *(self.ring.drafts[slot].logprobs
                                              if self.ring.drafts else ()))
        return tuple((part.values.cpu(blocking=False, cq_id=cq),
                      part.ids.cpu(blocking=False, cq_id=cq)) for part in lanes)

    def _copy_drafts(self, slot: int, cq: int) -> tuple[ttnn.Tensor, ...] | None:
        """Non-blocking copies of the slot's draft part (tokens, count, drafts), on the ids'
        queue: before the one event, as the logprob part."""
        if not self.ring.drafts:
            return None
        part = self.ring.drafts[slot]
        return tuple(t.cpu(blocking=False, cq_id=cq) for t in (*part.tokens, part.count,
                                                               *part.drafts))

    def readback_drafts(self, pending: Any) -> DraftCopy:
        """The draft part's host copy; its event was synchronised by `readback_complete`."""
        if pending.drafts is None:
            raise RuntimeError("this mirror was opened without drafts (MirrorSpec.drafts)")
        k = len(self.ring.drafts[0].drafts)
        lanes = [[int(v) for v in self.tt.to_torch(t).reshape(-1).tolist()] for t in pending.drafts]
        tokens, (counts,), drafts = lanes[: k + 1], lanes[k + 1: k + 2], lanes[k + 2:]
        return DraftCopy(tokens=tuple(zip(*tokens, strict=True)), counts=tuple(counts),
                         drafts=tuple(zip(*drafts, strict=True)))

    def readback_logprobs(self, pending: Any) -> list[TokenLogprobs]:
        """The logprob part's host copy; its event was synchronised by `readback_complete`."""
        if pending.logprobs is None:
            raise RuntimeError("this mirror was opened without logprobs (MirrorSpec.logprobs)")
        rows: list[TokenLogprobs] = []
        for lane in pending.logprobs:  # lane-major: lane j of row i at j * width + i
            values, ids = (self.tt.to_torch(t) for t in lane)
            width = values.shape[-2]
            rows += logprob_rows(values.reshape(width, -1).tolist(),
                                 ids.reshape(width, -1).tolist())
        return rows

    def readback_complete(self, pending: Any) -> list[int]:
        self._wait(pending)
        return self._host_read(pending)

    def _wait(self, pending: PendingReadback) -> None:
        """The host waits for the copy's event: the one device completion a step waits on."""
        timeout = self.spec.readback_timeout_s
        if timeout is None:
            self._synchronize(pending)
        else:
            if self._waiter is None:
                self._waiter = ThreadPoolExecutor(1, thread_name_prefix="readback-wait")
            # One waiter, in issue order: a wait queued behind a stalled one waits for it too.
            wait = self._waiter.submit(self._synchronize, pending)
            try:
                wait.result(timeout=timeout)
            except WaitTimeout:
                self.timeouts += 1
                raise RuntimeError(
                    f"readback of slot {pending.slot}: its event did not fire within {timeout} s"
                ) from None
        # Copies issued before this one on the same queue have landed: their tensors may go.
        self._abandoned = [p for p in self._abandoned if p.issued > pending.issued]
        if self.spec.report is not None:
            self.spec.report("device_wait", pending.slot)

    def _synchronize(self, pending: PendingReadback) -> None:
        """Block until the copy's event (and the logprob part's own, where there is one) fired."""
        self.tt.event_synchronize(pending.event)
        if pending.logprobs_event is not None:
            self.tt.event_synchronize(pending.logprobs_event)

    def abandon(self, pending: Any) -> None:
        self._abandoned.append(pending)

    def _host_read(self, pending: PendingReadback) -> list[int]:
        if self.spec.report is not None:  # reported first: the read is what may be unsafe
            self.spec.report("host_read", pending.slot)
        assert pending.host is not None
        values = self.tt.to_torch(pending.host).reshape(-1)
        return [int(v) for v in values.tolist()]

    def describe(self) -> dict[str, Any]:
        return {
            "launches": self.launches,
            "trace": self.traces is not None,
            "trace_captures": self.traces.captures if self.traces else 0,
            "trace_replays": self.traces.replays if self.traces else 0,
            "readback_cq": self.readback_cq,
            "ring_width": self.ring.width,
            "state_rows": self.spec.state_rows,
            "readback_timeouts": self.timeouts,
        }

    def close(self) -> None:
        try:
            self.tt.synchronize_device(self.device)
        except RuntimeError:
            # The device is gone (closed under us): nothing is left to wait for, and abandoned
            # copies stay referenced until the device's owner has closed it.
            pass
        else:
            self._abandoned.clear()
        if self._waiter is not None:
            self._waiter.shutdown(wait=False)
        if self.traces is not None:
            self.traces.release()
            self.ring.unseal()


class TtBackend(Backend):
    """`device`: an open mesh device to use; else one is opened at load by `provider` (default
    `devices.default_provider()`: a chip when present, else the provider plugged in)."""

    name = "tt"
    reports_device_waits = True

    def __init__(
        self,
        device: Any = None,
        *,
        readback_cq: int | None = None,
        trace_region_size: int = DEFAULT_TRACE_REGION,
        provider: DeviceProvider | None = None,
    ) -> None:
        self.device = device
        self.readback_cq = readback_cq
        self.trace_region_size = trace_region_size
        self.provider = provider
        self._owns_device = False

    def supports_async_sampled_token_readback(self) -> bool:
        return True  # TtMirror keeps sampled ids in the ring and combines them on device

    def supports_draft_aware_combine(self) -> bool:
        return True  # its combine takes newest token, position and drafts through the row map

    def device_provider(self) -> DeviceProvider:
        """Who opened (or will open) the device."""
        if self.device is not None:
            return provider_of(self.device)
        return self.provider or default_provider()

    def device_kind(self) -> str:
        return self.device_provider().kind

    def open_device(self) -> Any:
        if self.device is None:
            self.device = self.device_provider().open(
                num_command_queues=2, trace_region_size=self.trace_region_size, l1_small_size=0)
            self._owns_device = True
        return self.device

    def open_mirror(self, spec: MirrorSpec) -> Mirror:
        device = self.open_device()
        readback_cq = self.readback_cq
        if readback_cq is None:
            two = self._owns_device or _num_command_queues(device) >= 2
            readback_cq = 1 if two else COMPUTE_CQ
        return built(TtMirror, spec.overrides)(device, spec, readback_cq)

    def close(self) -> None:
        if self._owns_device and self.device is not None:
            ttnn_for(self.device).close_mesh_device(self.device)
            self.device = None
            self._owns_device = False

    def info(self) -> dict[str, Any]:
        return device_info(self.device_provider())


def _num_command_queues(device: Any) -> int:
    """CQs the device was opened with: the emulated device says so; a chip's MeshDevice does not
    expose it, so assume one (everything on CQ0 is always safe) unless we opened it with two."""
    count = getattr(device, "num_command_queues", None)
    return count if isinstance(count, int) else 1
