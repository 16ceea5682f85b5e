"""Device data as it comes into being: the combine's output and each slot's content.

The model's `combine` gives each row the id it `consumed`; its `launch` writes the slot's
`content`. On the emulated device those are bytes that a command writes when it completes,
and the harness sees them then, through a test-only view of the emulated memory: each completed
command is reported to the observer (`EmulatedMeshDevice.observers`) with the buffers it wrote,
and the observer copies what matters before anything can overwrite it. Nothing is enqueued and no
ordering changes, so observing cannot hide or cause a hazard. `impl/` never uses this view.

Which command stands for which model effect (attributed when the host issues it):

=================================  ==========================================================
model effect                       the command whose completion makes it exist
=================================  ==========================================================
combine(q): rows[i].consumed       the one writing the combine's input ids (`where`), issued by
                                   step q's combine (eager) or by its launch's trace replay
launch(q): slots[k].content        the one writing ring slot k (the sampler), issued by step
                                   q's launch (eager, or inside the trace replay)
readback_complete(q): host_copy    none: the host copy is the host's, read after the event
=================================  ==========================================================

With drafts (spec rule 13) each effect has more parts, and each part exists from the moment the
command writing it completes (a "part" below is a buffer the command writes):

=================================  ==========================================================
model effect (with drafts)         the part, and the command writing it
=================================  ==========================================================
combine(q): rows[i].drafts[j]      ``lane{j+1}``: the `where` writing draft lane j + 1
combine(q): rows[i].placed, pos    ``base``: the `where` writing the rows' base positions
launch(q): slots[k].counts         ``count``: the `add` writing slot k's count (a + 1)
launch(q): slots[k].positions      ``position``: the `add` advancing slot k's position
launch(q): the slot's run          ``tokens{j}``: the sampler writing the target's token of
                                   lane j (the run is tokens 0 .. count - 1)
launch(q): the slot's drafts       ``drafts{j}``: the `add` writing the drafter's j-th proposal
=================================  ==========================================================

With state rows (spec rule 14) the launch's post-update is one more effect: the model's launch
writes each of its rows' state rows (``newest``, with drafts ``position``), and the command
writing that table tensor (the post-update's last `add`) makes it exist. It is kept per state
row, with the step and the batch row that wrote it: a state row keeps its value until a later
step names it again, however many steps later.

Each part is copied anew whenever a command writes it, with the step that wrote it, so a part
that a later step overwrites shows as overwritten. The counts are also kept per step, after the
slot is rewritten: they are how far each row got, which fixes where its later tokens are.

On the cpu backend the mirror computes on the host, synchronously: the effects exist when the
combine and launch return, and are copied then. On a chip no such view exists; the observer is
absent and the abstraction erases `consumed` and `content`, as before (`Lockstep` says so).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ttmirror.impl.runner import Runner

type Part = tuple[int, tuple[int, ...]]
"""(the step that wrote it, the ids)."""


@dataclass
class Observed:
    """What the device computed, keyed the way the model names it."""

    consumed: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """Step number -> the combine's output ids, once its command completed."""
    content: dict[int, tuple[int, tuple[int, ...]]] = field(default_factory=dict)
    """Slot -> (the step whose sampler wrote it, the ids), once that command completed."""
    problems: list[str] = field(default_factory=list)
    """Device effects in an order the model forbids (a sampler before its own combine)."""
    drafts: int = 0
    """K: the spec tokens the mirror carries (0: none of the fields below is ever filled)."""
    lanes: dict[int, dict[str, tuple[int, ...]]] = field(default_factory=dict)
    """With drafts: step number -> its combine's other parts ("lane1".., "base") -> ids."""
    parts: dict[int, dict[str, Part]] = field(default_factory=dict)
    """With drafts: slot -> its draft part's parts ("count", "position", "tokens0"..,
    "drafts0"..) -> (the step that wrote it, the ids)."""
    counts: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """With drafts: step number -> the counts its launch wrote, kept after the slot is
    rewritten."""
    table: dict[str, dict[int, tuple[int, int, int]]] = field(default_factory=dict)
    """With state rows: part ("newest", "position") -> state row -> (the step whose post-update
    wrote it last, the batch row that named it or -1 for none, the value)."""
    scattered: dict[int, set[str]] = field(default_factory=dict)
    """With state rows: step number -> the table parts its post-update has written."""

    def record_table(self, step: int, part: str, idx: tuple[int, ...],
                     ids: tuple[int, ...]) -> None:
        """Step `step`'s post-update wrote table `part`: each state row its rows name (`idx`,
        per batch row) now holds that row's value; a state row it does not name must hold what
        it held, and one that changed is kept as written by no row (-1)."""
        table = self.table.setdefault(part, {})
        named = {s: i for i, s in enumerate(idx) if 0 <= s < len(ids)}
        for s, value in enumerate(ids):
            if s in named:
                table[s] = (step, named[s], value)
            elif s in table and table[s][2] != value:
                table[s] = (step, -1, value)
        self.scattered.setdefault(step, set()).add(part)

    def record_combine(self, step: int, part: str, ids: tuple[int, ...]) -> None:
        if part == "ids":
            self.consumed[step] = ids
        else:
            self.lanes.setdefault(step, {})[part] = ids

    def record_launch(self, step: int, slot: int, part: str, ids: tuple[int, ...]) -> None:
        if part == "ids":
            if step not in self.consumed:
                self.problems.append(
                    f"the sampler of step {step} completed before its combine wrote the input ids"
                )
            self.content[slot] = (step, ids)
            return
        self.parts.setdefault(slot, {})[part] = (step, ids)
        if part == "count":
            self.counts[step] = ids


