"""Snapshot and restore of a run in lockstep: a restored run is the saved one, exactly.

A run is walked at random (acts and device completions), saved at several points; each saved
point is restored and the rest of the walk performed again. After every move the restored run
must show what the original showed: the abstraction (what `check` compares with the model),
every byte of emulated DRAM, the queued commands (their effects as data), the completion log,
the hazard counts, the pending readbacks. Copies are independent of each other and of the
original.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from ttmirror.conformance.lockstep.harness import DROPS, Lockstep, Move
from ttmirror.model.actions import Action
from ttmirror.model.state import RING

BOUNDS = RING._replace(requests=2, max_tokens=3)


def device_data(ls: Lockstep) -> tuple[Any, ...]:
    """What the device holds, as data: DRAM bytes, queued effects, what completed, hazards."""
    if ls.device is None:
        return ()
    d = ls.device
    return (
        bytes(d.allocator.memory.numpy()),
        tuple(tuple(f"{c!r} {c.effect!r}" for c in q) for q in d.queues),
        tuple(d.completion_log),
        tuple(sorted(d.hazards.counts.items())),
        tuple(sorted(b.label for b in d.allocator.live)),
        len(d.readbacks.pending()),
    )


def seen(ls: Lockstep) -> tuple[Any, ...]:
    return ls.observe(), ls.state, device_data(ls)


def random_moves(ls: Lockstep, rng: random.Random, count: int,
                 views: list[tuple[Any, ...]] | None = None) -> list[Move]:
    """Perform up to `count` random moves (acts and device completions); return them, and add
    what the run shows after each to `views`."""
    done: list[Move] = []
    for _ in range(count):
        ready = [cq for cq in (0, 1) if ls.device_ready(cq)]
        if ready and rng.random() < 0.4:
            move = Move("device", Action("device", (rng.choice(ready),)))
        else:
            enabled = ls.enabled()
            if not enabled:
                break
            # Mostly keep requests alive: a walk of aborts ends before it tests much.
            going = [a for a in enabled if a.name not in DROPS]
            move = Move("act", rng.choice(going if going and rng.random() < 0.9 else enabled))
        ls.perform(move)
        done.append(move)
        if views is not None:
            views.append(seen(ls))
    return done


@pytest.mark.parametrize(("backend", "config", "process"), [
    ("tt", "eager-2cq", False), ("tt", "eager-1cq", False), ("tt", "traced", False),
    ("cpu", "host", False), ("tt", "eager-2cq", True), ("tt", "traced", True),
], ids=["eager-2cq", "eager-1cq", "traced", "cpu", "eager-2cq-device-process",
        "traced-device-process"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_restoring_and_walking_on_sees_what_the_original_saw(backend: str, config: str,
                                                             process: bool, seed: int) -> None:
    """`process`: the device's queues in a gated device process; each restored copy starts its
    own, from the saved DRAM and queues."""
    rng = random.Random(seed)
    ls = Lockstep(BOUNDS, backend, config=config, refused=set(), device_process=process)
    saved: list[tuple[int, bytes]] = []
    moves: list[Move] = []
    views: list[tuple[Any, ...]] = []
    try:
        for _ in range(4):
            saved.append((len(moves), ls.snapshot()))
            moves += random_moves(ls, rng, 8, views)
        assert len(moves) >= 16, "the walk ended too soon to test anything"
        assert backend == "cpu" or any(m.kind == "device" for m in moves)
        for at, data in saved:
            copy = Lockstep.restore(data, set())
            try:
                assert copy.moves == ls.moves[: len(copy.moves)]
                if process and copy.device is not None:
                    assert copy.device.executor is copy.device.scheduler  # a process of its own
                for i in range(at, len(moves)):
                    copy.perform(moves[i])
                    assert seen(copy) == views[i], f"move {i} ({moves[i].label()}) differs"
            finally:
                copy.close()
    finally:
        ls.close()


@pytest.mark.parametrize("config", ["eager-2cq", "traced"])
def test_a_walk_in_a_device_process_sees_what_it_sees_in_the_hosts(config: str) -> None:
    """The same seeded walk with the device's queues in the host's process and in a gated device
    process: the same moves, and after each the same abstraction, model state and device data."""
    runs = []
    for process in (False, True):
        ls = Lockstep(BOUNDS, "tt", config=config, refused=set(), device_process=process)
        views: list[tuple[Any, ...]] = []
        try:
            moves = random_moves(ls, random.Random(3), 40, views)
        finally:
            ls.close()
        runs.append((moves, views))
    assert runs[0] == runs[1]
    assert sum(m.kind == "device" for m in runs[1][0]) >= 5


def test_copies_are_independent() -> None:
    ls = Lockstep(BOUNDS, "tt", refused=set())
    try:
        random_moves(ls, random.Random(5), 10)
        data = ls.snapshot()
        before = seen(ls)
        first, second = Lockstep.restore(data), Lockstep.restore(data)
        try:
            assert first.device is not second.device is not ls.device
            random_moves(first, random.Random(6), 10)
            assert seen(first) != before  # it moved on
            assert seen(second) == seen(ls) == before  # and nobody else did
        finally:
            first.close()
            second.discard()
    finally:
        ls.close()


def test_a_copy_is_an_open_device_with_its_own_api_until_discarded() -> None:
    from ttmirror.emulator import open_devices

    ls = Lockstep(BOUNDS, "tt", refused=set())
    try:
        random_moves(ls, random.Random(7), 6)
        copy = Lockstep.restore(ls.snapshot())
        device = copy.device
        assert device in open_devices() and ls.device in open_devices()
        # The copy's ttnn API is its own (its calls reach the copy, not the original).
        assert device.api is not ls.device.api and device.api.device is device
        copy.discard()
        assert device not in open_devices() and ls.device in open_devices()
    finally:
        ls.close()
    assert ls.device not in open_devices()


class Referent:
    """A weak-referenceable object that pickles (a test's local class does not)."""


def test_weak_references_copy_as_weak_references() -> None:
    """A live one points at the copy of its referent; a dead one is a dead weak reference (what
    a readback's `HostRead.target()` and the readback registry call), not some other object."""
    import weakref

    from ttmirror.emulator.snapshot import restore, snapshot

    held = Referent()
    gone = weakref.ref(Referent())
    assert gone() is None
    copied, live, dead = restore(snapshot(([held], weakref.ref(held), gone)))
    assert isinstance(dead, weakref.ref) and dead() is None
    assert isinstance(live, weakref.ref) and live() is copied[0] and live() is not held


def test_a_threaded_device_refuses_a_snapshot_in_one_line() -> None:
    import pickle

    from ttmirror.emulator import Emulator, ThreadedScheduler, open_device
    from ttmirror.emulator.snapshot import snapshot

    device = open_device(emulator=Emulator(scheduler=ThreadedScheduler), emulated=True)
    tt = device.api
    try:
        with pytest.raises(pickle.PicklingError, match="ManualScheduler"):
            snapshot(device)
    finally:
        tt.close_mesh_device(device)


def dram_span(ls: Lockstep) -> tuple[int, int]:
    memory = ls.device.allocator.memory
    return memory.data_ptr(), memory.data_ptr() + memory.numel()


def scribble(ls: Lockstep, value: int) -> None:
    """Write `value` over every byte of every live buffer of the run's DRAM."""
    dram = ls.device.allocator
    for buffer in dram.live:
        dram.memory[buffer.address : buffer.end] = value


@pytest.mark.parametrize("config", ["eager-2cq", "eager-1cq", "traced"])
def test_changing_a_restored_run_leaves_the_save_and_every_other_restore_as_saved(
        config: str) -> None:
    """Restore A, change its DRAM and host state; B restored from the same save (while A lives,
    and after A is discarded, in A's DRAM) is the saved run, field for field and byte for byte,
    and A and B share no device memory."""
    ls = Lockstep(BOUNDS, "tt", config=config, refused=set())
    runs: list[Lockstep] = []
    try:
        random_moves(ls, random.Random(11), 10)
        saved = ls.snapshot()
        before = seen(ls)
        dram_before = bytes(ls.device.allocator.memory.numpy())
        first = Lockstep.restore(saved, set())
        as_saved = first.snapshot()  # the whole object graph of a copy as restored, as data
        first.discard()  # its DRAM is the spare A now takes: A mutates what B may reuse
        a = Lockstep.restore(saved, set())
        runs.append(a)
        assert seen(a) == before
        random_moves(a, random.Random(12), 10)  # host state and DRAM move on
        # And every byte it ever allocated, some above the saved high-water mark (a buffer of
        # its own): bytes the restore into this DRAM, once A is discarded, must clear again.
        grown = a.device.allocator.allocate(64 << 10)
        assert grown.end > ls.device.allocator.high_water
        a.device.allocator.memory[: grown.end].fill_(0x5A)
        a.runner.stats["changed"] += 1  # and host state no move would make
        a.state = a.state._replace(broken=frozenset({"changed"}))
        a.moves.clear()
        assert seen(a) != before

        b = Lockstep.restore(saved, set())
        runs.append(b)
        assert seen(b) == before and b.snapshot() == as_saved
        assert bytes(b.device.allocator.memory.numpy()) == dram_before
        (a_low, a_high), (b_low, b_high) = dram_span(a), dram_span(b)
        assert a_high <= b_low or b_high <= a_low  # no byte of DRAM in common
        scribble(a, 0x00)
        assert seen(b) == before  # writing to A is not seen in B
        scribble(b, 0xFF)  # nor writing to B in A
        assert all(not a.device.allocator.memory[x.address : x.end].any()
                   for x in a.device.allocator.live)

        a.discard()  # A's changed DRAM becomes the spare the next restore takes
        runs.remove(a)
        c = Lockstep.restore(saved, set())
        runs.append(c)
        assert seen(c) == before and c.snapshot() == as_saved
        assert seen(ls) == before and ls.snapshot() == saved  # nor did the saved run move
    finally:
        for run in runs:
            run.discard()
        ls.close()
