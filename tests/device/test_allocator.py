"""First-fit DRAM allocation, bottom-up reuse, contents that persist across frees."""

from __future__ import annotations

import pytest
import torch

from ttmirror.emulator.allocator import ALIGNMENT, FILL_BYTE, DramAllocator


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
