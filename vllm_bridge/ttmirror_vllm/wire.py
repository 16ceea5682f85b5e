"""vLLM's scheduler output in plain values for the worker, and the worker's tokens back as vLLM's
model runner output. Request ids are vLLM's strings here and small integers in the worker."""

from __future__ import annotations

from typing import Any

from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.outputs import LogprobsLists, ModelRunnerOutput


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
        self.partial_chunks += plan["short_chunks"]
        self.rows_over_placeholders += sum(1 for req in plan["rows"] if req in in_flight)

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


def unsupported(params: Any) -> list[str]:
    """The sampling parameters of `params` (vLLM's) that the mirror does not serve, by their
    API names; [] for pooling parameters or a request it serves whole."""
    if not isinstance(params, SamplingParams):
        return []
    asked = {
        "min_p": params.min_p > 0.0,
        "logit_bias": bool(params.logit_bias),
        "allowed_token_ids": params.allowed_token_ids is not None,
        "bad_words": bool(params.bad_words) or bool(params._bad_words_token_ids),
        "structured_outputs": params.structured_outputs is not None,
        "prompt_logprobs": params.prompt_logprobs is not None,
        "prompt_logprob_token_ids": params.prompt_logprob_token_ids is not None,
        "logprob_token_ids": params.logprob_token_ids is not None,
        "watermarking": bool(params.watermarking),
        "thinking_token_budget": params.thinking_token_budget is not None,
        "repetition_detection": params.repetition_detection is not None,
    }
    return [name for name, yes in asked.items() if yes]


GREEDY_BELOW = 1e-5
"""A temperature below this is greedy (vLLM's `_SAMPLING_EPS`)."""


def sampling(params: SamplingParams | None) -> dict[str, Any] | None:
    """The request's sampling as the worker's `SamplingParams` fields (greedy: no seed; sampled
    without a seed: seed None, drawn by the worker at arrival); None only without parameters.
    vLLM's top_k of 0 or -1 (the whole vocabulary) is sent as None: the worker takes its
    vocabulary."""
    if params is None:
        return None
    out: dict[str, Any] = {
        "presence_penalty": params.presence_penalty,
        "frequency_penalty": params.frequency_penalty,
        "repetition_penalty": params.repetition_penalty,
        "min_tokens": params.min_tokens,
        "logprobs": params.logprobs,
    }
    if params.temperature >= GREEDY_BELOW:
        out.update(seed=params.seed, top_p=params.top_p, temperature=params.temperature,
                   top_k=params.top_k if params.top_k is not None and params.top_k > 0 else None)
    return out


def plan(so: SchedulerOutput, ids: Ids, spec_tokens: int = 0) -> dict[str, Any]:
    """The step `so` describes, as `ttmirror.serving.scheduled.Plan`'s fields (with the
    parameters of each arrival the mirror does not serve, for the worker to refuse it)."""
    new, computed = [], {}
    for n in so.scheduled_new_reqs:
        req = ids.new(n.req_id)
        params = n.sampling_params
        assert params is not None and n.prompt_token_ids is not None
        refuse = unsupported(params)
        if spec_tokens and params.logprobs is not None:
            refuse.append("logprobs with speculative decoding")
        new.append({"req": req, "prompt": list(n.prompt_token_ids),
                    "max_tokens": params.max_tokens,
                    "stop_ids": sorted(params.all_stop_token_ids),
                    "sampling": sampling(params), "unsupported": refuse})
        computed[req] = n.num_computed_tokens
    cached = so.scheduled_cached_reqs
    short = 0  # prefill chunks that stop short of the context: new and resumed requests
    for n in so.scheduled_new_reqs:
        short += so.num_scheduled_tokens[n.req_id] < len(n.prompt_token_ids or ())
    for i, rid in enumerate(cached.req_ids):
        computed[ids.of[rid]] = cached.num_computed_tokens[i]
        if rid in cached.resumed_req_ids and rid in cached.all_token_ids:
            left = len(cached.all_token_ids[rid]) - cached.num_computed_tokens[i]
            short += so.num_scheduled_tokens[rid] < left
    return {
        "rows": [ids.of[rid] for rid in so.num_scheduled_tokens],
        "tokens": {str(ids.of[rid]): n for rid, n in so.num_scheduled_tokens.items()},
        "computed": {str(k): v for k, v in computed.items()},
        "new": new,
        "resumed": sorted(ids.of[rid] for rid in cached.resumed_req_ids),
        "preempted": sorted(ids.of[rid] for rid in (so.preempted_req_ids or ())),
        "finished": sorted(ids.of[rid] for rid in so.finished_req_ids if rid in ids.of),
        # Draft ids per request: the real ones at depth 1 (ours, through take_draft_token_ids),
        # placeholders (-1) under async scheduling, where they live on the device.
        "spec": {str(ids.of[rid]): list(d) for rid, d in so.scheduled_spec_decode_tokens.items()},
        "short_chunks": short,
    }


def output(so: SchedulerOutput, collected: dict[str, Any], ids: Ids) -> ModelRunnerOutput:
    """The worker's tokens of the step `so` as vLLM's model runner output: every scheduled
    request in the step's order, with no token where the worker delivered none (a partial
    prefill chunk, a row dropped by an abort), and the logprobs of those that asked: one row
    per request, the sampled id first, then the top ones. A sampled id outside the top n has
    rank n + 1 here (the ring holds the top n, not the whole vocabulary's order)."""
    req_ids = list(so.num_scheduled_tokens)
    tokens = collected["tokens"]
    logprobs = collected.get("logprobs") or {}
    lists = None
    if logprobs:
        import numpy as np

        width = 1 + max(len(rows[0][1]) for rows in logprobs.values() if rows)
        ids_a = np.zeros((len(req_ids), width), dtype=np.int64)
        lps = np.full((len(req_ids), width), float("-inf"), dtype=np.float32)
        ranks = np.ones(len(req_ids), dtype=np.int64)
        for i, rid in enumerate(req_ids):
            key = str(ids.of[rid])
            rows, got = logprobs.get(key), tokens.get(key, [])
            if not rows or not got:
                continue
            sampled, top = rows[-1]
            ids_a[i, 0], lps[i, 0] = got[-1], sampled
            for j, (token, value) in enumerate(top):
                ids_a[i, 1 + j], lps[i, 1 + j] = token, value
            ranks[i] = next((j + 1 for j, (token, _) in enumerate(top) if token == got[-1]),
                            len(top) + 1)
        lists = LogprobsLists(ids_a, lps, ranks)
    return ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
        sampled_token_ids=[list(tokens.get(str(ids.of[rid]), [])) for rid in req_ids],
        logprobs=lists,
    )
