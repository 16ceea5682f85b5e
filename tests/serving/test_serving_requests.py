"""Requests the serving engine must refuse at submit, before anything is scheduled."""

from __future__ import annotations

import pytest

from ttmirror.impl.cpu_backend import CpuBackend
from ttmirror.impl.tt_backend import TtBackend
from ttmirror.serving.backend import ServingBackend
from ttmirror.serving.batching import InvalidRequest, ServingConfig, ServingEngine
from ttmirror.serving.models import ProbeDecoder


@pytest.fixture
def engine() -> ServingEngine:
    return ServingEngine(ServingBackend(CpuBackend(), ProbeDecoder()), ServingConfig(kv_tokens=20))


@pytest.mark.parametrize(
    ("prompt", "max_tokens", "message"),
    [
        ([3, 64], 4, "prompt id 64 at index 1 is outside the vocabulary [0, 64) of probe"),
        ([-1], 4, "prompt id -1 at index 0 is outside the vocabulary"),
        ([True], 4, "prompt id True at index 0"),
        ([2.0], 4, "prompt id 2.0 at index 0"),
        ([], 4, "the prompt is empty"),
        ([1], 0, "max_tokens must be a positive integer"),
        ([1, 2, 3], 19, "needs 21 KV tokens, the budget is 20"),
        ([1], 300, "exceeds the context of probe"),
    ],
)
def test_refused_before_anything_is_scheduled(
    engine: ServingEngine, prompt: list, max_tokens: int, message: str
) -> None:
    engine.submit(0, [1, 2], max_tokens=3)  # a good request, queued but not yet admitted
    with pytest.raises(InvalidRequest) as caught:
        engine.submit(1, prompt, max_tokens=max_tokens)
    assert message in str(caught.value)
    assert 1 not in engine.requests and engine.queued == [0]
    assert engine.runner.steps == 0 and not engine.runner.requests
    engine.run()
    assert len(engine.tokens(0)) == 3 and set(engine.runner.requests) == {0}


def test_duplicate_request_refused(engine: ServingEngine) -> None:
    engine.submit(0, [1], max_tokens=2)
    with pytest.raises(InvalidRequest, match="already submitted"):
        engine.submit(0, [2], max_tokens=2)


def test_the_decoder_refuses_a_chip_at_load_in_one_line() -> None:
    """No ttnn kernel computes a transformers model: on a chip the serving decoder refuses to load
    with one clear line, before any device work (the emulated device is the only one it runs on)."""

    class Chip:
        """Stands for a chip's MeshDevice: any device that is not the emulated one."""

        num_command_queues = 2

    backend = ServingBackend(TtBackend(Chip()), ProbeDecoder())
    with pytest.raises(NotImplementedError) as refused:
        ServingEngine(backend, ServingConfig())
    message = str(refused.value)
    assert len(message.splitlines()) == 1
    assert "runs as an emulated-device op" in message and "TT model stack" in message
