"""Emulated-device throughput for small tensors, against calling ttnn's goldens directly.

Both sides run the same op mix (plus_one, argmax into a preallocated output, copy) on the same
small shapes, interleaved in one run, so the overhead ratio compares like with like. The emulated
side goes through the real ttnn API (routed): signature check, the documented support table,
allocation, hazard bookkeeping, enqueue, completion; once with the kernels in the host's process
(the manual scheduler: a sync completes them) and once in a device process of their own
(`ProcessScheduler`: the host enqueues while the device process runs them). Then one steady
decode step of the tt mirror is counted, eager beside traced: its device commands and the
host's ttnn calls (`impl/calls.py`). The last line prints the ratios.

Usage: python benchmarks/bench_device.py [--ops N] [--rounds R]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import ttnn
from pinning import add_pin, split_cores

from ttmirror.conformance.rig import open_rig
from ttmirror.emulator import EmulatedMeshDevice, ProcessScheduler
from ttmirror.emulator.calls import step_calls

ROWS, VOCAB = 32, 64


def emulated_round(device: EmulatedMeshDevice, ops: int) -> tuple[float, int]:
    tt = device.api
    logits = tt.from_torch(
        torch.randn(1, 1, ROWS, VOCAB, dtype=torch.bfloat16),
        dtype=ttnn.bfloat16,
        layout=ttnn.TILE_LAYOUT,
        device=device,
    )
    tokens = tt.allocate_tensor_on_device(
        ttnn.Shape([1, 1, ROWS]), ttnn.uint32, ttnn.ROW_MAJOR_LAYOUT, device
    )
    positions = tt.from_torch(
        torch.zeros(1, ROWS, dtype=torch.int32), dtype=ttnn.int32, device=device
    )
    mirror = tt.allocate_tensor_on_device(
        ttnn.Shape([1, 1, ROWS]), ttnn.uint32, ttnn.ROW_MAJOR_LAYOUT, device
    )
    tt.synchronize_device(device)
    before = len(device.completion_log)
    start = time.perf_counter()
    for i in range(ops // 3):
        tt.argmax(logits, dim=-1, output_tensor=tokens)
        tt.plus_one(positions, skip_negative_entries=True)
        tt.copy(tokens, mirror)
        if i % 64 == 63:
            tt.synchronize_device(device)
    tt.synchronize_device(device)
    elapsed = time.perf_counter() - start
    return elapsed, len(device.completion_log) - before


def golden_round(ops: int) -> tuple[float, int]:
    argmax = ttnn.get_golden_function(ttnn.argmax)
    plus_one = ttnn.get_golden_function(ttnn.plus_one)
    copy = ttnn.get_golden_function(ttnn.copy)
    logits = torch.randn(1, 1, ROWS, VOCAB, dtype=torch.bfloat16)
    tokens = torch.zeros(1, 1, ROWS, dtype=torch.uint32)
    positions = torch.zeros(1, ROWS, dtype=torch.int32)
    mirror = torch.zeros(1, 1, ROWS, dtype=torch.uint32)
    start = time.perf_counter()
    for _ in range(ops // 3):
        tokens.copy_(argmax(logits, dim=-1).to(torch.uint32))
        plus_one(positions, skip_negative_entries=True)
        mirror.copy_(copy(tokens, mirror))
    return time.perf_counter() - start, 3 * (ops // 3)


def handshake_round(device: EmulatedMeshDevice, iterations: int) -> tuple[float, int]:
    """Commands/s of the canonical two-queue loop (events included), for context."""
    tt = device.api
    rows = 4
    inp, work, out = (
        tt.allocate_tensor_on_device(
            ttnn.Shape([1, rows]), ttnn.int32, ttnn.ROW_MAJOR_LAYOUT, device
        )
        for _ in range(3)
    )
    host = tt.from_torch(torch.ones(1, rows, dtype=torch.int32), dtype=ttnn.int32)
    tt.copy(inp, work)
    tt.copy(work, out)
    read_event = tt.record_event(device, 1)
    write_event = tt.record_event(device, 1)
    tt.synchronize_device(device)
    before = len(device.completion_log)
    start = time.perf_counter()
    pending = []
    for _ in range(iterations):
        tt.wait_for_event(0, write_event)
        tt.copy(inp, work)
        first_op = tt.record_event(device, 0)
        tt.wait_for_event(0, read_event)
        tt.copy(work, out)
        last_op = tt.record_event(device, 0)
        tt.wait_for_event(1, first_op)
        tt.copy_host_to_device_tensor(host, inp, cq_id=1)
        write_event = tt.record_event(device, 1)
        tt.wait_for_event(1, last_op)
        pending.append(out.cpu(blocking=False, cq_id=1))
        read_event = tt.record_event(device, 1)
        if len(pending) == 2:
            tt.event_synchronize(read_event)
            pending.clear()
    tt.synchronize_device(device)
    return time.perf_counter() - start, len(device.completion_log) - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=6000)
    parser.add_argument("--rounds", type=int, default=5)
    add_pin(parser, default=False, why="every side alike; default: off, here pinned runs "
                                       "measured no higher ratio and a lower host-process rate")
    args = parser.parse_args()
    cores = split_cores(parser, args.pin)
    device_cores = cores[1] if cores else None
    if cores:  # before the first device process starts: it stays off this core
        os.sched_setaffinity(0, cores[0])

    device = open_rig("default", hazard_mode="count", trace_region=0)
    # The same device with its queues in a device process of their own (ProcessScheduler).
    apart = open_rig("default", scheduler=lambda: ProcessScheduler(cpus=device_cores),
                     hazard_mode="count", trace_region=0)
    assert isinstance(device, EmulatedMeshDevice) and isinstance(apart, EmulatedMeshDevice)
    emulated_round(device, 300)  # warm: program cache, torch kernels
    emulated_round(apart, 300)
    golden_round(300)

    emulated_rates, golden_rates, apart_rates = [], [], []
    for _ in range(args.rounds):  # interleaved, so drift hits every side alike
        seconds, commands = emulated_round(device, args.ops)
        emulated_rates.append(commands / seconds)
        seconds, commands = emulated_round(apart, args.ops)
        apart_rates.append(commands / seconds)
        seconds, calls = golden_round(args.ops)
        golden_rates.append(calls / seconds)
    seconds, commands = handshake_round(device, args.ops // 11)
    handshake_rate = commands / seconds
    seconds, commands = handshake_round(apart, args.ops // 11)
    apart_handshake = commands / seconds
    for d in (device, apart):
        assert d.hazards.total == 0, d.hazards.counts
        d.api.close_mesh_device(d)

    emulated = statistics.median(emulated_rates)
    golden = statistics.median(golden_rates)
    if cores:
        print(f"host on core {sorted(cores[0])}, the device process on {sorted(cores[1])}")
    print(
        f"tensors: logits [1,1,{ROWS},{VOCAB}] bf16 TILE, tokens [1,1,{ROWS}] uint32, "
        f"positions [1,{ROWS}] int32"
    )
    print(
        f"emulated ops (argmax, plus_one, copy): {emulated:,.0f} commands/s "
        f"(median of {args.rounds})"
    )
    apart_rate = statistics.median(apart_rates)
    print(f"  the same in a device process:         {apart_rate:,.0f} commands/s")
    print(f"golden functions called directly:      {golden:,.0f} calls/s")
    print(f"two-queue handshake incl. events:      {handshake_rate:,.0f} commands/s")
    print(f"  the same in a device process:         {apart_handshake:,.0f} commands/s")
    print(f"target >= 20,000 commands/s: {'met' if emulated >= 20_000 else 'NOT met'}")
    eager, traced = step_calls(), step_calls(trace=True)
    for name, run in (("eager", eager), ("traced", traced)):
        print(
            f"one decode step of the mirror, {name:>6}: {run['device_commands_per_step']} device "
            f"commands ({len(eager['ops'])} ops, all documented: "
            f"{all(o['documented'] for o in eager['ops'])}), {run['host_calls_per_step']} host "
            f"calls, {run['hazards']} hazards"
        )
    print(
        f"ratios: emulated/golden time per op = {golden / emulated:.2f}x; "
        f"emulated commands/s = {emulated:,.0f}; handshake commands/s = {handshake_rate:,.0f}; "
        f"device process/host process commands/s = {apart_rate / emulated:.2f}x, handshake "
        f"{apart_handshake / handshake_rate:.2f}x; "
        f"host calls per step traced/eager = "
        f"{traced['host_calls_per_step'] / eager['host_calls_per_step']:.2f}x"
    )


if __name__ == "__main__":
    main()
