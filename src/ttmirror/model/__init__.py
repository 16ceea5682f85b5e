"""The formal model of device-mirrored sampled ids: pure Python, no torch, ttnn or I/O."""
