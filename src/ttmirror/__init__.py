"""ttmirror: safe asynchronous (depth-2) scheduling on Tenstorrent devices, and its proof."""

__version__ = "0.1.0"
