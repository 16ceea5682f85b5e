"""The Tenstorrent implementation of device-mirrored sampled ids, on the real ttnn package."""
