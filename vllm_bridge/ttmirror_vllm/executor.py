"""vLLM's executor for the TT mirror: each step goes to a ttmirror worker process.

`execute_model` sends the step's plan and returns once the worker has launched it: the worker
does not wait for the device. `sample_tokens` returns a future that asks the worker for the
oldest step's tokens only when vLLM waits on it, so with async scheduling vLLM schedules and
launches step N+1 before step N's tokens are read back, as on any device.

A request the worker refused or failed (at launch or at readback) is named on its step's
output (`scheduler.FAILED`), for vLLM's scheduler to end it alone; only a worker that failed
as a whole (or died) raises here, which ends vLLM's engine.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import torch
from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
from vllm.v1.executor.abstract import Executor
from vllm.v1.kv_cache_interface import FullAttentionSpec
from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput

from . import check_version, wire
from .scheduler import FAILED

PYTHON = "TTMIRROR_PYTHON"
"""ttmirror's Python (its environment's interpreter): the worker runs there."""
TRACE = "TTMIRROR_TRACE"
"""Where the worker writes the run's events (an ITF trace for `ttmirror validate`)."""
SEED = "TTMIRROR_SAMPLER_SEED"
"""The worker's sampler seed, where set; else vLLM's own (`--seed`, default 0)."""
DEVICE = "TTMIRROR_DEVICE"
"""Off hardware, where the emulated device runs: `process` (default: a device process of its
own, beside the worker) or `host` (in the worker's process, as the host waits)."""
SAMPLER = "TTMIRROR_SAMPLER"
"""`greedy`: the worker loads the argmax path (sampled requests are then refused alone); by
default it loads the seeded sampler, as vLLM's default sampling (temperature 1.0) needs."""
STATE = "TTMIRROR_STATE"
"""`rows`: the worker keeps a state row per request on the device (spec rule 14); by default
the ring of per-step slots."""
MAX_LOGPROBS = "TTMIRROR_MAX_LOGPROBS"
SUMMARY = "TTMIRROR_SUMMARY"
"""Where the worker writes the run's closing summary (JSON: its counters, how it closed
each request), at shutdown."""
PROTOCOL = 2
BLOCK_SIZE = 16


NO_OPS = frozenset({"compile_or_warm_up_model", "init_device", "load_model", "reset_mm_cache",
                    "reset_encoder_cache"})
"""Worker methods vLLM calls that the mirror's worker has nothing for (no multimodal or
encoder caches, no compilation)."""


class WorkerError(RuntimeError):
    """The worker refused or failed a request (its one line), or died."""


@dataclass
class _Step:
    """A step vLLM scheduled: whether the worker launched one for it, what it refused at
    launch (worker ids -> reason), and the future of its output once vLLM asked for it."""

    so: SchedulerOutput
    launched: bool
    refused: dict[str, str] = field(default_factory=dict)
    future: _Collect | None = None
    deferred: dict[str, Any] | None = None
    """The plan of a step with structured-output rows: launched only once vLLM hands its
    grammar bitmask to `sample_tokens` (vLLM defers that until the tokens it is built from are
    known)."""


class _Collect(Future):  # type: ignore[type-arg]
    """A step's output, fetched from the worker when first waited on (oldest steps first)."""

    def __init__(self, executor: MirrorExecutor) -> None:
        super().__init__()
        self.executor = executor

    def result(self, timeout: float | None = None) -> Any:
        if not self.done():
            self.executor._collect_until(self)
        return super().result(timeout)


