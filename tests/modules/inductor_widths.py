"""Inductor's CPU code at every vector width the host offers, and scalar.

A claim that compiled equals eager bit for bit must not rest on Inductor summing in the
order ATen's kernels happen to sum on this host: an Inductor reduction (or transcendental
function, or fused rounding) that matches eager at one vector width differs at another.
ATen picks its kernels' width once per process, from the CPU; Inductor's width is a
setting (``cpp.simdlen``). Compiling at each width Inductor can generate here, and with
scalar code, makes Inductor's code differ from ATen's on every host, so a test that
passes at all of them holds by construction, not by the luck of the host's ISA.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch

SCALAR = 0  # ``cpp.simdlen`` for scalar code


def widths() -> list[int | None]:
    """``None`` (the width Inductor picks for this host), every other width the host
    supports, and scalar code."""
    from torch._inductor import cpu_vec_isa

    native = cpu_vec_isa.pick_vec_isa()
    others = sorted(
        {isa.bit_width() for isa in cpu_vec_isa.valid_vec_isa_list()}
        - {native.bit_width() if native else SCALAR}
    )
    return [None, *others, SCALAR]


def width_params() -> list[object]:
    return [pytest.param(w, id="native" if w is None else f"simd{w}") for w in widths()]


@contextlib.contextmanager
def inductor_width(width: int | None) -> Iterator[None]:
    """Inductor's CPU code at ``width`` bits (``None``: the host's pick; 0: scalar)."""
    import torch._inductor.config as config

    with config.patch({"cpp.simdlen": width}):
        torch._dynamo.reset()
        yield
    torch._dynamo.reset()
