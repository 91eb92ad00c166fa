"""``TransformerLayer``: TE 2.20.2's transformer layer from our modules.

``self_attention`` (``MultiheadAttention``, its input norm fused into the QKV GEMM),
``inter_attention`` (cross attention on ``encoder_output``, ``layer_type="decoder"``),
``layernorm_mlp`` (``LayerNormMLP``) and, with ``output_layernorm``, a final
``layernorm``; each sublayer ends in TE's bias-dropout-add
(``residual + dropout(out + bias)``, with ``drop_path`` on the main path). Submodule
names, defaults and the state-dict keys are TE's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import is_grad_enabled, nn

from ..generated.bias_dropout import call_bias_dropout
from ..runtime.boundary import registered_group
from ._base import check_positive, reject_unimplemented
from ._call import cast_to_autocast_dtype, refuse_torch_func
from ._device import default_device
from .layernorm import LayerNorm, RMSNorm
from .layernorm_mlp import LayerNormMLP
from .multi_head_attention import MultiheadAttention, resolve_mask

LAYER_TYPES = ("encoder", "decoder")


class DropPath(nn.Module):
    """TE's stochastic depth: in training, each sample's (dim 0's) branch output is
    dropped with ``drop_prob`` and the kept ones scaled by ``1 / (1 - drop_prob)`` (the
    ``bias_dropout`` op's ``drop_path``, which ``TransformerLayer`` folds into its
    bias-dropout-add)."""

    def __init__(self, drop_prob: float = 0.0) -> None:
        super().__init__()
        self.drop_prob = float(drop_prob)

    def forward(self, hidden_state: torch.Tensor) -> torch.Tensor:
        if self.drop_prob == 0.0 or not self.training:
            return hidden_state
        return call_bias_dropout(
            inp=hidden_state,
            bias=None,
            inp_requires_grad=hidden_state.requires_grad,
            bias_requires_grad=False,
            dropout=0.0,
            drop_path=self.drop_prob,
            training=True,
            is_grad_enabled=is_grad_enabled(),
        )[0]


class TransformerLayer(nn.Module):
    """TE's ``TransformerLayer`` (constructor arguments in TE's order, ``device=None`` is
    TE's ``"cuda"`` where CUDA is available, else the CPU). ``forward(hidden_states, attention_mask=None, ...)``:
    ``[s, b, h]`` (``attn_input_format="sbhd"``) or ``[b, s, h]`` in, the same out."""

    def __init__(
        self,
        hidden_size: int,
        ffn_hidden_size: int,
        num_attention_heads: int,
        num_gqa_groups: int | None = None,
        layernorm_epsilon: float = 1e-5,
        hidden_dropout: float = 0.1,
        attention_dropout: float = 0.1,
        init_method: Callable | None = None,
        output_layer_init_method: Callable | None = None,
        layer_number: int | None = None,
        kv_channels: int | None = None,
        self_attn_mask_type: str = "causal",
        window_size: tuple[int, int] | None = None,
        bottom_right_diagonal: bool | None = None,
        softcap: float = 0.0,
        enc_dec_attn_mask_type: str = "no_mask",
        enc_dec_bottom_right_diagonal: bool | None = None,
        enc_dec_window_size: tuple[int, int] | None = None,
        tp_group: Any = None,
        tp_size: int = 1,
        params_dtype: torch.dtype | None = None,
        get_rng_state_tracker: Callable | None = None,
        fuse_wgrad_accumulation: bool = False,
        seq_length: int | None = None,
        micro_batch_size: int | None = None,
        sequence_parallel: bool = False,
        apply_residual_connection_post_layernorm: bool = False,
        output_layernorm: bool = False,
        parallel_attention_mlp: bool = False,
        layer_type: str = "encoder",
        drop_path_rate: float = 0.0,
        set_parallel_mode: bool = False,
        fuse_qkv_params: bool = False,
        rotary_pos_interleaved: bool = False,
        zero_centered_gamma: bool = False,
        qkv_weight_interleaved: bool = True,
        ub_tp_comm_overlap: bool = False,
        ub_overlap_ag: bool = True,
        ub_overlap_rs: bool = True,
        ub_overlap_rs_dgrad: bool = False,
        ub_bulk_dgrad: bool = True,
        ub_bulk_wgrad: bool = True,
        bias: bool = True,
        activation: str = "gelu",
        activation_params: dict | None = None,
        normalization: str = "LayerNorm",
        device: torch.device | str | None = None,
        attn_input_format: str = "sbhd",
        name: str | None = None,
        qk_norm_type: str | None = None,
        qk_norm_eps: float = 1e-6,
        qk_norm_before_rope: bool = False,
        softmax_type: str = "vanilla",
    ) -> None:
        super().__init__()
        device = default_device(device)  # TE's default: CUDA where available
        cls = type(self).__name__
        # The ub_* flags only matter with ub_tp_comm_overlap (TE ANDs them with it).
        reject_unimplemented(
            cls,
            get_rng_state_tracker=(get_rng_state_tracker, None),
            ub_tp_comm_overlap=(ub_tp_comm_overlap, False),
            softmax_type=(softmax_type, "vanilla"),
        )
        if layer_type not in LAYER_TYPES:
            raise ValueError(f"{cls}: layer_type must be one of {LAYER_TYPES}, got {layer_type!r}")
        if parallel_attention_mlp and (
            layer_type != "encoder" or apply_residual_connection_post_layernorm or output_layernorm
        ):
            raise ValueError(
                f"{cls}: parallel_attention_mlp needs layer_type='encoder' and neither "
                "apply_residual_connection_post_layernorm nor output_layernorm"
            )
        if fuse_wgrad_accumulation and not fuse_qkv_params:
            raise ValueError(
                f"{cls}: fuse_wgrad_accumulation=True requires fuse_qkv_params=True (as in TE)"
            )
        if tp_group is not None:
            tp_size = registered_group(tp_group, f"{cls}.tp_group").size()
        self.self_attn_mask_type = self_attn_mask_type
        self.window_size = window_size
        self.bottom_right_diagonal = bottom_right_diagonal
        self.softcap = softcap
        self.enc_dec_attn_mask_type = enc_dec_attn_mask_type
        self.enc_dec_window_size = enc_dec_window_size
        self.enc_dec_bottom_right_diagonal = enc_dec_bottom_right_diagonal
        resolve_mask(self_attn_mask_type, window_size, bottom_right_diagonal)
        resolve_mask(enc_dec_attn_mask_type, enc_dec_window_size, enc_dec_bottom_right_diagonal)
        params_dtype = params_dtype or torch.get_default_dtype()
        self.layer_number = layer_number
        self.output_layernorm = bool(output_layernorm)
        self.layer_type = layer_type
        self.apply_residual_connection_post_layernorm = bool(
            apply_residual_connection_post_layernorm
        )
        self.parallel_attention_mlp = bool(parallel_attention_mlp)
        check_positive(cls, num_attention_heads=num_attention_heads)
        if num_gqa_groups is not None:
            check_positive(cls, num_gqa_groups=num_gqa_groups)
        self.kv_channels = kv_channels or hidden_size // num_attention_heads  # TE: 0 is unset
        self.tp_group, self.tp_size = tp_group, tp_size
        self.sequence_parallel = tp_size > 1 and bool(sequence_parallel)
        self.seq_length = seq_length
        self.attn_input_format = attn_input_format
        self.hidden_dropout = float(hidden_dropout)
        self.name = name
        attention_args = (
            hidden_size,
            num_attention_heads,
            self.kv_channels,
            attention_dropout,
            layernorm_epsilon,
            init_method,
            output_layer_init_method,
        )
        common: dict[str, Any] = dict(
            layer_number=layer_number,
            tp_group=tp_group,
            tp_size=tp_size,
            num_gqa_groups=num_gqa_groups,
            fuse_wgrad_accumulation=fuse_wgrad_accumulation,
            sequence_parallel=self.sequence_parallel,
            params_dtype=params_dtype,
            return_layernorm_output=apply_residual_connection_post_layernorm,
            set_parallel_mode=set_parallel_mode,
            fuse_qkv_params=fuse_qkv_params,
            zero_centered_gamma=zero_centered_gamma,
            qkv_weight_interleaved=qkv_weight_interleaved,
            rotary_pos_interleaved=rotary_pos_interleaved,
            qkv_format=attn_input_format,
            bias=bias,
            normalization=normalization,
            device=device,
            qk_norm_type=qk_norm_type,
            qk_norm_eps=qk_norm_eps,
            qk_norm_before_rope=qk_norm_before_rope,
        )
        self.self_attention = MultiheadAttention(
            *attention_args,
            **common,
            attn_mask_type=self_attn_mask_type,
            window_size=window_size,
            bottom_right_diagonal=bottom_right_diagonal,
            softcap=softcap,
            input_layernorm=not output_layernorm,
            attention_type="self",
            return_bias=not parallel_attention_mlp,
            name=None if name is None else f"{name}.self_attention",
        )
        if layer_type == "decoder":
            self.inter_attention = MultiheadAttention(
                *attention_args,
                **common,
                attn_mask_type=enc_dec_attn_mask_type,
                window_size=enc_dec_window_size,
                bottom_right_diagonal=enc_dec_bottom_right_diagonal,
                softcap=softcap,
                input_layernorm=True,
                attention_type="cross",
                return_bias=True,
                name=None if name is None else f"{name}.inter_attention",
            )
        self.layernorm_mlp = LayerNormMLP(
            hidden_size,
            ffn_hidden_size,
            eps=layernorm_epsilon,
            fuse_wgrad_accumulation=fuse_wgrad_accumulation,
            tp_group=tp_group,
            tp_size=tp_size,
            init_method=init_method,
            output_layer_init_method=output_layer_init_method,
            bias=bias,
            return_bias=not parallel_attention_mlp,
            sequence_parallel=self.sequence_parallel,
            params_dtype=params_dtype,
            return_layernorm_output=apply_residual_connection_post_layernorm,
            seq_length=None,
            micro_batch_size=None,
            set_parallel_mode=set_parallel_mode,
            zero_centered_gamma=zero_centered_gamma,
            activation=activation,
            activation_params=activation_params,
            normalization=normalization,
            device=device,
            name=None if name is None else f"{name}.layernorm_mlp",
        )
        self.drop_path = DropPath(drop_path_rate) if drop_path_rate > 0.0 else None
        if output_layernorm:
            norm = RMSNorm if normalization == "RMSNorm" else LayerNorm
            self.layernorm = norm(
                hidden_size,
                eps=layernorm_epsilon,
                sequence_parallel=self.sequence_parallel,
                params_dtype=params_dtype,
                zero_centered_gamma=zero_centered_gamma,
                device=device,
            )

    def set_tensor_parallel_group(self, tp_group: Any) -> None:
        """TE's: every submodule communicates over ``tp_group`` from now on."""
        self.tp_group = tp_group
        for child in self.children():
            if hasattr(child, "set_tensor_parallel_group"):
                child.set_tensor_parallel_group(tp_group)

    def reset_parameters(self) -> None:
        """Every submodule's ``reset_parameters`` (after ``device="meta"`` and
        ``to_empty()``)."""
        for child in self.children():
            if hasattr(child, "reset_parameters"):
                child.reset_parameters()

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: Any = None,
        self_attn_mask_type: str | None = None,
        window_size: tuple[int, int] | None = None,
        bottom_right_diagonal: bool | None = None,
        encoder_output: torch.Tensor | None = None,
        enc_dec_attn_mask: Any = None,
        enc_dec_attn_mask_type: str | None = None,
        enc_dec_window_size: tuple[int, int] | None = None,
        enc_dec_bottom_right_diagonal: bool | None = None,
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
    ) -> torch.Tensor:
        refuse_torch_func(self)  # a torch.func transform: a clear error
        cls = type(self).__name__
        if self.sequence_parallel and self.seq_length is not None:
            expected = self.seq_length // self.tp_size
            if hidden_states.shape[0] != expected:
                raise ValueError(
                    f"{cls}: with sequence_parallel, hidden_states.shape[0] must be "
                    f"seq_length // tp_size = {expected}, got {hidden_states.shape[0]}"
                )
        self_type = self.self_attn_mask_type if self_attn_mask_type is None else self_attn_mask_type
        cross_type = (
            self.enc_dec_attn_mask_type
            if enc_dec_attn_mask_type is None
            else enc_dec_attn_mask_type
        )
        for mask, mask_type, what in (
            (attention_mask, self_type, "attention_mask"),
            (enc_dec_attn_mask, cross_type, "enc_dec_attn_mask"),
        ):
            # As TE: a mask the mask type reads (padding, arbitrary) must be boolean.
            if mask is None or not ("padding" in mask_type or mask_type == "arbitrary"):
                continue
            parts = mask if isinstance(mask, (tuple, list)) else (mask,)
            if any(m.dtype != torch.bool for m in parts):
                raise TypeError(
                    f"{cls}: {what} must be boolean tensor(s), got {[m.dtype for m in parts]}"
                )
        # As TE: under torch.autocast the residual stream takes the autocast dtype.
        hidden_states = cast_to_autocast_dtype(hidden_states).contiguous()
        shared: dict[str, Any] = dict(
            is_first_microbatch=is_first_microbatch,
            checkpoint_core_attention=checkpoint_core_attention,
            inference_params=inference_params,
            rotary_pos_emb=rotary_pos_emb,
            core_attention_bias_type=core_attention_bias_type,
            core_attention_bias=core_attention_bias,
            alibi_slopes=alibi_slopes,
            fast_zero_fill=fast_zero_fill,
            pad_between_seqs=pad_between_seqs,
            softcap=softcap,
        )
        attention = self.self_attention(
            hidden_states,
            attention_mask=attention_mask,
            attn_mask_type=self_attn_mask_type,
            window_size=window_size,
            bottom_right_diagonal=bottom_right_diagonal,
            cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_kv=cu_seqlens_q,
            cu_seqlens_q_padded=cu_seqlens_q_padded,
            cu_seqlens_kv_padded=cu_seqlens_q_padded,
            max_seqlen_q=max_seqlen_q,
            max_seqlen_kv=max_seqlen_q,
            thd_attention_policies=thd_attention_policies,
            thd_attention_policy_dispatch=thd_attention_policy_dispatch,
            **shared,
        )
        if self.apply_residual_connection_post_layernorm and not self.output_layernorm:
            out, out_bias, residual = attention
            hidden_states = self._bias_dropout_add(out, out_bias, residual, self.drop_path)
        elif not self.parallel_attention_mlp:
            out, out_bias = attention
            hidden_states = self._bias_dropout_add(out, out_bias, hidden_states, self.drop_path)
        if self.layer_type == "decoder":
            cross = self.inter_attention(
                hidden_states,
                attention_mask=enc_dec_attn_mask,
                encoder_output=encoder_output,
                attn_mask_type=enc_dec_attn_mask_type,
                window_size=enc_dec_window_size,
                bottom_right_diagonal=enc_dec_bottom_right_diagonal,
                cu_seqlens_q=cu_seqlens_q,
                cu_seqlens_kv=cu_seqlens_kv,
                cu_seqlens_q_padded=cu_seqlens_q_padded,
                cu_seqlens_kv_padded=cu_seqlens_kv_padded,
                max_seqlen_q=max_seqlen_q,
                max_seqlen_kv=max_seqlen_kv,
                **shared,
            )
            if self.apply_residual_connection_post_layernorm:
                out, out_bias, residual = cross
            else:
                (out, out_bias), residual = cross, hidden_states
            hidden_states = self._bias_dropout_add(out, out_bias, residual)
        mlp = self.layernorm_mlp(hidden_states, is_first_microbatch=is_first_microbatch)
        if self.apply_residual_connection_post_layernorm:
            out, out_bias, residual = mlp
            output = self._bias_dropout_add(out, out_bias, residual, self.drop_path)
        elif self.parallel_attention_mlp:
            # Attention and MLP read the same input; their sum is the branch output.
            output = self._bias_dropout_add(attention, mlp, hidden_states, self.drop_path)
        else:
            out, out_bias = mlp
            output = self._bias_dropout_add(out, out_bias, hidden_states, self.drop_path)
        if self.output_layernorm:
            output = self.layernorm(output)
        return output

    def _bias_dropout_add(
        self,
        hidden_state: torch.Tensor,
        bias: torch.Tensor | None,
        residual: torch.Tensor,
        drop_path: DropPath | None = None,
    ) -> torch.Tensor:
        """TE's ``residual + drop_path(dropout(hidden_state + bias))``: the part before the
        residual add is the ``bias_dropout`` op whenever it computes anything (a bias,
        dropout in training, stochastic depth in training), so that compiled it keeps
        eager's bits (its bias gradient is a sum over the tokens, its masks come from
        torch's generator); the residual add is one rounding of two stored tensors."""
        has_bias = bias is not None and bias.numel() != 0
        dropout = self.hidden_dropout if self.training else 0.0
        path = drop_path.drop_prob if drop_path is not None and self.training else 0.0
        if has_bias or dropout or path:
            hidden_state = call_bias_dropout(
                inp=hidden_state,
                bias=bias if has_bias else None,
                inp_requires_grad=hidden_state.requires_grad,
                bias_requires_grad=has_bias and bias.requires_grad,
                dropout=dropout,
                drop_path=path,
                training=self.training,
                is_grad_enabled=is_grad_enabled(),
            )[0]
        return residual + hidden_state
