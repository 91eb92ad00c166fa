"""TE 2.20's MoE token helpers: permutation, chunk sorting and row padding, with TE's
signatures, each on a generated op (``ops/moe_*.py``), eager and under
``torch.compile(fullgraph=True)``.

* ``moe_permute(inp, routing_map, num_out_tokens, max_token_num, map_type)``,
  ``moe_permute_with_probs``, ``moe_permute_and_pad_with_probs``: tokens to expert
  order; ``moe_unpermute``: back, merged with probabilities (``ops/moe_permute.py``,
  ``ops/moe_unpermute.py``, TE's ``row_id_map`` in ``ops/_moe.py``).
* ``moe_sort_chunks_by_index`` (``_with_probs``): row chunks reordered
  (``ops/moe_sort_chunks.py``).
* ``Fp8Padding`` / ``Fp8Unpadding``: each expert's rows padded with zero rows to the
  recipe's alignment, and cut back (``ops/moe_pad_rows.py``).

Nothing reads a tensor value on the host, so on CUDA nothing synchronizes and a CUDA
graph captures every call, with two exceptions, both TE's: ``moe_permute`` with the mask
map and no ``num_out_tokens`` counts the routed rows (one synchronization;
``num_out_tokens`` is required in TE), and ``moe_permute_and_pad_with_probs`` reads
whether padding is needed and the padded row count (TE's function does the same).
Where a value is read under ``torch.compile``, Dynamo needs
``torch._dynamo.config.capture_scalar_outputs = True`` to keep one graph (the count
becomes a symbolic size), and otherwise breaks the graph there (``fullgraph=True``
raises). Values that do not fit (routed copies past ``num_out_tokens``, a row map of
another input, chunks past the rows) are refused with a ValueError on the CPU and a
device-side assertion on CUDA.

Differences from TE: quantized (FP8) inputs are refused (TE permutes FP8 codes and
scales eagerly); rows of the permuted output that no copy fills are zeros (TE leaves
them unwritten unless padding); ``max_token_num`` (TE's workspace hint) has nothing to
size here and is accepted and ignored; an unpermute whose input has no rows returns
the ``[num_tokens, hidden]`` zeros its shape promises (TE returns the empty input).
"""

from __future__ import annotations

import warnings
from typing import Any, Optional

import torch
from torch import nn

from ..generated.moe_pad_rows import call_moe_pad_rows
from ..generated.moe_permute import call_moe_permute
from ..generated.moe_sort_chunks import call_moe_sort_chunks
from ..generated.moe_unpermute import call_moe_unpermute
from ..quantization.quantizer import QuantizedData
from .autocast import STATE

__all__ = [
    "Fp8Padding",
    "Fp8Unpadding",
    "moe_permute",
    "moe_permute_and_pad_with_probs",
    "moe_permute_with_probs",
    "moe_sort_chunks_by_index",
    "moe_sort_chunks_by_index_with_probs",
    "moe_unpermute",
]

_MAP_TYPES = ("mask", "index")


def _needs_grad(t: Optional[torch.Tensor]) -> bool:
    return t is not None and t.requires_grad


def _refuse_quantized(fn: str, inp: Any) -> None:
    if isinstance(inp, QuantizedData):
        raise TypeError(
            f"{fn}: a quantized input ({type(inp).__name__}) is not supported here; permute "
            "the high-precision tensor and quantize the permuted rows"
        )


def _routed_count(routing_map: torch.Tensor) -> int:
    """The routed copies of a mask map: one read on the host (a synchronization on
    CUDA; a symbolic size under torch.compile with ``capture_scalar_outputs``)."""
    return int((routing_map != 0).sum().item())


