"""Scale and element encodings checked against straightforward scalar implementations."""

from __future__ import annotations

import math
import struct

import pytest
import torch

from transformer_engine_ops.quantization import encoding


def fp32(v: float) -> float:
    return struct.unpack("f", struct.pack("f", v))[0]


def e4m3_values() -> list[float]:
    """All finite non-negative E4M3 values, indexed by code 0..126."""
    values = []
    for code in range(127):
        exponent, mantissa = code >> 3, code & 7
        if exponent == 0:
            values.append(mantissa / 8 * 2.0**-6)
        else:
            values.append((1 + mantissa / 8) * 2.0 ** (exponent - 7))
    return values


def nearest_even_code(v: float, values: list[float]) -> int:
    """Index of the nearest value; ties go to the even index; beyond the last saturates."""
    if v >= values[-1]:
        return len(values) - 1
    best = min(range(len(values)), key=lambda i: (abs(values[i] - v), i % 2))
    return best


def test_e4m3_encoding_matches_scalar_reference():
    values = e4m3_values()
    midpoints = [(a + b) / 2 for a, b in zip(values, values[1:], strict=False)]
    g = torch.Generator().manual_seed(0)
    randoms = (torch.rand(300, generator=g) * 500).tolist() + [0.0, 448.0, 1000.0, 2.0**-12]
    inputs = [fp32(v) for v in values + midpoints + randoms]
    got = encoding.encode_e4m3(torch.tensor(inputs, dtype=torch.float32)).tolist()
    assert got == [nearest_even_code(v, values) for v in inputs]


def test_e2m1_encoding_matches_scalar_reference():
    values = list(encoding.E2M1_VALUES)
    midpoints = [(a + b) / 2 for a, b in zip(values, values[1:], strict=False)]
    magnitudes = values + midpoints + [0.1, 0.3, 2.2, 4.9, 5.1, 7.0, 100.0]
    inputs = magnitudes + [-m for m in magnitudes if m != 0]
    got = encoding.encode_e2m1(torch.tensor(inputs)).tolist()
    expected = []
    for v in inputs:
        code = nearest_even_code(abs(v), values)
        expected.append(code | (8 if v < 0 and code != 0 else 0))
    assert got == expected
    back = encoding.e2m1_to_float(torch.tensor(expected, dtype=torch.uint8)).tolist()
    assert back == [math.copysign(values[c & 7], -1 if c & 8 else 1) for c in expected]


def test_e2m1_pack_puts_the_even_element_in_the_low_nibble():
    codes = torch.tensor([[1, 2, 15, 8]], dtype=torch.uint8)
    packed = encoding.pack_e2m1(codes)
    assert packed.tolist() == [[0x21, 0x8F]]
    assert torch.equal(encoding.unpack_e2m1(packed), codes)


def e8m0_reference(amax: float, fmax: float) -> int:
    if amax == 0:
        return 127
    ratio = fp32(fp32(amax) / fmax)
    k = -127
    while 2.0**k < ratio and k < 127:
        k += 1
    return k + 127


@pytest.mark.parametrize("fmax", [448.0, 57344.0])
def test_e8m0_scale_matches_scalar_reference(fmax):
    g = torch.Generator().manual_seed(1)
    amaxes = (torch.exp2(torch.randn(400, generator=g) * 20)).tolist()
    amaxes += [0.0, fmax, fmax * 2, fmax * 2.0000005, 1e-30, 3e38, 2.0**-140]
    amaxes = [fp32(a) for a in amaxes]
    got = encoding.e8m0_scale_inv_code(torch.tensor(amaxes, dtype=torch.float32), fmax)
    assert got.tolist() == [e8m0_reference(a, fmax) for a in amaxes]


def test_e8m0_decode_is_a_power_of_two_and_255_is_nan():
    codes = torch.tensor([0, 1, 127, 128, 254, 255], dtype=torch.uint8)
    decoded = encoding.e8m0_to_float(codes).tolist()
    assert decoded[:5] == [2.0**-127, 2.0**-126, 1.0, 2.0, 2.0**127]
    assert math.isnan(decoded[5])


def scale_reference(amax: float, fmax: float, pow2: bool, eps: float) -> float:
    amax = max(amax, fp32(eps))
    if amax == 0 or math.isinf(amax):
        return 1.0
    scale = fp32(fmax / amax)
    if math.isinf(scale) or scale > 3.4028234663852886e38:
        scale = 3.4028234663852886e38
    if pow2:
        scale = 2.0 ** math.floor(math.log2(scale))
    return scale


@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize("eps", [0.0, 1e-3])
def test_scale_from_amax_matches_scalar_reference(pow2, eps):
    g = torch.Generator().manual_seed(2)
    amaxes = torch.exp2(torch.randn(200, generator=g) * 30).tolist() + [0.0, 1e-45, 448.0]
    amaxes = [fp32(a) for a in amaxes]
    got = encoding.scale_from_amax(
        torch.tensor(amaxes, dtype=torch.float32), 448.0, force_pow_2=pow2, epsilon=eps
    ).tolist()
    assert got == [scale_reference(a, 448.0, pow2, eps) for a in amaxes]


def test_amax_ignores_nan_and_inf_and_is_zero_when_empty():
    x = torch.tensor([1.0, -3.0, float("nan"), float("-inf"), 2.0])
    assert encoding.tensor_amax(x).item() == 3.0
    assert encoding.tensor_amax(torch.empty(0, 4)).item() == 0.0


def test_fp8_cast_saturates_inf_and_keeps_nan():
    x = torch.tensor([float("inf"), -float("inf"), float("nan"), 1000.0])
    for dtype, fmax in ((torch.float8_e4m3fn, 448.0), (torch.float8_e5m2, 57344.0)):
        back = encoding.fp8_to_float(encoding.cast_to_fp8(x * 1e3, dtype), dtype)
        assert back[0].item() == fmax and back[1].item() == -fmax
        assert math.isnan(back[2].item())
