"""vLLM's scheduler output in plain values for the worker, and the worker's tokens back as vLLM's
model runner output. Request ids are vLLM's strings here and small integers in the worker."""

from __future__ import annotations

from typing import Any

from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
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
    that stopped short of the prompt, preemptions, resumes, closes, rows scheduled while the
    request's previous step was still in flight (each one a placeholder in vLLM's books, filled
    on the device by the mirror), (re)entries whose prefix vLLM's cache held, rows launched
    with vLLM's grammar bitmask (`masked_rows`), and its freedoms of spec rule 14: running
    requests left out of a step while a step of theirs was in flight (`skipped_in_flight`),
    decoding rows with fewer than its K drafts (`fewer_drafts`), and steps holding a decoding
    row with none beside one with all K (`none_beside_all`)."""

    def __init__(self, k: int = 0) -> None:
        self.k = k
        self.steps = self.arrivals = self.partial_chunks = self.preemptions = 0
        self.resumes = self.finished = self.rows_over_placeholders = self.max_rows = 0
        self.prefix_hits = self.masked_rows = 0
        self.skipped_in_flight = self.fewer_drafts = self.none_beside_all = 0
        self._running: set[int] = set()
        self._prompt: dict[int, int] = {}

    def count(self, plan: dict[str, Any], in_flight: set[int]) -> None:
        self.steps += bool(plan["rows"])  # a plan of closes only is no step
        self.arrivals += len(plan["new"])
        self.preemptions += len(plan["preempted"])
        self.resumes += len(plan["resumed"])
        self.finished += len(plan["finished"])
        self.max_rows = max(self.max_rows, len(plan["rows"]))
        self.partial_chunks += plan["short_chunks"]
        self.rows_over_placeholders += sum(1 for req in plan["rows"] if req in in_flight)
        # (Re)entries with tokens already computed: vLLM's prefix cache had their first blocks.
        entering = [n["req"] for n in plan["new"]] + plan["resumed"]
        self.prefix_hits += sum(1 for req in entering if plan["computed"].get(str(req), 0) > 0)
        # Running requests: scheduled before, not closed or preempted since.
        self._running -= {*plan["finished"], *plan["preempted"]}
        rows = set(plan["rows"])
        self.skipped_in_flight += len((self._running & in_flight) - rows)
        self._prompt.update({n["req"]: len(n["prompt"]) for n in plan["new"]})
        if self.k:
            # Decoding rows: running, not (re)entering, past their prompt.
            drafts = [len(plan["spec"].get(str(req), ())) for req in plan["rows"]
                      if req in self._running and req not in entering
                      and plan["computed"][str(req)] >= self._prompt[req]]
            self.fewer_drafts += sum(d < self.k for d in drafts)
            self.none_beside_all += 0 in drafts and self.k in drafts
        self._running |= rows

    def as_dict(self) -> dict[str, int]:
        return {k: v for k, v in vars(self).items() if not k.startswith("_") and k != "k"}


def unsupported(params: Any) -> list[str]:
    """The sampling parameters of `params` (vLLM's) that the mirror does not serve, by their
    API names; [] for pooling parameters or a request it serves whole."""
    if not isinstance(params, SamplingParams):
        return []
    asked = {
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
        # vLLM's biases, allowed ids and bad words (as ids, from its tokenizer): the device's.
        "logit_bias": sorted((int(t), float(b)) for t, b in (params.logit_bias or {}).items()),
        "allowed_ids": (None if params.allowed_token_ids is None
                        else sorted(params.allowed_token_ids)),
        "bad_words": [list(w) for w in params.bad_words_token_ids or ()],
        "min_p": params.min_p,
    }
    if params.temperature >= GREEDY_BELOW:
        out.update(seed=params.seed, top_p=params.top_p, temperature=params.temperature,
                   top_k=params.top_k if params.top_k is not None and params.top_k > 0 else None)
    return out


def plan(so: SchedulerOutput, ids: Ids) -> dict[str, Any]:
    """The step `so` describes, as `ttmirror.serving.scheduled.Plan`'s fields (with the
    parameters of each arrival the mirror does not serve, for the worker to refuse it)."""
    new, computed = [], {}
    for n in so.scheduled_new_reqs:
        req = ids.new(n.req_id)
        params = n.sampling_params
        assert params is not None and n.prompt_token_ids is not None
        new.append({"req": req, "prompt": list(n.prompt_token_ids),
                    "max_tokens": params.max_tokens,
                    "stop_ids": sorted(params.all_stop_token_ids),
                    "sampling": sampling(params), "unsupported": unsupported(params),
                    # Structured output: vLLM builds each step's mask from the tokens it knows,
                    # so the request needs its newest token on the host (host-sync).
                    "host_sync": params.structured_outputs is not None})
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
    prefill chunk, a row dropped by an abort), and logprobs laid out as vLLM slices them: one
    row per delivered token, request after request (with drafts a row may deliver several;
    `cu_num_generated_tokens` holds where each request's rows start), the sampled id first,
    then the top ones. A request that asked for none has rows of no use to anyone (vLLM reads
    only the rows of requests that asked). A sampled id outside the top n has rank n + 1 here
    (the ring holds the top n, not the whole vocabulary's order)."""
    req_ids = list(so.num_scheduled_tokens)
    tokens = collected["tokens"]
    got = [list(tokens.get(str(ids.of[rid]), [])) for rid in req_ids]
    logprobs = collected.get("logprobs") or {}
    lists = None
    if logprobs:
        import numpy as np

        width = 1 + max((len(entries[0][1]) for entries in logprobs.values() if entries),
                        default=0)
        rows = sum(len(g) for g in got)
        ids_a = np.zeros((rows, width), dtype=np.int64)
        lps = np.full((rows, width), float("-inf"), dtype=np.float32)
        ranks = np.ones(rows, dtype=np.int64)
        starts, row = [], 0
        for rid, delivered in zip(req_ids, got, strict=True):
            starts.append(row)
            entries = logprobs.get(str(ids.of[rid])) or []
            if entries and len(entries) != len(delivered):
                raise RuntimeError(f"request {rid}: {len(entries)} logprob entries for "
                                   f"{len(delivered)} tokens")
            for at, (token, (sampled, top)) in enumerate(zip(delivered, entries, strict=False),
                                                         start=row):
                ids_a[at, 0], lps[at, 0] = token, sampled
                for j, (candidate, value) in enumerate(top):
                    ids_a[at, 1 + j], lps[at, 1 + j] = candidate, value
                ranks[at] = next((j + 1 for j, (candidate, _) in enumerate(top)
                                  if candidate == token), len(top) + 1)
            row += len(delivered)
        lists = LogprobsLists(ids_a, lps, ranks, starts)
    return ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
        sampled_token_ids=got,
        logprobs=lists,
    )


def masks(grammar: GrammarOutput | None, ids: Ids, so: SchedulerOutput, stride: int,
          vocab: int) -> dict[str, list[list[int]]]:
    """vLLM's grammar bitmask as the ids each structured-output row may draw, per query token:
    request i of `grammar` owns rows i * stride (its next token) to i * stride + d (the token
    after each of its d scheduled drafts), a bit per id, 32 to a word."""
    if grammar is None:
        return {}
    import numpy as np

    words = np.ascontiguousarray(grammar.grammar_bitmask).view(np.uint32)
    bits = np.unpackbits(words.view(np.uint8), axis=1, bitorder="little")[:, :vocab]
    out = {}
    for i, rid in enumerate(grammar.structured_output_request_ids):
        lanes = 1 + len(so.scheduled_spec_decode_tokens.get(rid, ()))
        out[str(ids.of[rid])] = [np.flatnonzero(bits[i * stride + j]).tolist()
                                 for j in range(lanes)]
    return out
