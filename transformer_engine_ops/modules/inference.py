"""``InferenceParams``: TE 2.20.2's KV cache for incremental decoding, paged or not.

As in TE, the host decides between steps and the device computes within one:
``pre_step(OrderedDict(seq_id -> new tokens))`` (plain Python, outside any compiled
region) assigns cache pages to new sequences, frees those that left, and writes this
step's bookkeeping into fixed device tensors in place (``copy_``): the page table, each
sequence's cached length before the step and its step length. A layer's forward then
reads only those tensors: its ``step`` scatters the new keys and values into the cache
and gathers each sequence's pages for attention, with no host read, so the decode step
traces into one graph and replays under CUDA graphs (the cache and the bookkeeping
tensors keep their addresses; they are marked static as TE marks its caches).

One layout serves both kinds: the cache is ``[pages + 1, page_size, heads, dim]``; a
non-paged cache is one page of ``max_sequence_length`` tokens per batch slot (TE's
``[max_batch_size, max_seqlen, ...]``), a paged one ``total_num_pages`` pages of
``page_size``. The extra last page takes the writes of padding tokens (a prefill's
shorter sequences), so every step scatters a fixed number of rows.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch

from ..runtime import _torch_private as _private

_FORMATS = ("bshd", "sbhd")


class InferenceParams:
    """TE's ``InferenceParams(max_batch_size, max_sequence_length, num_heads_kv,
    head_dim_k, dtype, head_dim_v=None, is_paged=False, total_num_pages=None,
    page_size=None, max_ctx_len=None, qkv_format="bshd", custom_cache_manager=None)``.
    ``device`` (not TE's; TE uses the current CUDA device): None is CUDA when available,
    else the CPU."""

    def __init__(
        self,
        max_batch_size: int,
        max_sequence_length: int,
        num_heads_kv: int | None = None,
        head_dim_k: int | None = None,
        dtype: torch.dtype | None = None,
        head_dim_v: int | None = None,
        is_paged: bool = False,
        total_num_pages: int | None = None,
        page_size: int | None = None,
        max_ctx_len: int | None = None,
        qkv_format: str = "bshd",
        custom_cache_manager: Any = None,
        device: torch.device | str | None = None,
    ) -> None:
        cls = type(self).__name__
        if num_heads_kv is None or head_dim_k is None or dtype is None:
            raise ValueError(f"{cls}: num_heads_kv, head_dim_k and dtype are required (as in TE)")
        if custom_cache_manager is not None:
            raise NotImplementedError(f"{cls}: custom_cache_manager is not implemented")
        if qkv_format not in _FORMATS:
            raise NotImplementedError(
                f"{cls}: qkv_format={qkv_format!r} is not implemented (one of {_FORMATS})"
            )
        self.max_batch_size = max_batch_size
        self.max_sequence_length = max_sequence_length
        self.num_heads_kv, self.head_dim_k = num_heads_kv, head_dim_k
        self.head_dim_v = head_dim_k if head_dim_v is None else head_dim_v
        self.dtype = dtype
        self.is_paged = bool(is_paged)
        self.max_ctx_len = max_ctx_len
        self.input_qkv_format = qkv_format
        if self.is_paged:
            if page_size is None or max_sequence_length % page_size:
                raise ValueError(
                    f"{cls}: a paged cache needs page_size dividing max_sequence_length="
                    f"{max_sequence_length}, got {page_size}"
                )
            pages_per_seq = max_sequence_length // page_size
            if total_num_pages != max_batch_size * pages_per_seq:
                raise ValueError(
                    f"{cls}: total_num_pages must be max_batch_size * max_sequence_length // "
                    f"page_size = {max_batch_size * pages_per_seq}, got {total_num_pages}"
                )
            self.page_size, self.total_num_pages = page_size, total_num_pages
        else:
            self.page_size, self.total_num_pages = max_sequence_length, max_batch_size
        self.pages_per_seq = max_sequence_length // self.page_size
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        int32 = dict(dtype=torch.int32, device=self.device)
        # Per batch entry: its pages (unused entries: the trash page), its cached length
        # before this step, and this step's token count. Written in place by pre_step.
        self.page_table = torch.full((max_batch_size, self.pages_per_seq), self.trash_page, **int32)
        self.pre_step_seqlens = torch.zeros(max_batch_size, **int32)
        self.step_lens = torch.zeros(max_batch_size, **int32)
        for buffer in (self.page_table, self.pre_step_seqlens, self.step_lens):
            _private.mark_static_address(buffer)
        self.cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.sequences: OrderedDict[Any, int] = OrderedDict()
        self._pages: dict[Any, list[int]] = {}
        self._free = list(range(self.total_num_pages))
        self.batch_size = 0

    @property
    def trash_page(self) -> int:
        """The extra page padding tokens are written to (never read)."""
        return self.total_num_pages

    def reset(self) -> None:
        """Forget every sequence (the cache contents are left; they are never read
        past a sequence's length)."""
        self.sequences = OrderedDict()
        self._pages = {}
        self._free = list(range(self.total_num_pages))
        self.batch_size = 0

    def allocate_memory(self, layer_number: int) -> None:
        shape = (self.total_num_pages + 1, self.page_size, self.num_heads_kv)
        k = torch.zeros(*shape, self.head_dim_k, dtype=self.dtype, device=self.device)
        v = torch.zeros(*shape, self.head_dim_v, dtype=self.dtype, device=self.device)
        _private.mark_static_address(k)
        _private.mark_static_address(v)
        self.cache[layer_number] = (k, v)

    def pre_step(self, step_dict: OrderedDict) -> None:
        """Host side, before a step: ``step_dict`` maps each sequence of this step, in
        batch order, to its new token count. Sequences absent from it are finished and
        their pages freed; new ones get pages for their tokens; continuing ones grow."""
        cls = type(self).__name__
        if len(step_dict) > self.max_batch_size:
            raise ValueError(
                f"{cls}.pre_step: {len(step_dict)} sequences, max_batch_size={self.max_batch_size}"
            )
        for seq in [s for s in self.sequences if s not in step_dict]:
            self._free.extend(self._pages.pop(seq))
            del self.sequences[seq]
        before = []
        for seq, new in step_dict.items():
            cached = self.sequences.get(seq, 0)
            total = cached + int(new)
            if total > self.max_sequence_length:
                raise ValueError(
                    f"{cls}.pre_step: sequence {seq!r} would hold {total} tokens, "
                    f"max_sequence_length={self.max_sequence_length}"
                )
            pages = self._pages.setdefault(seq, [])
            while len(pages) * self.page_size < total:
                if not self._free:
                    raise RuntimeError(f"{cls}.pre_step: KV cache is full")
                pages.append(self._free.pop(0))
            before.append(cached)
        self.sequences = OrderedDict(
            (seq, before[i] + int(n)) for i, (seq, n) in enumerate(step_dict.items())
        )
        self.batch_size = len(step_dict)
        table = torch.full(
            (self.max_batch_size, self.pages_per_seq), self.trash_page, dtype=torch.int32
        )
        lens = torch.zeros(self.max_batch_size, dtype=torch.int32)
        steps = torch.zeros(self.max_batch_size, dtype=torch.int32)
        for i, (seq, new) in enumerate(step_dict.items()):
            pages = self._pages[seq]
            table[i, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
            lens[i], steps[i] = before[i], int(new)
        self.page_table.copy_(table)
        self.pre_step_seqlens.copy_(lens)
        self.step_lens.copy_(steps)

    def get_seqlens_pre_step(self) -> torch.Tensor:
        """Each batch entry's cached length before this step (RoPE's start positions)."""
        return self.pre_step_seqlens

    def step(
        self, layer_number: int, new_k: torch.Tensor, new_v: torch.Tensor, qkv_format: str
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Device side: write this step's keys and values (``[b, s, h, d]`` for bshd,
        ``[s, b, h, d]`` for sbhd; sequence i's first ``step_lens[i]`` tokens) into
        ``layer_number``'s cache, and return every sequence's keys and values
        ``[b, max_sequence_length, h, d]`` with the padding masks of the query
        ``[b, 1, 1, s]`` and of the keys ``[b, 1, 1, max_sequence_length]`` (True:
        padding), TE's mask convention."""
        if qkv_format not in _FORMATS:
            raise NotImplementedError(
                f"{type(self).__name__}.step: qkv_format={qkv_format!r} (one of {_FORMATS})"
            )
        if qkv_format == "sbhd":
            new_k, new_v = new_k.transpose(0, 1), new_v.transpose(0, 1)
        k_cache, v_cache = self.cache[layer_number]
        batch, steps = new_k.shape[0], new_k.shape[1]
        device = new_k.device
        pre = self.pre_step_seqlens[:batch].long()
        step_lens = self.step_lens[:batch].long()
        offsets = torch.arange(steps, device=device)
        positions = pre[:, None] + offsets[None, :]  # [b, s] logical positions
        valid = offsets[None, :] < step_lens[:, None]
        table = self.page_table[:batch].long()
        page = torch.gather(
            table, 1, (positions // self.page_size).clamp(max=self.pages_per_seq - 1)
        )
        page = torch.where(valid, page, self.trash_page)
        slot = positions % self.page_size
        k_cache.index_put_((page, slot), new_k.to(k_cache.dtype))
        v_cache.index_put_((page, slot), new_v.to(v_cache.dtype))
        length = self.max_sequence_length
        keys = k_cache[table].reshape(batch, length, *k_cache.shape[2:])
        values = v_cache[table].reshape(batch, length, *v_cache.shape[2:])
        total = pre + step_lens
        kv_pad = torch.arange(length, device=device)[None, :] >= total[:, None]
        q_pad = ~valid
        return keys, values, q_pad.view(batch, 1, 1, steps), kv_pad.view(batch, 1, 1, length)

    def __repr__(self) -> str:
        return (
            f"InferenceParams(dtype={self.dtype}, is_paged={self.is_paged}, "
            f"pages={self.total_num_pages}, page_size={self.page_size}, "
            f"num_heads={self.num_heads_kv}, head_dim_k={self.head_dim_k}, "
            f"head_dim_v={self.head_dim_v})"
        )
