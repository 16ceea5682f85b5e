"""The soak: the serving loop fuzzed, and run long with device faults, checked on data.
"""
