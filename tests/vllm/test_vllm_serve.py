"""`vllm serve` on localhost, served by the TT mirror: vLLM's OpenAI-compatible server (its API
process and its engine-core process) answers a completion request, asked with a real HTTP client;
greedy tokens are the probe's own; Ctrl-C shuts it down, the worker's events are written and
validate, and no process is left."""

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

from ttmirror.conformance.itf import read_events
from ttmirror.conformance.validate import bounds_of, validate
from ttmirror.impl.probe import ProbeReference
from ttmirror.serving.models import ProbeDecoder, load_model_dir, write_model_dir
from ttmirror.vllm_client import ROOT, vllm_python


def _group(pgid: int) -> list[int]:
    """Live processes of process group `pgid` (vllm serve's session: API server, engine core,
    the worker)."""
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

STARTUP_S = 600.0
"""How long vLLM may take to import and start (slow, not wrong: no verdict depends on it)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _post(port: int, body: dict[str, object]) -> dict[str, object]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as reply:
        answer: dict[str, object] = json.loads(reply.read())
        return answer


def test_vllm_serve_answers_a_completion_from_the_mirror(tmp_path: Path) -> None:
    model_dir = str(tmp_path / "model")
    write_model_dir("probe", model_dir)
    model = load_model_dir(model_dir)
    assert isinstance(model, ProbeDecoder)
    trace = tmp_path / "events.itf.json"
    port = _free_port()
    vllm = str(Path(vllm_python()).parent / "vllm")
    env = dict(os.environ, TTMIRROR_VLLM="1", TTMIRROR_PYTHON=sys.executable,
               TTMIRROR_TRACE=str(trace), OMP_NUM_THREADS="1", VLLM_LOGGING_LEVEL="WARNING")
    server = subprocess.Popen(
        [vllm, "serve", model_dir, "--skip-tokenizer-init", "--dtype", "float32",
         "--max-model-len", "128", "--max-num-seqs", "4", "--async-scheduling",
         "--enforce-eager", "--no-enable-prefix-caching", "--host", "127.0.0.1",
         "--port", str(port),
         # vLLM drains at shutdown and its engine core closes the worker, which writes its
         # events (with vLLM's default of 0 it force-kills the engine core's subprocesses).
         "--shutdown-timeout", "30"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
        start_new_session=True)
    try:
        deadline = time.monotonic() + STARTUP_S
        while True:
            assert server.poll() is None, server.communicate()[1][-3000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                assert time.monotonic() < deadline, "vllm serve did not start"
                time.sleep(1.0)
        prompts = [[1, 2, 3], [9, 4], [30]]
        for prompt in prompts:
            answer = _post(port, {"model": model_dir, "prompt": prompt, "max_tokens": 6,
                                  "temperature": 0, "return_token_ids": True})
            (choice,) = answer["choices"]  # type: ignore[misc]
            assert choice["finish_reason"] == "length"
            assert choice["token_ids"] == ProbeReference(model.spec).sequence(prompt[-1], 6)
    finally:
        os.killpg(server.pid, signal.SIGINT)  # Ctrl-C, as a user stops it
        try:
            server.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.communicate()
            raise
    deadline = time.monotonic() + 60
    while _group(server.pid) and time.monotonic() < deadline:
        time.sleep(0.5)  # the engine core and the worker exit after the API server
    assert _group(server.pid) == [], "a process of vllm serve outlived it"
    events = list(read_events(trace))
    assert sum(e.action == "arrive" for e in events) == len(prompts)
    d = validate(events, bounds_of(events))
    assert d is None, d.line()
