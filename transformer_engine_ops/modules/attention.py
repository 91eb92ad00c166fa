"""``DotProductAttention``: TE 2.20.2's core attention, through the generated
``dot_product_attention`` op.

Constructor and ``forward`` take TE's arguments, names and defaults. What this module
computes is TE's attention in high precision (``fp8_dpa=False``, TE's default); TE's
arguments that it does not implement (FP8 attention, context parallelism, the inference
KV cache, cuDNN score modifiers, attention sinks) raise ``NotImplementedError`` naming
them. The module turns its arguments into one ``DotProductAttnFwdArgs`` bundle
(mask type, window, softcap, biases, cu_seqlens, the dropout's rng state, the backend
chosen for this call) and calls the op.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

from ..generated.attention import call_dot_product_attention
from ..ops.attention import (
    ATTN_BIAS_TYPES,
    ATTN_MASK_TYPES,
    QKV_FORMATS,
    backend_support,
    default_alibi_slopes,
    select_backend,
)
from ..quantization.stochastic import draw_rng_state
from ._base import ExtraStateMixin, check_positive
from ._call import autocast_enabled, refuse_torch_func
from .autocast import STATE

_NAME = "DotProductAttention"

# TE spells some mask types more than one way.
_MASK_ALIASES = {"causal_padding": "padding_causal", "padding,causal": "padding_causal"}
_PADDED = {
    "no_mask": "padding",
    "causal": "padding_causal",
    "causal_bottom_right": "padding_causal_bottom_right",
}


def _mask_type(value: str) -> str:
    mask = str(value).replace(",", "_")
    mask = _MASK_ALIASES.get(mask, mask)
    if mask not in ATTN_MASK_TYPES:
        raise ValueError(f"{_NAME}: attn_mask_type {value!r}, expected one of {ATTN_MASK_TYPES}")
    return mask


def check_set_window_size(mask: str, window: Any) -> tuple[int, int]:
    """TE's ``check_set_window_size``: the window a mask type implies, a close
    mismatch corrected with a warning, anything else refused."""
    if window is not None:
        window = tuple(int(w) for w in window)
        if len(window) != 2:
            raise ValueError(f"{_NAME}: window_size {window}, expected (left, right)")
    if "causal" in mask:
        if window is None:
            return (-1, 0)
        if window == (-1, -1) or (window[0] >= 0 and window[1] != 0):
            warnings.warn(
                f"window_size should be (-1, 0) or (>=0, 0) for attn_mask_type={mask}",
                stacklevel=3,
            )
            return (window[0], 0)
        if window != (-1, 0) and window[0] < 0:
            raise ValueError(
                f"{_NAME}: window_size {window}; (-1, 0) or (>=0, 0) for attn_mask_type={mask}"
            )
        return window
    if window is None:
        return (-1, -1)
    if window == (-1, 0):
        warnings.warn(
            f"window_size should be (-1, -1) or (>=0, >=0) for attn_mask_type={mask}",
            stacklevel=3,
        )
        return (-1, -1)
    if window != (-1, -1) and (window[0] < 0 or window[1] < 0):
        raise ValueError(
            f"{_NAME}: window_size {window}; (-1, -1) or (>=0, >=0) for attn_mask_type={mask}"
        )
    return window


def _refuse(**given: Any) -> None:
    """NotImplementedError naming each argument TE has that this module does not implement."""
    named = sorted(name for name, value in given.items() if value)
    if named:
        raise NotImplementedError(f"{_NAME}: {', '.join(named)} not implemented")


def _cu_seqlens_from_mask(mask: torch.Tensor, seq: int, where: str) -> torch.Tensor:
    """cu_seqlens (int32, [b + 1]) of a padding mask [b, 1, 1, s] (True = padding), as
    TE's fused backends read it: each sequence's length is its count of unmasked tokens."""
    if mask.dtype != torch.bool or mask.dim() != 4 or tuple(mask.shape[1:]) != (1, 1, seq):
        raise ValueError(
            f"{_NAME}: {where} padding mask of {mask.dtype} {tuple(mask.shape)}; expected a "
            f"bool tensor [batch, 1, 1, {seq}] (True = padding)"
        )
    lens = (~mask).reshape(mask.shape[0], seq).sum(1, dtype=torch.int32)
    return torch.cat([lens.new_zeros(1), lens.cumsum(0, dtype=torch.int32)])


def _max_seqlen(cu: torch.Tensor, given: Any, name: str) -> Any:
    if given is not None:
        return given
    if torch.compiler.is_compiling():
        raise ValueError(
            f"{_NAME}: qkv_format 'thd' under torch.compile needs {name} (the longest "
            "sequence); reading it from cu_seqlens would synchronize with the device"
        )
    return int((cu[1:] - cu[:-1]).max())


def _accept_missing_extra_state(module: nn.Module, incompatible_keys: Any) -> None:
    """TE's hook: a checkpoint without ``core_attention._extra_state`` (older TE) loads."""
    missing = incompatible_keys.missing_keys
    for key in [k for k in missing if k.endswith("_extra_state") and "core_attention" in k]:
        missing.remove(key)


