"""The emulated device refuses what a chip refuses: each op's documented dtypes, layouts and shapes.

The table (`emulator/support.py`) is read back against the installed docstrings (`audit.py`);
every op the mirror path uses is called once outside its documented rows (the chip's TT_FATAL)
and once inside them (the golden result); the check holds inside a trace capture too. TILE
tensors keep their padded shape, and layout conversions are device commands.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch
import ttnn

from ttmirror.emulator import DeviceTensor, EmulatedMeshDevice, HazardError, ops, support
from ttmirror.emulator.audit import audit
from ttmirror.emulator.checker import OpNotSupported
from ttmirror.emulator.docstrings import Supported, allow, doc_tables
from ttmirror.impl.devices import bind_sampling_identity

TILE, RM = ttnn.TILE_LAYOUT, ttnn.ROW_MAJOR_LAYOUT


def _dev(device: EmulatedMeshDevice, data: torch.Tensor, dtype: ttnn.DataType,
         layout: ttnn.Layout = RM) -> ttnn.Tensor:
    tt = device.api
    return tt.from_torch(data, dtype=dtype, layout=layout, device=device)


def _ids(device: EmulatedMeshDevice, values: list[int], layout: ttnn.Layout,
         dtype: ttnn.DataType = ttnn.uint32) -> ttnn.Tensor:
    return _dev(device, torch.tensor([[[values]]], dtype=torch.int32), dtype, layout)


def _host(t: ttnn.Tensor) -> list[Any]:
    """A tensor's values as torch: a device tensor's through its device's API."""
    tt = t.device().api if isinstance(t, DeviceTensor) else ttnn
    return tt.to_torch(t).reshape(-1).tolist()  # type: ignore[no-any-return]


# --- the table against the installed documentation ------------------------------------------------


def test_the_table_agrees_with_the_installed_docstrings() -> None:
    assert audit() == []
    assert set(ops.OPS) <= set(support.TABLE)  # every op the emulated device runs has its rules
    documented = {op for op, s in support.TABLE.items() if s.documented}
    assert {"gather", "where", "add", "argmax", "typecast", "sampling", "fill"} <= documented
    from_tables = [r for s in support.TABLE.values() for r in s.rules if r.source.table]
    from_prose = [r for s in support.TABLE.values() for r in s.rules if r.source.quotes]
    assert len(from_tables) >= 9 and len(from_prose) >= 7


def _with_rule(op: str, index: int, **changes: Any) -> dict[str, support.OpSupport]:
    table = dict(support.TABLE)
    rules = list(table[op].rules)
    rules[index] = dataclasses.replace(rules[index], **changes)
    table[op] = dataclasses.replace(table[op], rules=tuple(rules))
    return table


@pytest.mark.parametrize(
    ("op", "index", "changes", "said"),
    [
        # a table row widened: ROW_MAJOR index for gather
        ("gather", 1, {"supported": (allow("UINT16, UINT32", "TILE, ROW_MAJOR"),)},
         "!= documented"),
        # a table row narrowed: where without BFLOAT4_B
        ("where", 0, {"supported": (allow("BFLOAT16, BFLOAT8_B, FLOAT32, INT32, UINT32", "TILE"),)},
         "!= documented"),
        # a prose row that names a dtype its sentence does not: argmax's output as INT32
        ("argmax", 4, {"supported": (allow("UINT32, INT32", "ROW_MAJOR"),)}, "row dtypes"),
        # a prose row that drops a layout its sentence names
        ("argmax", 1, {"supported": (allow("BFLOAT16/FLOAT32/INT32/UINT32/UINT16", "ROW_MAJOR"),
                                allow("BFLOAT16/FLOAT32", "ROW_MAJOR"))}, "row layouts"),
        # a caption the docstring does not have
        ("sampling", 0, {"source": support.Source(table="values")}, "no docstring table"),
        # a quote the docstring does not say
        ("plus_one", 0, {"source": support.Source(quotes=("Input must be UINT32.",))}, "quote"),
    ],
)
def test_a_changed_row_is_caught(op: str, index: int, changes: dict[str, Any], said: str) -> None:
    found = audit(_with_rule(op, index, **changes))
    assert found and all(f.startswith(op) for f in found) and said in " ".join(found)


def test_the_docstring_parser_reads_captions_and_strips_notes() -> None:
    tables = {t.caption: t.supported for t in doc_tables(ttnn.sampling.__doc__ or "")}
    assert tables["input_indices_tensor, k"] == (Supported(frozenset({"UINT32", "INT32"}),
                                                     frozenset({"ROW_MAJOR"})),)
    gather = {t.caption for t in doc_tables(ttnn.gather.__doc__ or "")}
    assert gather == {"Supported dtypes and layout for input tensor values:",
                      "Supported dtypes and layout for index tensor values:"}


