"""First-fit DRAM allocation, bottom-up reuse, contents that persist across frees, and the
check that no allocation overlaps a live buffer (with the planted bug that shows it live)."""

from __future__ import annotations

import itertools
import pickle
from typing import Any

import pytest
import torch

from ttmirror.emulator import HazardError, HazardKind, HazardLog
from ttmirror.emulator import allocator as allocator_module
from ttmirror.emulator.allocator import (
    ALIGNMENT,
    FILL_BYTE,
    PLANTED,
    SPARE_HANDED_OUT_TWICE,
    DramAllocator,
)
from ttmirror.emulator.hazards import Hazard

TWICE = frozenset({SPARE_HANDED_OUT_TWICE})


def test_first_fit_bottom_up_and_immediate_reuse() -> None:
    dram = DramAllocator(1024)
    a, b, c = dram.allocate(64), dram.allocate(64), dram.allocate(64)
    assert [a.address, b.address, c.address] == [0, 64, 128]
    dram.free(b)
    assert dram.allocate(32).address == 64  # the lowest hole that fits, at once
    assert (
        dram.allocate(64).address == 192
    )  # 32 B left in the hole: too small, so first fit moves on


def test_frees_coalesce_so_a_large_buffer_fits_again() -> None:
    dram = DramAllocator(256)
    buffers = [dram.allocate(64) for _ in range(4)]
    with pytest.raises(RuntimeError, match="Out of Memory"):
        dram.allocate(ALIGNMENT)
    for buffer in (buffers[1], buffers[3], buffers[2]):
        dram.free(buffer)
    assert dram.allocate(192).address == 64


def test_contents_persist_after_free_and_show_through_reuse() -> None:
    dram = DramAllocator(256)
    assert int(dram.memory[0]) == FILL_BYTE  # never-written DRAM is not zero
    a = dram.allocate(16)
    dram.view(a.address, 16, torch.int32, (4,)).copy_(torch.tensor([1, 2, 3, 4], dtype=torch.int32))
    dram.free(a)
    b = dram.allocate(16)
    assert b.address == a.address
    assert dram.view(b.address, 16, torch.int32, (4,)).tolist() == [
        1,
        2,
        3,
        4,
    ]  # stale, not cleared


@pytest.fixture
def spares(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """A spare list of this test's own: a planted run leaves shared DRAM listed on it."""
    own: list[Any] = []
    monkeypatch.setattr(allocator_module, "_SPARE", own)
    return own


def overlaps(log: HazardLog) -> list[Hazard]:
    return log.of_kind(HazardKind.OVERLAPPING_ALLOCATION)


def two_live_copies(planted: frozenset[str]) -> tuple[DramAllocator, DramAllocator]:
    """Books with a live buffer, saved; one restored copy discarded (its DRAM becomes the
    spare); then two copies restored, alive together, each allocating once."""
    dram = DramAllocator(1024, hazards=HazardLog(mode="count"), planted=planted)
    dram.allocate(64)
    saved = pickle.dumps(dram)
    pickle.loads(saved).recycle()
    first, second = pickle.loads(saved), pickle.loads(saved)
    first.allocate(96)  # both at 0x40: the same books pick the same address
    second.allocate(32)
    return first, second


def test_twin_a_spare_handed_out_twice_is_reported_with_both_buffers(spares: list[Any]) -> None:
    first, second = two_live_copies(TWICE)
    assert first.memory.data_ptr() == second.memory.data_ptr()  # the bug: one DRAM, two copies
    assert overlaps(first.hazards) == []  # alone on its DRAM when it restored and allocated
    at_restore, at_allocation = overlaps(second.hazards)
    elsewhere = " of another live allocator on this DRAM"
    assert at_restore.buffers == ("buffer#1@0x0+64", "buffer#1@0x0+64" + elsewhere)
    assert "restored into DRAM holding live" in at_restore.message
    assert at_allocation.buffers == ("buffer#2@0x40+32", "buffer#2@0x40+96" + elsewhere)
    assert "[0x40, 0x60) belong to both" in at_allocation.message


def test_without_the_plant_the_same_copies_share_nothing(spares: list[Any]) -> None:
    first, second = two_live_copies(frozenset())
    assert first.memory.data_ptr() != second.memory.data_ptr()
    assert first.hazards.total == second.hazards.total == 0
    assert [b.label for b in first.live] == ["buffer#1@0x0+64", "buffer#2@0x40+96"]


def test_in_raise_mode_the_overlapping_allocation_raises(spares: list[Any]) -> None:
    dram = DramAllocator(1024, planted=TWICE)
    saved = pickle.dumps(dram)
    pickle.loads(saved).recycle()
    first, second = pickle.loads(saved), pickle.loads(saved)
    first.allocate(64)
    with pytest.raises(HazardError, match="overlapping-allocation") as caught:
        second.allocate(64)
    assert caught.value.hazard.buffers[0] == "buffer#1@0x0+64"


@pytest.mark.parametrize(("free_first", "hole", "clash"), [
    (False, (32, 64), "buffer#1@0x0+64"),  # starts inside the live buffer below it
    (True, (0, 96), "buffer#2@0x40+64"),  # runs into the live buffer above it
], ids=["below", "above"])
def test_twin_books_that_list_live_bytes_as_free_are_caught(
        free_first: bool, hole: tuple[int, int], clash: str) -> None:
    dram = DramAllocator(1024)
    first = dram.allocate(64)
    dram.allocate(64)
    if free_first:
        dram.free(first)
    dram._free.insert(0, hole)  # the twin: free-list books that list live bytes as free
    with pytest.raises(HazardError, match="overlapping-allocation") as caught:
        dram.allocate(hole[1])
    assert caught.value.hazard.buffers == (f"buffer#3@0x{hole[0]:x}+{hole[1]}", clash)


def test_intact_books_never_report_an_overlap() -> None:
    dram = DramAllocator(4096, hazards=HazardLog(mode="count"))
    held = [dram.allocate(32 * (1 + i % 5)) for i in range(40)]
    for buffer in held[::3]:
        dram.free(buffer)
    held = [dram.allocate(32 * (1 + i % 3)) for i in range(20)]
    assert dram.hazards.total == 0
    spans = sorted((b.address, b.end) for b in dram.live)
    assert all(end <= start for (_, end), (start, _) in itertools.pairwise(spans))


def test_planted_ids_are_listed_and_an_unknown_one_is_refused() -> None:
    assert set(PLANTED) == {"spare-handed-out-twice"}
    with pytest.raises(ValueError, match="unknown planted allocator bugs"):
        DramAllocator(1024, planted=frozenset({"no-such-bug"}))
