"""TE's ``parameters_split`` for the QKV projections of ``MultiheadAttention``.

TE's ``Linear``/``LayerNormLinear(parameters_split=...)`` keep the output features as
several parameters (``query_weight``, ``key_weight``, ``value_weight`` and their
biases, registered weights first) and concatenate them for the GEMM. ``MultiheadAttention``
builds its projections with it unless ``fuse_qkv_params=True``, so a TE checkpoint
names them that way. Here the split modules are subclasses of ours: the parameters
live under TE's names, and ``weight``/``bias`` (which the parent's forward reads) are
their concatenation, made per call (autograd, and under ``torch.compile`` one ``cat``
node, route each part's gradient back). With column parallelism every part is
sharded on its own, as TE does, so each rank holds its heads' rows of each part.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ._base import full_then_shard, te_default_init, tp_rank
from .autocast import STATE
from .layernorm_linear import LayerNormLinear
from .linear import Linear


def split_names(cls: str, parameters_split: Any, out_features: int) -> dict[str, int]:
    """TE's reading of ``parameters_split``: a dict of name -> size, or names splitting
    ``out_features`` evenly; the sizes must add up to ``out_features``."""
    if isinstance(parameters_split, dict):
        sizes = {str(name).rstrip("_"): int(size) for name, size in parameters_split.items()}
    elif isinstance(parameters_split, (tuple, list)) and parameters_split:
        if not all(isinstance(name, str) for name in parameters_split):
            raise TypeError(f"{cls}: parameters_split names must be strings")
        each = out_features // len(parameters_split)
        sizes = {name.rstrip("_"): each for name in parameters_split}
    else:
        raise ValueError(f"{cls}: parameters_split must be a non-empty dict or tuple of names")
    if sum(sizes.values()) != out_features:
        raise ValueError(
            f"{cls}: parameters_split sizes {list(sizes.values())} do not add up to "
            f"out_features={out_features}"
        )
    return sizes


class SplitWeightsMixin:
    """Holds a GEMM module's weight and bias as TE's named parts; ``weight`` and
    ``bias`` read as their concatenation."""

    weight_names: tuple[str, ...]
    bias_names: tuple[str, ...]

    def _split(self, sizes: dict[str, int], bias: bool, init_method: Any) -> None:
        cls = type(self).__name__
        module: Any = self
        if module.delay_wgrad_compute or module.fuse_wgrad_accumulation:
            raise NotImplementedError(
                f"{cls}: fuse_wgrad_accumulation / delay_wgrad_compute with split QKV "
                "parameters (fuse_qkv_params=False) are not implemented; use "
                "fuse_qkv_params=True (TE's TransformerLayer requires it for "
                "fuse_wgrad_accumulation too)"
            )
        if STATE.model_init is not None and len(sizes) > 1:
            raise NotImplementedError(
                f"{cls}: quantized_model_init with split QKV parameters: a quantized "
                "weight cannot be split into several parameters (TE refuses it too); use "
                "fuse_qkv_params=True"
            )
        column = module.parallel_mode == "column"
        parts = module.tp_size if column else 1
        for name, size in sizes.items():
            if size % parts:
                raise ValueError(
                    f"{cls}: parameters_split part {name!r} of {size} features does not "
                    f"divide over tp_size={parts}"
                )
        self.weight_names = tuple(f"{name}_weight" for name in sizes)
        self.bias_names = tuple(f"{name}_bias" for name in sizes)
        self.__dict__["_teops_split_sizes"] = dict(sizes)
        self.__dict__["_teops_split_init"] = init_method
        whole = module._parameters.pop("weight")
        module._parameters.pop("bias", None)
        module.__dict__.pop("bias", None)
        if len(sizes) == 1:
            # One part: the drawn weight is the part (quantized or not).
            module.register_parameter(self.weight_names[0], whole)
        else:
            for name, weight in zip(self.weight_names, self._draw(whole.device), strict=True):
                module.register_parameter(name, nn.Parameter(weight))
        if bias:
            for name, size in zip(self.bias_names, sizes.values(), strict=True):
                zeros = torch.zeros(size // parts, dtype=module.params_dtype, device=whole.device)
                module.register_parameter(name, nn.Parameter(zeros))

    def _draw(self, device: Any) -> list[torch.Tensor]:
        """Each part's full weight from the init method, then this rank's shard."""
        module: Any = self
        column = module.parallel_mode == "column"
        parts = module.tp_size if column else 1
        rank = tp_rank(module.tp_group, module.tp_size)
        init = self.__dict__["_teops_split_init"] or te_default_init
        return [
            full_then_shard(
                (size, module.in_features), 0, parts, rank, init, module.params_dtype, device
            )
            for size in self.__dict__["_teops_split_sizes"].values()
        ]

    def __getattr__(self, name: str) -> Any:
        if name == "weight":
            weights = [getattr(self, n) for n in self.weight_names]
            return weights[0] if len(weights) == 1 else torch.cat(weights)
        if name == "bias":
            biases = [self._parameters.get(n) for n in self.bias_names]  # type: ignore[attr-defined]
            if biases[0] is None:
                return None
            return biases[0] if len(biases) == 1 else torch.cat(biases)
        return super().__getattr__(name)  # type: ignore[misc]

    def reset_parameters(self) -> None:
        """TE's ``reset_parameters`` per part: each weight drawn again (full, then this
        rank's shard), the biases zeroed, the norm's parameters reset."""
        module: Any = self
        if "layer_norm_weight" in module._parameters:
            module._reset_filled(("layer_norm_weight",), float(not module.zero_centered_gamma))
            module._reset_filled(("layer_norm_bias",), 0.0)
        device = getattr(self, self.weight_names[0]).device
        for name, weight in zip(self.weight_names, self._draw(device), strict=True):
            module._reset_weight(name, weight)
        module._reset_filled(tuple(n for n in self.bias_names if n in module._parameters), 0.0)


class SplitLinear(SplitWeightsMixin, Linear):
    """``Linear(parameters_split=...)`` as TE's."""

    def __init__(self, *args: Any, parameters_split: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        sizes = split_names(type(self).__name__, parameters_split, self.out_features)
        self._split(sizes, kwargs.get("bias", True), kwargs.get("init_method"))


class SplitLayerNormLinear(SplitWeightsMixin, LayerNormLinear):
    """``LayerNormLinear(parameters_split=...)`` as TE's."""

    def __init__(self, *args: Any, parameters_split: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        sizes = split_names(type(self).__name__, parameters_split, self.out_features)
        self._split(sizes, kwargs.get("bias", True), kwargs.get("init_method"))
