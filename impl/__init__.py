"""The Tenstorrent implementation of device-mirrored sampled ids, on the real ttnn package.

This package is the mirror alone, the safety-critical path: the backend capability and its
resolution, the runner's phases, the ring, the combine, traces, and the tt and cpu backends.
`device/` is the emulated device (reached only through `device.open_device()`); the serving
engine that uses the mirror lives in `ttmirror.serving`, which nothing here imports.
"""
