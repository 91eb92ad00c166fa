"""``Keep``: what a module keeps of an op call across calls (TE's weight workspace).

A module hands one to the generated ``call_<op>(..., keep=keep)``. Naming the saved values'
indices up front is what lets a compiled call hand exactly those values out of its
graph (``custom_ops.kept_values``) and the module write them to its state in the traced
frame; eagerly they are the forward's saved values themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple


class Keep(NamedTuple):
    """``saved``: the indices of the forward's saved values to keep; ``into``: receives
    those values, in ``saved``'s order (what else it needs of the call, the module binds
    when it makes the ``Keep``: a compiled call builds no bundle to hand it)."""

    saved: tuple[int, ...]
    into: Callable[[tuple[Any, ...]], None]
