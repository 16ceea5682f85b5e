"""Model and implementation in lockstep: the harness, the abstraction function, the device data as
it comes, the state machine, replay.
"""
