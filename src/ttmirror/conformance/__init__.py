"""Conformance: model and implementation in lockstep (the only package importing both)."""
