"""``InferenceParams``: TE 2.20.2's KV cache for incremental decoding, paged or not.

As in TE, the host decides between steps and the device computes within one:
``pre_step(OrderedDict(seq_id -> new tokens))`` (plain Python, outside any compiled
region) assigns cache pages to new sequences, frees those that left, and writes this
step's bookkeeping into fixed device tensors in place: the page table, each sequence's
cached length before the step and its step length. It keeps a host copy of each and
copies only what changed (in steady decoding, the cached lengths), through pinned
memory without blocking on CUDA, so the host never waits for the device between steps.

A layer's forward then reads only those tensors (and checks its keys and values against
what ``pre_step`` declared, from sizes and host values): ``step`` writes the new keys and
values into the cache at the step's positions (one scatter each, in place) and returns
the keys and values to attend over; ``attention_mask`` says which cached keys each query sees.
No host read within a step, fixed addresses: the decode step traces into one graph and
replays under CUDA graphs (the cache and the bookkeeping tensors are marked static, as
TE marks its caches).

One layout serves both kinds: the cache is ``[pages + 1, page_size, heads, dim]``; a
non-paged cache is one page of ``max_sequence_length`` tokens per batch slot (TE's
``[max_batch_size, max_seqlen, ...]``), a paged one ``total_num_pages`` pages of
``page_size``. The extra last page takes the writes of padding tokens (a prefill's
shorter sequences), so every step scatters a fixed number of rows.

* Non-paged, batch entry ``i`` always owns page ``i``, as in TE (whose ``pre_step``
  reorders the cache when sequences finish): attention reads ``cache[:batch]`` in place,
  the static cache under a length mask, as a hand-written static-cache decode does.
  When a sequence finishes, ``pre_step`` moves the cached rows of the sequences that
  change batch position (an eager copy, only on such steps).
* Paged, a sequence's pages are wherever the pool had room; attention needs them in
  order, so ``step`` gathers each batch entry's ``max_sequence_length // page_size``
  pages (its whole page-table row: a static shape cannot follow the pages in use). That
  gather is the paged cache's price: one copy of ``batch * max_sequence_length`` rows of
  keys and of values per layer and step, in the cache's dtype.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch

from ..runtime import _torch_private as _private
from ._device import default_device

_FORMATS = ("bshd", "sbhd")


class InferenceParams:
    """TE's ``InferenceParams(max_batch_size, max_sequence_length, num_heads_kv,
    head_dim_k, dtype, head_dim_v=None, is_paged=False, total_num_pages=None,
    page_size=None, max_ctx_len=None, qkv_format="bshd", custom_cache_manager=None)``.
    ``device`` (not TE's; TE uses the current CUDA device): None is the modules'
    default (modules/_device.py): the current CUDA device when available, else the CPU."""

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
        self.device = torch.device(default_device(device))
        # Per batch entry: its pages (unused entries: the trash page; non-paged: page i),
        # its cached length before this step, and this step's token count. The host
        # keeps what it last wrote to each, and pre_step writes only what changed.
        self._host_table = self._empty_table()
        self._host_pre = [0] * max_batch_size
        self._host_steps = [0] * max_batch_size
        int32 = dict(dtype=torch.int32, device=self.device)
        self.page_table = torch.tensor(self._host_table, **int32)
        self.pre_step_seqlens = torch.zeros(max_batch_size, **int32)
        self.step_lens = torch.zeros(max_batch_size, **int32)
        for buffer in (self.page_table, self.pre_step_seqlens, self.step_lens):
            _private.mark_static_address(buffer)
        self.cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.sequences: OrderedDict[Any, int] = OrderedDict()
        self._pages: dict[Any, list[int]] = {}
        self._free = list(range(self.total_num_pages))
        self.batch_size = 0
        # What the last pre_step declared, for step's checks (host values: no device
        # read): the most new tokens of one sequence, and the layers that have written
        # this step's keys and values since (cleared in place, one set for good).
        self._longest_step = 0
        self._stepped: set[int] = set()

    @property
    def trash_page(self) -> int:
        """The extra page padding tokens are written to (never read)."""
        return self.total_num_pages

    def _empty_table(self) -> list[list[int]]:
        """The page table with no sequence: the trash page everywhere, except that a
        non-paged cache's batch entry ``i`` is page ``i`` for good."""
        if self.is_paged:
            return [[self.trash_page] * self.pages_per_seq for _ in range(self.max_batch_size)]
        return [[i] for i in range(self.max_batch_size)]

    def reset(self) -> None:
        """Forget every sequence (the cache contents are left; they are never read
        past a sequence's length)."""
        self.sequences = OrderedDict()
        self._pages = {}
        self._free = list(range(self.total_num_pages))
        self.batch_size = 0
        self._longest_step = 0
        self._stepped.clear()

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
        counts = [int(n) for n in step_dict.values()]
        before = [self.sequences.get(seq, 0) for seq in step_dict]
        for seq, cached, new in zip(step_dict, before, counts, strict=True):
            if cached + new > self.max_sequence_length:
                raise ValueError(
                    f"{cls}.pre_step: sequence {seq!r} would hold {cached + new} tokens, "
                    f"max_sequence_length={self.max_sequence_length}"
                )
        if self.is_paged:
            self._assign_pages(step_dict, before, counts)
        else:
            self._move_continuing_sequences(step_dict)
        self.sequences = OrderedDict(
            (seq, cached + new) for seq, cached, new in zip(step_dict, before, counts, strict=True)
        )
        self.batch_size = len(step_dict)
        self._longest_step = max(counts, default=0)
        self._stepped.clear()
        unused = self.max_batch_size - self.batch_size
        table = self._empty_table()
        if self.is_paged:
            for i, seq in enumerate(step_dict):
                pages = self._pages[seq]
                table[i][: len(pages)] = pages
        self._host_table = self._write(self.page_table, self._host_table, table)
        self._host_pre = self._write(self.pre_step_seqlens, self._host_pre, before + [0] * unused)
        self._host_steps = self._write(self.step_lens, self._host_steps, counts + [0] * unused)

    def _assign_pages(self, step_dict: OrderedDict, before: list[int], counts: list[int]) -> None:
        """Paged: free the pages of finished sequences, give each sequence the pages its
        new length needs (the first free page first)."""
        for seq in [s for s in self.sequences if s not in step_dict]:
            self._free.extend(self._pages.pop(seq))
        for seq, cached, new in zip(step_dict, before, counts, strict=True):
            pages = self._pages.setdefault(seq, [])
            while len(pages) * self.page_size < cached + new:
                if not self._free:
                    raise RuntimeError(f"{type(self).__name__}.pre_step: KV cache is full")
                pages.append(self._free.pop(0))

    def _move_continuing_sequences(self, step_dict: OrderedDict) -> None:
        """Non-paged: batch entry ``i`` owns page ``i``, so a continuing sequence whose
        batch position changes (one before it finished) has its cached rows moved to its
        new page in every layer's cache (TE's non-paged ``pre_step`` reorders likewise)."""
        old = {seq: i for i, seq in enumerate(self.sequences)}
        moves = [(i, old[seq]) for i, seq in enumerate(step_dict) if old.get(seq, i) != i]
        if not moves or not self.cache:
            return
        dst = self._staged([d for d, _ in moves], torch.int64).to(self.device, non_blocking=True)
        src = self._staged([s for _, s in moves], torch.int64).to(self.device, non_blocking=True)
        for k_cache, v_cache in self.cache.values():
            for cache in (k_cache, v_cache):
                cache.index_copy_(0, dst, cache.index_select(0, src))

    def _write(self, buffer: torch.Tensor, current: list[Any], values: list[Any]) -> list[Any]:
        """Copy ``values`` into the device ``buffer`` in place unless the host's copy of
        it (``current``) already equals them."""
        if values == current:
            return current
        buffer.copy_(self._staged(values, buffer.dtype), non_blocking=True)
        return values

    def _staged(self, values: list[Any], dtype: torch.dtype) -> torch.Tensor:
        """``values`` as a host tensor, pinned when the cache is on CUDA: a copy from it
        need not wait (from pageable memory the host would wait for the device to finish
        the previous step first)."""
        host = torch.tensor(values, dtype=dtype)
        return host.pin_memory() if self.device.type == "cuda" else host

    def get_seqlens_pre_step(self) -> torch.Tensor:
        """Each batch entry's cached length before this step (RoPE's start positions)."""
        return self.pre_step_seqlens

    def step(
        self, layer_number: int, new_k: torch.Tensor, new_v: torch.Tensor, qkv_format: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Device side: write this step's keys and values (``[b, s, h, d]`` for bshd,
        ``[s, b, h, d]`` for sbhd; sequence i's first ``step_lens[i]`` tokens) into
        ``layer_number``'s cache in place, and return every sequence's keys and values
        ``[b, max_sequence_length, h, d]``: the cache itself (non-paged) or its pages
        gathered in order (paged). :meth:`attention_mask` says which of them to read."""
        if qkv_format not in _FORMATS:
            raise NotImplementedError(
                f"{type(self).__name__}.step: qkv_format={qkv_format!r} (one of {_FORMATS})"
            )
        self._check_step(layer_number, new_k, new_v, qkv_format)
        if qkv_format == "sbhd":
            new_k, new_v = new_k.transpose(0, 1), new_v.transpose(0, 1)
        k_cache, v_cache = self.cache[layer_number]
        batch, steps = new_k.shape[0], new_k.shape[1]
        offsets = torch.arange(steps, device=new_k.device)
        step_lens = self.step_lens[:batch].long()
        positions = self.pre_step_seqlens[:batch].long()[:, None] + offsets[None, :]  # [b, s]
        table = self.page_table[:batch].long()
        page = torch.gather(
            table, 1, (positions // self.page_size).clamp(max=self.pages_per_seq - 1)
        )
        page = torch.where(offsets[None, :] < step_lens[:, None], page, self.trash_page)
        slot = positions % self.page_size
        k_cache.index_put_((page, slot), new_k.to(k_cache.dtype))
        v_cache.index_put_((page, slot), new_v.to(v_cache.dtype))
        if not self.is_paged:
            return k_cache[:batch], v_cache[:batch]
        length = self.max_sequence_length
        keys = k_cache[table].reshape(batch, length, *k_cache.shape[2:])
        values = v_cache[table].reshape(batch, length, *v_cache.shape[2:])
        return keys, values

    def _check_step(
        self, layer_number: int, new_k: torch.Tensor, new_v: torch.Tensor, qkv_format: str
    ) -> None:
        """That ``step``'s keys and values (in ``qkv_format``) are what the last
        ``pre_step`` declared and the cache holds: one write per layer and ``pre_step``,
        as many sequences, at least the longest sequence's new tokens (fewer would leave
        cache rows the mask reads unwritten), ``num_heads_kv`` heads of ``head_dim_k``
        / ``head_dim_v``. Sizes and host values only: under torch.compile these are
        guards, never a device read."""
        where = f"InferenceParams.step (layer_number={layer_number})"

        def shapes() -> str:  # for a message only
            return f"{qkv_format} keys {tuple(new_k.shape)}, values {tuple(new_v.shape)}"

        if layer_number not in self.cache:
            raise ValueError(
                f"{where}: no cache for this layer; allocate_memory({layer_number}) first"
            )
        if self.batch_size == 0:
            raise ValueError(
                f"{where}: no sequences declared ({shapes()}); call pre_step(OrderedDict("
                "seq_id -> new tokens)) before each forward"
            )
        if layer_number in self._stepped:
            raise ValueError(
                f"{where}: this layer already wrote this step's keys and values; call "
                "pre_step before each forward (a second forward would write over the same "
                "cache positions)"
            )
        for name, t, dim, dim_name in (
            ("keys", new_k, self.head_dim_k, "head_dim_k"),
            ("values", new_v, self.head_dim_v, "head_dim_v"),
        ):
            if t.dim() != 4 or t.shape[2] != self.num_heads_kv or t.shape[3] != dim:
                raise ValueError(
                    f"{where}: {qkv_format} {name} of shape {tuple(t.shape)}, expected "
                    f"[..., {self.num_heads_kv}, {dim}] (the cache's num_heads_kv="
                    f"{self.num_heads_kv}, {dim_name}={dim})"
                )
        if new_k.shape[:2] != new_v.shape[:2]:
            raise ValueError(f"{where}: {shapes()} differ in batch or sequence length")
        batch, steps = (new_k.shape[1], new_k.shape[0]) if qkv_format == "sbhd" else new_k.shape[:2]
        # int() in the messages: under torch.compile these sizes and counts may be
        # symbolic, which Dynamo formats only once made concrete.
        if batch != self.batch_size:
            raise ValueError(
                f"{where}: {shapes()} hold a batch of {int(batch)}, but pre_step declared a batch "
                f"of {int(self.batch_size)}"
            )
        if steps < self._longest_step:
            raise ValueError(
                # Without the shapes: the sequence length may be a symbolic size under
                # torch.compile, which Dynamo cannot put in a message (steps is a
                # constant here, the comparison having specialized it).
                f"{where}: {qkv_format} keys and values hold {int(steps)} tokens per sequence, "
                "but pre_step declared "
                f"{int(self._longest_step)} new tokens for a sequence (the cache rows past the "
                "tokens given would be attended over without being written)"
            )
        self._stepped.add(layer_number)

    def attention_mask(
        self, batch: int, steps: int, causal: bool, window_size: tuple[int, int]
    ) -> torch.Tensor:
        """Which cached keys each of this step's queries must not see, ``[b, 1, s,
        max_sequence_length]`` (True: masked, TE's convention): key ``j`` of sequence
        ``i`` is seen by its query ``t`` (at position ``pre_step_seqlens[i] + t``) when
        ``j`` is cached after this step, ``t`` is one of its ``step_lens[i]`` tokens, and
        (causal) ``j`` is not after the query, within ``window_size`` of it. The causal
        diagonal is aligned to the sequence's end, TE's bottom right."""
        device = self.page_table.device
        pre = self.pre_step_seqlens[:batch].long().view(batch, 1, 1)
        step_lens = self.step_lens[:batch].long().view(batch, 1, 1)
        query = torch.arange(steps, device=device).view(1, steps, 1)
        key = torch.arange(self.max_sequence_length, device=device).view(1, 1, -1)
        position = pre + query
        seen = (key < pre + step_lens) & (query < step_lens)
        left, right = window_size
        if causal:
            right = 0
        if right >= 0:
            seen = seen & (key <= position + right)
        if left >= 0:
            seen = seen & (key >= position - left)
        return (~seen).unsqueeze(1)

    def __repr__(self) -> str:
        return (
            f"InferenceParams(dtype={self.dtype}, is_paged={self.is_paged}, "
            f"pages={self.total_num_pages}, page_size={self.page_size}, "
            f"num_heads={self.num_heads_kv}, head_dim_k={self.head_dim_k}, "
            f"head_dim_v={self.head_dim_v})"
        )
