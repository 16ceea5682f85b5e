"""Device ops of the emulated device. Numerics come from ttnn's own golden functions.

Each op is planned at call time (output allocated, addresses fixed) and its effect runs when its
command completes, reading and writing DRAM at those addresses. `sampling` is the exception to the
goldens: its golden is a stub, so it uses the seeded sampler in `sampling.py`. Goldens return
values; in-place and `output_tensor=` semantics are applied here, as the runtime notes require.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import ttnn

from .commands import Program
from .device import EmulatedMeshDevice
from .sampling import sample_rows
from .tensors import DeviceTensor, torch_dtype

Compute = Callable[[list[torch.Tensor]], torch.Tensor]
Bound = dict[str, Any]

# Captured at import: routing replaces the module attributes only while an emulated device is open.
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
    inputs: Sequence[DeviceTensor],
    compute: Compute,
    out_dtype: ttnn.DataType,
    out_layout: ttnn.Layout,
    output: DeviceTensor | None,
    key: tuple[object, ...],
    device: EmulatedMeshDevice | None = None,
) -> DeviceTensor:
    device = device or _device_of(inputs if inputs else [output])  # type: ignore[list-item]
    cache_key = (name, tuple(t.spec_key for t in inputs), key, out_dtype.value, out_layout.value)
    shape = _output_shapes.get(cache_key)
    if shape is None:
        # The output spec is what compiling the program decides; values do not matter.
        probe = [torch.zeros(t._shape, dtype=torch_dtype(t.dtype)) for t in inputs]
        shape = _output_shapes[cache_key] = tuple(compute(probe).shape)
    if output is None:
        output = device.allocate(shape, out_dtype, out_layout)
    elif output.dims != tuple(shape):
        raise RuntimeError(
            f"TT_FATAL @ ttnn.{name} (emulated device): output_tensor has shape "
            f"{list(output.shape)}, the op produces {list(shape)}"
        )
    # Addresses are fixed now (a trace replays them): the body works on views of those bytes.
    views = [t.data for t in inputs]
    destination = output.data

    def body() -> None:
        destination.copy_(compute(views).reshape(destination.shape))  # copy_ casts the dtype

    reads = tuple(t.buffer for t in inputs)
    device.launch(Program(name, reads, (output.buffer,), body, cache_key), cq)
    return output


def argmax(bound: Bound, cq: int) -> DeviceTensor:
    x = bound["input_tensor"]
    dim, keepdim = bound.get("dim"), bool(bound.get("keepdim", False))
    golden = GOLDEN["argmax"]
    return _launch(
        cq,
        "argmax",
        inputs=[x],
        compute=lambda v: golden(v[0], dim=dim, keepdim=keepdim),
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
            "ttmirror.impl.device.bind_sampling_identity(device, request_ids, positions) (a no-op "
            "on a chip)"
        )
    requests, positions = device.sampling_identity
    seed = int(bound.get("seed") or 0)
    output = bound.get("output_tensor")
    inputs = [
        values,
        bound["input_indices_tensor"],
        bound["k"],
        bound["p"],
        bound["temp"],
        requests,
        positions,
    ]

    def compute(v: list[torch.Tensor]) -> torch.Tensor:
        return sample_rows(v[0], v[1], v[2], v[3], v[4], seed=seed, requests=v[5], positions=v[6])

    return _launch(
        cq,
        "sampling",
        inputs=inputs,
        compute=compute,
        out_dtype=output.dtype if output is not None else ttnn.uint32,
        out_layout=ttnn.ROW_MAJOR_LAYOUT,
        output=output,
        key=(seed,),
    )


def gather(bound: Bound, cq: int) -> DeviceTensor:
    x, dim, index = bound["input"], int(bound["dim"]), bound["index"]
    golden = GOLDEN["gather"]

    def compute(v: list[torch.Tensor]) -> torch.Tensor:
        # "The value produced at any output position whose index falls outside that range is
        # unspecified": such positions get garbage, as on a chip, not an exception.
        size = v[0].shape[dim]
        wide = v[1].to(torch.int64) & 0xFFFFFFFF
        outside = wide >= size
        out = golden(v[0], dim, torch.where(outside, 0, wide))
        return torch.where(outside, torch.full_like(out, GARBAGE_ID), out)

    return _launch(
        cq,
        "gather",
        inputs=[x, index],
        compute=compute,
        out_dtype=x.dtype,
        out_layout=x.layout,
        output=bound.get("out"),
        key=(dim,),
    )


def where(bound: Bound, cq: int) -> DeviceTensor:
    operands = [bound["predicate"], bound["true_value"], bound["false_value"]]
    tensors = [o for o in operands if isinstance(o, DeviceTensor)]
    branches = [o for o in operands[1:] if isinstance(o, DeviceTensor)]
    golden = GOLDEN["where"]

    def compute(v: list[torch.Tensor]) -> torch.Tensor:
        it = iter(v)
        args = [next(it) if isinstance(o, DeviceTensor) else o for o in operands]
        return golden(*args)

    scalars = tuple(o for o in operands if not isinstance(o, DeviceTensor))
    return _launch(
        cq,
        "where",
        inputs=tensors,
        compute=compute,
        out_dtype=(branches or tensors)[0].dtype,
        out_layout=operands[0].layout,
        output=bound.get("output_tensor"),
        key=scalars,
    )


def embedding(bound: Bound, cq: int) -> DeviceTensor:
    ids, weight = bound["input_tensor"], bound["weight"]
    dtype = bound.get("dtype") or weight.dtype
    layout = bound.get("layout") or ttnn.ROW_MAJOR_LAYOUT
    golden = GOLDEN["embedding"]
    return _launch(
        cq,
        "embedding",
        inputs=[ids, weight],
        compute=lambda v: golden(v[0], v[1]),
        out_dtype=dtype,
        out_layout=layout,
        output=bound.get("output_tensor"),
        key=(),
    )


def typecast(bound: Bound, cq: int) -> DeviceTensor:
    x = bound["input_tensor"]
    out_dtype = bound.get("output_dtype") or bound["dtype"]
    golden = GOLDEN["typecast"]

    def compute(v: list[torch.Tensor]) -> torch.Tensor:
        return golden(
            v[0],
            dtype=out_dtype,
            _ttnn_input_dtype=x.dtype,
            _ttnn_is_host=False,
            _ttnn_arch_name=_ARCH,
        )

    return _launch(
        cq,
        "typecast",
        inputs=[x],
        compute=compute,
        out_dtype=out_dtype,
        out_layout=x.layout,
        output=bound.get("output_tensor"),
        key=(),
    )


def copy(bound: Bound, cq: int) -> DeviceTensor:
    source, target = bound["input_a"], bound["input_b"]
    like = _empty_like_dtype(target.dtype)
    golden = GOLDEN["copy"]
    return _launch(
        cq,
        "copy",
        inputs=[source],
        compute=lambda v: golden(v[0], like),
        out_dtype=target.dtype,
        out_layout=target.layout,
        output=target,
        key=(),
    )


def plus_one(bound: Bound, cq: int) -> DeviceTensor:
    x = bound["input_tensor"]
    skip = bool(bound.get("skip_negative_entries", False))
    golden = GOLDEN["plus_one"]
    view = x.data

    def body() -> None:
        golden(view, skip_negative_entries=skip)  # the golden works in place

    key = ("plus_one", (x.spec_key,), skip)
    x.device().launch(Program("plus_one", (x.buffer,), (x.buffer,), body, key), cq)
    return x


def fill(bound: Bound, cq: int) -> DeviceTensor:
    x, value = bound["input_tensor"], bound["fill_value"]
    shape, dtype = x._shape, torch_dtype(x.dtype)
    golden = GOLDEN["fill"]
    # fill reads only its input's spec, not its values: no read of the input buffer.
    return _launch(
        cq,
        "fill",
        inputs=[],
        compute=lambda v: golden(torch.empty(shape, dtype=dtype), value),
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
    golden = GOLDEN["add"]
    extra = {
        "_ttnn_input_tensor_a_dtype": getattr(a, "dtype", None),
        "_ttnn_input_tensor_b_dtype": getattr(b, "dtype", None),
        "_ttnn_output_tensor_dtype": getattr(output, "dtype", None),
    }

    def compute(v: list[torch.Tensor]) -> torch.Tensor:
        it = iter(v)
        args = [next(it) if isinstance(o, DeviceTensor) else o for o in (a, b)]
        return golden(*args, dtype=dtype, **extra)

    scalars = tuple(o for o in (a, b) if not isinstance(o, DeviceTensor))
    return _launch(
        cq,
        "add",
        inputs=tensors,
        compute=compute,
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
    golden = GOLDEN["slice"]
    return _launch(
        cq,
        "slice",
        inputs=[x],
        compute=lambda v: golden(v[0], start, end, step),
        out_dtype=x.dtype,
        out_layout=x.layout,
        output=bound.get("output_tensor"),
        key=(start, end, step),
    )


def concat(bound: Bound, cq: int) -> DeviceTensor:
    tensors = list(bound["tensors"])
    dim, groups = int(bound.get("dim", 0)), int(bound.get("groups", 1))
    golden = GOLDEN["concat"]
    return _launch(
        cq,
        "concat",
        inputs=tensors,
        compute=lambda v: golden(v, dim, groups),
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

    def compute(v: list[torch.Tensor]) -> torch.Tensor:
        # The mask is 1 for true and 0 for false, carried in the output dtype (no bool dtype).
        it = iter(v)
        x, y = (next(it) if isinstance(o, DeviceTensor) else o for o in (a, b))
        return torch.eq(x, y).to(torch.int32)

    scalars = tuple(o for o in (a, b) if not isinstance(o, DeviceTensor))
    return _launch(cq, "eq", inputs=tensors, compute=compute, out_dtype=dtype,
                   out_layout=tensors[0].layout, output=output, key=(scalars, dtype.value))


def matmul(bound: Bound, cq: int) -> DeviceTensor:
    a, b = bound["input_tensor_a"], bound["input_tensor_b"]
    ta, tb = bool(bound.get("transpose_a", False)), bool(bound.get("transpose_b", False))
    output = bound.get("optional_output_tensor")
    dtype = bound.get("dtype") or (output.dtype if output is not None else a.dtype)

    def compute(v: list[torch.Tensor]) -> torch.Tensor:
        x = v[0].transpose(-1, -2) if ta else v[0]
        y = v[1].transpose(-1, -2) if tb else v[1]
        return x.float() @ y.float()  # copy_ casts to the output dtype

    return _launch(cq, "matmul", inputs=[a, b], compute=compute, out_dtype=dtype,
                   out_layout=ttnn.TILE_LAYOUT, output=output, key=(ta, tb, dtype.value))


def _convert(
    cq: int, name: str, x: DeviceTensor, layout: ttnn.Layout, dtype: ttnn.DataType, pad: float
) -> DeviceTensor:
    """A layout conversion: one device command into a new tensor of the same logical shape. A TILE
    output's padding gets `pad`; its logical elements are the input's, cast to `dtype`."""
    device = x.device()
    output = device.allocate(tuple(x._shape), dtype, layout)
    source, stored, destination = x.data, output.stored, output.data

    def body() -> None:
        if output.tiled:
            stored.fill_(pad)
        destination.copy_(source)

    key = (name, (x.spec_key,), dtype.value, layout.value, pad)
    device.launch(Program(name, (x.buffer,), (output.buffer,), body, key), cq)
    return output


def to_layout(bound: Bound, cq: int) -> DeviceTensor:
    x = bound["tensor"]
    pad = float(bound.get("pad_value") or 0.0)
    return _convert(cq, "to_layout", x, bound["layout"], bound.get("dtype") or x.dtype, pad)


def tilize(bound: Bound, cq: int) -> DeviceTensor:
    x = bound["input_tensor"]
    return _convert(cq, "tilize", x, ttnn.TILE_LAYOUT, bound.get("dtype") or x.dtype, 0.0)


def untilize(bound: Bound, cq: int) -> DeviceTensor:
    x = bound["input_tensor"]
    return _convert(cq, "untilize", x, ttnn.ROW_MAJOR_LAYOUT, x.dtype, 0.0)


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