def combine_parts(mirror: Any) -> dict[str, Any]:
    """The combine's output tensors by part name: the ids, and with drafts the draft lanes and
    the base positions."""
    combiner = mirror.combiner
    parts = {"ids": combiner.input_ids}
    if combiner.k:
        parts.update({f"lane{j}": lane for j, lane in enumerate(combiner.lanes) if j})
        parts["base"] = combiner.base
    return parts


def table_parts(mirror: Any) -> dict[str, Any]:
    """The state-row table's tensors by part name (none with the ring)."""
    table = getattr(mirror, "table", None)
    if table is None:
        return {}
    parts = {"newest": table.newest}
    if table.position is not None:
        parts["position"] = table.position
    return parts


def slot_parts(mirror: Any, k: int) -> dict[str, Any]:
    """Slot k's tensors by part name: its ids, and with drafts its draft part's."""
    ring = mirror.ring
    parts = {"ids": ring.slots[k]}
    if ring.drafts:
        part = ring.drafts[k]
        parts.update({f"tokens{j}": t for j, t in enumerate(part.tokens)})
        parts.update({"count": part.count, "position": part.position})
        parts.update({f"drafts{j}": t for j, t in enumerate(part.drafts)})
    return parts


class DeviceObserver:
    """Watches one emulated device running one runner's tt mirror."""

    available = True

    def __init__(self, runner: Runner) -> None:
        mirror: Any = runner.mirror
        self.runner = runner
        self.device = mirror.device
        # Buffer -> ("combine", part, the tensor) or ("launch", part, slot, the tensor).
        self.buffers: dict[Any, tuple[Any, ...]] = {
            t.buffer: ("combine", part, t) for part, t in combine_parts(mirror).items()}
        for k in range(len(mirror.ring)):
            self.buffers.update({t.buffer: ("launch", part, k, t)
                                 for part, t in slot_parts(mirror, k).items()})
        self.buffers.update({t.buffer: ("table", part, t)
                             for part, t in table_parts(mirror).items()})
        self.effects: dict[int, tuple[int, list[tuple[Any, ...]]]] = {}
        """Command id -> (step number, the parts it writes)."""
        self.seen = 0
        self.seen = self._newest()
        self.observed = Observed(drafts=mirror.combiner.k)
        self.device.observers.append(self._completed)

    def issued(self, step: int) -> None:
        """Attribute the commands the host just enqueued for `step` (after its combine or
        launch): which ones write the combine's outputs, which ones a slot's."""
        for queue in self.device.queues:
            for command in queue:
                if command.id <= self.seen:
                    continue
                parts = [self.buffers[b] for b in command.writes if b in self.buffers]
                if parts:
                    self.effects[command.id] = (step, parts)
        self.seen = self._newest()

    def next_effect(self, cq: int) -> Any | None:
        """The next command on `cq` that makes a model effect exist, if it can be reached by
        completing `cq`'s commands in order now (each ready, or waiting on one before it)."""
        if cq >= len(self.device.queues):
            return None  # a one-queue device
        earlier: set[int] = set()
        for command in self.device.queues[cq]:
            if not command.ready() and (
                command.event is None or command.event.record.id not in earlier
            ):
                return None
            if command.id in self.effects:
                return command
            earlier.add(command.id)
        return None

    def _completed(self, command: Any) -> None:
        effect = self.effects.pop(command.id, None)
        if effect is None:
            return
        step, parts = effect
        for kind, part, *where in parts:
            ids = _ids(where[-1])
            if kind == "combine":
                self.observed.record_combine(step, part, ids)
            elif kind == "table":
                self.observed.record_table(step, part, _state_rows(self.runner, step), ids)
            else:
                self.observed.record_launch(step, where[0], part, ids)

    def _newest(self) -> int:
        """The newest command id enqueued so far (ids only grow)."""
        return max((c.id for q in self.device.queues for c in q), default=self.seen)

    def close(self) -> None:
        if self._completed in self.device.observers:
            self.device.observers.remove(self._completed)


