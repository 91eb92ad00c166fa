"""``LayerNormLinear``: TE's LayerNorm/RMSNorm + Linear, through the generated op.

The constructor takes TE 2.20.2's arguments in TE's order; parameters are TE's
(``layer_norm_weight``, ``layer_norm_bias``, ``weight``, ``bias``, plus ``_extra_state``).
``device=None`` means TE's ``"cuda"`` where CUDA is available, else the CPU
(``modules/_device.py``).
``forward(inp, is_first_microbatch, fp8_output)`` behaves as ``Linear``'s: the output
quantized by the recipe's output quantizer, and the quantized weight cached across
microbatches (compiled too: one graph per flag value); under ``torch.compile`` the
calls ``Linear`` runs eagerly (a differentiable quantized output) run eagerly here too,
with the reason.
``parallel_mode="row"`` raises ``NotImplementedError``, as in TE 2.20.2.
The recipe is taken as ``Linear`` takes it: its GEMM settings (``fp8_gemm_fprop`` ...),
its ``backward_override`` (the GEMM's backward on the original or dequantized norm output
and weight), and under delayed scaling a ``quantized_model_init`` weight quantized with
the module's own weight quantizer, its scale seeded from the weight's amax.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import is_grad_enabled, is_tensor, nn

from ..generated.layernorm_linear import call_layernorm_linear
from ..quantization.stochastic import rng_state_for
from ..runtime.keep import Keep
from ._base import (
    ExtraStateMixin,
    forward_recipe,
    full_then_shard,
    reject_unimplemented,
    te_default_init,
    tp_rank,
)
from ._call import (
    activation_dtype,
    backward_override_of,
    quantizes_weight,
    recipe_gemm_fields,
    refuse_torch_func,
    refuse_unsupported,
    torch_autocast_on,
    under_torch_autocast,
)
from ._device import default_device
from ._wgrad import WgradScheduling, wgrad_flags
from ._workspace import WeightWorkspace
from .autocast import STATE, CalibrationQuantizers
from .linear import _check_parallelism


def _workspace_fits(fields: dict[str, Any]) -> bool:
    """Whether the cached weight workspace has every usage this call needs: the
    columnwise data the dgrad GEMM reads when a gradient flows into the norm."""
    needs_columnwise = (
        fields["is_grad_enabled"]
        and fields["backward_override"] is None
        and (
            fields["input_requires_grad"]
            or fields["ln_weight_requires_grad"]
            or fields["ln_bias_requires_grad"]
        )
    )
    workspace = fields["weight_workspace"]
    return not needs_columnwise or bool(getattr(workspace, "columnwise_usage", True))


def check_normalization(cls: str, normalization: str) -> None:
    if normalization not in ("LayerNorm", "RMSNorm"):
        raise ValueError(
            f"{cls}: normalization must be 'LayerNorm' or 'RMSNorm', got {normalization!r}"
        )


class LayerNormLinear(ExtraStateMixin, WgradScheduling, nn.Module):
    """``y = norm(x) W^T + b`` with TE's recipes and column parallelism."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        eps: float = 1e-5,
        sequence_parallel: bool = False,
        fuse_wgrad_accumulation: bool = False,
        tp_group: Any = None,
        tp_size: int = 1,
        get_rng_state_tracker: Callable | None = None,
        init_method: Callable | None = None,
        bias: bool = True,
        normalization: str = "LayerNorm",
        return_bias: bool = False,
        params_dtype: torch.dtype | None = None,
        parallel_mode: str | None = None,
        return_layernorm_output: bool = False,
        return_layernorm_output_gathered: bool = False,
        parameters_split: Any = None,
        zero_centered_gamma: bool = False,
        device: torch.device | str | None = None,
        ub_overlap_ag: bool = False,
        ub_overlap_rs: bool = False,
        ub_overlap_rs_dgrad: bool = False,
        ub_bulk_wgrad: bool = False,
        ub_bulk_dgrad: bool = False,
        ub_name: str | None = None,
        delay_wgrad_compute: bool = False,
        symmetric_ar_type: str | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__()
        device = default_device(device)  # TE's default: CUDA where available
        cls = type(self).__name__
        reject_unimplemented(
            cls,
            get_rng_state_tracker=(get_rng_state_tracker, None),
            return_layernorm_output_gathered=(return_layernorm_output_gathered, False),
            parameters_split=(parameters_split, None),
            ub_overlap_ag=(ub_overlap_ag, False),
            ub_overlap_rs=(ub_overlap_rs, False),
            ub_overlap_rs_dgrad=(ub_overlap_rs_dgrad, False),
            ub_bulk_wgrad=(ub_bulk_wgrad, False),
            ub_bulk_dgrad=(ub_bulk_dgrad, False),
            ub_name=(ub_name, None),
            symmetric_ar_type=(symmetric_ar_type, None),
        )
        if parallel_mode == "row":
            # TE 2.20.2 refuses it too: a row-parallel input shards the hidden dimension
            # that the norm normalizes over.
            raise NotImplementedError(
                f"{cls}: parallel_mode='row' is not supported: normalization does not "
                "support tensor-parallel distribution of its input features (as in TE "
                "2.20.2); use parallel_mode='column' or None"
            )
        check_normalization(cls, normalization)
        tp_size = _check_parallelism(
            in_features, out_features, tp_group, tp_size, parallel_mode, cls=cls
        )
        self.name = name
        self._set_wgrad_scheduling(fuse_wgrad_accumulation, delay_wgrad_compute)
        self.in_features, self.out_features = in_features, out_features
        self.eps = float(eps)
        self.normalization = normalization
        self.zero_centered_gamma = bool(zero_centered_gamma)
        self.return_bias = bool(return_bias)
        self.return_layernorm_output = bool(return_layernorm_output)
        self.params_dtype = params_dtype or torch.get_default_dtype()
        self.tp_group, self.tp_size = tp_group, tp_size
        self.parallel_mode = parallel_mode
        self.sequence_parallel = (
            bool(sequence_parallel) and parallel_mode is not None and tp_size > 1
        )
        dtype = self.params_dtype
        self.layer_norm_weight = nn.Parameter(
            torch.full((in_features,), float(not zero_centered_gamma), dtype=dtype, device=device)
        )
        if normalization == "LayerNorm":
            self.layer_norm_bias = nn.Parameter(
                torch.zeros(in_features, dtype=dtype, device=device)
            )
        else:
            self.register_parameter("layer_norm_bias", None)
        parts = tp_size if parallel_mode == "column" else 1
        rank = tp_rank(tp_group, tp_size)
        weight = full_then_shard(
            (out_features, in_features),
            0,
            parts,
            rank,
            init_method or te_default_init,
            dtype,
            device,
        )
        self.out_features_per_partition = out_features // parts
        init = STATE.model_init
        if init is not None:
            weight = self._initial_weight(init, weight)
        self.weight = nn.Parameter(weight)
        if bias:
            self.bias = nn.Parameter(
                torch.zeros(self.out_features_per_partition, dtype=dtype, device=device)
            )
        else:
            self.register_parameter("bias", None)
        # The quantized weight kept across microbatches (``is_first_microbatch``).
        self._weight_cache = WeightWorkspace()
        self._teops_init_methods = (init_method,)

    def reset_parameters(self) -> None:
        """Draw the weights again as the constructor did (``init_method``, else TE's N(0, 0.023); the full
        weight, then this rank's shard) and reset the other parameters to their initial
        values, as TE's ``reset_parameters``: what a module built on ``device="meta"``
        needs after ``to_empty()``; ``quantized_model_init`` weights are quantized again."""
        self._reset_filled(("layer_norm_weight",), float(not self.zero_centered_gamma))
        self._reset_filled(("layer_norm_bias",), 0.0)
        column = self.parallel_mode == "column"
        weight = full_then_shard(
            (self.out_features, self.in_features),
            0,
            self.tp_size if column else 1,
            tp_rank(self.tp_group, self.tp_size),
            self._teops_init_methods[0] or te_default_init,
            self.params_dtype,
            self.weight.device,
        )
        self._reset_weight("weight", weight)
        self._reset_filled(("bias",), 0.0)

    def forward(
        self,
        inp: torch.Tensor,
        is_first_microbatch: bool | None = None,
        fp8_output: bool = False,
        fp8_grad: bool = False,
    ) -> Any:
        refuse_torch_func(self)  # a torch.func transform: a clear error
        if torch_autocast_on(inp):  # TE's rule: cast the input, run with autocast off
            return under_torch_autocast(
                LayerNormLinear.forward, self, inp, is_first_microbatch, fp8_output, fp8_grad
            )
        if fp8_grad:  # TE's quantized input gradient (``type(self)`` only read here)
            reject_unimplemented(f"{type(self).__name__}.forward", fp8_grad=(fp8_grad, False))
        active = forward_recipe(self)
        calibration = None
        if isinstance(active, CalibrationQuantizers):  # TE's calibrating=True
            active, calibration = self._split_calibration(active)
        q: Any = self._stateful_quantizers(active)
        if 0 in self.weight.shape:  # no features: nothing to quantize, the norm runs
            q = None
        refuse_unsupported(q, self.weight)  # a format this CUDA device lacks
        fields = self._op_fields(inp, q, is_first_microbatch, fp8_output)
        keep = None
        if fields["cache_weight"]:
            if is_first_microbatch is False:  # a copy made by this call's quantizer
                fields["weight_workspace"] = self._weight_cache.read(fields["weight_quantizer"])
            if fields["weight_workspace"] is not None and not _workspace_fits(fields):
                fields["weight_workspace"] = None  # remade with every usage this call needs
            if fields["weight_workspace"] is None:
                keep = Keep(
                    (4,),
                    functools.partial(self._keep_weight_workspace, fields["weight_quantizer"]),
                )
        outputs = call_layernorm_linear(**fields, calibration_quantizers=calibration, keep=keep)
        out = outputs[0]
        extra: tuple[Any, ...] = ()
        if self.return_bias:
            extra += (None if self.bias is None else self.bias.to(fields["activation_dtype"]),)
        if self.return_layernorm_output:
            extra += (outputs[1],)
        return (out, *extra) if extra else out

    def _op_fields(
        self,
        inp: torch.Tensor,
        q: Any,
        is_first_microbatch: bool | None,
        fp8_output: bool,
    ) -> dict[str, Any]:
        """This call's ``LayerNormLinearFwdArgs`` fields by name, as
        ``call_layernorm_linear`` takes them (no bundle is built on the compiled path)."""
        dtype = activation_dtype(self, inp, self.params_dtype)
        bias = None if self.return_bias else self.bias
        ln_weight, ln_bias = self.layer_norm_weight, self.layer_norm_bias
        return dict(
            inp=inp,
            ln_weight=ln_weight,
            ln_bias=ln_bias,
            weight=self.weight,
            bias=bias,
            weight_workspace=None,  # read below, by this call's weight quantizer
            input_requires_grad=is_tensor(inp) and inp.requires_grad,
            ln_weight_requires_grad=ln_weight.requires_grad,
            ln_bias_requires_grad=ln_bias is not None and ln_bias.requires_grad,
            weight_requires_grad=self.weight.requires_grad,
            bias_requires_grad=bias is not None and bias.requires_grad,
            normalization=self.normalization,
            eps=self.eps,
            zero_centered_gamma=self.zero_centered_gamma,
            return_layernorm_output=self.return_layernorm_output,
            input_quantizer=q and q.input,
            weight_quantizer=q and q.weight,
            output_quantizer=q and q.output,
            grad_input_quantizer=q and q.grad_input,
            grad_weight_quantizer=q and q.grad_weight,
            grad_output_quantizer=q and q.grad_output,
            activation_dtype=dtype,
            fp8_output=bool(fp8_output),
            backward_override=backward_override_of(q),
            **recipe_gemm_fields(q),
            is_first_microbatch=is_first_microbatch,
            # Caching only means something where this call quantizes the weight.
            cache_weight=is_first_microbatch is not None
            and quantizes_weight(q and q.weight, self.weight),
            parallel_mode=self.parallel_mode,
            tp_group=self.tp_group,
            tp_size=self.tp_size,
            sequence_parallel=self.sequence_parallel,
            in_features=self.in_features,
            out_features=self.out_features,
            is_grad_enabled=is_grad_enabled(),
            sr_rng_state=rng_state_for(
                (q and q.grad_output,),
                inp,
                self.weight.device,
                is_grad_enabled() and backward_override_of(q) is None,
            ),
            **wgrad_flags(self.fuse_wgrad_accumulation, self.delay_wgrad_compute, self.weight),
        )

    def _keep_weight_workspace(self, weight_quantizer: Any, kept: tuple[Any, ...]) -> None:
        """Keep the quantized weight a first microbatch made (the forward's saved value
        4: mu, rsigma, ln_out, GEMM input, GEMM weight); later microbatches
        (``is_first_microbatch=False``) reuse it without quantizing, compiled too
        (written into the kept buffers where an eager call made them)."""
        self._weight_cache.keep(kept[0], weight_quantizer)

    @property
    def _weight_workspace(self) -> Any:
        """The kept quantized weight (None until a caching call made one)."""
        return self._weight_cache.value

    def _wgrad_weights(self) -> tuple[Any, ...]:
        return (self.weight,)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, normalization={self.normalization}"
        )
