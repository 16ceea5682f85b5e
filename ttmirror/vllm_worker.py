"""The worker process behind vLLM's executor: vLLM's steps served by the TT mirror.

vLLM runs in its own environment (it needs numpy >= 2, ttnn < 2), so its executor
(`vllm_bridge/ttmirror_vllm/executor.py`) starts this module with ttmirror's Python and talks to
it over one socket (`--fd`), in plain Python values only: no class of either environment crosses.

    ("init", options)  -> ("ready", facts)        load the model, open the device, the engine
    ("launch", plan)   -> ("launched", step)      one step of vLLM's, launched (not waited for)
    ("collect",)       -> ("collected", result)   the oldest step's tokens, read back
    ("drafts",)        -> ("drafts", {req: ids})  drafts read back (depth 1 with drafts)
    ("close",)         -> ("closed", summary)     write the events' trace, close the device

Every reply to a request that failed is ("error", one line); the worker then only answers
("close",). It exits when the socket closes, whatever state it is in (writing the events it
has first), so a vLLM that dies leaves no worker behind; it ignores Ctrl-C, which vLLM
handles.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import sys
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

PROTOCOL = 1
"""Bumped whenever a message changes: the executor refuses a worker of another protocol."""


def _plan(message: dict[str, Any], vocab: int) -> Any:
    from .serving.context import SamplingParams
    from .serving.scheduled import NewRequest, Plan

    def sampling(d: dict[str, Any] | None) -> SamplingParams | None:
        if d is None:
            return None
        if "temperature" in d:
            if d.get("seed") is None:
                raise ValueError("a sampled request needs its own seed on the mirror (draws "
                                 "are keyed by seed and position): give SamplingParams.seed")
            if d.get("top_k") is None:
                d = {**d, "top_k": vocab}  # vLLM's "no top-k": the whole vocabulary
        return SamplingParams(**d)

    return Plan(
        rows=tuple(message["rows"]),
        tokens={int(k): v for k, v in message["tokens"].items()},
        computed={int(k): v for k, v in message["computed"].items()},
        new=tuple(NewRequest(n["req"], tuple(n["prompt"]), n["max_tokens"],
                             frozenset(n["stop_ids"]), sampling(n.get("sampling")))
                  for n in message["new"]),
        resumed=frozenset(message["resumed"]),
        spec={int(k): tuple(v) for k, v in message.get("spec", {}).items()},
        preempted=frozenset(message["preempted"]),
        finished=frozenset(message["finished"]),
    )


class Worker:
    def __init__(self) -> None:
        self.engine: Any = None
        self.backend: Any = None
        self.trace: Path | None = None
        self.failed: str | None = None

    def init(self, options: dict[str, Any]) -> dict[str, Any]:
        from .impl.backend import get_backend, padded_rows
        from .serving.backend import ServingBackend
        from .serving.batching import ServingConfig
        from .serving.context import SamplingParams
        from .serving.models import load_model_dir
        from .serving.scheduled import ScheduledEngine

        model = load_model_dir(options["model_dir"])
        rows = int(options["rows"])
        backend_options: dict[str, Any] = {}
        if options.get("backend", "tt") == "tt":
            from .impl.devices import chip_present

            if not chip_present():
                from .emulator import Emulator
                from .emulator.decoder import dram_bytes
                from .emulator.device import DEFAULT_DRAM_SIZE

                backend_options["provider"] = Emulator(
                    dram_size=DEFAULT_DRAM_SIZE + dram_bytes(model, padded_rows(rows), rows))
        seed = options.get("seed")
        sampling = SamplingParams() if seed is None else SamplingParams(seed=int(seed))
        self.backend = ServingBackend(get_backend(options.get("backend", "tt"),
                                                  **backend_options), model, sampling)
        config = ServingConfig(
            async_scheduling="on" if options["async_scheduling"] else "off", rows=rows,
            max_logprobs=int(options.get("max_logprobs", 0)),
            spec_tokens=int(options.get("spec_tokens", 0)))
        self.engine = ScheduledEngine(self.backend, config)
        self.trace = Path(options["trace"]) if options.get("trace") else None
        return {
            "protocol": PROTOCOL, "model": model.name, "vocab": model.vocab,
            "max_context": model.max_context, "backend": self.backend.name,
            "device": self.backend.device_kind(),
            "async_scheduling": self.engine.async_scheduling_enabled(),
            "max_concurrent_batches": self.engine.max_concurrent_batches(),
        }

    def launch(self, plan: dict[str, Any]) -> int:
        step: int = self.engine.launch(_plan(plan, self.engine.model.vocab))
        return step

    def collect(self) -> dict[str, Any]:
        got = self.engine.collect()
        return {
            "step": got.step,
            "tokens": {str(k): v for k, v in got.tokens.items()},
            "logprobs": {str(k): [(lp.sampled, list(lp.top)) for lp in v]
                         for k, v in got.logprobs.items()},
        }

    def drafts(self) -> dict[str, list[int]]:
        """Each open request's drafts as read back with its last step (depth 1: the scheduler
        hands them to the next step)."""
        return {str(k): list(v) for k, v in self.engine.host_drafts().items()}

    def close(self) -> dict[str, Any]:
        summary: dict[str, Any] = {"failed": self.failed}
        engine = self.engine
        if engine is not None:
            summary["stats"] = dict(engine.runner.stats) | {
                "preemptions": engine.kv.preemptions, "resumes": engine.kv.resumes,
                "partial_chunks": engine.kv.partial_chunks, "prefills": engine.kv.prefills}
            summary["closed_as"] = {str(k): v for k, v in engine.closed_as.items()}
            if self.trace is not None:
                from .conformance.itf import write_events

                events = engine.runner.events.events
                write_events(events, self.trace)
                summary["events"] = len(events)
            engine.close()
        if self.backend is not None:
            self.backend.close()
        return summary


def serve(conn: Connection) -> None:
    worker = Worker()
    handlers: dict[str, Callable[..., Any]] = {
        "init": worker.init, "launch": worker.launch, "collect": worker.collect,
        "drafts": worker.drafts}
    replies = {"init": "ready", "launch": "launched", "collect": "collected",
               "drafts": "drafts"}
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            # vLLM's side is gone without a close: keep the events recorded so far, then go.
            with contextlib.suppress(Exception):  # the trace is written before the device closes
                worker.close()
            return
        kind, *args = message
        if kind == "close":
            try:
                conn.send(("closed", worker.close()))
            except Exception as e:
                conn.send(("error", f"close: {type(e).__name__}: {e}"))
            return
        if worker.failed is not None:
            conn.send(("error", f"the worker failed earlier: {worker.failed}"))
            continue
        try:
            result = handlers[kind](*args)
        except Exception as e:
            worker.failed = f"{kind}: {type(e).__name__}: {e}"
            if os.environ.get("TTMIRROR_WORKER_TRACEBACK"):
                traceback.print_exc()
            conn.send(("error", worker.failed))
            continue
        conn.send((replies[kind], result))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ttmirror.vllm_worker")
    parser.add_argument("--fd", type=int, required=True,
                        help="the socket inherited from vLLM's executor")
    ns = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # Ctrl-C reaches the whole process group: vLLM shuts down and closes the worker in order
    # (or the socket closes); an interrupt here would lose the run's events.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock = socket.socket(fileno=ns.fd)
    conn = Connection(os.dup(sock.fileno()))
    sock.close()
    try:
        serve(conn)
    finally:
        conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