class DotProductAttention(ExtraStateMixin, nn.Module):
    """Attention ``softmax(scale * Q K^T + bias, mask) V`` over heads, with TE's masks,
    sliding windows, softcap, ALiBi, GQA/MQA, thd (ragged) inputs and dropout. Output:
    ``[sq, b, h * dv]`` (sbhd), ``[b, sq, h * dv]`` (bshd) or ``[t, h * dv]`` (thd).
    Its state dict holds TE's ``_extra_state`` (empty: no FP8 attention metadata)."""

    def __init__(
        self,
        num_attention_heads: int,
        kv_channels: int | tuple[int, int],
        num_gqa_groups: int | None = None,
        attention_dropout: float = 0.0,
        qkv_format: str = "sbhd",
        attn_mask_type: str = "causal",
        window_size: tuple[int, int] | None = None,
        bottom_right_diagonal: bool | None = None,
        softcap: float = 0.0,
        sequence_parallel: bool = False,
        tp_size: int = 1,
        get_rng_state_tracker: Any = None,
        tp_group: Any = None,
        layer_number: int | None = None,
        attention_type: str = "self",
        cp_group: Any = None,
        cp_global_ranks: Any = None,
        cp_stream: Any = None,
        cp_comm_type: str = "p2p",
        softmax_scale: float | None = None,
        softmax_type: str = "vanilla",
        return_max_logit: bool | None = False,
        name: str | None = None,
    ) -> None:
        super().__init__()
        _refuse(
            get_rng_state_tracker=get_rng_state_tracker is not None,
            cp_group=cp_group is not None,
            cp_global_ranks=cp_global_ranks is not None,
            cp_stream=cp_stream is not None,
            return_max_logit=bool(return_max_logit),
        )
        if softmax_type != "vanilla":
            raise NotImplementedError(
                f"{_NAME}: softmax_type={softmax_type!r} (attention sinks) not implemented; "
                "'vanilla' is"
            )
        if qkv_format not in QKV_FORMATS:
            raise ValueError(f"{_NAME}: qkv_format {qkv_format!r}, expected one of {QKV_FORMATS}")
        if attention_type not in ("self", "cross"):
            raise ValueError(f"{_NAME}: attention_type {attention_type!r}, expected self or cross")
        if not isinstance(kv_channels, int):
            kv_channels = tuple(kv_channels)
            if len(kv_channels) != 2:
                raise ValueError(
                    f"{_NAME}: kv_channels={kv_channels}, expected an int or a pair "
                    "(head dim of queries and keys, head dim of values)"
                )
            check_positive(
                _NAME, **{"kv_channels[0]": kv_channels[0], "kv_channels[1]": kv_channels[1]}
            )
        else:
            check_positive(_NAME, kv_channels=kv_channels)
        check_positive(_NAME, num_attention_heads=num_attention_heads)
        if num_gqa_groups is not None:
            check_positive(_NAME, num_gqa_groups=num_gqa_groups)
        self.qkv_format = qkv_format
        self.attn_mask_type = _mask_type(attn_mask_type)
        self.window_size = check_set_window_size(self.attn_mask_type, window_size)
        self.bottom_right_diagonal = bottom_right_diagonal
        self.softcap = float(softcap)
        if tp_group is not None:
            tp_size = torch.distributed.get_world_size(tp_group)
        self.tp_size = tp_size
        self.tp_group = tp_group
        self.sequence_parallel = sequence_parallel
        self.num_attention_heads = num_attention_heads
        self.layer_number = 1 if layer_number is None else layer_number
        self.cp_comm_type = cp_comm_type
        self.hidden_size_per_attention_head_k = (
            kv_channels if isinstance(kv_channels, int) else kv_channels[0]
        )
        self.hidden_size_per_attention_head_v = (
            kv_channels if isinstance(kv_channels, int) else kv_channels[1]
        )
        self.num_gqa_groups = num_attention_heads if num_gqa_groups is None else num_gqa_groups
        if num_attention_heads % self.num_gqa_groups != 0:
            raise ValueError(
                f"{_NAME}: num_attention_heads={num_attention_heads} is not divisible by "
                f"num_gqa_groups={self.num_gqa_groups}"
            )
        self.num_gqa_groups_per_partition = self.num_gqa_groups // self.tp_size
        if softmax_scale is None:
            softmax_scale = self.hidden_size_per_attention_head_k**-0.5
        self.softmax_scale = float(softmax_scale)
        self.attention_type = attention_type
        self.attention_dropout = float(attention_dropout)
        self.softmax_type = softmax_type
        self.return_max_logit = False
        self.name = name
        self.register_load_state_dict_post_hook(_accept_missing_extra_state)

    def forward(
        self,
        query_layer: torch.Tensor | None = None,
        key_layer: torch.Tensor | None = None,
        value_layer: torch.Tensor | None = None,
        attention_mask: Any = None,
        qkv_format: str | None = None,
        cu_seqlens_q: torch.Tensor | None = None,
        cu_seqlens_kv: torch.Tensor | None = None,
        cu_seqlens_q_padded: torch.Tensor | None = None,
        cu_seqlens_kv_padded: torch.Tensor | None = None,
        max_seqlen_q: int | None = None,
        max_seqlen_kv: int | None = None,
        attn_mask_type: str | None = None,
        window_size: tuple[int, int] | None = None,
        bottom_right_diagonal: bool | None = None,
        softcap: float | None = None,
        checkpoint_core_attention: bool = False,
        core_attention_bias_type: str = "no_bias",
        core_attention_bias: torch.Tensor | None = None,
        alibi_slopes: torch.Tensor | None = None,
        fast_zero_fill: bool = True,
        inference_params: Any = None,
        pad_between_seqs: bool | None = None,
        fp8_output: bool | None = False,
        bf16_backward: bool | None = False,
        num_splits: int | None = 1,
        score_mod: Any = None,
        score_mod_bprop: Any = None,
        score_mod_tensors: Any = None,
        score_mod_bprop_tensors: Any = None,
        qkv_layer: torch.Tensor | None = None,
        kv_layer: torch.Tensor | None = None,
        qkv_interleave_dim: int = -3,
        thd_attention_policies: Any = None,
        thd_attention_policy_dispatch: str = "auto",
    ) -> torch.Tensor:
        refuse_torch_func(self)  # a torch.func transform: a clear error
        _refuse(
            fp8_output=bool(fp8_output),
            score_mod=score_mod is not None,
            score_mod_bprop=score_mod_bprop is not None,
            score_mod_tensors=score_mod_tensors is not None,
            score_mod_bprop_tensors=score_mod_bprop_tensors is not None,
            thd_attention_policies=thd_attention_policies is not None,
        )
        quantizers = STATE.autocast
        recipe = None if quantizers is None else quantizers.recipe
        for flag in ("fp8_dpa", "fp8_mha"):
            if getattr(recipe, flag, False):
                raise NotImplementedError(
                    f"{_NAME}: FP8 attention ({flag}=True in the active recipe) not "
                    "implemented; attention runs in high precision with fp8_dpa=False"
                )
        fmt = self.qkv_format if qkv_format is None else qkv_format
        if fmt not in QKV_FORMATS:
            raise ValueError(f"{_NAME}: qkv_format {fmt!r}, expected one of {QKV_FORMATS}")
        q, k, v = _unpack_layers(
            query_layer, key_layer, value_layer, qkv_layer, kv_layer, qkv_interleave_dim
        )
        self._check_layers(q, k, v, fmt)
        autocast_device = _autocast_device(q)
        if autocast_device is not None:
            # TE's modules follow torch.autocast: the inputs take its dtype, and the op's
            # own fp32 math runs with autocast off.
            dtype = torch.get_autocast_dtype(autocast_device)
            q, k, v = (t.to(dtype) if t.is_floating_point() else t for t in (q, k, v))
        mask = self.attn_mask_type if attn_mask_type is None else _mask_type(attn_mask_type)
        window = check_set_window_size(  # TE: the constructor's window, for this mask type
            mask, self.window_size if window_size is None else window_size
        )
        if inference_params is not None:
            if core_attention_bias_type != "no_bias" or alibi_slopes is not None:
                raise NotImplementedError(
                    f"{_NAME}: inference_params with core_attention_bias_type="
                    f"{core_attention_bias_type!r} or alibi_slopes is not implemented"
                )
            cap = self.softcap if softcap is None else float(softcap)
            return self._cached_attention(
                inference_params, q, k, v, fmt, mask, window, cap, checkpoint_core_attention
            )
        if fmt == "thd" and "padding" not in mask:
            raise ValueError(
                f"{_NAME}: qkv_format 'thd' takes attn_mask_type padding, padding_causal or "
                f"padding_causal_bottom_right, got {mask!r}"
            )
        seq_dim = {"sbhd": 0, "bshd": 1, "thd": 0}[fmt]
        arbitrary = None
        if "padding" in mask and fmt != "thd" and cu_seqlens_q is None:
            if attention_mask is None:
                raise ValueError(
                    f"{_NAME}: attn_mask_type {mask!r} needs attention_mask or cu_seqlens_q "
                    "and cu_seqlens_kv"
                )
            masks = attention_mask if isinstance(attention_mask, (tuple, list)) else None
            if masks is None and self.attention_type == "cross":
                raise ValueError(
                    f"{_NAME}: cross attention takes a pair of padding masks (query, key/value)"
                )
            mask_q, mask_kv = masks if masks is not None else (attention_mask, attention_mask)
            cu_seqlens_q = _cu_seqlens_from_mask(mask_q, q.shape[seq_dim], "the query's")
            cu_seqlens_kv = _cu_seqlens_from_mask(mask_kv, k.shape[seq_dim], "the key's")
        elif "padding" in mask and cu_seqlens_kv is None:
            cu_seqlens_kv = cu_seqlens_q
        if mask == "arbitrary":
            if not isinstance(attention_mask, torch.Tensor):
                raise ValueError(f"{_NAME}: attn_mask_type 'arbitrary' needs attention_mask")
            arbitrary = attention_mask
        if fmt == "thd":
            if cu_seqlens_q is None or cu_seqlens_kv is None:
                raise ValueError(f"{_NAME}: qkv_format 'thd' needs cu_seqlens_q and cu_seqlens_kv")
            max_seqlen_q = _max_seqlen(cu_seqlens_q, max_seqlen_q, "max_seqlen_q")
            max_seqlen_kv = _max_seqlen(cu_seqlens_kv, max_seqlen_kv, "max_seqlen_kv")
        else:
            max_seqlen_q = q.shape[seq_dim]
            max_seqlen_kv = k.shape[seq_dim]
            cu_seqlens_q_padded = cu_seqlens_kv_padded = None  # TE ignores them off thd
        if pad_between_seqs is False and cu_seqlens_q_padded is not None:
            cu_seqlens_q_padded = cu_seqlens_kv_padded = None
        if core_attention_bias_type not in ATTN_BIAS_TYPES:
            raise ValueError(
                f"{_NAME}: core_attention_bias_type {core_attention_bias_type!r}, expected one "
                f"of {ATTN_BIAS_TYPES}"
            )
        if core_attention_bias_type == "alibi" and alibi_slopes is None:
            alibi_slopes = default_alibi_slopes(q.shape[-2], q.device)  # TE: the query's heads
        if core_attention_bias_type != "alibi":
            alibi_slopes = None
        bias = core_attention_bias if core_attention_bias_type.endswith("_scale_bias") else None
        cap = self.softcap if softcap is None else float(softcap)
        dropout = self.attention_dropout if self.training else 0.0
        grad = torch.is_grad_enabled()
        bias_grad = bias is not None and bias.requires_grad
        br = self.bottom_right_diagonal if bottom_right_diagonal is None else bottom_right_diagonal
        br = mask not in ("causal", "padding_causal") if br is None else bool(br)
        backend = select_backend(
            backend_support(
                device=q.device,
                dtype=q.dtype,
                head_dim=q.shape[-1],
                head_dim_v=v.shape[-1],
                qkv_format=fmt,
                attn_mask_type=mask,
                window_size=window,
                bottom_right_diagonal=br,
                same_seqlens=max_seqlen_q == max_seqlen_kv,
                attn_bias_type=core_attention_bias_type,
                bias_requires_grad=grad and bias_grad,
                softcap=cap,
                dropout=dropout > 0.0,
            ),
            q.device,
        )
        fields = dict(
            q=q,
            k=k,
            v=v,
            attn_bias=bias,
            cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_kv=cu_seqlens_kv,
            cu_seqlens_q_padded=cu_seqlens_q_padded,
            cu_seqlens_kv_padded=cu_seqlens_kv_padded,
            attention_mask=arbitrary,
            alibi_slopes=alibi_slopes,
            rng_state=draw_rng_state(q, q.device) if dropout > 0.0 else None,
            q_requires_grad=q.requires_grad,
            k_requires_grad=k.requires_grad,
            v_requires_grad=v.requires_grad,
            attn_bias_requires_grad=bias_grad,
            is_training=self.training,
            max_seqlen_q=max_seqlen_q,
            max_seqlen_kv=max_seqlen_kv,
            attn_scale=self.softmax_scale,
            dropout_p=dropout,
            qkv_format=fmt,
            attn_bias_type=core_attention_bias_type,
            attn_mask_type=mask,
            window_size=window,
            bottom_right_diagonal=br,
            softcap=cap,
            backend=backend,
            is_grad_enabled=grad,
            # TE's checkpoint_core_attention: the op keeps only its inputs and its
            # backward recomputes the forward (the same dropout bits: rng_state).
            checkpoint=bool(checkpoint_core_attention),
        )
        if autocast_device is None:
            return call_dot_product_attention(**fields)[0]
        with torch.autocast(autocast_device, enabled=False):
            return call_dot_product_attention(**fields)[0]

    def _cached_attention(
        self,
        inference_params: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        fmt: str,
        mask: str,
        window: tuple[int, int],
        softcap: float,
        checkpoint_core_attention: bool,
    ) -> torch.Tensor:
        """TE's KV-cache step: this step's keys and values written into
        ``inference_params``' cache for ``layer_number`` (its memory allocated on a first
        eager use, as TE's MultiheadAttention allocates it), then attention of this
        step's queries over every cached key of their sequence, the causal diagonal
        aligned to each sequence's end (TE turns ``padding_causal`` into
        ``padding_causal_bottom_right``); the output in the query's format, ``[s, b, h *
        d]`` or ``[b, s, h * d]``.

        The keys are read where they lie, ``[b, max_sequence_length, groups, d]`` under
        the cache's length mask (``attn_mask_type="arbitrary"``), and the query heads of
        each KV group are folded into the query's sequence dimension (``[b, s * heads /
        groups, groups, d]``, mask rows repeated to match), so attention sees as many
        query heads as key heads: no kernel repeats the cache for GQA."""
        if "padding" not in mask:  # TE's assertion
            raise ValueError(
                f"{_NAME}: KV caching requires padding mask! (inference_params with "
                f"attn_mask_type={mask!r}: 'padding', 'padding_causal' or "
                "'padding_causal_bottom_right')"
            )
        if fmt not in ("sbhd", "bshd"):
            raise NotImplementedError(
                f"{_NAME}: inference_params with qkv_format={fmt!r} is not implemented "
                "(sbhd and bshd are)"
            )
        layer = self.layer_number
        if layer not in inference_params.cache:
            if torch.compiler.is_compiling():  # allocating marks static addresses: eagerly
                raise ValueError(
                    f"{_NAME}: inference_params holds no cache for layer_number={layer}; "
                    f"call inference_params.allocate_memory({layer}) before a compiled step "
                    "(MultiheadAttention does so on its first, eager, call)"
                )
            inference_params.allocate_memory(layer)
        keys, values = inference_params.step(layer, k.contiguous(), v.contiguous(), fmt)
        sbhd = fmt == "sbhd"
        query = q.transpose(0, 1) if sbhd else q  # [b, s, heads, d]
        batch, steps, heads, head_dim = query.shape
        groups, length, head_dim_v = keys.shape[2], keys.shape[1], values.shape[3]
        per_group = heads // groups
        masked = inference_params.attention_mask(batch, steps, "causal" in mask, window)
        rows = steps * per_group
        packed = query.reshape(batch, steps, groups, per_group, head_dim).transpose(2, 3)
        masked = masked.unsqueeze(3).expand(batch, 1, steps, per_group, length)
        context = self.forward(  # the module's hooks ran for the call itself
            packed.reshape(batch, rows, groups, head_dim),
            keys,
            values,
            attention_mask=masked.reshape(batch, 1, rows, length),
            qkv_format="bshd",
            attn_mask_type="arbitrary",
            window_size=(-1, -1),
            softcap=softcap,
            checkpoint_core_attention=checkpoint_core_attention,
        )
        context = context.view(batch, steps, per_group, groups, head_dim_v).transpose(2, 3)
        context = context.reshape(batch, steps, heads * head_dim_v)
        return context.transpose(0, 1) if sbhd else context

    def _check_layers(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fmt: str) -> None:
        """TE's forward assertions on the layers' shapes against this module's
        configuration, each naming the argument, the shape the configuration expects and
        the one given: q/k/v 3-D (thd) or 4-D, k and v alike but for the head dim, the
        head dims ``kv_channels``, ``num_gqa_groups / tp_size`` key/value heads. Like TE,
        the query's head count is not fixed (it must be a multiple of the key/value
        heads); the softmax scale comes from ``kv_channels`` alone."""
        want = 3 if fmt == "thd" else 4
        layers = (("query_layer", q), ("key_layer", k), ("value_layer", v))
        for name, t in layers:
            if t.dim() != want:
                raise ValueError(
                    f"{_NAME}: qkv_format {fmt!r} takes {want}-D query, key and value layers; "
                    f"{name} has shape {tuple(t.shape)}"
                )
        if k.shape[:-1] != v.shape[:-1]:
            raise ValueError(
                f"{_NAME}: key_layer {tuple(k.shape)} and value_layer {tuple(v.shape)} must "
                "have the same batch size, sequence length and number of heads"
            )
        groups = self.num_gqa_groups_per_partition
        dk, dv = self.hidden_size_per_attention_head_k, self.hidden_size_per_attention_head_v
        heads = q.shape[-2]
        groups_arg = "num_gqa_groups" if self.tp_size == 1 else "num_gqa_groups / tp_size"
        dk_arg, dv_arg = ("kv_channels",) * 2 if dk == dv else ("kv_channels[0]", "kv_channels[1]")
        expected = (
            ("query_layer", q, heads, dk, dk_arg),
            ("key_layer", k, groups, dk, dk_arg),
            ("value_layer", v, groups, dv, dv_arg),
        )
        for name, t, n, d, dim_arg in expected:
            want_shape = (*t.shape[:-2], n, d)
            if tuple(t.shape) != want_shape:
                why = (
                    f"head_dim = {t.shape[-1]}, but {dim_arg} = {d}"
                    if t.shape[-1] != d
                    else f"{t.shape[-2]} heads, but {groups_arg} = {n}"
                )
                raise ValueError(
                    f"{_NAME}: {name} of shape {tuple(t.shape)}, expected {want_shape}: "
                    f"{why} (module: {self._config()})"
                )
        if heads % groups != 0:
            raise ValueError(
                f"{_NAME}: query_layer {tuple(q.shape)} has {heads} heads, not a multiple of "
                f"the {groups} key/value heads (module: {self._config()})"
            )

    def _config(self) -> str:
        kv = self.hidden_size_per_attention_head_k, self.hidden_size_per_attention_head_v
        channels = kv[0] if kv[0] == kv[1] else kv
        per_partition = f" / tp_size={self.tp_size}" if self.tp_size != 1 else ""
        return (
            f"num_attention_heads={self.num_attention_heads}, num_gqa_groups="
            f"{self.num_gqa_groups}{per_partition}, kv_channels={channels}"
        )

    def extra_repr(self) -> str:
        return (
            f"heads={self.num_attention_heads}, gqa_groups={self.num_gqa_groups}, "
            f"kv_channels=({self.hidden_size_per_attention_head_k}, "
            f"{self.hidden_size_per_attention_head_v}), qkv_format={self.qkv_format}, "
            f"attn_mask_type={self.attn_mask_type}, window_size={self.window_size}"
        )


def _autocast_device(q: torch.Tensor) -> str | None:
    """The device type of an enclosing ``torch.autocast`` that covers ``q``, else None."""
    device = q.device.type
    if autocast_enabled(device):
        return device
    return None


def _unpack_layers(
    query: Any, key: Any, value: Any, qkv: Any, kv: Any, interleave_dim: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v from separate layers or TE's packed ``qkv_layer``/``kv_layer`` (views)."""
    if interleave_dim not in (-3, -2):
        raise ValueError(f"{_NAME}: qkv_interleave_dim {interleave_dim}, expected -3 or -2")
    if qkv is not None:
        if query is not None or key is not None or value is not None or kv is not None:
            raise ValueError(f"{_NAME}: qkv_layer excludes query/key/value_layer and kv_layer")
        query, key, value = qkv.unbind(interleave_dim)
    elif kv is not None:
        if query is None or key is not None or value is not None:
            raise ValueError(f"{_NAME}: kv_layer goes with query_layer alone")
        key, value = kv.unbind(interleave_dim)
    for name, t in (("query_layer", query), ("key_layer", key), ("value_layer", value)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{_NAME}: {name} must be a tensor, got {type(t).__name__}")
    return query, key, value
