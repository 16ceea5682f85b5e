"""Subcommands for serve-demo (the async serving loop)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ttmirror.cli.arguments import AddParser, UsageError, writable

if TYPE_CHECKING:  # imported for real inside the command: they load torch and ttnn
    from ttmirror.serving.backend import ServingBackend
    from ttmirror.serving.models import DecoderModel
    from ttmirror.serving.workload import Outcome, RequestPlan


def register(add_parser: AddParser) -> None:
    """Add `serve-demo` to the `ttmirror` parser."""
    from ttmirror.serving.catalog import model_names  # no torch/ttnn import: cheap

    s = add_parser(
        "serve-demo",
        help="serve a short workload with the async loop; print outputs and timing",
        description="Serve a short workload (staggered arrivals, stop tokens, an abort, a KV "
        "budget that forces preemption) and print each request's tokens and timing.",
    )
    s.add_argument("--model", choices=model_names(), default="tiny-qwen3",
                   help="model (default %(default)s); checkpoints load from the local HF cache")
    s.add_argument("--backend", choices=("tt", "cpu"), default="tt",
                   help="tt: the TT mirror (emulated device without a chip); cpu: torch on host")
    s.add_argument("--async-scheduling", choices=("auto", "on", "off"), default="auto",
                   help="requested async scheduling (default %(default)s)")
    s.add_argument("--sampling", choices=("greedy", "seeded"), default="greedy",
                   help="sampler on device: argmax, or seeded top-k/top-p (default %(default)s)")
    s.add_argument("--seed", type=int, default=0, help="sampling seed (default %(default)s)")
    s.add_argument("--requests", type=int, default=8, help="requests (default %(default)s)")
    s.add_argument("--max-tokens", type=int, default=None,
                   help="cap every request's max_tokens (default: the workload's 6..15)")
    s.add_argument("--kv-tokens", type=int, default=24,
                   help="KV budget in context tokens (default %(default)s)")
    s.add_argument("--prompt", default=None,
                   help="comma-separated prompt ids for request 0 (checked against the vocab)")
    s.add_argument("--preempt-policy", choices=("keep", "drop"), default="keep",
                   help="a preempted request's in-flight tokens: keep (vLLM's: delivered) or "
                        "drop (recomputed) (default %(default)s)")
    s.add_argument("--prefill-chunk", type=int, default=None,
                   help="context tokens prefilled per step per request (chunked prefill; "
                        "default: no such limit)")
    s.add_argument("--max-step-tokens", type=int, default=None,
                   help="tokens one step computes: a token per decoding row, prefills chunked "
                        "into the rest (at least the 8 rows, unless --subsets; default: no "
                        "budget)")
    s.add_argument("--subsets", action="store_true",
                   help="the scheduler takes vLLM's freedoms (spec rule 14): under "
                        "--max-step-tokens a step holds what fits, decoding rows first with "
                        "the drafts the budget leaves, the rest waiting; drafts trimmed at the "
                        "model's context")
    s.add_argument("--logprobs", type=int, default=None,
                   help="every request also gets, per token, its logprob and the top N "
                        "(printed: the tokens' mean logprob and the first token's top N)")
    s.add_argument("--spec-tokens", type=int, default=0,
                   help="speculative decoding: K = 1 or 2 drafts per decoding row, proposed and "
                        "verified on the device (default %(default)s: none)")
    s.add_argument("--trace", default=None,
                   help="write the runner's recorded events here (an ITF trace for "
                        "`ttmirror validate`)")
    s.set_defaults(func=cmd_serve_demo)


def _positive(name: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise UsageError(f"--{name} must be at least 1, got {value}")


def _parse_prompt(text: str) -> tuple[int, ...]:
    try:
        ids = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise UsageError(f"--prompt must be comma-separated integers, got {text!r}") from None
    if not ids:
        raise UsageError("--prompt is empty")
    return ids


def cmd_serve_demo(ns: argparse.Namespace) -> int:
    _positive("requests", ns.requests)
    _positive("max-tokens", ns.max_tokens)
    _positive("kv-tokens", ns.kv_tokens)
    _positive("prefill-chunk", ns.prefill_chunk)
    _positive("max-step-tokens", ns.max_step_tokens)
    _positive("logprobs", ns.logprobs)
    if ns.spec_tokens not in (0, 1, 2):
        raise UsageError(f"--spec-tokens must be 0, 1 or 2 (drafts per decoding row), got "
                         f"{ns.spec_tokens}")
    prompt = _parse_prompt(ns.prompt) if ns.prompt is not None else None
    if ns.trace is not None:  # before the run: its trace must have somewhere to go
        writable(ns.trace)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # Checked before the imports below: they load torch, ttnn and transformers.
    from ttmirror.serving.batching import InvalidRequest
    from ttmirror.serving.engine import NoProgress
    from ttmirror.serving.workload import run_workload

    started = time.perf_counter()
    model = _load_model(ns)
    plan = _plan(ns, model.vocab, prompt)
    backend, engine = _open_engine(ns, model)
    try:
        loaded = time.perf_counter() - started
        try:
            for p in plan:  # every request is checked before anything is scheduled
                engine.validate(p.req, p.prompt, p.max_tokens)
        except InvalidRequest as e:
            raise UsageError(str(e)) from None
        timeline = _Timeline()
        try:
            out = run_workload(engine, plan, on_step=timeline.watch)
        except NoProgress as e:  # a livelock: one line, exit 1 (the cap would take minutes)
            print(f"ttmirror: error: serving stopped: {e}", file=sys.stderr)
            return 1
        _print_header(ns, backend, engine, loaded)
        _print_requests(plan, out, timeline)
        _print_totals(out, ns.spec_tokens)
        if ns.trace is not None:
            _write_trace(Path(ns.trace), engine)
        if not _validated(engine):
            return 1
    finally:
        engine.close()
        backend.close()
    return 0


def _validated(engine: Any) -> bool:
    """Check the run's recorded events against the model; print the verdict."""
    from ttmirror.conformance.traces.validate import bounds_of, validate

    events = engine.runner.events.events
    d = validate(events, bounds_of(events))
    if d is None:
        print(f"validated: {len(events)} events, each a transition of the model")
        return True
    print(d.line(), file=sys.stderr)
    return False