class HostObserver:
    """The cpu mirror: its effects exist when the combine and the launch return."""

    available = True

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        mirror: Any = runner.mirror
        self.observed = Observed(drafts=mirror.k)

    def combined(self, step: int) -> None:
        mirror: Any = self.runner.mirror
        self.observed.record_combine(step, "ids", _values(mirror.input_ids))
        if mirror.k:
            for j in range(1, mirror.k + 1):
                self.observed.record_combine(step, f"lane{j}", _values(mirror.input_lanes[j]))
            self.observed.record_combine(step, "base", _values(mirror.input_positions))

    def launched(self, step: int, slot: int) -> None:
        mirror: Any = self.runner.mirror
        self.observed.record_launch(step, slot, "ids", _values(mirror.ring[slot]))
        if mirror.state_rows:
            idx = _state_rows(self.runner, step)
            self.observed.record_table(step, "newest", idx, _values(mirror.table_newest))
            if mirror.k:
                self.observed.record_table(step, "position", idx,
                                           _values(mirror.table_positions))
        if not mirror.k:
            return
        parts = {f"tokens{j}": t for j, t in enumerate(mirror.ring_tokens[slot])}
        parts.update({"count": mirror.ring_counts[slot],
                      "position": mirror.ring_positions[slot]})
        parts.update({f"drafts{j}": t for j, t in enumerate(mirror.ring_drafts[slot])})
        for part, values in parts.items():
            self.observed.record_launch(step, slot, part, _values(values))

    def close(self) -> None:
        pass


def _state_rows(runner: Runner, step: int) -> tuple[int, ...]:
    """Step number `step`'s idx_mapping, per batch row (it is in flight: a post-update completes
    before its step's readback, and so before it retires)."""
    found = next((s for s in runner.queue if s.index == step), None)
    return () if found is None else tuple(row.idx for row in found.rows)


def _values(tensor: Any) -> tuple[int, ...]:
    """A host tensor's ids as uint32, as a device holds them."""
    return tuple(int(v) & 0xFFFFFFFF for v in tensor.tolist())


def _ids(tensor: Any) -> tuple[int, ...]:
    """The ids a device tensor holds, read through the emulated memory (no command)."""
    return tuple(int(v) & 0xFFFFFFFF for v in tensor.data.reshape(-1).tolist())
