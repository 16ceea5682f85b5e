"""The Tenstorrent implementation of device-mirrored sampled ids, on the real ttnn package.

This package is the mirror alone, the safety-critical path that would run unchanged on a chip:
the backend capability and its resolution, the runner's phases, the ring, the combine, traces,
and the tt and cpu backends. It gets its device from one seam (`devices.py`): a chip through
ttnn, or a provider plugged in from outside (the emulated device, `ttmirror.emulator`, which
nothing here imports). The serving engine that uses the mirror lives in `ttmirror.serving`,
which nothing here imports either.
"""
