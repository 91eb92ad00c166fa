"""``MultiheadAttention``: TE 2.20.2's attention block from our GEMM modules.

Self attention: ``layernorm_qkv`` (``LayerNormLinear``, with ``input_layernorm``) or
``qkv`` (``Linear``) projects to q, k and v; cross attention: ``layernorm_query`` or
``query_layer`` for q and ``key_value`` (``Linear``) on ``encoder_output`` for k and v.
Then optional q/k norms (``q_norm``, ``k_norm``) and rotary embeddings, the core
attention (``core_attention``, ``DotProductAttention``) and the output projection
``proj`` (``Linear``).
Submodule and parameter names, parameter layouts (``query_weight``/``key_weight``/
``value_weight`` unless ``fuse_qkv_params``; with ``qkv_weight_interleaved`` the fused
rows grouped per KV group as ``[q heads of the group, k, v]``) and the ``_extra_state``
entries are TE's, so a TE checkpoint loads by name. Every recipe quantizes the GEMMs;
the attention itself runs in high precision (TE's default ``fp8_dpa=False``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..ops.attention import ATTN_MASK_TYPES
from ..runtime.boundary import registered_group
from ._base import check_positive, reject_unimplemented
from ._call import refuse_torch_func
from ._device import default_device
from ._split_weights import SplitLayerNormLinear, SplitLinear
from .attention import DotProductAttention, check_set_window_size
from .l2normalization import L2Normalization
from .layernorm import LayerNorm, RMSNorm
from .layernorm_linear import LayerNormLinear, check_normalization
from .linear import Linear
from .rope import apply_rotary_pos_emb

ATTENTION_TYPES = ("self", "cross")
QK_NORMS = ("L2Normalization", "RMSNorm", "LayerNorm")
# A mask type's padding form, which DotProductAttention's KV-cache step requires (TE's
# MultiheadAttention passes its mask type as it is, and TE's attention then asserts one).
_CACHED_MASK_TYPES = {
    "no_mask": "padding",
    "causal": "padding_causal",
    "causal_bottom_right": "padding_causal_bottom_right",
}


def resolve_mask(
    mask_type: str,
    window_size: tuple[int, int] | None,
    bottom_right_diagonal: bool | None,
) -> tuple[tuple[int, int], bool]:
    """TE's per-call reading of the mask arguments: the window the mask type implies,
    and the diagonal it is aligned to (top-left for ``causal``/``padding_causal``,
    bottom-right for the ``*_bottom_right`` types and by default)."""
    if mask_type not in ATTN_MASK_TYPES:
        raise ValueError(f"attn_mask_type must be one of {ATTN_MASK_TYPES}, got {mask_type!r}")
    window = check_set_window_size(mask_type, window_size)
    if mask_type in ("causal", "padding_causal"):
        bottom_right_diagonal = False
    if bottom_right_diagonal is None or mask_type.endswith("bottom_right"):
        bottom_right_diagonal = True
    return window, bool(bottom_right_diagonal)


class MultiheadAttention(nn.Module):
    """TE's ``MultiheadAttention`` (constructor arguments in TE's order; ``device=None``
    is TE's ``"cuda"`` where CUDA is available, else the CPU). ``forward(hidden_states,
    attention_mask=None, encoder_output=None, ...)`` returns the attention output, then
    the projection bias (``return_bias``) and the norm output
    (``return_layernorm_output``)."""

    def __init__(
        self,
        hidden_size: int,
        num_attention_heads: int,
        kv_channels: int | None = None,
        attention_dropout: float = 0.1,
        layernorm_epsilon: float = 1e-5,
        init_method: Callable | None = None,
        output_layer_init_method: Callable | None = None,
        layer_number: int | None = None,
        attn_mask_type: str = "causal",
        window_size: tuple[int, int] | None = None,
        bottom_right_diagonal: bool | None = None,
        softcap: float = 0.0,
        tp_group: Any = None,
        tp_size: int = 1,
        num_gqa_groups: int | None = None,
        fuse_wgrad_accumulation: bool = False,
        get_rng_state_tracker: Callable | None = None,
        sequence_parallel: bool = False,
        params_dtype: torch.dtype | None = None,
        return_bias: bool = False,
        return_layernorm_output: bool = False,
        input_layernorm: bool = False,
        attention_type: str = "self",
        set_parallel_mode: bool = False,
        fuse_qkv_params: bool = False,
        zero_centered_gamma: bool = False,
        qkv_weight_interleaved: bool = True,
        rotary_pos_interleaved: bool = False,
        ub_overlap_ag: bool = False,
        ub_overlap_rs: bool = False,
        ub_overlap_rs_dgrad: bool = False,
        ub_bulk_dgrad: bool = False,
        ub_bulk_wgrad: bool = False,
        bias: bool = True,
        normalization: str = "LayerNorm",
        device: torch.device | str | None = None,
        qkv_format: str = "sbhd",
        name: str | None = None,
        qk_norm_type: str | None = None,
        qk_norm_eps: float = 1e-6,
        qk_norm_before_rope: bool = False,
        seq_length: int | None = None,
        micro_batch_size: int | None = None,
        softmax_type: str = "vanilla",
    ) -> None:
        super().__init__()
        device = default_device(device)  # TE's default: CUDA where available
        cls = type(self).__name__
        reject_unimplemented(
            cls,
            get_rng_state_tracker=(get_rng_state_tracker, None),
            ub_overlap_ag=(ub_overlap_ag, False),
            ub_overlap_rs=(ub_overlap_rs, False),
            ub_overlap_rs_dgrad=(ub_overlap_rs_dgrad, False),
            ub_bulk_dgrad=(ub_bulk_dgrad, False),
            ub_bulk_wgrad=(ub_bulk_wgrad, False),
            softmax_type=(softmax_type, "vanilla"),
        )
        if qk_norm_type is not None and qk_norm_type not in QK_NORMS:
            raise ValueError(  # TE's message
                f"{cls}: Unsupported QK norm type: {qk_norm_type}. "
                f"Supported types: {list(QK_NORMS)}"
            )
        if attention_type not in ATTENTION_TYPES:
            raise ValueError(
                f"{cls}: attention_type must be one of {ATTENTION_TYPES}, got {attention_type!r}"
            )
        if layer_number is not None and layer_number <= 0:
            raise ValueError(f"{cls}: layer_number must be a positive integer, got {layer_number}")
        check_normalization(cls, normalization)
        resolve_mask(attn_mask_type, window_size, bottom_right_diagonal)  # fail early
        if tp_group is not None:
            tp_size = registered_group(tp_group, f"{cls}.tp_group").size()
        check_positive(cls, num_attention_heads=num_attention_heads)
        if num_gqa_groups is not None:
            check_positive(cls, num_gqa_groups=num_gqa_groups)
        if not kv_channels:  # TE: None or 0 is hidden_size // num_attention_heads
            kv_channels = hidden_size // num_attention_heads
            check_positive(cls, **{"hidden_size // num_attention_heads": kv_channels})
        check_positive(cls, kv_channels=kv_channels)
        num_gqa_groups = num_attention_heads if num_gqa_groups is None else num_gqa_groups
        if num_attention_heads % num_gqa_groups:
            raise ValueError(
                f"{cls}: num_attention_heads={num_attention_heads} is not divisible by "
                f"num_gqa_groups={num_gqa_groups}"
            )
        if num_gqa_groups % tp_size or num_attention_heads % tp_size:
            raise ValueError(
                f"{cls}: num_attention_heads={num_attention_heads} and num_gqa_groups="
                f"{num_gqa_groups} must be divisible by tp_size={tp_size}"
            )
        self.hidden_size = hidden_size
        self.qkv_format = qkv_format
        self.attn_mask_type = attn_mask_type
        self.window_size = window_size
        self.bottom_right_diagonal = bottom_right_diagonal
        self.softcap = float(softcap)
        self.layer_number = 1 if layer_number is None else layer_number
        self.input_layernorm = bool(input_layernorm)
        self.attention_type = attention_type
        self.return_bias = bool(return_bias)
        self.return_layernorm_output = bool(return_layernorm_output)
        self.params_dtype = params_dtype or torch.get_default_dtype()
        self.num_attention_heads = num_attention_heads
        self.num_gqa_groups = num_gqa_groups
        self.tp_group, self.tp_size = tp_group, tp_size
        self.sequence_parallel = tp_size > 1 and bool(sequence_parallel)
        self.heads_per_partition = num_attention_heads // tp_size
        self.groups_per_partition = num_gqa_groups // tp_size
        self.hidden_size_per_attention_head = kv_channels
        self.qkv_weight_interleaved = bool(qkv_weight_interleaved) and bool(fuse_qkv_params)
        self.rotary_pos_interleaved = bool(rotary_pos_interleaved)
        self.qk_norm_before_rope = bool(qk_norm_before_rope)
        self.name = name
        q_size, kv_size = kv_channels * num_attention_heads, kv_channels * num_gqa_groups
        gemm: dict[str, Any] = dict(
            fuse_wgrad_accumulation=fuse_wgrad_accumulation,
            tp_group=tp_group,
            tp_size=tp_size,
            sequence_parallel=sequence_parallel,
            params_dtype=self.params_dtype,
            device=device,
        )
        norm_dtype = params_dtype
        if qk_norm_type == "L2Normalization":
            # Parameter-free: one module serves query and key, as TE's.
            self.q_norm = self.k_norm = L2Normalization(
                eps=qk_norm_eps, seq_length=seq_length, micro_batch_size=micro_batch_size
            )
        elif qk_norm_type is not None:
            norm = RMSNorm if qk_norm_type == "RMSNorm" else LayerNorm
            self.q_norm: nn.Module | None = norm(
                kv_channels, eps=qk_norm_eps, device=device, params_dtype=norm_dtype
            )
            self.k_norm: nn.Module | None = norm(
                kv_channels, eps=qk_norm_eps, device=device, params_dtype=norm_dtype
            )
        else:
            self.q_norm = self.k_norm = None
        column = "column" if set_parallel_mode else None
        ln: dict[str, Any] = dict(
            eps=layernorm_epsilon,
            return_layernorm_output=return_layernorm_output,
            zero_centered_gamma=zero_centered_gamma,
            normalization=normalization,
        )
        if attention_type == "self":
            sizes = {"query": q_size, "key": kv_size, "value": kv_size}
            out = q_size + 2 * kv_size
            if input_layernorm:
                self.layernorm_qkv = self._gemm(
                    LayerNormLinear, SplitLayerNormLinear, fuse_qkv_params, sizes,
                    hidden_size, out, init_method, bias, column, gemm, ln,
                )  # fmt: skip
            else:
                self.qkv = self._gemm(
                    Linear, SplitLinear, fuse_qkv_params, sizes,
                    hidden_size, out, init_method, bias, column, gemm, {},
                )  # fmt: skip
        else:
            if input_layernorm:
                self.layernorm_query = self._gemm(
                    LayerNormLinear, SplitLayerNormLinear, fuse_qkv_params, ("query",),
                    hidden_size, q_size, init_method, bias, column, gemm, ln,
                )  # fmt: skip
            else:
                self.query_layer = Linear(
                    hidden_size, q_size, init_method=init_method, bias=bias,
                    parallel_mode=column, **gemm,
                )  # fmt: skip
            self.key_value = self._gemm(
                Linear, SplitLinear, fuse_qkv_params, ("key", "value"),
                hidden_size, 2 * kv_size, init_method, bias, column, gemm, {},
            )  # fmt: skip
        self.core_attention = DotProductAttention(
            num_attention_heads,
            kv_channels,
            num_gqa_groups=num_gqa_groups,
            attention_dropout=attention_dropout,
            qkv_format=qkv_format,
            attn_mask_type=attn_mask_type,
            window_size=window_size,
            bottom_right_diagonal=bottom_right_diagonal,
            softcap=softcap,
            sequence_parallel=sequence_parallel,
            tp_size=tp_size,
            tp_group=tp_group,
            layer_number=self.layer_number,
            attention_type=attention_type,
            name=None if name is None else f"{name}.core_attention",
        )
        self.proj = Linear(
            q_size,
            hidden_size,
            init_method=output_layer_init_method,
            bias=bias,
            return_bias=return_bias,
            parallel_mode="row" if set_parallel_mode else None,
            **gemm,
        )

    @staticmethod
    def _gemm(
        fused: type,
        split: type,
        fuse_qkv_params: bool,
        parts: Any,
        hidden_size: int,
        out: int,
        init_method: Any,
        bias: bool,
        parallel_mode: str | None,
        gemm: dict[str, Any],
        ln: dict[str, Any],
    ) -> nn.Module:
        kwargs = dict(init_method=init_method, bias=bias, parallel_mode=parallel_mode, **gemm, **ln)
        if fuse_qkv_params:
            return fused(hidden_size, out, **kwargs)
        return split(hidden_size, out, parameters_split=parts, **kwargs)

    def set_tensor_parallel_group(self, tp_group: Any) -> None:
        """TE's: every GEMM submodule communicates over ``tp_group`` from now on."""
        self.tp_group = tp_group
        for child in self.children():
            if hasattr(child, "set_tensor_parallel_group"):
                child.set_tensor_parallel_group(tp_group)

    def reset_parameters(self) -> None:
        """Every submodule's ``reset_parameters`` (what ``device="meta"`` and
        ``to_empty()`` need)."""
        for child in self.children():
            if hasattr(child, "reset_parameters"):
                child.reset_parameters()

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: Any = None,
        encoder_output: torch.Tensor | None = None,
        attn_mask_type: str | None = None,
        window_size: tuple[int, int] | None = None,
        bottom_right_diagonal: bool | None = None,
        is_first_microbatch: bool | None = None,
        checkpoint_core_attention: bool = False,
        inference_params: Any = None,
        rotary_pos_emb: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None = None,
        core_attention_bias_type: str = "no_bias",
        core_attention_bias: torch.Tensor | None = None,
        alibi_slopes: torch.Tensor | None = None,
        cu_seqlens_q: torch.Tensor | None = None,
        cu_seqlens_kv: torch.Tensor | None = None,
        cu_seqlens_q_padded: torch.Tensor | None = None,
        cu_seqlens_kv_padded: torch.Tensor | None = None,
        max_seqlen_q: int | None = None,
        max_seqlen_kv: int | None = None,
        fast_zero_fill: bool = True,
        pad_between_seqs: bool | None = None,
        thd_attention_policies: Any = None,
        thd_attention_policy_dispatch: str = "auto",
        softcap: float | None = None,
    ) -> Any:
        refuse_torch_func(self)  # a torch.func transform: a clear error
        cls = type(self).__name__
        reject_unimplemented(
            f"{cls}.forward",
            thd_attention_policies=(thd_attention_policies, None),
        )
        mask_type = self.attn_mask_type if attn_mask_type is None else attn_mask_type
        window, bottom_right = resolve_mask(
            mask_type,
            self.window_size if window_size is None else window_size,
            self.bottom_right_diagonal if bottom_right_diagonal is None else bottom_right_diagonal,
        )
        softcap = self.softcap if softcap is None else softcap
        layernorm_output = None
        head_dim = self.hidden_size_per_attention_head
        if self.attention_type == "self":
            if self.input_layernorm:
                mixed = self.layernorm_qkv(hidden_states, is_first_microbatch=is_first_microbatch)
                if self.return_layernorm_output:
                    mixed, layernorm_output = mixed
            else:
                mixed = self.qkv(hidden_states, is_first_microbatch=is_first_microbatch)
            query, key, value = self._split_qkv(mixed)
        else:
            if encoder_output is None:
                raise ValueError(f"{cls}: attention_type='cross' needs encoder_output")
            mixed_kv = self.key_value(encoder_output, is_first_microbatch=is_first_microbatch)
            groups = self.groups_per_partition
            if self.qkv_weight_interleaved:
                mixed_kv = mixed_kv.view(*mixed_kv.shape[:-1], groups, 2 * head_dim)
                key, value = mixed_kv.split(head_dim, dim=-1)
            else:
                mixed_kv = mixed_kv.view(*mixed_kv.shape[:-1], 2 * groups, head_dim)
                key, value = mixed_kv.split(groups, dim=-2)
            if self.input_layernorm:
                query = self.layernorm_query(hidden_states, is_first_microbatch=is_first_microbatch)
                if self.return_layernorm_output:
                    query, layernorm_output = query
            else:
                query = self.query_layer(hidden_states, is_first_microbatch=is_first_microbatch)
            query = query.view(*query.shape[:-1], self.heads_per_partition, head_dim)
        if self.q_norm is not None and self.qk_norm_before_rope:
            query, key = self.q_norm(query), self.k_norm(key)  # type: ignore[misc]
        if rotary_pos_emb is not None:
            q_freqs, k_freqs = (
                rotary_pos_emb if isinstance(rotary_pos_emb, tuple) else (rotary_pos_emb,) * 2
            )
            padded = bool(pad_between_seqs)
            rope: dict[str, Any] = dict(fused=True, interleaved=self.rotary_pos_interleaved)
            if inference_params is not None:
                rope["start_positions"] = inference_params.get_seqlens_pre_step()
            query = apply_rotary_pos_emb(
                query,
                q_freqs,
                self.qkv_format,
                cu_seqlens=cu_seqlens_q_padded if padded else cu_seqlens_q,
                **rope,
            )
            key = apply_rotary_pos_emb(
                key,
                k_freqs,
                self.qkv_format,
                cu_seqlens=cu_seqlens_kv_padded if padded else cu_seqlens_kv,
                **rope,
            )
        if self.q_norm is not None and not self.qk_norm_before_rope:
            query, key = self.q_norm(query), self.k_norm(key)  # type: ignore[misc]
        if inference_params is not None:
            if self.attention_type == "cross":
                raise NotImplementedError(
                    f"{cls}: inference_params with attention_type='cross' is not "
                    "implemented (the KV cache holds self attention's keys and values)"
                )
            if self.layer_number not in inference_params.cache:  # as TE's
                inference_params.allocate_memory(self.layer_number)
            # The cache's lengths are the padding: DotProductAttention's KV-cache step
            # (TE's) takes the padding form of the mask type.
            context = self.core_attention(
                query,
                key,
                value,
                qkv_format=self.qkv_format,
                attn_mask_type=_CACHED_MASK_TYPES.get(mask_type, mask_type),
                window_size=window,
                softcap=softcap,
                core_attention_bias_type=core_attention_bias_type,
                alibi_slopes=alibi_slopes,
                inference_params=inference_params,
                checkpoint_core_attention=checkpoint_core_attention,
            )
        else:
            context = self.core_attention(
                query,
                key,
                value,
                attention_mask=attention_mask,
                qkv_format=self.qkv_format,
                cu_seqlens_q=cu_seqlens_q,
                cu_seqlens_kv=cu_seqlens_kv,
                cu_seqlens_q_padded=cu_seqlens_q_padded,
                cu_seqlens_kv_padded=cu_seqlens_kv_padded,
                max_seqlen_q=max_seqlen_q,
                max_seqlen_kv=max_seqlen_kv,
                attn_mask_type=mask_type,
                window_size=window,
                bottom_right_diagonal=bottom_right,
                softcap=softcap,
                core_attention_bias_type=core_attention_bias_type,
                core_attention_bias=core_attention_bias,
                alibi_slopes=alibi_slopes,
                fast_zero_fill=fast_zero_fill,
                pad_between_seqs=pad_between_seqs,
                checkpoint_core_attention=checkpoint_core_attention,
            )
        projected = self.proj(context, is_first_microbatch=is_first_microbatch)
        outputs = projected if self.return_bias else (projected,)
        if self.input_layernorm and self.return_layernorm_output:
            outputs = (*outputs, layernorm_output)
        return outputs if len(outputs) > 1 else outputs[0]

    def _split_qkv(self, mixed: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """q ``[..., heads, d]``, k and v ``[..., groups, d]`` from the QKV projection:
        per KV group ``[q heads, k, v]`` (interleaved) or ``[all q, all k, all v]``."""
        groups, head_dim = self.groups_per_partition, self.hidden_size_per_attention_head
        per_group = self.heads_per_partition // groups
        lead = mixed.shape[:-1]
        if self.qkv_weight_interleaved:
            mixed = mixed.view(*lead, groups, per_group + 2, head_dim)
            split_dim = -2
        else:
            mixed = mixed.view(*lead, per_group + 2, groups, head_dim)
            split_dim = -3
        query, key, value = mixed.split((per_group, 1, 1), dim=split_dim)
        # Head counts written out: a -1 is ambiguous for an empty batch.
        heads = (groups * per_group, groups, groups)
        return tuple(
            t.reshape(*lead, n, head_dim) for t, n in zip((query, key, value), heads, strict=True)
        )

    def extra_repr(self) -> str:
        return (
            f"attention_type={self.attention_type}, heads={self.num_attention_heads}, "
            f"gqa_groups={self.num_gqa_groups}, qkv_format={self.qkv_format}"
        )
