"""Conformance: drives the model and the implementation in lockstep (the only package importing both)."""
