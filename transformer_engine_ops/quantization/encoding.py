"""Number formats and scale rules shared by the quantizers, written out plainly.

Conventions (see docs/quantization.md): all math runs in fp32; a *scale* multiplies the
high-precision value into the format's range, its inverse (``scale_inv``) dequantizes.
Amaxes ignore NaN and +-Inf, so one bad element does not wreck its block's scale. NaN
stays NaN where the format has one (NVFP4 has none: a NaN marks its whole 16-element
block NaN via the block scale). An Inf keeps its saturated code but makes the scale of
its tensor (FP8 per tensor) or block (the block formats) non-finite, so the value
dequantizes to non-finite numbers and an overflow reaches the GEMM outputs, where a
GradScaler-style ``isfinite`` check sees it (see docs/quantization.md, "NaN and Inf").
"""

from __future__ import annotations

from typing import Any

import torch

from ..constants import DType

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
FP32_MAX = torch.finfo(torch.float32).max
E4M3_MAX = 448.0
E2M1_MAX = 6.0
E8M0_BIAS = 127
E8M0_NAN = 0xFF
E4M3_NAN = 0x7F


def require_fp8_dtype(owner: str, dtype: torch.dtype) -> None:
    """Refuse a quantizer configured with a dtype that is not an FP8 format."""
    if dtype not in FP8_DTYPES:
        raise TypeError(
            f"{owner}: fp8_dtype must be torch.float8_e4m3fn or torch.float8_e5m2 "
            f"(te.DType.kFloat8E4M3 or te.DType.kFloat8E5M2), got {dtype!r}"
        )


def fp8_dtype_argument(owner: str, value: Any) -> torch.dtype:
    """An FP8 dtype as TE's quantizers take it: ``te.DType.kFloat8E4M3`` or
    ``kFloat8E5M2``, or the torch dtype itself; anything else is refused naming it."""
    if isinstance(value, DType):
        if value not in (DType.kFloat8E4M3, DType.kFloat8E5M2):
            raise TypeError(
                f"{owner}: fp8_dtype must be te.DType.kFloat8E4M3 or te.DType.kFloat8E5M2, "
                f"got {value!r}"
            )
        return value.torch_dtype
    require_fp8_dtype(owner, value)
    return value


def te_fp8_dtype(dtype: torch.dtype) -> DType:
    """The ``te.DType`` of an FP8 torch dtype (a quantizer's TE ``dtype`` attribute)."""
    return DType.kFloat8E4M3 if dtype == torch.float8_e4m3fn else DType.kFloat8E5M2


def ceil_div(a: Any, b: int) -> Any:
    """``ceil(a / b)`` for ints and SymInts."""
    return (a + b - 1) // b


def round_up(a: Any, multiple: int) -> Any:
    """Smallest multiple of ``multiple`` that is >= ``a``."""
    return ceil_div(a, multiple) * multiple


def finite_abs(x: torch.Tensor) -> torch.Tensor:
    """``|x|`` with NaN and +-Inf replaced by 0, for amax computations."""
    return torch.where(torch.isfinite(x), x.abs(), torch.zeros_like(x))


def has_inf(x: torch.Tensor) -> torch.Tensor:
    """Whether ``x`` holds a +-Inf, as a 0-d bool tensor (overflow detection)."""
    return torch.isinf(x).any()


def block_has_inf(xb: torch.Tensor) -> torch.Tensor:
    """Whether each block of a :func:`to_blocks` view holds a +-Inf: (Mb, Kb) bool."""
    return torch.isinf(xb).any(dim=3).any(dim=1)


def tensor_amax(x: torch.Tensor) -> torch.Tensor:
    """Finite amax of the whole tensor as a 0-d fp32 tensor (0 for an empty tensor)."""
    flat = finite_abs(x.float()).reshape(-1)
    return torch.cat([flat, flat.new_zeros(1)]).amax()


