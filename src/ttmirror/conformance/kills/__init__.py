"""The kill matrix: the catalog of planted bugs, each planted as overrides, and the suite run
against every one (lockstep, serving, fault and allocator halves).
"""
