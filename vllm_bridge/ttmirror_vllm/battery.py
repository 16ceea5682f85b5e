"""One cell of the vLLM-driven battery: a workload served by vLLM's engine on the TT mirror.

    python -m ttmirror_vllm.battery CELLS.json OUT.json

CELLS.json is one cell or a list of them, served one after the other in this process (vLLM's
import is paid once); OUT.json holds one result per cell, in order. Each cell names its own
`trace` (where the worker writes the run's events).

CELL.json: `model_dir`, `async_scheduling`, the engine's sizes (`max_num_seqs`,
`max_num_batched_tokens`, `num_gpu_blocks`, `max_model_len`), `requests` (id, prompt ids,
max_tokens, and optional arrival (the engine step it is added before), abort_after (aborted
once it has that many tokens), temperature, seed, top_k, top_p, stop ids, penalties,
min_tokens, logprobs), `aborts` ({request id: after how many engine steps}) and
`sampler_seed` (the worker
loads the seeded sampler when set). OUT.json: each request's tokens and finish reason, the counts
of vLLM's decisions, and the worker's summary. vLLM's own `LLMEngine` schedules every step.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

ENGINE_STEPS = 10_000
"""A run that has not finished after this many engine steps is stuck: it fails."""


def _params(r: dict[str, Any]) -> Any:
    from vllm import SamplingParams

    return SamplingParams(
        max_tokens=r["max_tokens"], temperature=r.get("temperature", 0.0), seed=r.get("seed"),
        top_k=r.get("top_k", 0), top_p=r.get("top_p", 1.0),
        stop_token_ids=r.get("stop", []), presence_penalty=r.get("presence_penalty", 0.0),
        frequency_penalty=r.get("frequency_penalty", 0.0),
        repetition_penalty=r.get("repetition_penalty", 1.0),
        min_tokens=r.get("min_tokens", 0), logprobs=r.get("logprobs"), detokenize=False,
        ignore_eos=True)


def run(cell: dict[str, Any], summary_path: str) -> dict[str, Any]:
    _set_environment(cell, summary_path)
    from vllm.v1.engine.llm_engine import LLMEngine

    from . import check_version

    check_version()
    engine = LLMEngine.from_engine_args(_engine_args(cell))
    config = engine.vllm_config
    try:
        steps, tokens, finish, logprobs = _drive(engine, cell)
    finally:
        engine.engine_core.shutdown()
    return {
        "async_scheduling": config.scheduler_config.async_scheduling,
        "max_concurrent_batches": config.max_concurrent_batches,
        "engine_steps": steps, "tokens": tokens, "finish": finish, "logprobs": logprobs,
    }


def _set_environment(cell: dict[str, Any], summary_path: str) -> None:
    """What the platform plugin and the worker read: the cell's options, as variables."""
    os.environ["TTMIRROR_VLLM"] = "1"
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["TTMIRROR_SUMMARY"] = summary_path
    for key, env in (("sampler_seed", "TTMIRROR_SAMPLER_SEED"), ("trace", "TTMIRROR_TRACE"),
                     ("max_logprobs", "TTMIRROR_MAX_LOGPROBS"), ("state", "TTMIRROR_STATE")):
        if cell.get(key) is not None:
            os.environ[env] = str(cell[key])
        else:
            os.environ.pop(env, None)
    # The emulated device in the worker's process (completed as the host waits): these cells
    # check vLLM's decisions and the tokens, not overlap, and a device process per cell costs
    # more than the cell (`vllm serve` keeps the default, a device process).
    os.environ["TTMIRROR_DEVICE"] = cell.get("device", "host")
    # Without a sampler seed the worker loads the argmax path: greedy cells compare with the
    # model's own float32 argmax (the sampler draws from bfloat16 logits, as ttnn.sampling).
    if cell.get("sampler_seed") is None:
        os.environ["TTMIRROR_SAMPLER"] = "greedy"
    else:
        os.environ.pop("TTMIRROR_SAMPLER", None)