class MirrorExecutor(Executor):
    uses_ray = False

    def _init_executor(self) -> None:
        check_version()
        python = os.environ.get(PYTHON)
        if not python:
            raise WorkerError(f"set {PYTHON} to ttmirror's Python (its .venv/bin/python): the "
                              "worker runs there")
        ours, theirs = socket.socketpair()
        self.proc = subprocess.Popen([python, "-m", "ttmirror.vllm_worker", "--fd",
                                      str(theirs.fileno())], pass_fds=[theirs.fileno()])
        theirs.close()
        self.conn = Connection(ours.detach())
        self.ids = wire.Ids()
        self.asked_s: dict[str, float] = {}
        """Wall seconds vLLM's process spent waiting on the worker, per kind of message (the
        socket, the worker and the device's readbacks together)."""
        self.in_flight: deque[_Step] = deque()
        self.rejected: dict[str, int] = {}
        """Drafts the last collected step rejected, per vLLM request id."""
        self.closed: dict[str, Any] | None = None
        sched = self.vllm_config.scheduler_config
        spec = self.vllm_config.speculative_config
        k = spec.num_speculative_tokens if spec is not None else 0
        self.decisions = wire.Decisions(k)
        self.mask_stride = 1 + k  # rows of vLLM's grammar bitmask a structured request owns
        seed = os.environ.get(SEED)
        self.facts = self._ask("init", {
            "model_dir": self.model_config.model,
            "async_scheduling": bool(sched.async_scheduling),
            "rows": sched.max_num_seqs,
            "spec_tokens": k,
            "trace": os.environ.get(TRACE),
            "summary": os.environ.get(SUMMARY),
            "device": os.environ.get(DEVICE, "process"),
            "state": os.environ.get(STATE, "ring"),
            "seed": int(seed) if seed is not None else int(self.model_config.seed or 0),
            "sampler": os.environ.get(SAMPLER) != "greedy",
            # The logprob ring's width: vLLM's own limit (`--max-logprobs`, default 20) unless
            # a test narrows it.
            "max_logprobs": int(os.environ.get(MAX_LOGPROBS)
                                or self.model_config.max_logprobs),
        })
        if self.facts.get("protocol") != PROTOCOL:
            raise WorkerError(f"the worker speaks protocol {self.facts.get('protocol')}, this "
                              f"executor {PROTOCOL}: reinstall vllm_bridge beside ttmirror")
        if self.facts["async_scheduling"] != bool(sched.async_scheduling):
            raise WorkerError(f"vLLM schedules with async_scheduling={sched.async_scheduling}; "
                              f"the worker's backend resolved {self.facts['async_scheduling']}")

    # --- the worker ------------------------------------------------------------------------------
    def _ask(self, kind: str, *args: Any) -> Any:
        started = time.perf_counter()
        try:
            self.conn.send((kind, *args))
            reply, value = self.conn.recv()
            self.asked_s[kind] = self.asked_s.get(kind, 0.0) + time.perf_counter() - started
        except (EOFError, OSError, BrokenPipeError):
            code = self.proc.poll()
            raise WorkerError(f"the ttmirror worker died (exit code {code}) during {kind}"
                              ) from None
        if reply == "error":
            raise WorkerError(f"ttmirror worker: {value}")
        return value

    def _books(self) -> dict[str, Any]:
        """What vLLM's side counted so far (its decisions, its waits on the worker), sent with
        each step: the worker's closing summary holds it even when vLLM's engine core is
        killed in its shutdown (its process manager does, a few seconds after a Ctrl-C)."""
        return {"vllm": self.decisions.as_dict(), "asked_s": dict(self.asked_s)}

    def in_flight_rows(self) -> set[int]:
        """The worker's ids of the requests with a row in a step not collected yet."""
        return {self.ids.of[rid] for step in self.in_flight
                for rid in step.so.num_scheduled_tokens}

    def _output(self, step: _Step) -> ModelRunnerOutput:
        """The step's output: its tokens read back (none where the worker launched nothing),
        marked with every request the worker refused or failed with it."""
        got = (self._ask("collect", self._books()) if step.launched
               else {"tokens": {}, "logprobs": {}})
        out = wire.output(step.so, got, self.ids)
        self._mark_failed(out, step.refused | got.get("refused", {}))
        # Drafts this step rejected, per request: vLLM counted them computed when it scheduled
        # the next step, and takes them back only now.
        self.rejected = {rid: len(d) + 1 - len(out.sampled_token_ids[out.req_id_to_index[rid]])
                         for rid, d in step.so.scheduled_spec_decode_tokens.items()
                         if out.sampled_token_ids[out.req_id_to_index[rid]]}
        return out

    def _mark_failed(self, out: ModelRunnerOutput, refused: dict[str, str]) -> None:
        """Name on `out` the requests the worker refused or failed (its ids -> reason), by
        vLLM's ids, for the scheduler to end them (`scheduler.FAILED`)."""
        setattr(out, FAILED, {self.ids.name[int(k)]: why for k, why in refused.items()})

    def _collect_until(self, target: _Collect) -> None:
        """Collect the oldest steps, in order, until `target` holds its output."""
        while not target.done():
            step = self.in_flight.popleft()
            future = step.future
            try:
                out = self._output(step)
            except Exception as e:
                if future is not None:
                    future.set_exception(e)
                if future is target or future is None:
                    if not target.done():
                        target.set_exception(e)
                    return
                continue
            if future is not None:
                future.set_result(out)

    # --- vLLM's executor interface ---------------------------------------------------------------
    def execute_model(self, scheduler_output: SchedulerOutput,  # type: ignore[override]
                      non_block: bool = False) -> Any:
        # A refusal is raised here, where vLLM's own executors surface a failed launch.
        so = scheduler_output
        launched: dict[str, Any] = {"step": -1, "refused": {}}
        deferred = None
        # A step of no tokens still carries closes and preemptions: the worker applies them.
        if so.total_num_scheduled_tokens > 0 or so.finished_req_ids or so.preempted_req_ids:
            plan = wire.plan(scheduler_output, self.ids)
            self.decisions.count(plan, self.in_flight_rows())
            if so.has_structured_output_requests and so.total_num_scheduled_tokens > 0:
                deferred = plan  # launched with its masks, in sample_tokens
            else:
                launched = self._ask("launch", plan, self._books())
        step = _Step(so, launched["step"] >= 0, launched["refused"], deferred=deferred)
        future: Future[ModelRunnerOutput | None] = Future()
        if so.total_num_scheduled_tokens == 0:
            # vLLM samples nothing for an empty step: its output is this one, empty.
            empty = ModelRunnerOutput(req_ids=[], req_id_to_index={})
            self._mark_failed(empty, step.refused)
            future.set_result(empty)
            return future if non_block else future.result()
        self.in_flight.append(step)
        future.set_result(None)
        return future if non_block else None

    def sample_tokens(self, grammar_output: GrammarOutput | None,  # type: ignore[override]
                      non_block: bool = False) -> Any:
        step = self.in_flight[-1]  # the step execute_model launched (or deferred) last
        if step.deferred is not None:
            plan, step.deferred = step.deferred, None
            so = step.so
            plan["masks"] = wire.masks(grammar_output, self.ids, so, self.mask_stride,
                                       self.facts["vocab"])
            # vLLM planned this step before it read the last one's tokens: its computed counts
            # still hold the drafts that step rejected (vLLM's own runner corrects them on the
            # device), and its drafts are now the ones read back, those its grammar rejected
            # padded with -1 (`update_draft_token_ids_in_output`).
            for rid, n in self.rejected.items():
                key = str(self.ids.of[rid])
                if key in plan["computed"] and rid in so.num_scheduled_tokens:
                    plan["computed"][key] -= n
            plan["spec"] = {str(self.ids.of[rid]): list(d)
                            for rid, d in so.scheduled_spec_decode_tokens.items()}
            self.decisions.masked_rows += len(plan["masks"])
            launched = self._ask("launch", plan, self._books())
            step.launched, step.refused = launched["step"] >= 0, launched["refused"]
        step.future = future = _Collect(self)
        return future if non_block else future.result()

    def take_draft_token_ids(self) -> DraftTokenIds | None:
        """At depth 1 vLLM schedules the next step's drafts itself: the worker's, as read back
        with the last step (under async scheduling they stay on the device)."""
        drafts = self._ask("drafts")
        if not drafts:
            return None
        names = [self.ids.name[int(k)] for k in drafts]
        return DraftTokenIds(names, [list(v) for v in drafts.values()])

    def collective_rpc(self, method: Any, timeout: float | None = None, args: tuple = (),
                       kwargs: dict | None = None, non_block: bool = False) -> Any:
        name = method if isinstance(method, str) else getattr(method, "__name__", repr(method))
        if name in NO_OPS:
            result: list[Any] = [None]
        else:
            raise WorkerError(f"the ttmirror executor has no worker method {name!r}")
        if non_block:
            f: Future[list[Any]] = Future()
            f.set_result(result)
            return f
        return result

    def get_kv_cache_specs(self) -> list[dict[str, Any]]:
        hf = self.model_config.hf_config
        spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=hf.num_key_value_heads,
                                 head_size=hf.head_dim, dtype=torch.float32)
        return [{f"model.layers.{i}.self_attn.attn": spec
                 for i in range(hf.num_hidden_layers)}]

    def determine_available_memory(self) -> list[int]:
        # Room for every row's whole context twice over: vLLM's preemptions then come from
        # `num_gpu_blocks_override` (a small KV cache), when a test asks for them.
        hf = self.model_config.hf_config
        per_token = 2 * hf.num_hidden_layers * hf.num_key_value_heads * hf.head_dim * 4
        tokens = 2 * self.scheduler_config.max_num_seqs * self.model_config.max_model_len
        return [per_token * tokens]

    def get_supported_kv_cache_layouts(self) -> list[list[str]]:
        return [["NHD"]]

    def set_kv_cache_layout(self, layout_name: str, cp_kv_cache_interleave_size: int) -> None:
        return None

    def initialize_from_config(self, kv_cache_configs: list[Any]) -> None:
        return None

    def compile_or_warm_up_model(self) -> None:
        return None

    @property
    def supported_tasks(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("generate",)

    def check_health(self) -> None:
        if self.proc.poll() is not None:
            raise WorkerError(f"the ttmirror worker exited (code {self.proc.returncode})")

    def shutdown(self) -> None:
        if self.closed is not None or not hasattr(self, "proc"):
            return
        self.closed = {}
        try:
            if self.proc.poll() is None:
                self.closed = self._ask("close", self._books())
        except WorkerError as e:
            self.closed = {"failed": str(e)}
        finally:
            self.closed |= self._books()
            self.conn.close()
            if os.environ.get(SUMMARY) and self.closed.get("failed"):
                # The worker writes the summary as it closes; one that failed or died cannot.
                import json

                with open(os.environ[SUMMARY], "w") as f:
                    json.dump(self.closed, f)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    @classmethod
    def supports_async_scheduling(cls) -> bool:
        return True