# --- every op of the mirror path: refused outside its rows, golden inside ------------------------

def _gather(layout: ttnn.Layout) -> Callable[[EmulatedMeshDevice], list[Any]]:
    def call(d: EmulatedMeshDevice) -> list[Any]:
        tt = d.api
        table = _ids(d, [10, 11, 12, 13], TILE)
        return _host(tt.gather(table, 3, _ids(d, [3, 0, 2, 2], layout)))

    return call


def _where(layout: ttnn.Layout) -> Callable[[EmulatedMeshDevice], list[Any]]:
    def call(d: EmulatedMeshDevice) -> list[Any]:
        tt = d.api
        mask = _ids(d, [1, 0, 1, 0], layout)
        return _host(tt.where(mask, _ids(d, [5, 6, 7, 8], TILE), _ids(d, [1, 2, 3, 4], TILE)))

    return call


def _add(dtype: ttnn.DataType) -> Callable[[EmulatedMeshDevice], list[Any]]:
    def call(d: EmulatedMeshDevice) -> list[Any]:
        tt = d.api
        out = tt.allocate_tensor_on_device(ttnn.Shape([1, 1, 1, 4]), ttnn.uint32, TILE, d)
        tt.add(_ids(d, [1, 2, 3, 4], RM, dtype), _ids(d, [1, 1, 1, 1], RM), output_tensor=out)
        return _host(out)

    return call


def _argmax(out_dtype: ttnn.DataType) -> Callable[[EmulatedMeshDevice], list[Any]]:
    def call(d: EmulatedMeshDevice) -> list[Any]:
        tt = d.api
        logits = _dev(d, torch.tensor([[[[0.0, 9.0], [3.0, 1.0], [1.0, 0.0]]]]), ttnn.float32, TILE)
        out = tt.allocate_tensor_on_device(ttnn.Shape([1, 1, 1, 2]), out_dtype, RM, d)
        tt.argmax(logits, dim=2, keepdim=True, output_tensor=out)
        return _host(out)

    return call


def _typecast(layout: ttnn.Layout) -> Callable[[EmulatedMeshDevice], list[Any]]:
    def call(d: EmulatedMeshDevice) -> list[Any]:
        tt = d.api
        x = _dev(d, torch.tensor([[1.5, -2.0]]), ttnn.float32, TILE)
        out = tt.allocate_tensor_on_device(ttnn.Shape([1, 2]), ttnn.bfloat16, layout, d)
        tt.typecast(x, ttnn.bfloat16, output_tensor=out)
        return _host(out)

    return call


def _sampling(values_layout: ttnn.Layout) -> Callable[[EmulatedMeshDevice], list[Any]]:
    def call(d: EmulatedMeshDevice) -> list[Any]:
        tt = d.api
        logits = torch.full((1, 1, 2, 32), -9.0)
        logits[0, 0, 0, 5] = logits[0, 0, 1, 17] = 9.0  # one certain token per row
        values = _dev(d, logits.to(torch.bfloat16), ttnn.bfloat16, values_layout)
        indices = _dev(d, torch.arange(32, dtype=torch.int32).repeat(2, 1).reshape(1, 1, 2, 32),
                       ttnn.int32)
        k = _dev(d, torch.full((2,), 1, dtype=torch.int32), ttnn.uint32)
        p, temp = (_dev(d, torch.ones(2, dtype=torch.bfloat16), ttnn.bfloat16) for _ in "pt")
        bind_sampling_identity(d, _dev(d, torch.tensor([0, 1], dtype=torch.int32), ttnn.uint32),
                               _dev(d, torch.tensor([0, 0], dtype=torch.int32), ttnn.uint32))
        return _host(tt.sampling(values, indices, k, p, temp, seed=3))

    return call


def _fill(dtype: ttnn.DataType) -> Callable[[EmulatedMeshDevice], list[Any]]:
    def call(d: EmulatedMeshDevice) -> list[Any]:
        tt = d.api
        x = tt.allocate_tensor_on_device(ttnn.Shape([1, 1, 1, 3]), dtype, TILE, d)
        tt.fill(x, 4, output_tensor=x)
        return _host(x)

    return call


