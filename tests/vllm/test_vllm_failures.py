"""The bridge's failures: a vLLM it does not know is refused in one line; a worker that dies is
an engine error in vLLM and leaves nothing behind; a vLLM that dies takes its worker with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import pytest

from ttmirror.serving.models import write_model_dir
from ttmirror.serving.workload import standard_plan
from ttmirror.vllm_client import ROOT, Cell, requests_of, vllm_python

WORKER = "ttmirror.vllm_worker"


def _workers_of(parent: int) -> list[int]:
    """Pids of live worker processes whose parent is `parent` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        state = stat.rsplit(")", 1)[1].split()[0]
        if WORKER in cmdline and ppid == parent and state != "Z":
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _start(tmp_path: Path, *, version: str | None = None) -> subprocess.Popen[str]:
    """A vLLM run of a long probe workload, in the background."""
    model_dir = str(tmp_path / "model")
    write_model_dir("probe", model_dir)
    cell = Cell(model_dir=model_dir, async_scheduling=True, max_num_seqs=4,
                requests=requests_of(standard_plan(64, 8, scale=8)), max_model_len=256,
                trace=str(tmp_path / "events.itf.json"))
    (tmp_path / "cells.json").write_text(json.dumps([asdict(cell)]))
    args = [str(tmp_path / "cells.json"), str(tmp_path / "out.json")]
    code = ("import runpy, sys, vllm\n"
            + (f"vllm.__version__ = {version!r}\n" if version else "")
            + f"sys.argv = ['battery', *{args!r}]\n"
            "runpy.run_module('ttmirror_vllm.battery', run_name='__main__')\n")
    env = dict(os.environ, TTMIRROR_PYTHON=sys.executable, OMP_NUM_THREADS="1",
               VLLM_LOGGING_LEVEL="WARNING")
    return subprocess.Popen([vllm_python(), "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


def _wait_for_worker(proc: subprocess.Popen[str], timeout: float = 300) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        workers = _workers_of(proc.pid)
        if workers:
            return workers[0]
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        time.sleep(0.2)
    raise AssertionError("no worker process appeared")


def test_an_unknown_vllm_is_refused_in_one_line(tmp_path: Path) -> None:
    proc = _start(tmp_path, version="0.34.0")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1
    last = err.strip().splitlines()[-1]
    assert last.startswith("ttmirror_vllm.battery: cell 0: RuntimeError: ttmirror-vllm "
                           "translates vLLM 0.33.0; this is vLLM 0.34.0"), last
    assert "Traceback" not in err


def test_a_dead_worker_is_an_engine_error_and_nothing_is_left(tmp_path: Path) -> None:
    proc = _start(tmp_path)
    worker = _wait_for_worker(proc)
    time.sleep(1.0)  # whenever it dies (loading or serving), vLLM must report it
    os.kill(worker, signal.SIGKILL)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1
    last = err.strip().splitlines()[-1]
    assert "WorkerError: the ttmirror worker died" in last, last
    assert not _alive(worker) and _workers_of(proc.pid) == []


def test_a_dead_vllm_takes_its_worker_with_it(tmp_path: Path) -> None:
    proc = _start(tmp_path)
    worker = _wait_for_worker(proc)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    deadline = time.monotonic() + 60
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(worker), "the worker outlived vLLM"


@pytest.fixture(autouse=True)
def _no_stray_workers() -> Iterator[None]:
    """Every test here ends with no worker of this test run alive."""
    yield
    assert _workers_of(os.getpid()) == []