def _write_trace(path: Path, engine: Any) -> None:
    """The run's recorded events as an ITF trace (the tokens were printed first: kept)."""
    from ttmirror.conformance.traces.itf import write_events

    events = engine.runner.events.events
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_events(events, path)
    except OSError as e:
        raise UsageError(f"cannot write the trace {path}: {e.strerror}") from None
    print(f"trace: {len(events)} events written to {path} (check it: ttmirror validate {path})")


def _load_model(ns: argparse.Namespace) -> DecoderModel:
    from ttmirror.serving.models import CheckpointUnavailable, load_model

    try:
        return load_model(ns.model, seed=ns.seed)
    except CheckpointUnavailable as e:
        raise UsageError(str(e)) from None


def _plan(ns: argparse.Namespace, vocab: int, prompt: tuple[int, ...] | None) -> list[RequestPlan]:
    """The standard workload, with --max-tokens and --prompt applied."""
    from ttmirror.serving.workload import standard_plan

    plan = standard_plan(vocab, ns.requests)
    if ns.max_tokens is not None:
        plan = [replace(p, max_tokens=min(p.max_tokens, ns.max_tokens)) for p in plan]
    if prompt is not None:
        plan[0] = replace(plan[0], prompt=prompt)
    if ns.logprobs is not None:
        from ttmirror.serving.context import SamplingParams

        # The engine's own sampling, plus logprobs (the request's seed is then the engine's).
        own = SamplingParams(seed=ns.seed, logprobs=ns.logprobs) if ns.sampling == "seeded" \
            else SamplingParams(logprobs=ns.logprobs)
        plan = [replace(p, sampling=own) for p in plan]
    return plan