CASES: dict[str, tuple[Callable[[EmulatedMeshDevice], Any], str, Callable[..., Any], list[Any]]] = {
    # op: (unsupported call, what the error names, supported call, golden result)
    "gather": (_gather(RM), "index is UINT32 ROW_MAJOR", _gather(TILE), [13, 10, 12, 12]),
    "where": (_where(RM), "predicate is UINT32 ROW_MAJOR", _where(TILE), [5, 2, 7, 4]),
    "add": (_add(ttnn.uint8), "input_tensor_a is UINT8 ROW_MAJOR", _add(ttnn.uint32),
            [2, 3, 4, 5]),
    "argmax": (_argmax(ttnn.int32), "output_tensor is INT32 ROW_MAJOR", _argmax(ttnn.uint32),
               [1, 0]),
    "typecast": (_typecast(RM), "output_tensor is [1, 2] ROW_MAJOR", _typecast(TILE),
                 [1.5, -2.0]),
    "sampling": (_sampling(RM), "input_values_tensor is BFLOAT16 ROW_MAJOR", _sampling(TILE),
                 [5, 17]),
    "fill": (_fill(ttnn.uint8), "input_tensor is UINT8 TILE", _fill(ttnn.uint32), [4, 4, 4]),
}


@pytest.mark.parametrize("op", sorted(CASES))
def test_outside_the_rows_the_chip_error_inside_the_golden(
    device: EmulatedMeshDevice, op: str
) -> None:
    bad, said, good, golden = CASES[op]
    with pytest.raises(OpNotSupported) as refused:
        bad(device)
    first = str(refused.value).splitlines()[0]
    assert first.startswith(f"TT_FATAL @ ttnn.{op} (emulated device): ") and said in first
    assert good(device) == golden


def test_refused_inside_a_trace_capture_at_the_call(device: EmulatedMeshDevice) -> None:
    tt = device.api
    table, good, bad = (_ids(device, [1, 0], layout) for layout in (TILE, TILE, RM))
    tt.gather(table, 3, good)  # compiled before capture, as every traced op must be
    trace = tt.begin_trace_capture(device, cq_id=0)
    tt.gather(table, 3, good)
    with pytest.raises(OpNotSupported, match="index is UINT32 ROW_MAJOR"):
        tt.gather(table, 3, bad)
    tt.end_trace_capture(device, trace, cq_id=0)
    assert device.hazards.total == 0
    tt.release_trace(device, trace)


def test_documented_shape_rules_are_enforced(device: EmulatedMeshDevice) -> None:
    tt = device.api
    with pytest.raises(OpNotSupported, match="input has rank 4, index has rank 2"):
        tt.gather(_ids(device, [1, 2], TILE), 3,
                    _dev(device, torch.tensor([[0, 1]], dtype=torch.int32), ttnn.uint32, TILE))
    values = _dev(device, torch.zeros(1, 1, 2, 96, dtype=torch.bfloat16), ttnn.bfloat16, TILE)
    indices = _dev(device, torch.zeros(1, 1, 2, 96, dtype=torch.int32), ttnn.int32)
    k = _dev(device, torch.ones(2, dtype=torch.int32), ttnn.uint32)
    p = _dev(device, torch.ones(2, dtype=torch.bfloat16), ttnn.bfloat16)
    with pytest.raises(OpNotSupported, match="96 is not a power-of-2 multiple of 32"):
        tt.sampling(values, indices, k, p, p, seed=0)
    with pytest.raises(OpNotSupported, match="input_a is"):
        tt.copy(_ids(device, [1, 2], RM), _ids(device, [1, 2, 3], RM))


def test_an_output_tensor_of_another_shape_is_refused(device: EmulatedMeshDevice) -> None:
    tt = device.api
    logits = _dev(device, torch.zeros(1, 1, 3, 2), ttnn.float32)
    out = tt.allocate_tensor_on_device(ttnn.Shape([1, 2]), ttnn.uint32, RM, device)
    with pytest.raises(RuntimeError, match=r"output_tensor has shape \[1, 2\], the op produces"):
        tt.argmax(logits, dim=2, keepdim=True, output_tensor=out)


def test_host_copies_keep_the_layout(device: EmulatedMeshDevice) -> None:
    tt = device.api
    tiles = tt.allocate_tensor_on_device(ttnn.Shape([1, 4]), ttnn.uint32, TILE, device)
    host = tt.from_torch(torch.zeros(1, 4, dtype=torch.int32), dtype=ttnn.uint32)
    with pytest.raises(RuntimeError, match="same layout"):
        tt.copy_host_to_device_tensor(host, tiles)


# --- TILE layout ---------------------------------------------------------------------------------


def test_tile_tensors_hold_their_padded_shape(device: EmulatedMeshDevice) -> None:
    row_major = _ids(device, [1, 2, 3], RM)
    tiles = _ids(device, [1, 2, 3], TILE)
    assert list(tiles.shape) == [1, 1, 1, 3] and list(tiles.padded_shape) == [1, 1, 32, 32]
    assert tiles.buffer.size >= 32 * 32 * 4 > row_major.buffer.size
    assert _host(tiles) == [1, 2, 3]  # the host sees the logical elements


