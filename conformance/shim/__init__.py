"""Modules copied beside the rewritten TE tests (conformance/runner.py)."""
