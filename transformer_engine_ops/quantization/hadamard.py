"""TE's random Hadamard transform (RHT) for NVFP4: each run of 16 contiguous elements is
multiplied by ``T = diag(signs) @ H16 / 4``, ``H16`` the Sylvester Hadamard matrix and
``signs`` TE's fixed "random" sign vector.

``T`` is orthogonal (``T @ T.T = I``), so a GEMM whose two operands are both transformed
along their shared dimension is unchanged in exact arithmetic: TE transforms the
columnwise data of the input and of the output gradient, which the weight-gradient GEMM
contracts over the token dimension, spreading outliers over 16 elements before their
FP4 rounding. Our dequantize applies ``T.T`` back, so a transformed value dequantizes to
(an approximation of) the original tensor and any GEMM on it stays correct.
"""

from __future__ import annotations

import torch

__all__ = ["HADAMARD_SIZE", "RHT_SIGNS", "apply_rht", "rht_matrix", "sign_mask", "undo_rht"]

HADAMARD_SIZE = 16
# TE 2.20.2's hard-coded signs (``get_wgrad_sign_vector``), the diagonal of diag(signs).
RHT_SIGNS = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)


# RHT_SIGNS as a bit mask (bit i set where sign i is -1), so the matrix is made on its
# device by arithmetic: a host-to-device copy is refused during CUDA-graph capture.
_NEGATIVE_SIGNS_MASK = sum(1 << i for i, s in enumerate(RHT_SIGNS) if s < 0)


def sign_mask(random_signs: bool = True) -> int:
    """The bit mask of the signs (bit i set where sign i is -1): TE's sign vector, or
    none (all +1) for TE's ``with_random_sign_mask=False``."""
    return _NEGATIVE_SIGNS_MASK if random_signs else 0


def rht_matrix(
    dtype: torch.dtype = torch.float32, device: object = None, random_signs: bool = True
) -> torch.Tensor:
    """``diag(RHT_SIGNS) @ H16 / 4`` (entries +-1/4, exact in every float dtype);
    ``H16 / 4`` without ``random_signs`` (TE's ``with_random_sign_mask=False``).

    Made on ``device`` from ``arange`` (Sylvester's ``H[i, j] = (-1)**popcount(i & j)``),
    never copied from the host, so it can be made while a CUDA graph is captured; not
    cached, so a trace never captures a tensor made by an earlier call."""
    idx = torch.arange(HADAMARD_SIZE, device=device)
    both = idx[:, None] & idx[None, :]
    parity = torch.zeros_like(both)
    for bit in range(HADAMARD_SIZE.bit_length() - 1):
        parity = parity ^ ((both >> bit) & 1)
    negative = (sign_mask(random_signs) >> idx) & 1
    signed = (1 - 2 * negative)[:, None] * (1 - 2 * parity)
    return signed.to(dtype) / 4


def _check_blocks(x2d: torch.Tensor) -> None:
    if x2d.shape[-1] % HADAMARD_SIZE != 0:
        raise ValueError(
            f"the random Hadamard transform runs on blocks of {HADAMARD_SIZE} along the "
            f"last dim, which must be a multiple of {HADAMARD_SIZE}; got shape "
            f"{tuple(x2d.shape)}"
        )


def _transform(x2d: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
    """Every 16-element run of each row of ``x2d`` times ``matrix``, in fp32, summed in
    index order: ``sum_i x[i] * matrix[i, j]`` from zero, each product and each sum
    rounded on its own (products by +-1/4 are exact but for subnormal results). A fixed
    order makes the bits the same on every device and in the Triton kernels
    (``nvfp4_kernels.py``); a matmul's order is its library's."""
    _check_blocks(x2d)
    r, c = x2d.shape
    # Contiguous first: a transposed input would reshape to a view whose runs of 16 are
    # strided (a columnwise quantize passes x.T).
    blocks = x2d.float().contiguous().reshape(r, c // HADAMARD_SIZE, HADAMARD_SIZE)
    out = torch.zeros_like(blocks)
    for i in range(HADAMARD_SIZE):
        out = out + blocks[..., i : i + 1] * matrix[i]
    return out.reshape(r, c)


def apply_rht(x2d: torch.Tensor, random_signs: bool = True) -> torch.Tensor:
    """``x2d`` (R, C) with every 16-element run of each row multiplied by ``T`` (fp32)."""
    return _transform(x2d, rht_matrix(device=x2d.device, random_signs=random_signs))


def undo_rht(y2d: torch.Tensor, random_signs: bool = True) -> torch.Tensor:
    """Inverse of :func:`apply_rht`: every 16-element run multiplied by ``T.T`` (fp32)."""
    return _transform(y2d, rht_matrix(device=y2d.device, random_signs=random_signs).t())