def test_to_layout_is_one_command_and_pads_with_its_value(device: EmulatedMeshDevice) -> None:
    tt = device.api
    x = _dev(device, torch.tensor([[1.0, 2.0, 3.0]]), ttnn.bfloat16)
    tt.synchronize_device(device)
    before = len(device.completion_log)
    tiles = tt.to_layout(x, TILE, pad_value=7.0)
    tt.synchronize_device(device)
    assert [c.split("#")[0] for c in device.completion_log[before:]] == ["to_layout"]
    stored = tiles.stored
    assert stored.shape == (32, 32) and float(stored[0, 3]) == 7.0 and float(stored[1, 0]) == 7.0
    back = tt.untilize(tt.tilize(x))
    assert back.layout == RM and _host(back) == [1.0, 2.0, 3.0]
    with pytest.raises(OpNotSupported, match=r"tilize \(emulated device\): input_tensor is UINT32"):
        tt.tilize(_ids(device, [1], RM))


def test_a_conversion_into_a_persistent_tensor_replays_in_a_trace(
    device: EmulatedMeshDevice,
) -> None:
    tt = device.api
    rows = _ids(device, [4, 5], RM)
    tiles = tt.allocate_tensor_on_device(ttnn.Shape([1, 1, 1, 2]), ttnn.uint32, TILE, device)
    tt.add(rows, 0, output_tensor=tiles)  # compile
    trace = tt.begin_trace_capture(device, cq_id=0)
    tt.add(rows, 0, output_tensor=tiles)
    tt.end_trace_capture(device, trace, cq_id=0)
    tt.copy_host_to_device_tensor(
        tt.from_torch(torch.tensor([[[[9, 8]]]], dtype=torch.int32), dtype=ttnn.uint32), rows
    )
    tt.execute_trace(device, trace, cq_id=0, blocking=True)
    assert _host(tiles) == [9, 8] and device.hazards.total == 0
    tt.release_trace(device, trace)


def test_an_index_out_of_range_gathers_garbage_not_a_crash(device: EmulatedMeshDevice) -> None:
    # "The value produced at any output position whose index falls outside that range is
    # unspecified": the emulated device yields garbage there, as a chip may.
    tt = device.api
    table = _ids(device, [10, 11], TILE)
    got = _host(tt.gather(table, 3, _ids(device, [1, 5], TILE)))
    assert got[0] == 11 and got[1] not in (10, 11)


def test_a_conversion_that_allocates_after_capture_is_unsafe_at_replay(
    device: EmulatedMeshDevice,
) -> None:
    # to_layout has no output_tensor: every call allocates. After a capture, that allocation is
    # alive at the next replay, which may write over it (TT_METAL_TRACE_ALLOC_TRACKING's check).
    tt = device.api
    rows = _ids(device, [4, 5], RM)
    tiles = tt.allocate_tensor_on_device(ttnn.Shape([1, 1, 1, 2]), ttnn.uint32, TILE, device)
    tt.add(rows, 0, output_tensor=tiles)
    trace = tt.begin_trace_capture(device, cq_id=0)
    tt.add(rows, 0, output_tensor=tiles)
    tt.end_trace_capture(device, trace, cq_id=0)
    converted = tt.to_layout(rows, TILE)
    with pytest.raises(HazardError, match="allocated after trace"):
        tt.execute_trace(device, trace, cq_id=0, blocking=True)
    assert converted.is_allocated()
    tt.release_trace(device, trace)


def test_a_recording_holds_its_own_devices_calls_only() -> None:
    """What `ttmirror info` lists is recorded on the device (no process-wide recorder): calls on
    another device, during the same block, stay out of it."""
    from ttmirror.emulator import checker

    from .conftest import open_emulated

    mine, other = open_emulated(), open_emulated()
    try:
        a, b = _ids(mine, [1, 2], RM), _ids(other, [1, 2], RM)
        with checker.recording(mine) as calls:
            other.api.add(b, b, output_tensor=_ids(other, [0, 0], RM))
            mine.api.add(a, a, output_tensor=_ids(mine, [0, 0], RM))
            other.api.add(b, 1, output_tensor=_ids(other, [0, 0], RM))
        assert [c.op for c in calls] == ["add"] and calls[0].documented
        assert mine.checked_calls is None and other.checked_calls is None
    finally:
        mine.api.close_mesh_device(mine)
        other.api.close_mesh_device(other)