def _open_engine(ns: argparse.Namespace, model: DecoderModel) -> tuple[ServingBackend, Any]:
    """The backend and the engine loaded on it; the backend is closed if the engine cannot load."""
    from ttmirror.impl.backend import get_backend
    from ttmirror.impl.runner import DeviceFault
    from ttmirror.serving.backend import ServingBackend
    from ttmirror.serving.batching import ServingConfig, ServingEngine
    from ttmirror.serving.context import SamplingParams

    sampling = SamplingParams(seed=ns.seed) if ns.sampling == "seeded" else SamplingParams()
    options: dict[str, Any] = {}
    if ns.backend == "tt":
        from ttmirror.impl.devices import chip_present

        if not chip_present():
            from ttmirror.emulator import Emulator, ProcessScheduler
            from ttmirror.emulator.decoder import dram_bytes
            from ttmirror.emulator.device import DEFAULT_DRAM_SIZE
            from ttmirror.impl.backend import padded_rows

            # An emulated device with room for the model's vocabulary, its queues in a device
            # process of their own (the entry point's default), running beside the host.
            options["provider"] = Emulator(
                scheduler=ProcessScheduler,
                dram_size=DEFAULT_DRAM_SIZE + dram_bytes(model, padded_rows(8), 8))
    backend = ServingBackend(get_backend(ns.backend, **options), model, sampling)
    try:
        config = ServingConfig(async_scheduling=ns.async_scheduling, kv_tokens=ns.kv_tokens,
                               preempt_policy=ns.preempt_policy, prefill_chunk=ns.prefill_chunk,
                               max_step_tokens=ns.max_step_tokens,
                               max_logprobs=ns.logprobs or 0, spec_tokens=ns.spec_tokens,
                               subsets=ns.subsets)
        return backend, ServingEngine(backend, config)
    except (ValueError, NotImplementedError) as e:
        # ValueError: async "on" where the backend cannot; NotImplementedError: the decoder op
        # exists on the emulated device only.
        backend.close()
        raise UsageError(str(e)) from None
    except DeviceFault as e:  # the device refused the load: one line, exit 1
        backend.close()
        print(f"ttmirror: error: the engine could not load: {e}", file=sys.stderr)
        raise SystemExit(1) from None


class _Timeline:
    """When each request got its first token and when it closed, in seconds since the start."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.first: dict[int, float] = {}
        self.done: dict[int, float] = {}

    def watch(self, engine: Any) -> None:
        from ttmirror.impl.runner import CLOSED

        now = time.perf_counter() - self.start
        for req, r in engine.runner.requests.items():
            if r.delivered and req not in self.first:
                self.first[req] = now
            if r.status in CLOSED and req not in self.done:
                self.done[req] = now


def _print_header(ns: argparse.Namespace, backend: ServingBackend, engine: Any,
                  loaded: float) -> None:
    print(
        f"model {backend.model.name} (vocab {backend.model.vocab}) on backend {backend.name} "
        f"({backend.device_kind()}), sampling {backend.sampling.describe()}"
    )
    print(
        f"async scheduling {ns.async_scheduling} -> "
        f"{'on' if engine.async_scheduling_enabled() else 'off'}, "
        f"max_concurrent_batches={engine.max_concurrent_batches()}, "
        f"KV budget {ns.kv_tokens} tokens, loaded in {loaded:.2f} s"
    )
    if ns.spec_tokens:
        print(f"speculative decoding: {ns.spec_tokens} draft(s) per decoding row from "
              f"{backend.drafter.name if backend.drafter else '?'}, verified by the launch")


def _print_requests(plan: list[RequestPlan], out: Outcome, timeline: _Timeline) -> None:
    for p in plan:
        toks = out.tokens.get(p.req, [])
        status = out.statuses[p.req].name.lower()
        first = timeline.first.get(p.req)
        ttft = f"{first * 1000:7.1f}" if first is not None else "      -"
        end = f"{timeline.done.get(p.req, out.seconds) * 1000:7.1f}"
        print(
            f"  r{p.req}: prompt {list(p.prompt)} -> {toks} [{status}, {len(toks)} tokens, "
            f"first {ttft} ms, done {end} ms]"
        )
        if p.req in out.errors:  # failed by a device fault (spec rule 12)
            print(f"      error: {out.errors[p.req]}")
        lps = out.logprobs.get(p.req)
        if lps:
            mean = sum(lp.sampled for lp in lps) / len(lps)
            top = ", ".join(f"{i}: {v:.3f}" for i, v in lps[0].top)
            print(f"      logprobs: mean {mean:.3f} over {len(lps)} tokens; first token's top "
                  f"{len(lps[0].top)}: {top}")


def _print_totals(out: Outcome, k: int) -> None:
    stats = out.stats
    if k:
        rows = stats.get("drafted_rows", 0)
        counts = [stats.get(f"accepted_{n}", 0) for n in range(k + 1)]
        accepted = sum(n * v for n, v in enumerate(counts))
        print(f"drafts: {rows} rows verified, accepted "
              + ", ".join(f"{n}: {v}" for n, v in enumerate(counts))
              + f"; {accepted} of {rows * k} drafts accepted ({accepted / max(rows * k, 1):.0%})")
    print(
        f"{out.generated} tokens in {out.seconds:.2f} s ({out.generated / out.seconds:.1f} tok/s), "
        f"{stats.get('launches', 0)} steps, {stats.get('overlapped_launches', 0)} overlapped, "
        f"{stats['kv_preemptions']} preemptions, {stats['kv_resumes']} resumes, "
        f"aborted {stats['aborted_requests']}"
    )
