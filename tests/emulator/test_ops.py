"""Device ops: numerics from ttnn's goldens, in-place and output_tensor= semantics, sampling."""

from __future__ import annotations

import pytest
import torch
import ttnn

from ttmirror.emulator import DeviceTensor, EmulatedMeshDevice
from ttmirror.impl.devices import bind_sampling_identity
from ttmirror.impl.sampling import sampling_uniform, seeded_sample

from .conftest import on_device, values_of


def _dev(
    device: EmulatedMeshDevice,
    data: torch.Tensor,
    dtype: ttnn.DataType,
    layout: ttnn.Layout = ttnn.ROW_MAJOR_LAYOUT,
) -> ttnn.Tensor:
    tt = device.api
    return tt.from_torch(data, dtype=dtype, layout=layout, device=device)


def _host(t: ttnn.Tensor) -> torch.Tensor:
    """A tensor's values as torch: a device tensor's through its device's API."""
    tt = t.device().api if isinstance(t, DeviceTensor) else ttnn
    return tt.to_torch(t)


def test_argmax_into_a_preallocated_uint32_output(device: EmulatedMeshDevice) -> None:
    tt = device.api
    logits = _dev(
        device,
        torch.tensor([[[[0.1, 3.0, 2.0, -1.0], [5.0, 0.0, 0.0, 0.0]]]], dtype=torch.bfloat16),
        ttnn.bfloat16,
        ttnn.TILE_LAYOUT,
    )
    out = tt.allocate_tensor_on_device(
        ttnn.Shape([1, 1, 2]), ttnn.uint32, ttnn.ROW_MAJOR_LAYOUT, device
    )
    result = tt.argmax(logits, dim=-1, output_tensor=out)
    assert result is out and out.dtype == ttnn.uint32
    assert _host(out).reshape(-1).tolist() == [1, 0]


def test_gather_where_embedding_typecast(device: EmulatedMeshDevice) -> None:
    tt = device.api
    tile = ttnn.TILE_LAYOUT
    table = _dev(device, torch.tensor([[10, 11, 12, 13]], dtype=torch.int32), ttnn.uint32, tile)
    index = _dev(device, torch.tensor([[3, 0]], dtype=torch.int32), ttnn.uint32, tile)
    assert _host(tt.gather(table, -1, index)).tolist() == [[13, 10]]

    mask = _dev(device, torch.tensor([[1, 0]], dtype=torch.int32), ttnn.int32, tile)
    a = _dev(device, torch.tensor([[5, 6]], dtype=torch.int32), ttnn.int32, tile)
    b = _dev(device, torch.tensor([[-1, -2]], dtype=torch.int32), ttnn.int32, tile)
    assert _host(tt.where(mask, a, b)).tolist() == [[5, -2]]

    weight = _dev(device, torch.arange(12, dtype=torch.float32).reshape(4, 3), ttnn.float32)
    ids = _dev(device, torch.tensor([[2, 0]], dtype=torch.int32), ttnn.uint32)
    assert _host(tt.embedding(ids, weight)).tolist() == [[[6.0, 7.0, 8.0], [0.0, 1.0, 2.0]]]

    as_int = tt.typecast(index, ttnn.int32)
    assert as_int.dtype == ttnn.int32 and _host(as_int).tolist() == [[3, 0]]


def test_copy_writes_input_b_in_place(device: EmulatedMeshDevice) -> None:
    tt = device.api
    a, b = on_device(device, [4, 5]), on_device(device, [0, 0])
    assert tt.copy(a, b) is b
    assert values_of(tt.from_device(b)) == [4, 5]


def test_plus_one_in_place_keeps_negative_sentinels(device: EmulatedMeshDevice) -> None:
    tt = device.api
    pos = on_device(device, [0, -1, 2**31 - 1, 7], ttnn.int32)
    assert tt.plus_one(pos, skip_negative_entries=True) is pos
    assert values_of(tt.from_device(pos)) == [1, -1, 2**31 - 1, 8]
    tt.plus_one(pos)
    assert values_of(tt.from_device(pos))[:2] == [2, 0]


def test_fill_add_slice_concat(device: EmulatedMeshDevice) -> None:
    tt = device.api
    a = on_device(device, [1, 2, 3, 4], ttnn.int32)
    tt.fill(a, 9, output_tensor=a)
    assert values_of(tt.from_device(a)) == [9, 9, 9, 9]
    b = on_device(device, [1, 2, 3, 4], ttnn.int32)
    assert values_of(tt.from_device(tt.add(a, b))) == [10, 11, 12, 13]
    assert values_of(tt.from_device(tt.add(b, 5))) == [6, 7, 8, 9]
    assert _host(tt.slice(b, [0, 1], [1, 3])).tolist() == [[2, 3]]
    assert _host(tt.concat([b, a], dim=0)).tolist() == [[1, 2, 3, 4], [9, 9, 9, 9]]


