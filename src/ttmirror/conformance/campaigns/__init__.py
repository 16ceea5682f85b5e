"""Campaigns: `ttmirror fuzz` (the state machine, then walks from the initial state or from saved
states), their checkpoints, shards, worker processes and coverage.
"""
