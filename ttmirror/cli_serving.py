"""Subcommands for serve-demo (the async serving loop)."""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from .cli import UsageError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add `serve-demo` to the `ttmirror` parser."""
    from .impl.models_catalog import model_names  # no torch/ttnn import: cheap

    s = sub.add_parser(
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
    prompt = _parse_prompt(ns.prompt) if ns.prompt is not None else None
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from dataclasses import replace

    from .impl.backend import get_backend
    from .impl.models import CheckpointUnavailable, load_model
    from .impl.runner import CLOSED
    from .impl.serving import InvalidRequest, ServingConfig, ServingEngine
    from .impl.serving_backend import ServingBackend
    from .impl.serving_context import SamplingParams
    from .impl.serving_workload import run_workload, standard_plan

    started = time.perf_counter()
    try:
        model = load_model(ns.model, seed=ns.seed)
    except CheckpointUnavailable as e:
        raise UsageError(str(e)) from None
    plan = standard_plan(model.vocab, ns.requests)
    if ns.max_tokens is not None:
        plan = [replace(p, max_tokens=min(p.max_tokens, ns.max_tokens)) for p in plan]
    if prompt is not None:
        plan[0] = replace(plan[0], prompt=prompt)
    sampling = SamplingParams(seed=ns.seed) if ns.sampling == "seeded" else SamplingParams()
    if ns.backend == "tt":
        from .impl.backend import padded_rows
        from .impl.device import install
        from .impl.device.device import DEFAULT_DRAM_SIZE
        from .impl.serving_device import dram_bytes

        # Without a chip: an emulated device with room for the model's vocabulary.
        install(dram_size=DEFAULT_DRAM_SIZE + dram_bytes(model, padded_rows(8), 8))
    backend = ServingBackend(get_backend(ns.backend), model, sampling)
    try:
        engine = ServingEngine(
            backend, ServingConfig(async_scheduling=ns.async_scheduling, kv_tokens=ns.kv_tokens)
        )
    except ValueError as e:  # async "on" where the backend cannot
        raise UsageError(str(e)) from None
    except NotImplementedError as e:  # the decoder op exists on the emulated device only
        raise UsageError(str(e)) from None
    loaded = time.perf_counter() - started
    try:
        for p in plan:  # every request is checked before anything is scheduled
            engine.validate(p.req, p.prompt, p.max_tokens)
    except InvalidRequest as e:
        engine.close()
        backend.close()
        raise UsageError(str(e)) from None

    first: dict[int, float] = {}
    done: dict[int, float] = {}
    t0 = time.perf_counter()

    def watch(e: Any) -> None:
        now = time.perf_counter() - t0
        for req, r in e.runner.requests.items():
            if r.delivered and req not in first:
                first[req] = now
            if r.status in CLOSED and req not in done:
                done[req] = now

    out = run_workload(engine, plan, on_step=watch)
    stats = out.stats
    print(
        f"model {model.name} (vocab {model.vocab}) on backend {backend.name} "
        f"({backend.device_kind()}), sampling {sampling.describe()}"
    )
    print(
        f"async scheduling {ns.async_scheduling} -> "
        f"{'on' if engine.async_scheduling_enabled() else 'off'}, "
        f"max_concurrent_batches={engine.max_concurrent_batches()}, "
        f"KV budget {ns.kv_tokens} tokens, loaded in {loaded:.2f} s"
    )
    for p in plan:
        toks = out.tokens.get(p.req, [])
        status = out.statuses[p.req].name.lower()
        ttft = f"{first[p.req] * 1000:7.1f}" if p.req in first else "      -"
        end = f"{done.get(p.req, out.seconds) * 1000:7.1f}"
        print(
            f"  r{p.req}: prompt {list(p.prompt)} -> {toks} [{status}, {len(toks)} tokens, "
            f"first {ttft} ms, done {end} ms]"
        )
    print(
        f"{out.generated} tokens in {out.seconds:.2f} s ({out.generated / out.seconds:.1f} tok/s), "
        f"{stats.get('launches', 0)} steps, {stats.get('overlapped_launches', 0)} overlapped, "
        f"{stats['kv_preemptions']} preemptions, {stats['kv_resumes']} resumes, "
        f"aborted {stats['aborted_requests']}"
    )
    engine.close()
    backend.close()
    return 0
