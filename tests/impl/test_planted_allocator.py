"""A real run on a device opened with the allocator's planted bug: the runner saved, then two
copies restored and stepped together, as a saved-state walk does (`conformance/allocator_runs.py`).
With "spare-handed-out-twice" the copies share DRAM and the overlap check fails the run; without
it the same run passes, the copies delivering the original's tokens."""

from __future__ import annotations

import pytest

from ttmirror.conformance.kills import allocator_half as allocator_runs
from ttmirror.emulator import allocator
from ttmirror.emulator.allocator import SPARE_HANDED_OUT_TWICE


def test_restored_copies_stepped_together_share_no_dram() -> None:
    v = allocator_runs.check()
    assert v.layer is None, v.message
    # Non-vacuous: every request got the tokens of the three steps after the restores and one
    # before, in the original and (checked inside) in both copies.
    assert v.tokens is not None and all(len(t) == 1 + allocator_runs.STEPS for t in v.tokens)


def test_a_spare_handed_out_twice_is_an_overlapping_allocation() -> None:
    killed, v = allocator_runs.kill(SPARE_HANDED_OUT_TWICE)
    assert killed and v.layer == "hazard", v
    assert v.message is not None and v.message.startswith("[overlapping-allocation]")
    assert "of another live allocator on this DRAM" in v.message


def test_with_the_overlap_check_off_the_planted_spare_goes_unnoticed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The twin of the check: without it, the shared DRAM is not reported by anything else.
    monkeypatch.setattr(allocator.DramAllocator, "_clash", lambda *a, **k: None)
    monkeypatch.setattr(allocator.DramAllocator, "_check_restored", lambda *a, **k: None)
    killed, v = allocator_runs.kill(SPARE_HANDED_OUT_TWICE)
    assert not killed, v
