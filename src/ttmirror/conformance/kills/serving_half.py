"""The serving half of the kill matrix: bugs of what only a serving decoder has (the logprob ring).

The lockstep drives the probe mirror, which computes no logprobs, so a bug of the logprob ring is
hunted here instead: a workload whose requests ask for logprobs is served on the emulated device
(hazards raised) at depth 2 and at depth 1, in one configuration of the mirror, and the data the
ring carried is checked: every token's logprobs against the model's own log-softmax over the
request's context (prompt and the tokens before it), recomputed on the host, and depth 2 against
depth 1, logprob for logprob. A hazard, a wrong logprob, a livelock (the engine's `NoProgress`)
and a crash are each a kill of its layer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import torch

from ttmirror.conformance.lockstep.planted import overrides
from ttmirror.conformance.rig import open_rig, serving_engine
from ttmirror.emulator import HazardError, SeededScheduler
from ttmirror.impl.devices import ttnn_for
from ttmirror.serving.batching import ServingConfig
from ttmirror.serving.context import SamplingParams
from ttmirror.serving.engine import NoProgress
from ttmirror.serving.grammar import GRAMMARS
from ttmirror.serving.models import DecoderModel, ProbeDecoder
from ttmirror.serving.workload import Outcome, RequestPlan, run_workload, standard_plan

CONFIGS = ("eager-2cq", "eager-1cq", "traced")
"""The mirror configurations the serving half runs in (as the lockstep's tt ones)."""
LOGPROBS = 3
SEED = 23
TOLERANCE = 1e-4
"""Float32 log-softmax of the same logits, on the device op and on the host."""


def logprob_plan(vocab: int) -> list[RequestPlan]:
    """The standard workload; odd requests sample with their own seed and every fourth one is
    greedy, both asking for logprobs."""
    out = []
    for p in standard_plan(vocab):
        if p.req % 2:
            p = replace(p, sampling=SamplingParams(seed=SEED + p.req, top_k=8, logprobs=LOGPROBS))
        elif p.req % 4 == 0:
            p = replace(p, sampling=SamplingParams(logprobs=LOGPROBS))
        out.append(p)
    return out


def logprob_errors(out: Outcome, plan: list[RequestPlan], model: DecoderModel,
                   greedy_engine: bool = False) -> list[str]:
    """What is wrong with the logprobs `out` delivered (empty: nothing). Each request that asked
    has one entry per token with the top n it asked for, most likely first, and each value is the
    model's log-softmax at that token over the request's context (a constrained request's logits
    masked to what its grammar allows there, as the decoder op masks them); on a greedy engine
    the token is its own top entry."""
    errors: list[str] = []
    asked = {p.req: p for p in plan if p.sampling is not None and p.sampling.logprobs is not None}
    if not asked:
        return ["no request asked for logprobs: the check would be vacuous"]
    if set(out.logprobs) != set(asked):
        errors.append(f"logprobs for requests {sorted(out.logprobs)}, asked by {sorted(asked)}")
    for req, p in asked.items():
        tokens, lps = out.tokens.get(req, []), out.logprobs.get(req, [])
        if len(lps) != len(tokens):
            errors.append(f"r{req}: {len(tokens)} tokens, {len(lps)} logprob entries")
            continue
        context = list(p.prompt)
        n = p.sampling.logprobs if p.sampling is not None else None
        for t, (token, lp) in enumerate(zip(tokens, lps, strict=True)):
            logits = model.logits(torch.tensor(context), t).float()
            if p.constraint is not None:
                allowed = sorted(GRAMMARS[p.constraint].allowed(tuple(context), model.vocab))
                logits = torch.full_like(logits, float("-inf")).index_copy(
                    0, torch.tensor(allowed), logits[allowed])
            want = torch.log_softmax(logits, dim=-1)
            where = f"r{req} token {t} ({token})"
            if len(lp.top) != n:
                errors.append(f"{where}: {len(lp.top)} top entries, asked {n}")
            values = [v for _, v in lp.top]
            if values != sorted(values, reverse=True):
                errors.append(f"{where}: the top entries are not most likely first")
            if abs(float(want[token]) - lp.sampled) > TOLERANCE:
                errors.append(f"{where}: logprob {lp.sampled:.6f}, the model gives "
                              f"{float(want[token]):.6f}")
            wrong = [(i, v) for i, v in lp.top if abs(float(want[i]) - v) > TOLERANCE]
            if wrong:
                errors.append(f"{where}: top entries {wrong} differ from the model's")
            if greedy_engine and lp.top and lp.top[0][0] != token:
                errors.append(f"{where}: argmax token, yet {lp.top[0][0]} is most likely")
            context.append(token)
    return errors


def serve(config: str, depth: int, plan: list[RequestPlan],
          model: DecoderModel | None = None, bug: str | None = None) -> Outcome:
    """Serve `plan` on a fresh emulated device in `config` at depth 2 ("auto") or 1 ("off"),
    with `bug` planted."""
    model = model or ProbeDecoder()
    device = open_rig("default", scheduler=lambda: SeededScheduler(SEED),
                      queues=1 if config == "eager-1cq" else 2)
    try:
        engine = serving_engine(device, model, ServingConfig(
            async_scheduling="auto" if depth == 2 else "off", rows=6, kv_tokens=24,
            trace=config == "traced", max_logprobs=LOGPROBS, overrides=overrides([bug])),
            SamplingParams(seed=SEED))
        try:
            return run_workload(engine, plan)
        finally:
            engine.close()
    finally:
        ttnn_for(device).close_mesh_device(device)


@dataclass
class Verdict:
    """One run of the serving half: which check failed first (None: every check held)."""

    layer: str | None
    message: str | None
    seconds: float


def check(config: str, bug: str | None = None) -> Verdict:
    """Serve the logprob workload at depth 2 and 1 in `config`, `bug` planted, and check what the
    ring carried."""
    started = time.perf_counter()
    model = ProbeDecoder()
    plan = logprob_plan(model.vocab)

    def verdict(layer: str | None, message: str | None) -> Verdict:
        return Verdict(layer, message, round(time.perf_counter() - started, 3))

    try:
        async_out = serve(config, 2, plan, model, bug)
        sync_out = serve(config, 1, plan, model, bug)
    except HazardError as e:
        return verdict("hazard", str(e).splitlines()[0][:300])
    except NoProgress as e:  # the engine's own livelock check, long before any cap
        return verdict("no progress", str(e)[:300])
    except Exception as e:  # the implementation raised: a kill, as in the lockstep
        return verdict("crash", f"{type(e).__name__}: {e}"[:300])
    errors = logprob_errors(async_out, plan, model)
    if async_out.logprobs != sync_out.logprobs or async_out.tokens != sync_out.tokens:
        errors.append("depth 2 and depth 1 delivered different tokens or logprobs")
    return verdict("device data" if errors else None, errors[0][:300] if errors else None)


def kill(bug: str, config: str) -> tuple[bool, Verdict]:
    """Serve with `bug` planted in `config`: (killed, what found it)."""
    v = check(config, bug)
    return v.layer is not None, v
