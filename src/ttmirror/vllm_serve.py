"""`vllm serve` on the TT mirror, started and stopped as a user does: in a session of its own
(API server, engine core, the worker), on localhost, stopped with Ctrl-C, the worker's events
read back afterwards; and vLLM's own load client, `vllm bench serve`, run against it. The HTTP
tests and `make bench-serve` (`benchmarks/bench_serve.py`) use both."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from ttmirror.conformance.traces.itf import read_events

from .impl.events import Event
from .vllm_client import ROOT, vllm_python

STARTUP_S = 600.0
"""How long vLLM may take to import and start (slow, not wrong: no verdict depends on it)."""
REPLY_S = 300.0
"""How long one request may take (a bound against a hang, not a verdict on speed)."""


class ServerFailed(RuntimeError):
    """`vllm serve` did not start, or left a process behind (one line, or vLLM's last lines)."""


def group(pgid: int) -> list[int]:
    """Live processes of process group `pgid` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z" and int(fields[2]) == pgid:
                found.append(int(entry.name))
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Server:
    """`vllm serve MODEL_DIR ARGS...` on localhost with the mirror's plugin on; `stop()` sends
    Ctrl-C and returns the run's recorded events."""

    def __init__(self, model_dir: str, trace: Path, *args: str) -> None:
        self.model = model_dir
        self.trace = trace
        self.summary_path = trace.with_name(trace.name + ".summary.json")
        self.summary: dict[str, Any] = {}
        """The worker's closing summary and vLLM's counted decisions, once stopped."""
        self.port = free_port()
        env = dict(os.environ, TTMIRROR_VLLM="1", TTMIRROR_PYTHON=sys.executable,
                   TTMIRROR_TRACE=str(trace), TTMIRROR_SUMMARY=str(self.summary_path),
                   OMP_NUM_THREADS="1",
                   VLLM_LOGGING_LEVEL=os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"))
        vllm = str(Path(vllm_python()).parent / "vllm")
        self.proc = subprocess.Popen(
            [vllm, "serve", model_dir, "--host", "127.0.0.1", "--port", str(self.port),
             # vLLM drains at shutdown and its engine core closes the worker, which writes its
             # events (with vLLM's default of 0 it force-kills the engine core's subprocesses).
             "--shutdown-timeout", "30", *args],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
            start_new_session=True)
        deadline = time.monotonic() + STARTUP_S
        while True:
            if self.proc.poll() is not None:
                raise ServerFailed(f"vllm serve exited ({self.proc.returncode}): "
                                   + self.proc.communicate()[1][-3000:])
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5):
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if time.monotonic() > deadline:
                    self.stop()
                    raise ServerFailed(f"vllm serve did not start in {STARTUP_S:.0f} s"
                                       ) from None
                time.sleep(1.0)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def post(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """POST `body` (the model filled in) to `path`: the status and the JSON answer."""
        request = urllib.request.Request(
            f"{self.url}{path}", data=json.dumps({"model": self.model, **body}).encode(),
            headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=REPLY_S) as reply:
                return reply.status, json.loads(reply.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=30) as reply:
                return bool(reply.status == 200)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def stop(self) -> list[Event]:
        """Ctrl-C, as a user stops it; every process of its session gone; the run's events."""
        os.killpg(self.proc.pid, signal.SIGINT)
        try:
            self.proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.communicate()
            raise
        deadline = time.monotonic() + 60
        while group(self.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.5)  # the engine core and the worker exit after the API server
        if group(self.proc.pid):
            raise ServerFailed("a process of vllm serve outlived it")
        if self.summary_path.exists():
            self.summary = json.loads(self.summary_path.read_text())
        return list(read_events(self.trace))

    def bench(self, out: Path, *args: str, timeout: float = 3600.0) -> dict[str, Any]:
        """vLLM's own load client against this server (`vllm bench serve --backend vllm`,
        `args` its options): the JSON result it saved."""
        vllm = str(Path(vllm_python()).parent / "vllm")
        done = subprocess.run(
            [vllm, "bench", "serve", "--backend", "vllm", "--base-url", self.url,
             "--model", self.model, "--save-result", "--result-dir", str(out.parent),
             "--result-filename", out.name, "--disable-tqdm", *args],
            capture_output=True, text=True, timeout=timeout, cwd=ROOT,
            env=dict(os.environ, OMP_NUM_THREADS="1", VLLM_LOGGING_LEVEL="WARNING"))
        if done.returncode != 0:
            raise ServerFailed(f"vllm bench serve failed ({done.returncode}): "
                               + done.stderr[-3000:])
        result: dict[str, Any] = json.loads(out.read_text())
        return result
