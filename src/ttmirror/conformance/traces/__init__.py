"""Traces: the ITF codec, and validation of a recorded run against the model (the model and the
events only: no runner, no device).
"""
