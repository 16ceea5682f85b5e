"""The host never reads step N's sampled ids between launching step N and combining step N+1.

The probe records, on the emulated device, every device-to-host read (which buffer, blocking or
not, on which queue), every host synchronisation, and the sampler command of each step; at each
combine it asks the device's happens-before tracker whether the host could know the previous
step's sampler had run. The twin runs the same work at depth 1, where it must.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import pytest

from ttmirror.emulator import EmulatedMeshDevice
from ttmirror.impl.tt_backend import TtBackend
from ttmirror.serving.engine import Engine, EngineConfig


@dataclass
class Probe:
    device: EmulatedMeshDevice
    ring: set[Any] = field(default_factory=set)  # the ring's buffers
    reads: list[tuple[Any, bool]] = field(default_factory=list)  # (buffer, blocking)
    syncs: int = 0
    samplers: dict[int, Any] = field(default_factory=dict)  # step -> its sampler command
    seen_at_combine: list[bool] = field(default_factory=list)  # host knew step N's ids?
    reads_at_combine: list[int] = field(default_factory=list)  # ring reads synced so far
    phases: list[tuple[str, int]] = field(default_factory=list)


def instrument(engine: Engine, device: EmulatedMeshDevice) -> Probe:
    probe = Probe(device)
    runner = engine.runner
    probe.ring = {slot.buffer for slot in runner.mirror.ring.slots}  # type: ignore[union-attr]
    read, enqueue, synchronize = device.read, device._enqueue, device.event_synchronize
    last_sampler: list[Any] = [None]

    def counting_read(tensor: Any, **kwargs: Any) -> Any:
        probe.reads.append((tensor.buffer, bool(kwargs["blocking"])))
        return read(tensor, **kwargs)

    def watching_enqueue(cq: int, name: str, **kwargs: Any) -> Any:
        command, hazards = enqueue(cq, name, **kwargs)
        if name == "argmax":  # the sampler, eager or replayed from a trace
            last_sampler[0] = command
        return command, hazards

    def counting_synchronize(event: Any) -> None:
        probe.syncs += 1
        synchronize(event)

    device.read = counting_read  # type: ignore[method-assign]
    device._enqueue = watching_enqueue  # type: ignore[method-assign]
    device.event_synchronize = counting_synchronize  # type: ignore[method-assign]

    launch, combine = runner.launch, runner.combine

    def launch_and_note(q: int) -> None:
        launch(q)
        step = runner.queue[q].index
        probe.samplers[step] = last_sampler[0]
        probe.phases.append(("launch", step))

    def combine_and_check(q: int) -> None:
        step = runner.queue[q].index
        previous = probe.samplers.get(step - 1)
        if previous is not None:
            known = device.ordering.host_has_seen(previous.cq, previous.index)
            probe.seen_at_combine.append(known)
        combine(q)
        probe.phases.append(("combine", step))

    runner.launch = launch_and_note  # type: ignore[method-assign]
    runner.combine = combine_and_check  # type: ignore[method-assign]
    return probe


def serve(tt: TtBackend, mode: str, trace: bool = False) -> tuple[Engine, Probe]:
    rng = random.Random(5)
    engine = Engine(
        tt,
        EngineConfig(async_scheduling=mode, rows=6, trace=trace),
        order=lambda eligible: rng.sample(eligible, len(eligible)),
    )
    probe = instrument(engine, tt.device)
    for req in range(10):
        engine.submit(req, prompt=3 * req, max_tokens=6 + req)
    engine.run()
    engine.close()
    return engine, probe


@pytest.mark.parametrize("trace", [False, True], ids=["eager", "traced"])
def test_no_host_read_of_sampled_ids_between_launch_n_and_combine_n_plus_1(
    tt: TtBackend, trace: bool
) -> None:
    engine, probe = serve(tt, "on", trace)
    launches = engine.runner.stats["launches"]
    assert len(probe.seen_at_combine) == launches - 1  # every combine after the first checked
    assert not any(probe.seen_at_combine)  # the host could not have known step N's ids
    ring_reads = [blocking for buffer, blocking in probe.reads if buffer in probe.ring]
    assert ring_reads.count(True) == 0  # never a blocking read of a slot
    assert ring_reads.count(False) == launches  # exactly one non-blocking readback per step
    assert probe.syncs == launches  # one event synchronisation per readback, nothing else
    assert tt.device.hazards.total == 0


def test_twin_at_depth_1_the_host_knows_step_n_before_combining_n_plus_1(tt: TtBackend) -> None:
    engine, probe = serve(tt, "off")
    assert len(probe.seen_at_combine) == engine.runner.stats["launches"] - 1
    assert all(probe.seen_at_combine)  # the check does see a host read when there is one
