"""vLLM's scheduler output in plain values for the worker, and the worker's tokens back as vLLM's
model runner output. Request ids are vLLM's strings here and small integers in the worker."""

from __future__ import annotations

from typing import Any

from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.outputs import ModelRunnerOutput


class Ids:
    """vLLM's request ids <-> the worker's integers, in order of arrival."""

    def __init__(self) -> None:
        self.of: dict[str, int] = {}
        self.name: dict[int, str] = {}

    def new(self, rid: str) -> int:
        if rid in self.of:
            raise RuntimeError(f"request {rid!r} arrives twice")
        self.of[rid] = n = len(self.of)
        self.name[n] = rid
        return n


class Decisions:
    """What vLLM's scheduler decided, counted from its outputs: steps, arrivals, prefill chunks
    that stopped short of the prompt, preemptions, resumes, closes, and rows scheduled while the
    request's previous step was still in flight (each one a placeholder in vLLM's books, filled
    on the device by the mirror)."""

    def __init__(self) -> None:
        self.steps = self.arrivals = self.partial_chunks = self.preemptions = 0
        self.resumes = self.finished = self.rows_over_placeholders = self.max_rows = 0

    def count(self, plan: dict[str, Any], in_flight: set[int]) -> None:
        self.steps += bool(plan["rows"])  # a plan of closes only is no step
        self.arrivals += len(plan["new"])
        self.preemptions += len(plan["preempted"])
        self.resumes += len(plan["resumed"])
        self.finished += len(plan["finished"])
        self.max_rows = max(self.max_rows, len(plan["rows"]))
        self.partial_chunks += sum(
            1 for n in plan["new"] if plan["tokens"][str(n["req"])] < len(n["prompt"]))
        self.rows_over_placeholders += sum(1 for req in plan["rows"] if req in in_flight)

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


def sampling(params: SamplingParams | None) -> dict[str, Any] | None:
    """The request's sampling as the worker's `SamplingParams` fields; None: greedy, the
    engine's own."""
    if params is None or params.temperature == 0.0:
        if params is not None and params.logprobs is not None:
            return {"logprobs": params.logprobs}
        return None
    out: dict[str, Any] = {
        "seed": params.seed if params.seed is not None else 0,
        "top_p": params.top_p, "temperature": params.temperature,
        "presence_penalty": params.presence_penalty,
        "frequency_penalty": params.frequency_penalty,
        "repetition_penalty": params.repetition_penalty,
        "min_tokens": params.min_tokens,
        "logprobs": params.logprobs,
    }
    if params.top_k is not None and params.top_k > 0:
        out["top_k"] = params.top_k
    return out


def plan(so: SchedulerOutput, ids: Ids) -> dict[str, Any]:
    """The step `so` describes, as `ttmirror.serving.scheduled.Plan`'s fields."""
    new, computed = [], {}
    for n in so.scheduled_new_reqs:
        req = ids.new(n.req_id)
        params = n.sampling_params
        assert params is not None and n.prompt_token_ids is not None
        new.append({"req": req, "prompt": list(n.prompt_token_ids),
                    "max_tokens": params.max_tokens,
                    "stop_ids": sorted(params.all_stop_token_ids),
                    "sampling": sampling(params)})
        computed[req] = n.num_computed_tokens
    cached = so.scheduled_cached_reqs
    for i, rid in enumerate(cached.req_ids):
        computed[ids.of[rid]] = cached.num_computed_tokens[i]
    return {
        "rows": [ids.of[rid] for rid in so.num_scheduled_tokens],
        "tokens": {str(ids.of[rid]): n for rid, n in so.num_scheduled_tokens.items()},
        "computed": {str(k): v for k, v in computed.items()},
        "new": new,
        "resumed": sorted(ids.of[rid] for rid in cached.resumed_req_ids),
        "preempted": sorted(ids.of[rid] for rid in (so.preempted_req_ids or ())),
        "finished": sorted(ids.of[rid] for rid in so.finished_req_ids if rid in ids.of),
    }


def output(so: SchedulerOutput, collected: dict[str, Any], ids: Ids) -> ModelRunnerOutput:
    """The worker's tokens of the step `so` as vLLM's model runner output: every scheduled
    request in the step's order, with no token where the worker delivered none (a partial
    prefill chunk, a row dropped by an abort)."""
    req_ids = list(so.num_scheduled_tokens)
    tokens = collected["tokens"]
    return ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
        sampled_token_ids=[list(tokens.get(str(ids.of[rid]), [])) for rid in req_ids],
    )
