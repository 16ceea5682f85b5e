"""vLLM's schedulers, able to end one request that the mirror refused or failed.

vLLM ends a single request with an error of its own (`RequestStatus.FINISHED_ERROR`, its
`RequestError` reaching the client as an error response, or finish reason `error`) only from
the scheduler: an exception raised by an executor kills the engine core, and every request with
it. So the executor does not raise for one request: it marks the step's model runner output
with the requests the mirror refused or failed (`FAILED`, vLLM request id -> reason), and these
schedulers end them before they read the rest of that output. Everything else is vLLM's own
`Scheduler` and `AsyncScheduler`; the platform selects them (`MirrorPlatform`).
"""

from __future__ import annotations

from typing import Any

from vllm.outputs import RequestError
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
from vllm.v1.request import RequestStatus

FAILED = "ttmirror_failed"
"""The attribute of a `ModelRunnerOutput` naming the requests the mirror refused or failed."""
CODE = "ttmirror_refused"
"""The error code of such a request (vLLM answers it with HTTP 500 and the reason)."""


class _EndsRefused:
    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        failed: dict[str, str] = getattr(model_runner_output, FAILED, None) or {}
        ended: list[tuple[int, EngineCoreOutput]] = []
        if failed:
            # Ended first: the rest of the output then skips them as finished requests.
            for request in self.finish_requests(  # type: ignore[attr-defined]
                    set(failed), RequestStatus.FINISHED_ERROR):
                ended.append((request.client_index, EngineCoreOutput(
                    request_id=request.request_id, new_token_ids=[],
                    finish_reason=request.get_finished_reason(), events=request.take_events(),
                    trace_headers=request.trace_headers,
                    error=RequestError(code=CODE, message=failed[request.request_id]))))
        outputs: dict[int, EngineCoreOutputs] = super().update_from_output(  # type: ignore[misc]
            scheduler_output, model_runner_output)
        for client, out in ended:
            if client in outputs:
                outputs[client].outputs.append(out)
            else:
                outputs[client] = EngineCoreOutputs(outputs=[out])
        return outputs


class MirrorScheduler(_EndsRefused, Scheduler):
    """vLLM's `Scheduler` (async scheduling off)."""


class MirrorAsyncScheduler(_EndsRefused, AsyncScheduler):
    """vLLM's `AsyncScheduler` (async scheduling on)."""
