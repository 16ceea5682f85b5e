"""A campaign's machines share one Hypothesis example database on a real Redis server: a
failure one `ttmirror fuzz` process finds, the next replays from the database before it
generates anything, and writes its trace where it was told."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REDIS = shutil.which("redis-server")

pytestmark = pytest.mark.skipif(
    REDIS is None, reason="no redis-server here (`make setup` installs Debian's redis-server "
                          "where apt can)")


@pytest.fixture
def redis_url() -> Iterator[str]:
    with socket.socket() as s:  # a free port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [str(REDIS), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
         "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import redis

        client = redis.Redis(port=port)
        # Wait for the server however slow its start (a loaded machine); the cap only guards a
        # server that never comes up, and one that died is reported at once.
        for _ in range(1200):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                assert server.poll() is None, f"redis-server exited with {server.returncode}"
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=10)


def fuzz(seed: int, database: str, traces: Path) -> dict[str, Any]:
    """A `ttmirror fuzz` process of its own, with a planted bug, at one request."""
    done = subprocess.run(
        [sys.executable, "-m", "ttmirror", "fuzz", "--requests", "1", "--examples", "30",
         "--seed", str(seed), "--jobs", "1", "--database", database, "--traces", str(traces),
         "--json"],
        capture_output=True, text=True, check=False, timeout=600,
        env={**os.environ, "TTMIRROR_BUG": "guard-off"})
    assert done.returncode == 1, done.stderr[-2000:]  # the planted bug is found
    report: dict[str, Any] = json.loads(done.stdout)
    assert report["database"] == database and report["stopped"] == "failure"
    return report


def test_a_failure_found_by_one_process_replays_first_in_the_next(
        redis_url: str, tmp_path: Path) -> None:
    import redis

    first = fuzz(1, f"{redis_url}/0", tmp_path / "first")
    # Hypothesis generated a few passing examples before the failing one, then shrank it.
    assert first["hypothesis_first_failure_example"] > 1
    assert Path(first["trace"]).parent == tmp_path / "first" and Path(first["trace"]).exists()
    assert redis.Redis.from_url(f"{redis_url}/0").keys("hypothesis-example:*")
    # Another process, another seed, the same database: its very first example is the stored
    # failure, replayed before anything new is generated; the trace lands where it was told.
    second = fuzz(2, f"{redis_url}/0", tmp_path / "second")
    assert second["hypothesis_first_failure_example"] == 1
    assert Path(second["trace"]).parent == tmp_path / "second" and Path(second["trace"]).exists()
    # The control: that seed on an empty database has to find the failure by generating.
    alone = fuzz(2, f"{redis_url}/1", tmp_path / "alone")
    assert alone["hypothesis_first_failure_example"] > 1


def test_an_unreachable_database_is_one_line_and_exit_2(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    done = subprocess.run(
        [sys.executable, "-m", "ttmirror", "fuzz", "--requests", "1", "--database",
         f"redis://127.0.0.1:{port}/0", "--traces", str(tmp_path)],
        capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot reach that Redis server" in lines[0]
