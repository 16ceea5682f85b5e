"""Device ops of the emulated device. Numerics come from ttnn's own golden functions.

Each op is planned at call time (output allocated, addresses fixed) and enqueued as a `Kernel`
(data: a registered kernel's name, its operands' DRAM regions, its parameters), which runs when its
command completes, reading and writing DRAM at those addresses. `sampling` is the exception to the
goldens: its golden is a stub, so it uses the seeded sampler in `sampling.py`. Goldens return
values; in-place and `output_tensor=` semantics are applied here, as the runtime notes require.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import ttnn

from ..impl.sampling import sample_rows
from .commands import Kernel, KernelFn, Program, register_kernel
from .device import EmulatedMeshDevice
from .tensors import DeviceTensor, torch_dtype

Bound = dict[str, Any]

# ttnn's golden functions: the torch reference of each op, what the emulated device computes.
GOLDEN: dict[str, Callable[..., Any]] = {
    name: ttnn.get_golden_function(getattr(ttnn, name))
    for name in (
        "argmax",
        "gather",
        "where",
        "embedding",
        "typecast",
        "copy",
        "plus_one",
        "fill",
        "add",
        "slice",
        "concat",
        "eq",
        "matmul",
    )
}
GARBAGE_ID = 0x3CDCDCDC  # what a gather yields where its index is out of range ("unspecified")
_ARCH = "wormhole_b0"  # the typecast golden asks the chip for its arch; off chip we name one
_output_shapes: dict[object, tuple[int, ...]] = {}
_EMPTY: dict[int, torch.Tensor] = {}


def _empty_like_dtype(dtype: ttnn.DataType) -> torch.Tensor:
    """An empty tensor that tells a golden the output dtype (the copy golden casts to it)."""
    found = _EMPTY.get(dtype.value)
    if found is None:
        found = _EMPTY[dtype.value] = torch.empty(0, dtype=torch_dtype(dtype))
    return found


def _device_of(tensors: Sequence[DeviceTensor]) -> EmulatedMeshDevice:
    return tensors[0].device()


def _launch(
    cq: int,
    name: str,
    *,
    args: Sequence[Any],
    params: dict[str, Any],
    out_dtype: ttnn.DataType,
    out_layout: ttnn.Layout,
    output: DeviceTensor | None,
    key: tuple[object, ...],
    device: EmulatedMeshDevice | None = None,
) -> DeviceTensor:
    """Plan op `name` on `args` (device tensors and plain values): allocate its output, and
    enqueue its kernel, which computes `COMPUTE[name](args, **params)` when it completes."""
    inputs = [a for a in args if isinstance(a, DeviceTensor)]
    device = device or _device_of(inputs if inputs else [output])  # type: ignore[list-item]
    cache_key = (name, tuple(t.spec_key for t in inputs), key, out_dtype.value, out_layout.value)
    shape = _output_shapes.get(cache_key)
    if shape is None:
        # The output spec is what compiling the program decides; values do not matter.
        probe = [
            torch.zeros(a._shape, dtype=torch_dtype(a.dtype)) if isinstance(a, DeviceTensor) else a
            for a in args
        ]
        shape = _output_shapes[cache_key] = tuple(COMPUTE[name](probe, **params).shape)
    if output is None:
        output = device.allocate(shape, out_dtype, out_layout)
    elif output.dims != tuple(shape):
        raise RuntimeError(
            f"TT_FATAL @ ttnn.{name} (emulated device): output_tensor has shape "
            f"{list(output.shape)}, the op produces {list(shape)}"
        )
    # Addresses are fixed now (a trace replays them): the kernel holds them, not views.
    kernel = Kernel(
        name,
        tuple(a.operand if isinstance(a, DeviceTensor) else a for a in args),
        (output.operand,),
        params,
    )
    reads = tuple(t.buffer for t in inputs)
    device.launch(Program(name, reads, (output.buffer,), kernel, cache_key), cq)
    return output


# --- what each op computes: golden references, on the operands' values at completion ------------


def _argmax(v: list[Any], dim: int | None, keepdim: bool) -> torch.Tensor:
    return GOLDEN["argmax"](v[0], dim=dim, keepdim=keepdim)


def _sampling(v: list[Any], seed: int) -> torch.Tensor:
    return sample_rows(v[0], v[1], v[2], v[3], v[4], seed=seed, requests=v[5], positions=v[6])


def _gather(v: list[Any], dim: int) -> torch.Tensor:
    # "The value produced at any output position whose index falls outside that range is
    # unspecified": such positions get garbage, as on a chip, not an exception.
    size = v[0].shape[dim]
    wide = v[1].to(torch.int64) & 0xFFFFFFFF
    outside = wide >= size
    out = GOLDEN["gather"](v[0], dim, torch.where(outside, 0, wide))
    return torch.where(outside, torch.full_like(out, GARBAGE_ID), out)


def _where(v: list[Any]) -> torch.Tensor:
    return GOLDEN["where"](*v)


def _embedding(v: list[Any]) -> torch.Tensor:
    return GOLDEN["embedding"](v[0], v[1])


def _typecast(v: list[Any], dtype: ttnn.DataType, input_dtype: ttnn.DataType) -> torch.Tensor:
    return GOLDEN["typecast"](
        v[0], dtype=dtype, _ttnn_input_dtype=input_dtype, _ttnn_is_host=False,
        _ttnn_arch_name=_ARCH,
    )


def _copy(v: list[Any], dtype: ttnn.DataType) -> torch.Tensor:
    return GOLDEN["copy"](v[0], _empty_like_dtype(dtype))


def _fill(v: list[Any], shape: tuple[int, ...], dtype: torch.dtype, value: Any) -> torch.Tensor:
    return GOLDEN["fill"](torch.empty(shape, dtype=dtype), value)


def _add(v: list[Any], dtype: ttnn.DataType | None, extra: dict[str, Any]) -> torch.Tensor:
    return GOLDEN["add"](*v, dtype=dtype, **extra)


def _slice(v: list[Any], start: tuple[int, ...], end: tuple[int, ...],
           step: tuple[int, ...] | None) -> torch.Tensor:
    return GOLDEN["slice"](v[0], start, end, step)


def _concat(v: list[Any], dim: int, groups: int) -> torch.Tensor:
    return GOLDEN["concat"](v, dim, groups)


def _eq(v: list[Any]) -> torch.Tensor:
    # The mask is 1 for true and 0 for false, carried in the output dtype (no bool dtype).
    return torch.eq(v[0], v[1]).to(torch.int32)


def _matmul(v: list[Any], ta: bool, tb: bool) -> torch.Tensor:
    x = v[0].transpose(-1, -2) if ta else v[0]
    y = v[1].transpose(-1, -2) if tb else v[1]
    return x.float() @ y.float()  # copy_ casts to the output dtype


COMPUTE: dict[str, Callable[..., torch.Tensor]] = {
    "argmax": _argmax,
    "sampling": _sampling,
    "gather": _gather,
    "where": _where,
    "embedding": _embedding,
    "typecast": _typecast,
    "copy": _copy,
    "fill": _fill,
    "add": _add,
    "slice": _slice,
    "concat": _concat,
    "eq": _eq,
    "matmul": _matmul,
}


def _writes_result(compute: Callable[..., torch.Tensor]) -> KernelFn:
    def kernel(args: list[Any], outputs: list[torch.Tensor], params: Mapping[str, Any]) -> None:
        out = outputs[0]
        out.copy_(compute(args, **params).reshape(out.shape))  # copy_ casts the dtype

    return kernel


def _plus_one(args: list[Any], outputs: list[torch.Tensor], params: Mapping[str, Any]) -> None:
    GOLDEN["plus_one"](outputs[0], skip_negative_entries=params["skip"])  # in place


def _convert(args: list[Any], outputs: list[torch.Tensor], params: Mapping[str, Any]) -> None:
    """A layout conversion into an output given with its padding: the padding gets `pad`."""
    stored, source = outputs[0], args[0]
    if params["tiled"]:
        stored.fill_(params["pad"])
    stored[tuple(slice(0, d) for d in source.shape)].copy_(source)


for _name, _compute in COMPUTE.items():
    register_kernel(_name, _writes_result(_compute))
register_kernel("plus_one", _plus_one)
register_kernel("convert", _convert)


# --- the ops: each binds its arguments, plans its output and enqueues its kernel ------------------


def argmax(bound: Bound, cq: int) -> DeviceTensor:
    x = bound["input_tensor"]
    dim, keepdim = bound.get("dim"), bool(bound.get("keepdim", False))
    return _launch(
        cq,
        "argmax",
        args=[x],
        params={"dim": dim, "keepdim": keepdim},
        out_dtype=ttnn.uint32,
        out_layout=ttnn.ROW_MAJOR_LAYOUT,
        output=bound.get("output_tensor"),
        key=(dim, keepdim),
    )


def sampling(bound: Bound, cq: int) -> DeviceTensor:
    values = bound["input_values_tensor"]
    device = values.device()
    if device.sampling_identity is None:
        raise RuntimeError(
            "emulated ttnn.sampling needs each row's (request, position): bind them with "
            "ttmirror.impl.devices.bind_sampling_identity(device, request_ids, positions) (a no-op "
            "on a chip)"
        )
    requests, positions = device.sampling_identity
    seed = int(bound.get("seed") or 0)
    output = bound.get("output_tensor")
    args = [
        values,
        bound["input_indices_tensor"],
        bound["k"],
        bound["p"],
        bound["temp"],
        requests,
        positions,
    ]
    return _launch(
        cq,
        "sampling",
        args=args,
        params={"seed": seed},
        out_dtype=output.dtype if output is not None else ttnn.uint32,
        out_layout=ttnn.ROW_MAJOR_LAYOUT,
        output=output,
        key=(seed,),
    )


def gather(bound: Bound, cq: int) -> DeviceTensor:
    x, dim, index = bound["input"], int(bound["dim"]), bound["index"]
    return _launch(
        cq,
        "gather",
        args=[x, index],
        params={"dim": dim},
        out_dtype=x.dtype,
        out_layout=x.layout,
        output=bound.get("out"),
        key=(dim,),
    )


def where(bound: Bound, cq: int) -> DeviceTensor:
    operands = [bound["predicate"], bound["true_value"], bound["false_value"]]
    tensors = [o for o in operands if isinstance(o, DeviceTensor)]
    branches = [o for o in operands[1:] if isinstance(o, DeviceTensor)]
    scalars = tuple(o for o in operands if not isinstance(o, DeviceTensor))
    return _launch(
        cq,
        "where",
        args=operands,
        params={},
        out_dtype=(branches or tensors)[0].dtype,
        out_layout=operands[0].layout,
        output=bound.get("output_tensor"),
        key=scalars,
    )


def embedding(bound: Bound, cq: int) -> DeviceTensor:
    ids, weight = bound["input_tensor"], bound["weight"]
    dtype = bound.get("dtype") or weight.dtype
    layout = bound.get("layout") or ttnn.ROW_MAJOR_LAYOUT
    return _launch(
        cq,
        "embedding",
        args=[ids, weight],
        params={},
        out_dtype=dtype,
        out_layout=layout,
        output=bound.get("output_tensor"),
        key=(),
    )


def typecast(bound: Bound, cq: int) -> DeviceTensor:
    x = bound["input_tensor"]
    out_dtype = bound.get("output_dtype") or bound["dtype"]
    return _launch(
        cq,
        "typecast",
        args=[x],
        params={"dtype": out_dtype, "input_dtype": x.dtype},
        out_dtype=out_dtype,
        out_layout=x.layout,
        output=bound.get("output_tensor"),
        key=(),
    )


def copy(bound: Bound, cq: int) -> DeviceTensor:
    source, target = bound["input_a"], bound["input_b"]
    return _launch(
        cq,
        "copy",
        args=[source],
        params={"dtype": target.dtype},
        out_dtype=target.dtype,
        out_layout=target.layout,
        output=target,
        key=(),
    )


def plus_one(bound: Bound, cq: int) -> DeviceTensor:
    x = bound["input_tensor"]
    skip = bool(bound.get("skip_negative_entries", False))
    kernel = Kernel("plus_one", (x.operand,), (x.operand,), {"skip": skip})
    key = ("plus_one", (x.spec_key,), skip)
    x.device().launch(Program("plus_one", (x.buffer,), (x.buffer,), kernel, key), cq)
    return x


def fill(bound: Bound, cq: int) -> DeviceTensor:
    x, value = bound["input_tensor"], bound["fill_value"]
    shape, dtype = x._shape, torch_dtype(x.dtype)
    # fill reads only its input's spec, not its values: no read of the input buffer.
    return _launch(
        cq,
        "fill",
        args=[],
        params={"shape": shape, "dtype": dtype, "value": value},
        out_dtype=x.dtype,
        out_layout=x.layout,
        output=bound.get("output_tensor"),
        key=(shape, value),
        device=x.device(),
    )


def add(bound: Bound, cq: int) -> DeviceTensor:
    a, b = bound["input_tensor_a"], bound["input_tensor_b"]
    tensors = [o for o in (a, b) if isinstance(o, DeviceTensor)]
    output = bound.get("output_tensor")
    dtype = bound.get("dtype")
    extra = {
        "_ttnn_input_tensor_a_dtype": getattr(a, "dtype", None),
        "_ttnn_input_tensor_b_dtype": getattr(b, "dtype", None),
        "_ttnn_output_tensor_dtype": getattr(output, "dtype", None),
    }
    scalars = tuple(o for o in (a, b) if not isinstance(o, DeviceTensor))
    return _launch(
        cq,
        "add",
        args=[a, b],
        params={"dtype": dtype, "extra": extra},
        out_dtype=dtype or tensors[0].dtype,
        out_layout=tensors[0].layout,
        output=output,
        key=(scalars, dtype),
    )


def slice_(bound: Bound, cq: int) -> DeviceTensor:
    x = bound["input_tensor"]
    # The overloads name the bounds slice_start/slice_end or starts/ends.
    start = tuple(bound["slice_start"] if "slice_start" in bound else bound["starts"])
    end = tuple(bound["slice_end"] if "slice_end" in bound else bound["ends"])
    step_arg = bound.get("slice_step", bound.get("steps"))
    step = tuple(step_arg) if step_arg is not None else None
    return _launch(
        cq,
        "slice",
        args=[x],
        params={"start": start, "end": end, "step": step},
        out_dtype=x.dtype,
        out_layout=x.layout,
        output=bound.get("output_tensor"),
        key=(start, end, step),
    )


def concat(bound: Bound, cq: int) -> DeviceTensor:
    tensors = list(bound["tensors"])
    dim, groups = int(bound.get("dim", 0)), int(bound.get("groups", 1))
    return _launch(
        cq,
        "concat",
        args=tensors,
        params={"dim": dim, "groups": groups},
        out_dtype=tensors[0].dtype,
        out_layout=tensors[0].layout,
        output=bound.get("output_tensor"),
        key=(dim, groups),
    )


def eq(bound: Bound, cq: int) -> DeviceTensor:
    a, b = bound["input_tensor_a"], bound["input_tensor_b"]
    tensors = [o for o in (a, b) if isinstance(o, DeviceTensor)]
    output = bound.get("output_tensor")
    dtype = bound.get("dtype") or (output.dtype if output is not None else tensors[0].dtype)
    scalars = tuple(o for o in (a, b) if not isinstance(o, DeviceTensor))
    return _launch(cq, "eq", args=[a, b], params={}, out_dtype=dtype,
                   out_layout=tensors[0].layout, output=output, key=(scalars, dtype.value))


def matmul(bound: Bound, cq: int) -> DeviceTensor:
    a, b = bound["input_tensor_a"], bound["input_tensor_b"]
    ta, tb = bool(bound.get("transpose_a", False)), bool(bound.get("transpose_b", False))
    output = bound.get("optional_output_tensor")
    dtype = bound.get("dtype") or (output.dtype if output is not None else a.dtype)
    return _launch(cq, "matmul", args=[a, b], params={"ta": ta, "tb": tb}, out_dtype=dtype,
                   out_layout=ttnn.TILE_LAYOUT, output=output, key=(ta, tb, dtype.value))


def _layout_op(
    cq: int, name: str, x: DeviceTensor, layout: ttnn.Layout, dtype: ttnn.DataType, pad: float
) -> DeviceTensor:
    """A layout conversion: one device command into a new tensor of the same logical shape. A TILE
    output's padding gets `pad`; its logical elements are the input's, cast to `dtype`."""
    device = x.device()
    output = device.allocate(tuple(x._shape), dtype, layout)
    kernel = Kernel("convert", (x.operand,), (output.stored_operand,),
                    {"tiled": output.tiled, "pad": pad})
    key = (name, (x.spec_key,), dtype.value, layout.value, pad)
    device.launch(Program(name, (x.buffer,), (output.buffer,), kernel, key), cq)
    return output


def to_layout(bound: Bound, cq: int) -> DeviceTensor:
    x = bound["tensor"]
    pad = float(bound.get("pad_value") or 0.0)
    return _layout_op(cq, "to_layout", x, bound["layout"], bound.get("dtype") or x.dtype, pad)


def tilize(bound: Bound, cq: int) -> DeviceTensor:
    x = bound["input_tensor"]
    return _layout_op(cq, "tilize", x, ttnn.TILE_LAYOUT, bound.get("dtype") or x.dtype, 0.0)


def untilize(bound: Bound, cq: int) -> DeviceTensor:
    x = bound["input_tensor"]
    return _layout_op(cq, "untilize", x, ttnn.ROW_MAJOR_LAYOUT, x.dtype, 0.0)


OPS: dict[str, Callable[[Bound, int], DeviceTensor]] = {
    "argmax": argmax,
    "sampling": sampling,
    "gather": gather,
    "where": where,
    "embedding": embedding,
    "typecast": typecast,
    "copy": copy,
    "plus_one": plus_one,
    "fill": fill,
    "add": add,
    "slice": slice_,
    "concat": concat,
    "to_layout": to_layout,
    "tilize": tilize,
    "untilize": untilize,
    "eq": eq,
    "matmul": matmul,
}
