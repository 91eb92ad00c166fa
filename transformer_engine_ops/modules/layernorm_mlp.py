"""``LayerNormMLP``: TE's norm -> fc1 -> activation -> fc2 block, through one generated op.

The constructor takes TE 2.20.2's arguments in TE's order; parameters are TE's
(``layer_norm_weight``, ``layer_norm_bias``, ``fc1_weight``, ``fc1_bias``, ``fc2_weight``,
``fc2_bias``, plus ``_extra_state``). ``device=None`` means TE's ``"cuda"`` where CUDA
is available, else the CPU (``modules/_device.py``). With ``set_parallel_mode=True`` fc1
is column- and fc2 row-parallel over ``tp_group``; every rank builds the same full
weights and keeps its shard (for a gated activation, its shard of each half).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import is_grad_enabled, is_tensor, nn

from ..generated.layernorm_mlp import call_layernorm_mlp
from ..ops.layernorm_mlp import (
    ACTIVATIONS,
    GATED,
    LayerNormMLPFwdArgs,
    cached_weights_need_columnwise,
)
from ..quantization.quantizer import QuantizedData
from ..quantization.stochastic import rng_state_for
from ..runtime.keep import Keep
from ..runtime.values import ClampedSwiGLUParams
from ._base import ExtraStateMixin, forward_recipe, reject_unimplemented, te_default_init, tp_rank
from ._call import (
    activation_dtype,
    recipe_gemm_fields,
    refuse_torch_func,
    refuse_unsupported,
    torch_autocast_on,
    under_torch_autocast,
)
from ._device import default_device
from ._wgrad import WgradScheduling, wgrad_flags
from ._workspace import WeightWorkspace
from .autocast import STATE, CalibrationQuantizers, RecipeQuantizers
from .layernorm_linear import check_normalization
from .linear import _check_parallelism


def _lacks_columnwise(workspace: Any) -> bool:
    """Whether a kept weight workspace was made without its columnwise usage."""
    return workspace is not None and not workspace.columnwise_usage


class LayerNormMLP(ExtraStateMixin, WgradScheduling, nn.Module):
    """``y = fc2(act(fc1(norm(x))))`` with TE's recipes and tensor/sequence parallelism."""

    further_gemms = ("fc2",)

    def __init__(
        self,
        hidden_size: int,
        ffn_hidden_size: int,
        eps: float = 1e-5,
        sequence_parallel: bool = False,
        return_bias: bool = False,
        get_rng_state_tracker: Callable | None = None,
        tp_group: Any = None,
        tp_size: int = 1,
        init_method: Callable | None = None,
        bias: bool = True,
        normalization: str = "LayerNorm",
        activation: str = "gelu",
        activation_params: dict | None = None,
        output_layer_init_method: Callable | None = None,
        fuse_wgrad_accumulation: bool = False,
        params_dtype: torch.dtype | None = None,
        return_layernorm_output: bool = False,
        return_layernorm_output_gathered: bool = False,
        seq_length: int | None = None,
        micro_batch_size: int | None = None,
        set_parallel_mode: bool = False,
        zero_centered_gamma: bool = False,
        device: torch.device | str | None = None,
        ub_overlap_ag: bool = False,
        name: str | None = None,
        ub_overlap_rs: bool = False,
        ub_overlap_rs_dgrad: bool = False,
        ub_bulk_dgrad: bool = False,
        ub_bulk_wgrad: bool = False,
        delay_wgrad_compute: bool = False,
        symmetric_ar_type: str | None = None,
        checkpoint: bool = False,
    ) -> None:
        super().__init__()
        device = default_device(device)  # TE's default: CUDA where available
        cls = type(self).__name__
        reject_unimplemented(
            cls,
            get_rng_state_tracker=(get_rng_state_tracker, None),
            return_layernorm_output_gathered=(return_layernorm_output_gathered, False),
            ub_overlap_ag=(ub_overlap_ag, False),
            ub_overlap_rs=(ub_overlap_rs, False),
            ub_overlap_rs_dgrad=(ub_overlap_rs_dgrad, False),
            ub_bulk_dgrad=(ub_bulk_dgrad, False),
            ub_bulk_wgrad=(ub_bulk_wgrad, False),
            symmetric_ar_type=(symmetric_ar_type, None),
        )
        # seq_length and micro_batch_size only size TE's JIT bias-GELU warm-up: accepted,
        # nothing here is warmed up.
        check_normalization(cls, normalization)
        if activation not in ACTIVATIONS:
            raise ValueError(f"{cls}: activation must be one of {ACTIVATIONS}, got {activation!r}")
        self.activation_params = activation_params
        self._activation_params = clamped_swiglu_params(cls, activation, activation_params)
        mode = "column" if set_parallel_mode else None
        tp_size = _check_parallelism(hidden_size, ffn_hidden_size, tp_group, tp_size, mode)
        self.name = name
        self._set_wgrad_scheduling(fuse_wgrad_accumulation, delay_wgrad_compute)
        self.hidden_size, self.ffn_hidden_size = hidden_size, ffn_hidden_size
        self.eps = float(eps)
        self.normalization, self.activation = normalization, activation
        self.zero_centered_gamma = bool(zero_centered_gamma)
        self.return_bias = bool(return_bias)
        self.return_layernorm_output = bool(return_layernorm_output)
        # TE's selective recompute: the forward keeps no activation, the backward
        # recomputes the norm, fc1 and the activation (the op's ``checkpoint``).
        self.checkpoint = bool(checkpoint)
        self.params_dtype = dtype = params_dtype or torch.get_default_dtype()
        self.tp_group, self.tp_size = tp_group, tp_size
        self.set_parallel_mode = bool(set_parallel_mode)
        self.sequence_parallel = bool(sequence_parallel) and self.set_parallel_mode and tp_size > 1
        parts = tp_size if set_parallel_mode else 1
        rank = tp_rank(tp_group, tp_size) if set_parallel_mode else 0  # unsplit: every row
        self.size_per_partition = local = ffn_hidden_size // parts
        self.layer_norm_weight = nn.Parameter(
            torch.full((hidden_size,), float(not zero_centered_gamma), dtype=dtype, device=device)
        )
        if normalization == "LayerNorm":
            self.layer_norm_bias = nn.Parameter(
                torch.zeros(hidden_size, dtype=dtype, device=device)
            )
        else:
            self.register_parameter("layer_norm_bias", None)
        halves = 2 if activation in GATED else 1
        fc1 = torch.empty(halves * ffn_hidden_size, hidden_size, dtype=dtype, device=device)
        (init_method or te_default_init)(fc1)
        # This rank's rows of each half (gate and linear halves of a gated activation).
        fc1 = torch.cat([h.narrow(0, rank * local, local) for h in fc1.chunk(halves, 0)]).clone()
        fc2 = torch.empty(hidden_size, ffn_hidden_size, dtype=dtype, device=device)
        (output_layer_init_method or te_default_init)(fc2)
        fc2 = fc2.narrow(1, rank * local, local).clone()
        init = STATE.model_init
        if init is not None:
            fc1 = self._initial_weight(init, fc1)
            fc2 = self._initial_weight(init, fc2, "fc2")
        # Registered in TE's order: fc1 weight and bias, then fc2's.
        self.fc1_weight = nn.Parameter(fc1)
        if bias:
            self.fc1_bias = nn.Parameter(torch.zeros(halves * local, dtype=dtype, device=device))
        else:
            self.register_parameter("fc1_bias", None)
        self.fc2_weight = nn.Parameter(fc2)
        if bias:
            self.fc2_bias = nn.Parameter(torch.zeros(hidden_size, dtype=dtype, device=device))
        else:
            self.register_parameter("fc2_bias", None)
        # The quantized weights kept across microbatches (``is_first_microbatch``).
        self._fc1_weight_cache = WeightWorkspace()
        self._fc2_weight_cache = WeightWorkspace()
        self._teops_init_methods = (init_method, output_layer_init_method)

    def reset_parameters(self) -> None:
        """Draw the weights again as the constructor did (``init_method`` for fc1 and ``output_layer_init_method`` for fc2,
        else TE's N(0, 0.023); the full
        weight, then this rank's shard) and reset the other parameters to their initial
        values, as TE's ``reset_parameters``: what a module built on ``device="meta"``
        needs after ``to_empty()``; ``quantized_model_init`` weights are quantized again."""
        self._reset_filled(("layer_norm_weight",), float(not self.zero_centered_gamma))
        self._reset_filled(("layer_norm_bias", "fc1_bias", "fc2_bias"), 0.0)
        fc1_init, fc2_init = self._teops_init_methods
        dtype, device = self.params_dtype, self.fc1_weight.device
        halves = 2 if self.activation in GATED else 1
        local, rank = self.size_per_partition, tp_rank(self.tp_group, self.tp_size)
        fc1 = torch.empty(
            halves * self.ffn_hidden_size, self.hidden_size, dtype=dtype, device=device
        )
        (fc1_init or te_default_init)(fc1)
        fc1 = torch.cat([h.narrow(0, rank * local, local) for h in fc1.chunk(halves, 0)]).clone()
        fc2 = torch.empty(self.hidden_size, self.ffn_hidden_size, dtype=dtype, device=device)
        (fc2_init or te_default_init)(fc2)
        self._reset_weight("fc1_weight", fc1)
        self._reset_weight("fc2_weight", fc2.narrow(1, rank * local, local).clone(), "fc2")

    def forward(self, inp: torch.Tensor, is_first_microbatch: bool | None = None) -> Any:
        """TE's ``LayerNormMLP.forward(inp, is_first_microbatch=None)``.

        ``is_first_microbatch``: None quantizes fc1's and fc2's weights on every call;
        True quantizes them and keeps the quantized copies (the weight workspaces);
        False reuses the kept copies without quantizing (the weights must not have
        changed since the first microbatch, as in TE). Inert without a recipe and for
        weights already quantized (``quantized_model_init``). Compiled as for ``Linear``:
        one graph per flag value, reading or writing the kept workspaces.
        """
        refuse_torch_func(self)  # a torch.func transform: a clear error
        if torch_autocast_on(inp):  # TE's rule: cast the input, run with autocast off
            return under_torch_autocast(LayerNormMLP.forward, self, inp, is_first_microbatch)
        shared = forward_recipe(self)
        calibration = None
        if isinstance(shared, CalibrationQuantizers):  # TE's calibrating=True
            shared, calibration = self._split_calibration(shared)
        if self.size_per_partition == 0:  # no hidden features: nothing to quantize
            shared = None
        fields = self._op_fields(inp, shared, is_first_microbatch)
        keep = None
        if fields["cache_weight"]:
            # A kept workspace that lacks a usage this call needs (made under no_grad,
            # now read by a dgrad GEMM) is remade.
            fc1_needs, fc2_needs = cached_weights_need_columnwise(LayerNormMLPFwdArgs(**fields))
            if fc1_needs and _lacks_columnwise(fields["fc1_weight_workspace"]):
                fields["fc1_weight_workspace"] = None
            if fc2_needs and _lacks_columnwise(fields["fc2_weight_workspace"]):
                fields["fc2_weight_workspace"] = None
            keep = Keep(
                (6, 8),
                functools.partial(
                    self._keep_weight_workspaces,
                    fields["fc1_weight_workspace"] is None,
                    fields["fc2_weight_workspace"] is None,
                    fields["fc1_weight_quantizer"],
                    fields["fc2_weight_quantizer"],
                ),
            )
        outputs = call_layernorm_mlp(**fields, calibration_quantizers=calibration, keep=keep)
        extra: tuple[Any, ...] = ()
        if self.return_bias:
            bias = self.fc2_bias
            extra += (None if bias is None else bias.to(fields["activation_dtype"]),)
        if self.return_layernorm_output:
            extra += (outputs[1],)
        return (outputs[0], *extra) if extra else outputs[0]

    def _op_fields(
        self, inp: Any, shared: RecipeQuantizers | None, is_first_microbatch: bool | None
    ) -> dict[str, Any]:
        """This call's ``LayerNormMLPFwdArgs`` fields by name, as ``call_layernorm_mlp``
        takes them (no bundle is built on the compiled path)."""
        # fc1 and fc2 each take their own quantizers: the recipe's, or under delayed
        # scaling each GEMM's own stateful ones (TE keeps FP8 metadata per GEMM).
        if shared is not None and shared.backward_override is not None:
            raise NotImplementedError(
                f"{type(self).__name__}: the recipe's backward_override="
                f"{shared.backward_override!r} is not implemented for LayerNormMLP (nor in "
                "TE 2.20.2); use LayerNormLinear + Linear for a high-precision or "
                "dequantized backward, or backward_override=None"
            )
        q1: Any = self._stateful_quantizers(shared)
        q2: Any = self._stateful_quantizers(shared, "fc2")
        refuse_unsupported(q1, self.fc1_weight)  # a format this CUDA device lacks
        refuse_unsupported(q2, self.fc2_weight)
        dtype = activation_dtype(self, inp, self.params_dtype)
        fc2_bias = None if self.return_bias else self.fc2_bias
        ln_weight, ln_bias = self.layer_norm_weight, self.layer_norm_bias
        fc1_weight, fc1_bias, fc2_weight = self.fc1_weight, self.fc1_bias, self.fc2_weight
        # Weight caching only means something where this call quantizes a weight.
        cache = (
            is_first_microbatch is not None
            and shared is not None
            and not (
                isinstance(fc1_weight, QuantizedData) and isinstance(fc2_weight, QuantizedData)
            )
        )
        later = cache and is_first_microbatch is False
        return dict(
            inp=inp,
            ln_weight=ln_weight,
            ln_bias=ln_bias,
            fc1_weight=fc1_weight,
            fc1_bias=fc1_bias,
            fc2_weight=fc2_weight,
            fc2_bias=fc2_bias,
            # Copies made by this call's own quantizers (another recipe's never).
            fc1_weight_workspace=self._fc1_weight_cache.read(q1.weight) if later else None,
            fc2_weight_workspace=self._fc2_weight_cache.read(q2.weight) if later else None,
            # (also read by a fused wgrad: True overwrites main_grad, as in TE)
            is_first_microbatch=is_first_microbatch
            if cache or self.fuse_wgrad_accumulation or self.delay_wgrad_compute
            else None,
            cache_weight=cache,
            input_requires_grad=is_tensor(inp) and inp.requires_grad,
            ln_weight_requires_grad=ln_weight.requires_grad,
            ln_bias_requires_grad=ln_bias is not None and ln_bias.requires_grad,
            fc1_weight_requires_grad=fc1_weight.requires_grad,
            fc1_bias_requires_grad=fc1_bias is not None and fc1_bias.requires_grad,
            fc2_weight_requires_grad=fc2_weight.requires_grad,
            fc2_bias_requires_grad=fc2_bias is not None and fc2_bias.requires_grad,
            normalization=self.normalization,
            eps=self.eps,
            zero_centered_gamma=self.zero_centered_gamma,
            return_layernorm_output=self.return_layernorm_output,
            activation=self.activation,
            activation_params=self._activation_params,
            fc1_input_quantizer=q1 and q1.input,
            fc1_weight_quantizer=q1 and q1.weight,
            fc1_output_quantizer=q1 and q1.output,
            fc1_grad_input_quantizer=q1 and q1.grad_input,
            fc1_grad_weight_quantizer=q1 and q1.grad_weight,
            fc1_grad_output_quantizer=q1 and q1.grad_output,
            fc2_input_quantizer=q2 and q2.input,
            fc2_weight_quantizer=q2 and q2.weight,
            fc2_output_quantizer=q2 and q2.output,
            fc2_grad_input_quantizer=q2 and q2.grad_input,
            fc2_grad_weight_quantizer=q2 and q2.grad_weight,
            fc2_grad_output_quantizer=q2 and q2.grad_output,
            activation_dtype=dtype,
            **recipe_gemm_fields(q1),
            set_parallel_mode=self.set_parallel_mode,
            tp_group=self.tp_group,
            tp_size=self.tp_size,
            sequence_parallel=self.sequence_parallel,
            hidden_size=self.hidden_size,
            ffn_hidden_size=self.ffn_hidden_size,
            is_grad_enabled=is_grad_enabled(),
            sr_rng_state=rng_state_for(
                (q1 and q1.grad_output, q2 and q2.grad_output),
                inp,
                fc1_weight.device,
                is_grad_enabled(),
            ),
            **wgrad_flags(
                self.fuse_wgrad_accumulation, self.delay_wgrad_compute, fc1_weight, fc2_weight
            ),
            checkpoint=self.checkpoint,
        )

    def _keep_weight_workspaces(
        self,
        fc1_missing: bool,
        fc2_missing: bool,
        fc1_quantizer: Any,
        fc2_quantizer: Any,
        kept: tuple[Any, ...],
    ) -> None:
        """Keep the quantized weights a call made where it had no workspace (the saved
        values 6 and 8, fc1's and fc2's weights, of mu, rsigma, ln_out, fc1_out,
        act_out, fc1 input, fc1 weight, fc2 input, fc2 weight), with every usage they
        were made with, for the later microbatches (compiled too; written into the
        kept buffers where an eager call made them)."""
        fc1, fc2 = kept
        if fc1_missing and fc1 is not None:
            self._fc1_weight_cache.keep(fc1, fc1_quantizer)
        if fc2_missing and fc2 is not None:
            self._fc2_weight_cache.keep(fc2, fc2_quantizer)

    @property
    def _fc1_weight_workspace(self) -> Any:
        """fc1's kept quantized weight (None until a caching call made one)."""
        return self._fc1_weight_cache.value

    @property
    def _fc2_weight_workspace(self) -> Any:
        """fc2's kept quantized weight (None until a caching call made one)."""
        return self._fc2_weight_cache.value

    def _wgrad_weights(self) -> tuple[Any, ...]:
        return (self.fc2_weight, self.fc1_weight)  # TE's backward_dw: fc2's GEMM first

    def extra_repr(self) -> str:
        return (
            f"hidden_size={self.hidden_size}, ffn_hidden_size={self.ffn_hidden_size}, "
            f"activation={self.activation}, normalization={self.normalization}, "
            f"bias={self.fc1_bias is not None}, set_parallel_mode={self.set_parallel_mode}"
        )


def clamped_swiglu_params(
    cls: str, activation: str, params: dict | None
) -> ClampedSwiGLUParams | None:
    """TE's ``activation_params`` as the op's value: clamped_swiglu's ``limit``,
    ``alpha`` and ``glu_linear_offset`` (TE's defaults for those left out). Any other
    activation takes none (TE's kernels take no keyword for them)."""
    if params is None:
        return ClampedSwiGLUParams() if activation == "clamped_swiglu" else None
    if activation != "clamped_swiglu":
        raise ValueError(
            f"{cls}: activation_params={params!r} is only read by activation='clamped_swiglu', "
            f"not activation={activation!r}"
        )
    if not isinstance(params, dict):
        raise TypeError(f"{cls}: activation_params must be a dict, got {type(params).__name__}")
    unknown = sorted(str(k) for k in params if k not in ("limit", "alpha", "glu_linear_offset"))
    if unknown:
        raise ValueError(
            f"{cls}: activation_params has unknown keys {unknown}; clamped_swiglu takes "
            "'limit', 'alpha' and 'glu_linear_offset'"
        )
    try:
        return ClampedSwiGLUParams(**params)
    except TypeError as error:
        raise TypeError(f"{cls}: {error}") from None
