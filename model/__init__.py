"""The formal model of device-mirrored sampled token ids (pure Python: no torch, no ttnn, no I/O)."""
