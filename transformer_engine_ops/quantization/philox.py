"""Philox4x32-10, the counter-based generator TE's stochastic-rounding kernels draw from
(through cuRAND), written in plain torch integer ops.

A counter-based generator makes the n-th random word a pure function of
``(key, counter)``: the bits a quantize draws depend on the ``(seed, offset)`` pair it
is given and on nothing else (no generator object, no hidden state), so an eager call,
a compiled graph's call and a replay of either read the same bits. Words are held as
non-negative int64 tensors below ``2**32``; the 32x32-bit products Philox needs are
split into 16-bit limbs so that no intermediate leaves int64's range.
"""

from __future__ import annotations

import torch

__all__ = ["RNG_STATE_DTYPE", "check_rng_state", "philox4x32", "philox_rounds", "uniform"]

RNG_STATE_DTYPE = torch.int64
_M32 = 0xFFFFFFFF
_MUL = (0xD2511F53, 0xCD9E8D57)
_WEYL = (0x9E3779B9, 0xBB67AE85)
_ROUNDS = 10


def check_rng_state(owner: str, rng_state: object) -> torch.Tensor:
    """``rng_state`` as TE passes it to a stochastic-rounding kernel: an int64 tensor of
    shape (2,) holding ``(seed, offset)``; anything else is a TypeError naming ``owner``."""
    if (
        not isinstance(rng_state, torch.Tensor)
        or rng_state.dtype != RNG_STATE_DTYPE
        or tuple(rng_state.shape) != (2,)
    ):
        got = (
            f"a {rng_state.dtype} tensor of shape {tuple(rng_state.shape)}"
            if isinstance(rng_state, torch.Tensor)
            else type(rng_state).__name__
        )
        raise TypeError(
            f"{owner}: stochastic rounding needs rng_state, an int64 tensor (seed, offset) "
            f"of shape (2,), got {got}"
        )
    return rng_state


def _mulhilo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(high, low) 32-bit words of the 64-bit product ``a * b`` (``b`` < 2**32)."""
    p = b * (a & 0xFFFF)  # < 2**48
    q = b * (a >> 16)  # < 2**48
    partial = p + ((q & 0xFFFF) << 16)  # < 2**49
    return (q >> 16) + (partial >> 32), partial & _M32


def _split(value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An int64 scalar tensor as its (low, high) 32-bit words, each in [0, 2**32)."""
    return value & _M32, (value >> 32) & _M32


def philox4x32(
    rng_state: torch.Tensor, count: int, stream: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Four words (int64 tensors of length ``count``, each < 2**32) per counter
    ``(i, stream, offset_lo, offset_hi)`` for ``i`` in ``range(count)``, keyed by the
    seed. Distinct streams of one ``rng_state`` are independent sequences."""
    seed, offset = rng_state.to(torch.int64).unbind(0)
    off_lo, off_hi = _split(offset)
    c0 = torch.arange(count, dtype=torch.int64, device=rng_state.device) & _M32
    counter = (c0, torch.full_like(c0, stream & _M32), off_lo.expand_as(c0), off_hi.expand_as(c0))
    return philox_rounds(counter, _split(seed))


def philox_rounds(
    counter: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    key: tuple[torch.Tensor, torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ten Philox4x32 rounds on explicit 32-bit counter and key words (Random123's
    ``philox4x32_10``; its known-answer vectors are in the tests)."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for _ in range(_ROUNDS):
        hi0, lo0 = _mulhilo(_MUL[0], c0)
        hi1, lo1 = _mulhilo(_MUL[1], c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = (k0 + _WEYL[0]) & _M32
        k1 = (k1 + _WEYL[1]) & _M32
    return c0, c1, c2, c3


def uniform(rng_state: torch.Tensor, numel: int, stream: int) -> torch.Tensor:
    """``numel`` fp32 values uniform in [0, 1) (multiples of ``2**-24``, exactly
    representable), four per Philox counter, from ``(seed, offset)`` and ``stream``."""
    words = torch.stack(philox4x32(rng_state, (numel + 3) // 4, stream), dim=1)
    top24 = words.reshape(-1)[:numel] >> 8
    return top24.to(torch.float32) * (2.0**-24)
