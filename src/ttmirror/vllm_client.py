"""vLLM as a client of the TT mirror: workloads served by vLLM's own engine and scheduler.

vLLM lives in its own environment (`.venv-vllm`, `make setup-vllm`): it needs numpy >= 2 and
ttnn needs numpy < 2. From ttmirror's side a run is a subprocess of vLLM's Python running the
bridge's cell driver (`vllm_bridge/ttmirror_vllm/battery.py`), whose executor starts a worker
in this environment (`ttmirror.vllm_worker`). This module writes the cells, runs them, and
reads back each request's tokens, vLLM's counted decisions and the worker's summary; the
worker writes the run's events, which `ttmirror validate` checks as model transitions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .serving.workload import RequestPlan

VLLM_PYTHON = "TTMIRROR_VLLM_PYTHON"
"""vLLM's Python; default: `.venv-vllm/bin/python` beside ttmirror's checkout."""
ROOT = Path(__file__).resolve().parents[2]
"""The project's root (the source tree's, above `src/`): where `.venv-vllm` is made."""


class VllmUnavailable(RuntimeError):
    """No vLLM environment to run in (one line: how to make one)."""


class VllmRunFailed(RuntimeError):
    """vLLM's run ended with an error (its one line)."""


def vllm_python() -> str:
    """The interpreter of vLLM's environment, or VllmUnavailable."""
    path = os.environ.get(VLLM_PYTHON) or str(ROOT / ".venv-vllm" / "bin" / "python")
    if not os.access(path, os.X_OK):
        raise VllmUnavailable(f"no vLLM environment at {path}: run `make setup-vllm` (or set "
                              f"{VLLM_PYTHON} to a Python with vllm==0.33.0 and vllm_bridge)")
    return path


@dataclass
class Cell:
    """One vLLM run: its engine's sizes, scheduling mode, workload and where its events go."""

    model_dir: str
    async_scheduling: bool
    requests: list[dict[str, Any]]
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 256
    num_gpu_blocks: int | None = None
    """vLLM's KV cache in blocks of 16 tokens (None: room for every row's whole context)."""
    max_model_len: int = 128
    aborts: dict[str, int] = field(default_factory=dict)
    sampler_seed: int | None = None
    max_logprobs: int | None = None
    spec_tokens: int = 0
    """Drafts per decoding row (vLLM's num_speculative_tokens; 0: no speculative decoding)."""
    state: str = "ring"
    """Where the worker keeps in-flight tokens on the device (spec rule 14): "ring" or "rows"."""
    trace: str | None = None


def requests_of(plan: list[RequestPlan], arrival_scale: int = 1) -> list[dict[str, Any]]:
    """A serving workload as the cell driver's requests (ids as strings, arrivals as engine
    steps, greedy unless a request carries its own sampling)."""
    out = []
    for p in plan:
        r: dict[str, Any] = {"id": str(p.req), "prompt": list(p.prompt),
                             "max_tokens": p.max_tokens, "stop": sorted(p.stop_ids),
                             "arrival": p.arrival * arrival_scale}
        if p.abort_after is not None:
            r["abort_after"] = p.abort_after
        s = p.sampling
        if s is not None:
            if not s.greedy:
                r.update(temperature=s.temperature, seed=s.seed, top_k=s.top_k, top_p=s.top_p)
            else:
                r["temperature"] = 0.0
            r.update(presence_penalty=s.presence_penalty, frequency_penalty=s.frequency_penalty,
                     repetition_penalty=s.repetition_penalty, min_tokens=s.min_tokens)
            if s.logprobs is not None:
                r["logprobs"] = s.logprobs
        out.append(r)
    return out


def serve(cells: list[Cell], workdir: Path, timeout: float = 1200.0) -> list[dict[str, Any]]:
    """Serve `cells` one after the other in one vLLM process; their results, in order."""
    python = vllm_python()
    workdir.mkdir(parents=True, exist_ok=True)
    given, out = workdir / "cells.json", workdir / "results.json"
    given.write_text(json.dumps([asdict(c) for c in cells]))
    env = dict(os.environ, TTMIRROR_PYTHON=sys.executable, OMP_NUM_THREADS="1",
               VLLM_LOGGING_LEVEL=os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"))
    done = subprocess.run([python, "-m", "ttmirror_vllm.battery", str(given), str(out)],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    if done.returncode != 0:
        lines = [ln for ln in done.stderr.splitlines() if ln.startswith("ttmirror_vllm")]
        why = lines[-1] if lines else (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise VllmRunFailed(f"vLLM's run failed (exit {done.returncode}): {why}")
    results: list[dict[str, Any]] = json.loads(out.read_text())
    return results