def _engine_args(cell: dict[str, Any]) -> Any:
    from vllm import EngineArgs

    return EngineArgs(
        model=cell["model_dir"], skip_tokenizer_init=True, dtype="float32",
        max_model_len=cell.get("max_model_len", 128), max_num_seqs=cell["max_num_seqs"],
        max_num_batched_tokens=cell["max_num_batched_tokens"],
        num_gpu_blocks_override=cell.get("num_gpu_blocks"),
        async_scheduling=cell["async_scheduling"], enforce_eager=True,
        # vLLM's default (on): a resumed request may re-enter with its prefix cached.
        enable_prefix_caching=cell.get("prefix_caching", True), disable_log_stats=True,
        # Drafts: vLLM is told of a draft model, the target's own directory; the worker drafts
        # on the device with that model's drafter (the probe's table, or its first layers).
        speculative_config=None if not cell.get("spec_tokens") else {
            "method": "draft_model", "model": cell["model_dir"],
            "num_speculative_tokens": cell["spec_tokens"]})


def _drive(engine: Any, cell: dict[str, Any]) -> tuple[int, dict[str, list[int]],
                                                      dict[str, str | None],
                                                      dict[str, list[list[list[float]]]]]:
    """Add the cell's requests as they arrive, step vLLM's engine until every one is done,
    aborting those the cell aborts; the steps taken, and each request's tokens, finish reason
    and logprobs."""
    from vllm.inputs import TokensPrompt

    tokens: dict[str, list[int]] = {}
    finish: dict[str, str | None] = {}
    logprobs: dict[str, list[list[list[float]]]] = {}
    aborts = dict(cell.get("aborts", {}))
    pending = sorted(cell["requests"], key=lambda r: r.get("arrival", 0))
    abort_after = {r["id"]: r["abort_after"] for r in pending if r.get("abort_after") is not None}
    steps = 0
    while pending or engine.has_unfinished_requests():
        if steps >= ENGINE_STEPS:
            raise RuntimeError(f"vLLM's engine did not finish in {ENGINE_STEPS} steps")
        while pending and pending[0].get("arrival", 0) <= steps:
            r = pending.pop(0)
            engine.add_request(r["id"], TokensPrompt(prompt_token_ids=r["prompt"]), _params(r))
        for out in engine.step():
            tokens[out.request_id] = list(out.outputs[0].token_ids)
            if out.outputs[0].logprobs is not None:
                logprobs[out.request_id] = [
                    sorted([t, lp.logprob, lp.rank] for t, lp in position.items())
                    for position in out.outputs[0].logprobs]
            if out.finished:
                finish[out.request_id] = out.outputs[0].finish_reason
        steps += 1
        for rid, after in list(aborts.items()):
            if steps >= after and rid not in finish:
                engine.abort_request([rid])
                aborts.pop(rid)
                finish[rid] = "abort"
        for rid, n in list(abort_after.items()):
            if len(tokens.get(rid, ())) >= n and rid not in finish:
                engine.abort_request([rid])  # with its next step likely in flight
                abort_after.pop(rid)
                finish[rid] = "abort"
    return steps, tokens, finish, logprobs


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m ttmirror_vllm.battery CELL.json OUT.json", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        given = json.load(f)
    cells = given if isinstance(given, list) else [given]
    summary = argv[1] + ".worker.json"
    results = []
    for i, cell in enumerate(cells):
        try:
            result = run(cell, summary)
        except Exception as e:  # one line for the caller; the exit code says it
            print(f"ttmirror_vllm.battery: cell {i}: {type(e).__name__}: {e}", file=sys.stderr)
            return 1
        with open(summary) as f:
            result["worker"] = json.load(f)
        results.append(result)
    with open(argv[1], "w") as f:
        json.dump(results if isinstance(given, list) else results[0], f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