def _permute(
    fn: str,
    inp: torch.Tensor,
    routing_map: torch.Tensor,
    num_out_tokens: Optional[int],
    map_type: str,
    probs: Optional[torch.Tensor] = None,
    pad_offsets: Optional[torch.Tensor] = None,
) -> tuple[Any, ...]:
    _refuse_quantized(fn, inp)
    if map_type not in _MAP_TYPES:
        raise ValueError("map_type should be one of 'mask' or 'index'")
    if num_out_tokens is None:
        num_out_tokens = 0 if map_type == "index" or inp.shape[0] == 0 else -1
    if num_out_tokens == -1 and map_type == "mask":
        num_out_tokens = _routed_count(routing_map)
    grad = torch.is_grad_enabled()
    return call_moe_permute(
        inp=inp,
        probs=probs,
        routing_map=routing_map,
        pad_offsets=pad_offsets,
        map_type=map_type,
        num_out_tokens=num_out_tokens,
        inp_requires_grad=grad and inp.requires_grad,
        probs_requires_grad=grad and _needs_grad(probs),
        is_grad_enabled=grad,
    )


def moe_permute(
    inp: torch.Tensor,
    routing_map: torch.Tensor,
    num_out_tokens: Optional[int] = None,
    max_token_num: int = -1,
    map_type: str = "mask",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(permuted, row_id_map)``: the tokens ``inp`` ``[T, H]`` grouped by expert.

    ``map_type="mask"``: ``routing_map`` ``[T, E]`` (bool or int, nonzero where routed);
    expert ``e``'s tokens in token order, experts in order. ``num_out_tokens``: the rows
    of the output (``int(routing_map.sum())`` or ``T * topk``; TE requires it): without it
    the routed copies are counted on the host, one synchronization. ``map_type="index"``:
    ``routing_map`` ``[T, K]`` of expert ids (int32, as TE recommends); the copies sorted
    by expert, the first ``num_out_tokens`` kept (0 or None: all ``T * K``).
    ``max_token_num`` is TE's workspace hint, ignored. ``row_id_map`` is what
    :func:`moe_unpermute` takes back (TE's layout)."""
    out, row_id_map, _ = _permute("moe_permute", inp, routing_map, num_out_tokens, map_type)
    return out, row_id_map


def moe_permute_with_probs(
    inp: torch.Tensor,
    probs: torch.Tensor,
    routing_map: torch.Tensor,
    num_out_tokens: Optional[int] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(permuted, permuted_probs, row_id_map)``: :func:`moe_permute` with the mask map,
    ``probs`` ``[T, E]`` permuted alongside (a routed copy of probability 0 becomes a
    zero row, TE's kernel's rule)."""
    out, row_id_map, permuted_probs = _permute(
        "moe_permute_with_probs", inp, routing_map, num_out_tokens, "mask", probs=probs
    )
    return out, permuted_probs, row_id_map


def moe_permute_and_pad_with_probs(
    inp: torch.Tensor,
    probs: torch.Tensor,
    routing_map: torch.Tensor,
    tokens_per_expert: torch.Tensor,
    align_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
    """``(permuted, permuted_probs, row_id_map, pad_offsets, padded_tokens_per_expert)``:
    :func:`moe_permute_with_probs` with each expert's rows padded with zero rows to a
    multiple of ``align_size`` (TE's fused padding). ``pad_offsets`` (None when nothing
    needs padding) is what :func:`moe_unpermute` takes to skip the padding. As TE's,
    this reads on the host whether padding is needed and the padded row count."""
    if tokens_per_expert is None:
        raise ValueError(
            "tokens_per_expert must be provided to the fused permute padding function."
        )
    if align_size <= 0:
        raise ValueError(f"align_size must be positive, got {align_size}.")
    if tokens_per_expert.device != inp.device:
        tokens_per_expert = tokens_per_expert.to(inp.device)
    target = (torch.ceil(tokens_per_expert / align_size) * align_size).long()
    pad_offsets = None
    if not torch.equal(tokens_per_expert, target):
        padding = torch.cumsum(target - tokens_per_expert, dim=0)
        pad_offsets = torch.cat([padding.new_zeros(1), padding[:-1]])
    out, row_id_map, permuted_probs = _permute(
        "moe_permute_and_pad_with_probs",
        inp,
        routing_map,
        int(target.sum().item()),
        "mask",
        probs=probs,
        pad_offsets=pad_offsets,
    )
    return out, permuted_probs, row_id_map, pad_offsets, target


def moe_unpermute(
    inp: torch.Tensor,
    row_id_map: torch.Tensor,
    merging_probs: Optional[torch.Tensor] = None,
    restore_shape: Optional[torch.Size] = None,
    map_type: str = "mask",
    probs: Optional[torch.Tensor] = None,
    pad_offsets: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Each token's rows of ``inp`` summed back into its row, times ``merging_probs``
    when given (fp32 math, one rounding; TE's). ``row_id_map`` and ``map_type`` are the
    permute's; ``restore_shape`` ``(num_tokens, hidden)`` (mask map; default
    ``inp.shape``); ``pad_offsets`` the padded permute's. ``probs`` is TE's deprecated
    name of ``merging_probs``. The index map's probabilities are used in fp32 (TE
    converts them with a warning)."""
    if probs is not None:
        if merging_probs is not None:
            raise ValueError(
                "Both merging_probs and probs kwarg are provided. probs is deprecated."
            )
        warnings.warn("probs kwarg is deprecated. Use merging_probs kwarg instead.", stacklevel=2)
        merging_probs = probs
    if map_type not in _MAP_TYPES:
        raise ValueError("map_type should be one of 'mask' or 'index'")
    _refuse_quantized("moe_unpermute", inp)
    if map_type == "index":
        if merging_probs is not None:
            if merging_probs.dtype != torch.float32:
                warnings.warn(
                    f"The data type of the input `probs` of Unpermute is {merging_probs.dtype}! "
                    "The recommended type is torch.float32.",
                    stacklevel=2,
                )
                merging_probs = merging_probs.to(torch.float32)
            num_tokens = merging_probs.shape[0]
        else:
            num_tokens = row_id_map.shape[0]
    else:
        if restore_shape is None:
            restore_shape = inp.shape
        if len(restore_shape) != 2 or restore_shape[1] != inp.shape[-1]:
            raise ValueError(
                f"moe_unpermute: restore_shape {tuple(restore_shape)} must be (num_tokens, "
                f"hidden) with the input's hidden size {inp.shape[-1]}"
            )
        num_tokens = restore_shape[0]
    grad = torch.is_grad_enabled()
    return call_moe_unpermute(
        inp=inp,
        merging_probs=merging_probs,
        row_id_map=row_id_map,
        pad_offsets=pad_offsets,
        map_type=map_type,
        num_tokens=num_tokens,
        inp_requires_grad=grad and inp.requires_grad,
        probs_requires_grad=grad and _needs_grad(merging_probs),
        is_grad_enabled=grad,
    )[0]


def _sort_chunks(
    inp: torch.Tensor,
    probs: Optional[torch.Tensor],
    split_sizes: torch.Tensor,
    sorted_index: torch.Tensor,
) -> tuple[Any, ...]:
    _refuse_quantized("moe_sort_chunks_by_index", inp)
    grad = torch.is_grad_enabled()
    return call_moe_sort_chunks(
        inp=inp,
        probs=probs,
        split_sizes=split_sizes,
        sorted_index=sorted_index,
        inp_requires_grad=grad and inp.requires_grad,
        probs_requires_grad=grad and _needs_grad(probs),
        is_grad_enabled=grad,
    )


def moe_sort_chunks_by_index(
    inp: torch.Tensor, split_sizes: torch.Tensor, sorted_index: torch.Tensor
) -> torch.Tensor:
    """``inp``'s rows split into chunks of ``split_sizes`` and the chunks put in the
    order ``sorted_index`` names (output chunk ``i`` is input chunk ``sorted_index[i]``);
    rows past the chunks stay in place. Both index tensors are read on the device."""
    return _sort_chunks(inp, None, split_sizes, sorted_index)[0]


def moe_sort_chunks_by_index_with_probs(
    inp: torch.Tensor,
    probs: torch.Tensor,
    split_sizes: torch.Tensor,
    sorted_index: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`moe_sort_chunks_by_index` with ``probs`` (one per row) moved alongside."""
    out, permuted_probs = _sort_chunks(inp, probs, split_sizes, sorted_index)
    return out, permuted_probs


# --- Fp8Padding / Fp8Unpadding ------------------------------------------------------


def _alignment() -> int:
    """TE's alignment of the active recipe (the default recipe outside ``autocast``):
    32 for MXFP8, 128 for NVFP4, a custom recipe's ``quantization_alignment``, 16 for
    the others."""
    active = STATE.autocast_cell[0]
    if active is not None:
        recipe = active.recipe
    else:
        from ..quantization.availability import get_default_recipe

        recipe = get_default_recipe()
    if recipe.custom():
        return recipe.quantization_alignment
    if recipe.mxfp8():
        return 32
    if recipe.nvfp4():
        return 128
    return 16


def _padded(module: Any, m_splits: Any, owner: str) -> tuple[list[Any], list[Any]]:
    """``(m_splits, padded m_splits)`` after TE's checks; sets ``align_size`` from the
    recipe on first use, as TE does."""
    m_splits = list(m_splits)
    if len(m_splits) != module.num_gemms:
        raise ValueError(
            f"{owner}: Number of splits should match number of GEMMs. (got {len(m_splits)} "
            f"splits for num_gemms={module.num_gemms})"
        )
    for i, m in enumerate(m_splits):
        if isinstance(m, bool) or not isinstance(m, int) and not isinstance(m, torch.SymInt):
            raise TypeError(f"{owner}: m_splits[{i}] is {m!r}; row counts must be ints")
    if module.align_size is None:
        module.align_size = _alignment()
    align = module.align_size
    return m_splits, [(m + align - 1) // align * align for m in m_splits]


def _move(inp: torch.Tensor, from_splits: list[Any], to_splits: list[Any]) -> torch.Tensor:
    grad = torch.is_grad_enabled()
    rows = inp.reshape(-1, inp.shape[-1])
    return call_moe_pad_rows(
        inp=rows,
        from_splits=from_splits,
        to_splits=to_splits,
        inp_requires_grad=grad and inp.requires_grad,
        is_grad_enabled=grad,
    )[0]


class Fp8Padding(nn.Module):
    """TE's ``Fp8Padding``: each GEMM's rows padded with zero rows to a multiple of
    ``align_size`` (when None, the active recipe's alignment on the first forward: 32
    for MXFP8, 128 for NVFP4, a custom recipe's ``quantization_alignment``, else 16).
    ``forward(inp, m_splits)`` returns ``(padded, padded_m_splits)``, or ``(inp,
    m_splits)`` themselves when nothing needs padding, as TE."""

    def __init__(self, num_gemms: int, align_size: Optional[int] = None) -> None:
        super().__init__()
        self.num_gemms = num_gemms
        self.align_size = align_size

    def forward(self, inp: torch.Tensor, m_splits: list[int]) -> tuple[torch.Tensor, list[int]]:
        m_splits, padded = _padded(self, m_splits, "Fp8Padding")
        if m_splits == padded:
            return inp, m_splits
        return _move(inp, m_splits, padded), padded


class Fp8Unpadding(nn.Module):
    """TE's ``Fp8Unpadding``: the inverse of :class:`Fp8Padding` (the same
    ``align_size`` rule); ``forward(inp, m_splits)`` takes the unpadded ``m_splits`` and
    returns the rows without padding (``inp`` itself when nothing was padded)."""

    def __init__(self, num_gemms: int, align_size: Optional[int] = None) -> None:
        super().__init__()
        self.num_gemms = num_gemms
        self.align_size = align_size

    def forward(self, inp: torch.Tensor, m_splits: list[int]) -> torch.Tensor:
        m_splits, padded = _padded(self, m_splits, "Fp8Unpadding")
        if m_splits == padded:
            return inp
        return _move(inp, padded, m_splits)
