"""A test run ends without nanobind leak reports.

nanobind reports, at interpreter exit, every ttnn object still alive ("nanobind: leaked N
instances!"): a user reads that as a leak. The device and impl tests make and read back ttnn
tensors through the emulated device (non-blocking readbacks, `HostReadback`, included), so they
run in a subprocess here and its output must not report one. What such a report has meant:
`conformance.replay` / `campaign.run` keeping a divergence with its traceback (the failed run's
frames, device and tensors), and pytest's import hook keeping the whole session past shutdown
(`tests/conftest.py`, `pytest_unconfigure`). Which objects are left at exit depends on the order
in which the interpreter tears modules down, so the device tests also run alone: that run is the
one that reported two leaked instances before.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("paths", [("tests/emulator", "tests/impl"), ("tests/emulator",)],
                         ids=["emulator+impl", "emulator"])
def test_the_run_ends_without_nanobind_leak_reports(paths: tuple[str, ...]) -> None:
    env = {**os.environ, "LOGURU_LEVEL": "WARNING"}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *paths],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    leaks = [line for line in output.splitlines() if "leaked" in line]
    assert not leaks, "the run ended with nanobind leak reports:\n" + "\n".join(leaks)
