"""The worker process behind vLLM's executor: vLLM's steps served by the TT mirror.

vLLM runs in its own environment (it needs numpy >= 2, ttnn < 2), so its executor
(`vllm_bridge/ttmirror_vllm/executor.py`) starts this module with ttmirror's Python and talks to
it over one socket (`--fd`), in plain Python values only: no class of either environment crosses.

    ("init", options)         -> ("ready", facts)        load the model, open the device
    ("launch", plan, books)   -> ("launched", result)    one step of vLLM's, launched (not
                                                         waited for): its index (-1: none)
                                                         and the requests refused
    ("collect", books)        -> ("collected", result)   the oldest step's tokens, read back,
                                                         and the requests a fault failed
    ("drafts",)               -> ("drafts", {req: ids})  drafts read back (depth 1, drafts)
    ("close", books)          -> ("closed", summary)     write the events' trace and the
                                                         summary, then close the device

`books` are vLLM's side's counts so far (its decisions, its waits on the worker), kept for the
summary, which the worker writes (`options["summary"]`) even when vLLM's engine core is killed
before it can ask.

A request the mirror cannot serve (a parameter it does not implement, a decision of vLLM's the
model forbids, a device fault in its step) is refused alone: the reply names it with its reason
and the other requests go on. Every reply to a message that failed otherwise is ("error", one
line); the worker then only answers ("close",). It exits when the socket closes, whatever
state it is in (writing the events it has first), so a vLLM that dies leaves no worker behind;
it ignores Ctrl-C, which vLLM handles.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

PROTOCOL = 2
"""Bumped whenever a message changes: the executor refuses a worker of another protocol."""
SAMPLER_ROWS = 32
"""Rows a step may hold on the sampler path: `ttnn.sampling` takes at most 32 users."""


def _new(n: dict[str, Any], vocab: int) -> Any:
    """An arrival of the plan: its sampling as the engine's `SamplingParams`; a sampled request
    without a seed draws one from the engine's stream; one that asks what the mirror does not
    serve (`unsupported`, as the bridge read it) is refused at arrival, naming it."""
    from .serving.context import SamplingParams
    from .serving.scheduled import NewRequest

    d: dict[str, Any] | None = n.get("sampling")
    draw = False
    if d is not None:
        d = dict(d)
        # Plain values across the socket; the engine's hashable forms here.
        d["logit_bias"] = tuple((int(t), float(b)) for t, b in d.get("logit_bias") or ())
        d["bad_words"] = tuple(tuple(int(t) for t in w) for w in d.get("bad_words") or ())
        if d.get("allowed_ids") is not None:
            d["allowed_ids"] = frozenset(int(t) for t in d["allowed_ids"])
        if "temperature" in d:
            draw = d.get("seed") is None
            if d.get("top_k") is None:
                d["top_k"] = vocab  # vLLM's "no top-k": the whole vocabulary
    unsupported = n.get("unsupported") or []
    refuse = (f"request {n['req']}: the TT mirror does not serve {', '.join(unsupported)}"
              if unsupported else None)
    return NewRequest(n["req"], tuple(n["prompt"]), n["max_tokens"], frozenset(n["stop_ids"]),
                      None if d is None else SamplingParams(**d), draw_seed=draw, refuse=refuse,
                      host_sync=bool(n.get("host_sync")))


def _plan(message: dict[str, Any], vocab: int) -> Any:
    from .serving.scheduled import Plan

    return Plan(
        rows=tuple(message["rows"]),
        tokens={int(k): v for k, v in message["tokens"].items()},
        computed={int(k): v for k, v in message["computed"].items()},
        new=tuple(_new(n, vocab) for n in message["new"]),
        resumed=frozenset(message["resumed"]),
        spec={int(k): tuple(v) for k, v in message.get("spec", {}).items()},
        masks={int(k): tuple(frozenset(lane) for lane in v)
               for k, v in message.get("masks", {}).items()},
        preempted=frozenset(message["preempted"]),
        finished=frozenset(message["finished"]),
    )


class Worker:
    def __init__(self) -> None:
        self.engine: Any = None
        self.backend: Any = None
        self.trace: Path | None = None
        self.failed: str | None = None
        self.seconds: dict[str, float] = {}
        """Wall seconds spent handling each kind of message (where the worker's time goes)."""
        self.summary: Path | None = None
        self.books: dict[str, Any] = {}
        """vLLM's side's counts, as of its last message (`vllm`, `asked_s`)."""

    def init(self, options: dict[str, Any]) -> dict[str, Any]:
        from .impl.backend import get_backend, padded_rows
        from .serving.backend import ServingBackend
        from .serving.batching import ServingConfig
        from .serving.context import SamplingParams
        from .serving.models import load_model_dir
        from .serving.scheduled import ScheduledEngine

        model = load_model_dir(options["model_dir"])
        rows = int(options["rows"])
        if options.get("sampler", True) and rows > SAMPLER_ROWS:
            raise ValueError(f"{rows} rows: ttnn.sampling draws for at most {SAMPLER_ROWS} "
                             f"users per step; serve at most {SAMPLER_ROWS} (--max-num-seqs)")
        backend_options: dict[str, Any] = {}
        if options.get("backend", "tt") == "tt":
            from .impl.devices import chip_present

            if not chip_present():
                from .emulator import Emulator, ManualScheduler, ProcessScheduler
                from .emulator.decoder import dram_bytes
                from .emulator.device import DEFAULT_DRAM_SIZE

                # The default emulated device: its queues in a device process of their own,
                # beside this host process, as a chip's cores run beside the host ("host":
                # completed in this process when the host waits, for comparison).
                in_host = options.get("device") == "host"
                backend_options["provider"] = Emulator(
                    scheduler=ManualScheduler if in_host else ProcessScheduler,
                    dram_size=DEFAULT_DRAM_SIZE + dram_bytes(model, padded_rows(rows), rows))
        # The seeded sampler unless told greedy-only: requests may sample (vLLM's default is
        # temperature 1.0), and a greedy one draws with top-k 1 there. Its seed is vLLM's own
        # (`--seed`), which also seeds the stream unseeded requests draw their seeds from.
        seed = int(options.get("seed") or 0)
        sampling = SamplingParams(seed=seed) if options.get("sampler", True) else SamplingParams()
        self.backend = ServingBackend(get_backend(options.get("backend", "tt"),
                                                  **backend_options), model, sampling)
        # vLLM's -1 is the whole vocabulary; the ring holds at most the vocabulary.
        logprobs = int(options.get("max_logprobs", 0))
        state = options.get("state") or "ring"
        if state not in ("ring", "rows"):
            raise ValueError(f"TTMIRROR_STATE must be ring or rows, got {state!r}")
        config = ServingConfig(
            async_scheduling="on" if options["async_scheduling"] else "off", rows=rows,
            max_logprobs=model.vocab if logprobs < 0 else min(logprobs, model.vocab),
            spec_tokens=int(options.get("spec_tokens", 0)), state=state)
        self.engine = ScheduledEngine(self.backend, config)
        self.trace = Path(options["trace"]) if options.get("trace") else None
        self.summary = Path(options["summary"]) if options.get("summary") else None
        return {
            "protocol": PROTOCOL, "model": model.name, "vocab": model.vocab,
            "max_context": model.max_context, "backend": self.backend.name,
            "device": self.backend.device_kind(),
            "async_scheduling": self.engine.async_scheduling_enabled(),
            "max_concurrent_batches": self.engine.max_concurrent_batches(),
        }

    def launch(self, plan: dict[str, Any], books: dict[str, Any] | None = None
               ) -> dict[str, Any]:
        self.books = books or self.books
        step: int = self.engine.launch(_plan(plan, self.engine.model.vocab))
        refused = self.engine.take_refused()
        return {"step": step, "refused": {str(k): v for k, v in refused.items()}}

    def collect(self, books: dict[str, Any] | None = None) -> dict[str, Any]:
        self.books = books or self.books
        got = self.engine.collect()
        return {
            "step": got.step,
            "tokens": {str(k): v for k, v in got.tokens.items()},
            "logprobs": {str(k): [(lp.sampled, list(lp.top)) for lp in v]
                         for k, v in got.logprobs.items()},
            "refused": {str(k): v for k, v in got.refused.items()},
        }

    def drafts(self) -> dict[str, list[int]]:
        """Each open request's drafts as read back with its last step (depth 1: the scheduler
        hands them to the next step)."""
        return {str(k): list(v) for k, v in self.engine.host_drafts().items()}

    def close(self, books: dict[str, Any] | None = None) -> dict[str, Any]:
        """Write the run's events and the closing summary (with vLLM's side's counts) and
        return it; the device stays open (`release`), so that vLLM has the summary before the
        device takes its time to close."""
        self.books = books or self.books
        summary: dict[str, Any] = {"failed": self.failed}
        engine = self.engine
        if engine is not None:
            summary["stats"] = dict(engine.runner.stats) | {
                "preemptions": engine.kv.preemptions, "resumes": engine.kv.resumes,
                "partial_chunks": engine.kv.partial_chunks, "prefills": engine.kv.prefills,
                "prefix_hits": engine.kv.prefix_hits, "prefix_tokens": engine.kv.prefix_tokens,
                "state_rows": len(engine.runner.table)}
            summary["closed_as"] = {str(k): v for k, v in engine.closed_as.items()}
            summary["seconds"] = dict(self.seconds, readback_wait=engine.readback_wait)
            if self.trace is not None:
                from ttmirror.conformance.traces.itf import write_events

                events = engine.runner.events.events
                write_events(events, self.trace)
                summary["events"] = len(events)
        summary |= self.books
        if self.summary is not None:
            self.summary.write_text(json.dumps(summary))
        return summary

    def release(self) -> None:
        """Close the engine and the device."""
        if self.engine is not None:
            self.engine.close()
        if self.backend is not None:
            self.backend.close()


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
                worker.release()
            return
        kind, *args = message
        if kind == "close":
            try:
                conn.send(("closed", worker.close(*args)))
            except Exception as e:
                conn.send(("error", f"close: {type(e).__name__}: {e}"))
            finally:
                with contextlib.suppress(Exception):  # vLLM has its answer: nothing to tell
                    worker.release()
            return
        if worker.failed is not None:
            conn.send(("error", f"the worker failed earlier: {worker.failed}"))
            continue
        started = time.perf_counter()
        try:
            result = handlers[kind](*args)
        except Exception as e:
            worker.failed = f"{kind}: {type(e).__name__}: {e}"
            if os.environ.get("TTMIRROR_WORKER_TRACEBACK"):
                traceback.print_exc()
            conn.send(("error", worker.failed))
            continue
        worker.seconds[kind] = worker.seconds.get(kind, 0.0) + time.perf_counter() - started
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