def to_blocks(x2d: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """(M, K) -> (ceil(M/rows), rows, ceil(K/cols), cols), zero-padded at the ends."""
    m, k = x2d.shape
    padded = torch.nn.functional.pad(x2d, (0, round_up(k, cols) - k, 0, round_up(m, rows) - m))
    return padded.reshape(ceil_div(m, rows), rows, ceil_div(k, cols), cols)


def from_blocks(xb: torch.Tensor, m: Any, k: Any) -> torch.Tensor:
    """Inverse of :func:`to_blocks`: drop the padding."""
    mb, rows, kb, cols = xb.shape
    return xb.reshape(mb * rows, kb * cols)[:m, :k]


def apply_block_scale(x2d: torch.Tensor, s: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Multiply each (rows x cols) block of ``x2d`` by its entry of ``s`` (Mb, Kb)."""
    m, k = x2d.shape
    return from_blocks(to_blocks(x2d, rows, cols) * s[:, None, :, None], m, k)


def block_amax(xb: torch.Tensor) -> torch.Tensor:
    """Finite amax of each block of a :func:`to_blocks` view: (Mb, Kb)."""
    return finite_abs(xb).amax(dim=(1, 3))


def scale_from_amax(
    amax: torch.Tensor, fmax: float, *, force_pow_2: bool = False, epsilon: float = 0.0
) -> torch.Tensor:
    """TE's rule: ``scale = fmax / max(amax, epsilon)``; 1 when that amax is 0 or Inf.

    An infinite scale (tiny amax) becomes FP32_MAX; ``force_pow_2`` truncates the scale
    to a power of two (it only ever shrinks, so scaled values stay within ``fmax``).
    """
    amax = torch.clamp(amax.float(), min=epsilon)
    degenerate = (amax == 0) | torch.isinf(amax)
    # A full tensor, not a Python scalar: torch turns ``scalar / t`` into a reciprocal
    # and a multiply, which is not correctly rounded.
    scale = torch.where(degenerate, torch.ones_like(amax), torch.full_like(amax, fmax) / amax)
    scale = torch.clamp(scale, max=FP32_MAX)  # Inf -> FP32_MAX
    if force_pow_2:
        _, exponent = torch.frexp(scale)  # scale = m * 2**exponent with m in [0.5, 1)
        scale = torch.ldexp(torch.full_like(scale, 0.5), exponent)  # 2**floor(log2(scale))
    return scale


# ----- FP8 elements -----


def cast_to_fp8(x: torch.Tensor, fp8_dtype: torch.dtype) -> torch.Tensor:
    """Round to nearest even with saturation (Inf -> +-max, NaN stays NaN); uint8 bits."""
    fmax = FP8_MAX[fp8_dtype]
    return torch.clamp(x.float(), -fmax, fmax).to(fp8_dtype).view(torch.uint8)


def fp8_to_float(bits: torch.Tensor, fp8_dtype: torch.dtype) -> torch.Tensor:
    return bits.view(fp8_dtype).float()


# ----- E8M0 scales (MXFP8) -----


def e8m0_scale_inv_code(amax: torch.Tensor, fmax: float) -> torch.Tensor:
    """Biased exponent of the smallest power of two ``s`` with ``amax / s <= fmax``.

    ``s = 2**ceil(log2(amax / fmax))`` (rounding the exponent up, as TE does, so no
    element saturates); an all-zero block gets ``s = 1``. Clamped to codes 0..254
    (``2**-127`` .. ``2**127``).
    """
    ratio = amax.float() / torch.full_like(amax, fmax, dtype=torch.float32)  # correctly rounded
    mantissa, exponent = torch.frexp(ratio)  # ratio = mantissa * 2**exponent
    # A power of two has mantissa exactly 0.5: ceil(log2) is exponent - 1, else exponent.
    ceil_log2 = torch.where(mantissa == 0.5, exponent - 1, exponent)
    code = torch.clamp(ceil_log2 + E8M0_BIAS, 0, 254)
    code = torch.where(ratio == 0, torch.zeros_like(code), code)  # amax/fmax underflowed
    code = torch.where(amax == 0, torch.full_like(code, E8M0_BIAS), code)
    return code.to(torch.uint8)


def e8m0_to_float(code: torch.Tensor) -> torch.Tensor:
    """2**(code - 127); code 255 is NaN."""
    value = torch.exp2(code.float() - E8M0_BIAS)
    return torch.where(code == E8M0_NAN, torch.full_like(value, float("nan")), value)


# ----- E4M3 block scales (NVFP4) -----


def encode_e4m3(x: torch.Tensor) -> torch.Tensor:
    """Non-negative fp32 -> E4M3 bits, nearest even, saturating at 448."""
    return torch.clamp(x.float(), 0.0, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)


# ----- E2M1 elements (NVFP4) -----

# The 8 non-negative E2M1 values, indexed by their 3-bit code (sign is bit 3).
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def encode_e2m1(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> 4-bit E2M1 codes (uint8 0..15): nearest, ties to even code, saturating.

    NaN must be removed by the caller. Code ``c`` counts the midpoints between
    neighbouring values that ``|x|`` lies above; at a tie the even code wins.
    """
    a = x.abs()
    code = torch.zeros_like(a, dtype=torch.uint8)
    for lower in range(7):
        midpoint = (E2M1_VALUES[lower] + E2M1_VALUES[lower + 1]) / 2
        upper_is_even = (lower + 1) % 2 == 0
        above = (a >= midpoint) if upper_is_even else (a > midpoint)
        code += above.to(torch.uint8)
    sign = (torch.signbit(x) & (code != 0)).to(torch.uint8) << 3
    return code | sign


def encode_e2m1_stochastic(x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """fp32 in [-6, 6] -> E2M1 codes rounded stochastically: ``|x|`` between neighbouring
    values ``lo <= |x| < hi`` becomes ``hi`` with probability ``(|x| - lo) / (hi - lo)``
    (``u`` < that, ``u`` uniform in [0, 1) and of ``x``'s shape), else ``lo``; so the
    expected value is ``x``. A representable ``|x|`` is kept. NaN removed by the caller."""
    a = x.abs()
    lower = torch.zeros_like(a, dtype=torch.uint8)  # code of the largest value <= |x|
    for value in E2M1_VALUES[1:]:
        lower += (a >= value).to(torch.uint8)
    lo = e2m1_to_float(lower)
    hi = e2m1_to_float(torch.clamp(lower + 1, max=7))
    gap = hi - lo
    p_up = torch.where(gap > 0, (a - lo) / torch.where(gap > 0, gap, 1.0), 0.0)
    code = lower + (u < p_up).to(torch.uint8)
    sign = (torch.signbit(x) & (code != 0)).to(torch.uint8) << 3
    return code | sign


def e2m1_to_float(code: torch.Tensor) -> torch.Tensor:
    """4-bit E2M1 codes -> fp32, computed from the bits (exact: 0, 0.5, 1, 1.5, 2, 3, 4, 6).

    No lookup table: building one on the code's device is a host-to-device copy, which
    CUDA graph capture (``mode="reduce-overhead"``) refuses.
    """
    c = (code & 7).to(torch.int32)
    exponent = c >> 1
    mantissa = (c & 1).to(torch.float32)
    normal = torch.exp2((exponent - 1).to(torch.float32)) * (1.0 + 0.5 * mantissa)
    magnitude = torch.where(exponent == 0, 0.5 * mantissa, normal)
    return torch.where((code & 8) != 0, -magnitude, magnitude)


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """(..., 2n) codes -> (..., n) bytes; the even element goes in the low nibble."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """(..., n) bytes -> (..., 2n) codes."""
    low = packed & 0x0F
    high = packed >> 4
    return torch.stack([low, high], dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def pad_2d(x: torch.Tensor, rows: Any, cols: Any) -> torch.Tensor:
    """Zero-pad a 2-D tensor at the bottom/right to (rows, cols)."""
    return torch.nn.functional.pad(x, (0, cols - x.shape[1], 0, rows - x.shape[0]))


# ----- layout helpers -----


def matrix_dims(shape: Any) -> tuple[Any, Any]:
    """(M, K): the product of the leading dims and the last dim."""
    m = 1
    for d in shape[:-1]:
        m = m * d
    return m, shape[-1]


def transposed_shape(shape: Any) -> tuple[Any, ...]:
    """The "last dim first" shape of a transposed (columnwise) buffer: (K, d0, ...)."""
    return (shape[-1], *shape[:-1])


def untransposed_shape(shape: Any) -> torch.Size:
    """Inverse of :func:`transposed_shape`."""
    return torch.Size((*shape[1:], shape[0]))


def transpose_2d_to(x2d: torch.Tensor, shape: Any) -> torch.Tensor:
    """(R, C) matrix -> its transpose in a fresh contiguous buffer, reshaped to ``shape``.

    Always a copy: the transpose of an (M, 1) or (1, K) matrix is already contiguous, so
    ``.t().contiguous()`` would return a view sharing storage with ``x2d``, and a custom
    op must not return two buffers that alias each other (batch 1, one feature).
    """
    return x2d.t().clone(memory_format=torch.contiguous_format).reshape(shape)
