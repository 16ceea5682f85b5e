"""`ttmirror serve-vllm`: a workload served by vLLM's own engine and scheduler on the mirror."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from ttmirror.cli.arguments import AddParser, UsageError, writable


def register(add_parser: AddParser) -> None:
    from ttmirror.serving.catalog import TINY_ARCHS

    s = add_parser(
        "serve-vllm",
        help="serve a workload with vLLM's engine and scheduler on the TT mirror",
        description="vLLM 0.33 (its own environment, .venv-vllm: make setup-vllm) schedules a "
        "workload; each of its steps runs on the TT mirror (the emulated device off hardware) in "
        "a worker of this environment. Prints each request's tokens and finish reason, what "
        "vLLM decided (preemptions, prefill chunks, rows over placeholders) and validates the "
        "run's events against the model.",
    )
    s.add_argument("--model", choices=["probe", *TINY_ARCHS], default="tiny-qwen3",
                   help="model (default %(default)s), written to a local model directory for "
                   "vLLM")
    s.add_argument("--async-scheduling", choices=("on", "off"), default="on",
                   help="vLLM's async_scheduling (default %(default)s)")
    s.add_argument("--requests", type=int, default=8, help="requests (default %(default)s)")
    s.add_argument("--kv-blocks", type=int, default=4,
                   help="vLLM's KV cache in blocks of 16 tokens (default %(default)s: it preempts)")
    s.add_argument("--step-tokens", type=int, default=6,
                   help="vLLM's max_num_batched_tokens (default %(default)s: it chunks prefills)")
    s.add_argument("--rows", type=int, default=4,
                   help="vLLM's max_num_seqs (default %(default)s)")
    s.add_argument("--trace", default=None,
                   help="also keep the run's events here (an ITF trace for `ttmirror validate`)")
    s.set_defaults(func=cmd_serve_vllm)


def cmd_serve_vllm(ns: argparse.Namespace) -> int:
    if ns.requests < 1 or ns.kv_blocks < 2 or ns.rows < 1 or ns.step_tokens < ns.rows:
        raise UsageError("--requests and --rows must be >= 1, --kv-blocks >= 2, --step-tokens "
                         ">= --rows")
    if ns.trace is not None:
        writable(ns.trace)
    from ttmirror.vllm_client import (
        Cell,
        VllmRunFailed,
        VllmUnavailable,
        requests_of,
        serve,
        vllm_python,
    )

    try:
        vllm_python()
    except VllmUnavailable as e:
        raise UsageError(str(e)) from None
    from ttmirror.conformance.traces.itf import read_events
    from ttmirror.conformance.traces.validate import bounds_of, validate
    from ttmirror.serving.models import load_model_dir, write_model_dir
    from ttmirror.serving.workload import standard_plan

    with tempfile.TemporaryDirectory(prefix="ttmirror-vllm-") as tmp:
        work = Path(tmp)
        model_dir = str(work / "model")
        write_model_dir(ns.model, model_dir)
        model = load_model_dir(model_dir)
        plan = standard_plan(model.vocab, ns.requests, scale=2)
        trace = Path(ns.trace) if ns.trace else work / "events.itf.json"
        longest = max(len(p.prompt) + p.max_tokens for p in plan)
        cell = Cell(model_dir=model_dir, async_scheduling=ns.async_scheduling == "on",
                    requests=requests_of(plan), max_num_seqs=ns.rows,
                    max_num_batched_tokens=ns.step_tokens, num_gpu_blocks=ns.kv_blocks,
                    max_model_len=min(16 * (ns.kv_blocks - 1), model.max_context),
                    trace=str(trace))
        if cell.max_model_len < longest:
            raise UsageError(f"--kv-blocks {ns.kv_blocks} hold {cell.max_model_len} tokens; a "
                             f"request of the workload needs {longest}: raise --kv-blocks")
        print(f"vLLM serving {ns.requests} requests of {model.name} on the TT mirror "
              f"(async_scheduling={ns.async_scheduling})...", flush=True)
        try:
            (result,) = serve([cell], work)
        except VllmRunFailed as e:
            print(f"ttmirror: error: {e}", file=sys.stderr)
            return 1
        for p in plan:
            rid = str(p.req)
            print(f"request {rid}: {result['finish'].get(rid)}, tokens "
                  f"{result['tokens'].get(rid, [])}")
        decided = result["worker"]["vllm"]
        stats = result["worker"]["stats"]
        print(f"vLLM: max_concurrent_batches={result['max_concurrent_batches']}, "
              f"{decided['steps']} steps, {decided['preemptions']} preemptions, "
              f"{decided['resumes']} resumes, {decided['partial_chunks']} partial prefill "
              f"chunks, {decided['rows_over_placeholders']} rows scheduled over placeholders")
        print(f"mirror: {stats.get('launches', 0)} launches, {stats.get('mirror_rows', 0)} rows "
              f"combined on the device, {stats.get('overlapped_launches', 0)} launched with a "
              "step in flight")
        events = list(read_events(trace))
        d = validate(events, bounds_of(events))
        if d is not None:
            print(f"ttmirror: the run left the model: {d.line()}", file=sys.stderr)
            return 1
        print(f"valid: {len(events)} events, every one a model transition"
              + (f" (trace {trace})" if ns.trace else ""))
    return 0