def test_host_ops_still_go_to_real_ttnn(device: EmulatedMeshDevice) -> None:
    tt = device.api
    host = tt.from_torch(torch.tensor([[1.7, -2.2]]), dtype=ttnn.float32)
    assert isinstance(host, ttnn.Tensor) and host.storage_type() == ttnn.StorageType.HOST
    assert tt.to_torch(tt.typecast(host, ttnn.int32)).tolist() == [[1, -2]]


def test_tensor_to_device_and_deallocate_semantics(device: EmulatedMeshDevice) -> None:
    tt = device.api
    host = tt.from_torch(torch.tensor([[3, 4]], dtype=torch.int32), dtype=ttnn.uint32)
    with pytest.raises(TypeError):
        host.to(device)  # ttnn.Tensor's own method, untouched: it knows no emulated device
    t = tt.to_device(host, device)
    assert t.storage_type() == ttnn.StorageType.DEVICE and values_of(t.cpu()) == [3, 4]
    same = tt.to_device(host, device, queue_id=0)
    same.deallocate()  # the method's force defaults to False: a lone handle still frees
    assert not same.is_allocated()
    tt.deallocate(t)
    assert not t.is_allocated()


# --- sampling ------------------------------------------------------------------------------------


def _sampling_inputs(
    device: EmulatedMeshDevice, logits: torch.Tensor, k: int, p: float, temp: float
) -> list[ttnn.Tensor]:
    rows, width = logits.shape
    values = _dev(
        device,
        logits.reshape(1, 1, rows, width).to(torch.bfloat16),
        ttnn.bfloat16,
        ttnn.TILE_LAYOUT,
    )
    indices = _dev(
        device,
        torch.arange(width, dtype=torch.int32).repeat(rows, 1).reshape(1, 1, rows, width),
        ttnn.int32,
    )
    ks = _dev(device, torch.full((rows,), k, dtype=torch.int32), ttnn.uint32)
    ps = _dev(device, torch.full((rows,), p, dtype=torch.bfloat16), ttnn.bfloat16)
    temps = _dev(device, torch.full((rows,), temp, dtype=torch.bfloat16), ttnn.bfloat16)
    return [values, indices, ks, ps, temps]


def _sample(
    device: EmulatedMeshDevice,
    logits: torch.Tensor,
    requests: list[int],
    positions: list[int],
    seed: int = 1,
) -> list[int]:
    tt = device.api
    inputs = _sampling_inputs(device, logits, k=32, p=1.0, temp=1.0)
    req = _dev(device, torch.tensor(requests, dtype=torch.int32), ttnn.uint32)
    pos = _dev(device, torch.tensor(positions, dtype=torch.int32), ttnn.int32)
    bind_sampling_identity(device, req, pos)
    return _host(tt.sampling(*inputs, seed=seed)).reshape(-1).tolist()


def test_sampling_depends_on_request_and_position_not_row(device: EmulatedMeshDevice) -> None:
    torch.manual_seed(0)
    logits = torch.zeros(2, 32)  # flat: every token equally likely
    first = _sample(device, logits, requests=[7, 9], positions=[3, 4])
    swapped = _sample(device, logits, requests=[9, 7], positions=[4, 3])
    assert swapped == first[::-1]
    later = [
        _sample(device, logits, requests=[7, 9], positions=[3 + s, 4 + s])[0] for s in range(1, 6)
    ]
    assert len(set(later)) > 1  # the draw moves with the position


def test_sampling_without_identity_is_refused(device: EmulatedMeshDevice) -> None:
    tt = device.api
    inputs = _sampling_inputs(device, torch.zeros(1, 32), k=1, p=1.0, temp=1.0)
    with pytest.raises(RuntimeError, match="bind_sampling_identity"):
        tt.sampling(*inputs, seed=0)


def test_seeded_sample_follows_top_k_top_p_and_temperature() -> None:
    logits = torch.tensor([0.0, 5.0, 4.9, -3.0])
    idx = torch.tensor([10, 11, 12, 13])
    draws = {
        seeded_sample(logits, idx, 2, 1.0, 1.0, seed=1, request=r, position=0) for r in range(64)
    }
    assert draws == {11, 12}  # top-2 only, both reachable
    assert {
        seeded_sample(logits, idx, 4, 0.0, 1.0, seed=1, request=r, position=0) for r in range(16)
    } == {11}
    assert sampling_uniform(1, 2, 3) == sampling_uniform(1, 2, 3) != sampling_uniform(1, 2, 4)
