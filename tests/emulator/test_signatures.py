"""Every routed call binds against the installed ttnn's own signature."""

from __future__ import annotations

import pytest
import ttnn

from ttmirror.emulator import EmulatedMeshDevice
from ttmirror.emulator.signatures import introspect, parse_docstring_args

from .conftest import on_device


def test_from_device_rejects_cq_id_and_accepts_queue_id(device: EmulatedMeshDevice) -> None:
    tt = device.api
    t = on_device(device, [1, 2, 3])
    with pytest.raises(TypeError, match="unexpected keyword argument 'cq_id'"):
        tt.from_device(t, cq_id=0)
    assert tt.to_torch(tt.from_device(t, queue_id=0)).tolist() == [[1, 2, 3]]


def test_to_torch_has_no_blocking(device: EmulatedMeshDevice) -> None:
    tt = device.api
    t = on_device(device, [4])
    with pytest.raises(TypeError, match="unexpected keyword argument 'blocking'"):
        tt.to_torch(t, blocking=False)
    assert tt.to_torch(t).tolist() == [[4]]


def test_keyword_only_cq_of_trace_calls_cannot_be_positional(device: EmulatedMeshDevice) -> None:
    tt = device.api
    with pytest.raises(TypeError, match="positional"):
        tt.begin_trace_capture(device, 0)
    trace = tt.begin_trace_capture(device, cq_id=0)
    tt.end_trace_capture(device, trace, cq_id=0)


def test_tensor_methods_are_checked_too(device: EmulatedMeshDevice) -> None:
    tt = device.api
    t = on_device(device, [7])
    with pytest.raises(TypeError, match="unexpected keyword argument 'queue_id'"):
        t.cpu(blocking=True, queue_id=0)
    assert tt.to_torch(t.cpu(blocking=True, cq_id=0)).tolist() == [[7]]


def test_op_keywords_follow_the_binding_not_the_docstring(device: EmulatedMeshDevice) -> None:
    # The sampling docstring lists `seed` among Args; the binding makes it keyword-only.
    tt = device.api
    sig = introspect(ttnn.sampling, "ttnn.sampling")
    assert "seed" in sig.overloads[0].keyword_only
    with pytest.raises(TypeError, match="at most 5 positional"):
        sig.bind([1, 2, 3, 4, 5, 6], {})
    with pytest.raises(TypeError, match="unexpected keyword argument 'out'"):
        tt.argmax(on_device(device, [1, 2]), dim=-1, out=None)


def test_docstring_fallback_reads_args_sections() -> None:
    overload = parse_docstring_args(ttnn.from_device.function.__doc__ or ttnn.from_device.__doc__)
    assert overload is not None
    assert overload.positional == ("tensor", "blocking") and overload.keyword_only == ("queue_id",)


def test_golden_functions_still_reachable_through_routed_ops(device: EmulatedMeshDevice) -> None:
    assert ttnn.get_golden_function(ttnn.argmax) is not None
