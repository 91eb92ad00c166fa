"""Transformer Engine style modules under torch.compile(fullgraph=True)."""

from . import recipe

__all__ = ["recipe"]
