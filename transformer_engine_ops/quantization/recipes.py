"""Recipes, named, ordered and defaulted as in Transformer Engine 2.20.2, each making its
quantizers.

A recipe is a plain, mutable dataclass, as TE's are (``recipe.margin = 1`` and
``recipe.fp4_quant_fwd_inp = QParams()`` work); ``make_quantizer(role)`` returns the
quantizer TE would use for a tensor in that role of a Linear: forward roles ``input``,
``weight``, ``output`` and backward roles ``grad_output``, ``grad_input``,
``grad_weight``. ``te.autocast`` snapshots the recipe's field values at each entry
(modules/autocast.py), so a change between two entries takes effect at the next one.

Every argument TE's recipe takes is accepted under TE's name, in TE's position, with
TE's default (TE reads a few defaults from ``NVTE_*`` environment variables when the
class is defined; so do these). A value this library does not implement raises
``NotImplementedError`` naming the argument; a value TE itself refuses raises
``ValueError``. Nothing is silently ignored. Extensions of this library (``block_len``,
``amax_epsilon``, ``fp8_all_gather``) are keyword-only, after TE's arguments.
"""

from __future__ import annotations

import dataclasses
import enum
import os
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple, Optional, Union

import torch

from ..runtime.values import GemmConfig
from .float8 import MAX_AMAX_HISTORY_LEN, Float8CurrentScalingQuantizer, Float8Quantizer
from .float8_block import MAX_BLOCK_LEN, Float8BlockQuantizer
from .mxfp8 import MXFP8Quantizer
from .nvfp4 import NVFP4Quantizer
from .quantizer import (
    Quantizer,
    check_bool,
    check_choice,
    check_float,
    check_int,
)

__all__ = [
    "BACKWARD_OVERRIDES",
    "ROLES",
    "CustomRecipe",
    "DelayedScaling",
    "DelayedScalingRequest",
    "Float8BlockScaling",
    "Float8CurrentScaling",
    "Format",
    "IdentityQuantizer",
    "MMParams",
    "MXFP8BlockScaling",
    "NVFP4BlockScaling",
    "QParams",
    "QuantizerRequest",
    "QuantizerRole",
    "Recipe",
]

FORWARD_ROLES = ("input", "weight", "output")
BACKWARD_ROLES = ("grad_output", "grad_input", "grad_weight")
ROLES = FORWARD_ROLES + BACKWARD_ROLES
BACKWARD_OVERRIDES = (None, "high_precision", "dequantized")
_NVFP4_4OVER6_SCOPES = ("none", "weights", "activations", "all")
_NVFP4_4OVER6_ERR_MODES = ("MAE", "MSE")

# TE's MMParams: how one GEMM runs (``use_split_accumulator``). One type with the
# GemmConfig value that crosses the op boundary, so a recipe's choice reaches the op.
MMParams = GemmConfig


@dataclasses.dataclass
class QParams:
    """TE's per-role quantization parameters of the NVFP4 recipe (``recipe.QParams``):
    which of TE's NVFP4 techniques a tensor role gets. ``power_2_scale`` and
    ``amax_epsilon`` are TE's fields for other formats; NVFP4 does not read them.
    Mutable as TE's; the values are checked again whenever a recipe reads them."""

    power_2_scale: bool = False
    amax_epsilon: float = 0.0
    random_hadamard_transform: bool = False
    stochastic_rounding: bool = False
    fp4_2d_quantization: bool = False

    def __post_init__(self) -> None:
        self.check(type(self).__name__)
        self.amax_epsilon = float(self.amax_epsilon)

    def check(self, owner: str) -> None:
        """Raise naming ``owner.<field>`` for a field that holds a wrong value (also one
        assigned after construction)."""
        for name in (
            "power_2_scale",
            "random_hadamard_transform",
            "stochastic_rounding",
            "fp4_2d_quantization",
        ):
            check_bool(owner, name, getattr(self, name))
        check_float(owner, "amax_epsilon", self.amax_epsilon)


def _env_flag(name: str, default: str = "0") -> bool:
    return os.getenv(name, default) == "1"


class _FormatHelper(NamedTuple):
    max_fwd: float
    max_bwd: float


class Format(enum.Enum):
    """Element formats per direction, as TE's ``Format``: E2M1 (FP4), E4M3 or E5M2 both
    ways, or HYBRID (E4M3 forward, E5M2 for gradients). Values hold the largest finite
    magnitude forward and backward."""

    E2M1 = _FormatHelper(max_fwd=6, max_bwd=6)
    E4M3 = _FormatHelper(max_fwd=448, max_bwd=448)
    E5M2 = _FormatHelper(max_fwd=57344, max_bwd=57344)
    HYBRID = _FormatHelper(max_fwd=448, max_bwd=57344)

    def dtype_for(self, role: str) -> torch.dtype:
        backward = _check_role(role) in BACKWARD_ROLES
        if self is Format.E2M1:
            raise ValueError("Format.E2M1 is an FP4 format; it has no FP8 dtype")
        if self is Format.E5M2 or (self is Format.HYBRID and backward):
            return torch.float8_e5m2
        return torch.float8_e4m3fn


def _check_role(role: str) -> str:
    if role not in ROLES:
        raise ValueError(f"unknown quantizer role {role!r}; expected one of {ROLES}")
    return role


class Recipe:
    """Base of all recipes; the class queries are TE's."""

    def make_quantizer(self, role: str) -> Quantizer:
        raise NotImplementedError

    def gemm_configs(self) -> tuple[GemmConfig, GemmConfig, GemmConfig]:
        """``(fprop, dgrad, wgrad)`` GEMM configurations."""
        default = GemmConfig()
        return (
            getattr(self, "fp8_gemm_fprop", default),
            getattr(self, "fp8_gemm_dgrad", default),
            getattr(self, "fp8_gemm_wgrad", default),
        )

    @classmethod
    def nvfp4(cls) -> bool:
        return issubclass(cls, NVFP4BlockScaling)

    @classmethod
    def mxfp8(cls) -> bool:
        return issubclass(cls, MXFP8BlockScaling)

    @classmethod
    def delayed(cls) -> bool:
        return issubclass(cls, DelayedScaling)

    @classmethod
    def float8_current_scaling(cls) -> bool:
        return issubclass(cls, Float8CurrentScaling)

    @classmethod
    def float8_per_tensor_scaling(cls) -> bool:
        return issubclass(cls, (DelayedScaling, Float8CurrentScaling))

    @classmethod
    def float8_block_scaling(cls) -> bool:
        return issubclass(cls, Float8BlockScaling)

    @classmethod
    def custom(cls) -> bool:
        return False

    # ----- shared validation -----

    def _owner(self) -> str:
        return type(self).__name__

    def _check_format(self, name: str, allowed: tuple[Format, ...]) -> None:
        value = getattr(self, name)
        if not isinstance(value, Format):
            raise TypeError(f"{self._owner()}: {name} must be a Format, got {value!r}")
        if value not in allowed:
            names = ", ".join(f"Format.{f.name}" for f in allowed)
            raise ValueError(f"{self._owner()}: {name} must be one of {names}, got {value}")

    def _check_common(self) -> None:
        """fp8_dpa, fp8_mha and backward_override, which every TE recipe takes."""
        owner = self._owner()
        for name in ("fp8_dpa", "fp8_mha"):
            if check_bool(owner, name, getattr(self, name)):
                raise NotImplementedError(
                    f"{owner}: {name}=True (FP8 attention) is not implemented by this library; "
                    "DotProductAttention runs in high precision (fp8_dpa=False)"
                )
        check_choice(owner, "backward_override", self.backward_override, BACKWARD_OVERRIDES)

    def _check_gemms(self, *, require_split: bool = False) -> None:
        for name in ("fp8_gemm_fprop", "fp8_gemm_dgrad", "fp8_gemm_wgrad"):
            value = getattr(self, name)
            if not isinstance(value, GemmConfig):
                raise TypeError(
                    f"{self._owner()}: {name} must be an MMParams, got {value!r} "
                    f"({type(value).__name__})"
                )
            check_bool(self._owner(), f"{name}.use_split_accumulator", value.use_split_accumulator)
            if require_split and not value.use_split_accumulator:
                raise ValueError(
                    f"{self._owner()}: {name}.use_split_accumulator must be True "
                    "(split accumulator required)"
                )

    def _set(self, name: str, value: Any) -> None:
        setattr(self, name, value)


@dataclasses.dataclass
class DelayedScaling(Recipe):
    """Per-tensor FP8 with scales from an amax history: stateful, so never value-opaque.

    Each module keeps its own scaling state per tensor role (see ``Linear``). As TE's:
    ``amax_compute_algo`` is ``"max"``, ``"most_recent"`` or a callable ``(amax_history)
    -> amax`` (the history a ``(amax_history_len, 1)`` tensor), and
    ``scaling_factor_compute_algo`` None (``scale = fp8_max / amax / 2**margin``) or a
    callable ``(amax, scale, fp8_max, recipe) -> scale``; both are called at each scale
    update, eagerly."""

    margin: int = 0
    fp8_format: Format = Format.HYBRID
    amax_history_len: int = 1024
    amax_compute_algo: Any = "max"
    scaling_factor_compute_algo: Optional[Any] = None
    reduce_amax: bool = True
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: Optional[str] = os.getenv("NVTE_BACKWARD_OVERRIDE", None)

    def __post_init__(self) -> None:
        owner = self._owner()
        self._set("margin", check_int(owner, "margin", self.margin, 0, 64))
        self._check_format("fp8_format", (Format.E4M3, Format.HYBRID))
        self._set(
            "amax_history_len",
            check_int(owner, "amax_history_len", self.amax_history_len, 1, MAX_AMAX_HISTORY_LEN),
        )
        if not callable(self.amax_compute_algo):
            check_choice(owner, "amax_compute_algo", self.amax_compute_algo, ("max", "most_recent"))
        if self.scaling_factor_compute_algo is not None and not callable(
            self.scaling_factor_compute_algo
        ):
            raise TypeError(
                f"{owner}: scaling_factor_compute_algo must be None or a callable "
                "(amax, scale, fp8_max, recipe) -> scale, got "
                f"{self.scaling_factor_compute_algo!r}"
            )
        # reduce_amax reduces amaxes over an amax-reduction group; this library's
        # autocast takes no such group, so there is nothing to reduce either way.
        check_bool(owner, "reduce_amax", self.reduce_amax)
        self._check_common()
        if self.backward_override is not None:
            raise ValueError(f"{owner}: delayed scaling only supports backward_override=None")

    def make_quantizer(self, role: str) -> Quantizer:
        made = Float8Quantizer(
            fp8_dtype=self.fp8_format.dtype_for(role),
            margin=self.margin,
            amax_history_len=self.amax_history_len,
            amax_compute_algo=self.amax_compute_algo,
            scaling_factor_compute_algo=self.scaling_factor_compute_algo,
        )
        # What a scaling_factor_compute_algo is given as its ``recipe`` (TE's).
        object.__setattr__(made, "_teops_recipe", self)
        return made


@dataclasses.dataclass
class Float8CurrentScaling(Recipe):
    """Per-tensor FP8 with the scale from each tensor's own amax."""

    use_power_2_scales: bool = _env_flag("NVTE_FP8_CURRENT_SCALING_POWER_2_SCALES")
    fp8_format: Format = Format.HYBRID
    fp8_gemm_fprop: GemmConfig = GemmConfig(use_split_accumulator=False)
    fp8_gemm_dgrad: GemmConfig = GemmConfig(use_split_accumulator=True)
    fp8_gemm_wgrad: GemmConfig = GemmConfig(use_split_accumulator=True)
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: Optional[str] = os.getenv("NVTE_BACKWARD_OVERRIDE", None)
    _: dataclasses.KW_ONLY
    amax_epsilon: float = 0.0  # extension: floor of the amax a scale is computed from
    # Extension: sequence-parallel all-gathers move FP8 (True, TE's way) or the
    # high-precision tensor (False); the same results, other bytes (docs/distributed.md).
    fp8_all_gather: bool = True

    def __post_init__(self) -> None:
        owner = self._owner()
        check_bool(owner, "use_power_2_scales", self.use_power_2_scales)
        check_bool(owner, "fp8_all_gather", self.fp8_all_gather)
        self._check_format("fp8_format", (Format.E4M3, Format.HYBRID))
        self._check_gemms()
        self._check_common()
        self._set("amax_epsilon", check_float(owner, "amax_epsilon", self.amax_epsilon))

    def make_quantizer(self, role: str) -> Quantizer:
        return Float8CurrentScalingQuantizer(
            fp8_dtype=self.fp8_format.dtype_for(role),
            force_pow_2_scales=self.use_power_2_scales,
            amax_epsilon=self.amax_epsilon,
            fp8_all_gather=self.fp8_all_gather,
        )


@dataclasses.dataclass
class MXFP8BlockScaling(Recipe):
    """MXFP8: 32-element blocks with E8M0 scales; E4M3 everywhere by default; 32x32
    weight tiles with ``enable_2d_quantization``."""

    margin: int = 0
    fp8_format: Format = Format.E4M3
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: Optional[str] = os.getenv("NVTE_BACKWARD_OVERRIDE", None)
    enable_2d_quantization: bool = False
    _: dataclasses.KW_ONLY
    # Extension: sequence-parallel all-gathers move MXFP8 codes and scales (True, TE's
    # way) or the high-precision tensor (False); the same results (docs/distributed.md).
    fp8_all_gather: bool = True

    def __post_init__(self) -> None:
        owner = self._owner()
        check_bool(owner, "fp8_all_gather", self.fp8_all_gather)
        self._set("margin", check_int(owner, "margin", self.margin, 0, 64))
        if self.margin != 0:
            raise NotImplementedError(f"{owner}: margin={self.margin} is not implemented; use 0")
        self._check_format("fp8_format", (Format.E4M3, Format.HYBRID))
        self._check_common()
        check_bool(owner, "enable_2d_quantization", self.enable_2d_quantization)

    def make_quantizer(self, role: str) -> Quantizer:
        """With ``enable_2d_quantization`` the weight gets 32x32 tiles (as TE's recipe
        state gives its Linear and GroupedLinear weights)."""
        two_d = self.enable_2d_quantization and role == "weight"
        return MXFP8Quantizer(
            fp8_dtype=self.fp8_format.dtype_for(role),
            with_2d_quantization=two_d,
            fp8_all_gather=self.fp8_all_gather,
        )


@dataclasses.dataclass
class Float8BlockScaling(Recipe):
    """FP8 block scaling: 128x128 blocks for weights, 1x128 for activations and grads."""

    use_f32_scales: bool = _env_flag("NVTE_FP8_BLOCK_SCALING_FP32_SCALES")
    fp8_format: Format = Format.E4M3
    x_block_scaling_dim: int = 1
    w_block_scaling_dim: int = 2
    grad_block_scaling_dim: int = 1
    fp8_gemm_fprop: GemmConfig = GemmConfig(use_split_accumulator=True)
    fp8_gemm_dgrad: GemmConfig = GemmConfig(use_split_accumulator=True)
    fp8_gemm_wgrad: GemmConfig = GemmConfig(use_split_accumulator=True)
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: Optional[str] = os.getenv("NVTE_BACKWARD_OVERRIDE", None)
    _: dataclasses.KW_ONLY
    block_len: int = 128  # extension: the block edge (TE's kernels use 128)
    amax_epsilon: float = 0.0  # extension: floor of each block's amax
    # Extension: sequence-parallel all-gathers move codes and scales (True, TE's way)
    # or the high-precision tensor (False); the same results (docs/distributed.md).
    fp8_all_gather: bool = True

    _DIMS: ClassVar[tuple[str, ...]] = (
        "x_block_scaling_dim",
        "w_block_scaling_dim",
        "grad_block_scaling_dim",
    )

    def __post_init__(self) -> None:
        owner = self._owner()
        check_bool(owner, "use_f32_scales", self.use_f32_scales)
        self._check_format("fp8_format", (Format.E4M3, Format.HYBRID))
        for name in self._DIMS:
            self._set(name, check_int(owner, name, getattr(self, name), 1, 2))
        for i, a in enumerate(self._DIMS):
            for b in self._DIMS[i + 1 :]:
                if getattr(self, a) == 2 and getattr(self, b) == 2:
                    raise ValueError(f"{owner}: {a}=2 with {b}=2: 2D by 2D block GEMM")
        self._check_gemms(require_split=True)
        self._check_common()
        self._set("block_len", check_int(owner, "block_len", self.block_len, 1, MAX_BLOCK_LEN))
        self._set("amax_epsilon", check_float(owner, "amax_epsilon", self.amax_epsilon))
        check_bool(owner, "fp8_all_gather", self.fp8_all_gather)

    def make_quantizer(self, role: str) -> Quantizer:
        if _check_role(role) == "weight":
            dim = self.w_block_scaling_dim
        elif role in BACKWARD_ROLES:
            dim = self.grad_block_scaling_dim
        else:
            dim = self.x_block_scaling_dim
        return Float8BlockQuantizer(
            fp8_dtype=self.fp8_format.dtype_for(role),
            block_len=self.block_len,
            block_scaling_dim=dim,
            force_pow_2_scales=not self.use_f32_scales,
            amax_epsilon=self.amax_epsilon,
            fp8_all_gather=self.fp8_all_gather,
        )


@dataclasses.dataclass
class NVFP4BlockScaling(Recipe):
    """NVFP4 everywhere, configured per tensor role as TE 2.20.2 does by default:

    * weights: 16x16 (2-D) blocks (``disable_2d_quantization`` turns them off);
    * inputs (and outputs): the random Hadamard transform on their columnwise data, the
      weight-gradient GEMM's operand (``disable_rht``);
    * gradients: the same transform, and stochastic rounding (``disable_rht``,
      ``disable_stochastic_rounding``), its bits drawn from a (seed, offset) pair each
      module call takes from torch's default generator (docs/quantization.md);
    * ``row_scaled_activation``: the input and output get one amax per row;
    * ``nvfp4_4over6``: the weight and/or activation roles pick map-to-4 or map-to-6 per
      block (``nvfp4_4over6_err_mode``), with the global E4M3 bound 256 where
      ``nvfp4_4over6_e4m3_use_256`` selects them. Both need ``disable_rht=True`` where
      they meet the transform (TE's kernels do not combine them).

    The three roles' parameters are TE's ``fp4_quant_fwd_inp``, ``fp4_quant_fwd_weight``
    and ``fp4_quant_bwd_grad`` (:class:`QParams`), derived from the flags on
    construction; as in TE, a user may replace them afterwards (TE's tests do). They
    are fields (not constructor arguments), so a recipe's value includes them.
    """

    disable_rht: bool = _env_flag("NVTE_NVFP4_DISABLE_RHT")
    disable_stochastic_rounding: bool = _env_flag("NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING")
    disable_2d_quantization: bool = _env_flag("NVTE_NVFP4_DISABLE_2D_QUANTIZATION")
    row_scaled_activation: bool = _env_flag("NVTE_NVFP4_ROW_SCALED_ACTIVATION")
    nvfp4_4over6: str = os.getenv("NVTE_NVFP4_4OVER6", "none")
    nvfp4_4over6_e4m3_use_256: str = os.getenv("NVTE_NVFP4_4OVER6_E4M3_USE_256", "all")
    nvfp4_4over6_err_mode: str = os.getenv("NVTE_NVFP4_4OVER6_ERR_MODE", "MAE").upper()
    fp4_format: Format = Format.E2M1
    fp8_format: Format = Format.E4M3
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: Optional[str] = os.getenv("NVTE_BACKWARD_OVERRIDE", None)
    _: dataclasses.KW_ONLY
    # Extension: sequence-parallel all-gathers move NVFP4 codes and scales (True, TE's
    # way) or the high-precision tensor (False); the same results (docs/distributed.md).
    fp8_all_gather: bool = True
    fp4_quant_fwd_inp: QParams = dataclasses.field(init=False)
    fp4_quant_fwd_weight: QParams = dataclasses.field(init=False)
    fp4_quant_bwd_grad: QParams = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        owner = self._owner()
        for name in (
            "disable_rht",
            "disable_stochastic_rounding",
            "disable_2d_quantization",
            "row_scaled_activation",
            "fp8_all_gather",
        ):
            check_bool(owner, name, getattr(self, name))
        self._check_format("fp4_format", (Format.E2M1,))
        self._check_format("fp8_format", (Format.E4M3,))
        check_choice(owner, "nvfp4_4over6", self.nvfp4_4over6, _NVFP4_4OVER6_SCOPES)
        check_choice(
            owner, "nvfp4_4over6_e4m3_use_256", self.nvfp4_4over6_e4m3_use_256, _NVFP4_4OVER6_SCOPES
        )
        check_choice(
            owner, "nvfp4_4over6_err_mode", self.nvfp4_4over6_err_mode, _NVFP4_4OVER6_ERR_MODES
        )
        self._check_common()
        # TE applies the transform to columnwise data only, for the wgrad GEMM.
        self._set("fp4_quant_fwd_inp", QParams(random_hadamard_transform=not self.disable_rht))
        self._set(
            "fp4_quant_fwd_weight", QParams(fp4_2d_quantization=not self.disable_2d_quantization)
        )
        self._set(
            "fp4_quant_bwd_grad",
            QParams(
                random_hadamard_transform=not self.disable_rht,
                stochastic_rounding=not self.disable_stochastic_rounding,
            ),
        )
        # Fail here, naming the arguments, rather than at the first quantize.
        for role in ("input", "weight"):
            self._check_combination(role)

    def _check_combination(self, role: str) -> None:
        """Refuse what TE's kernels cannot serve: row-scaled or 4over6 data with the
        transform (checked on construction and again by ``make_quantizer``, as the role
        parameters may have been replaced since)."""
        qp = self.qparams(role)
        if qp.random_hadamard_transform and (self._row_scaled(role) or self._uses_4over6(role)):
            what = (
                "row_scaled_activation=True"
                if self._row_scaled(role)
                else f"nvfp4_4over6={self.nvfp4_4over6!r}"
            )
            raise ValueError(
                f"{self._owner()}: {what} with the random Hadamard transform of the {role}: "
                "TE's NVFP4 kernels do not combine them; pass disable_rht=True"
            )

    def _row_scaled(self, role: str) -> bool:
        """TE: forward activation (non-weight) roles, with ``row_scaled_activation``."""
        return self.row_scaled_activation and role in ("input", "output")

    def _uses_4over6(self, role: str) -> bool:
        """TE: the non-gradient roles ``nvfp4_4over6`` selects."""
        if role in BACKWARD_ROLES:
            return False
        scope = "weights" if role == "weight" else "activations"
        return self.nvfp4_4over6 in (scope, "all")

    def _e4m3_max(self, role: str) -> int:
        """256 for the 4over6 roles ``nvfp4_4over6_e4m3_use_256`` selects, else 448."""
        scope = "weights" if role == "weight" else "activations"
        wide = self.nvfp4_4over6_e4m3_use_256 in (scope, "all")
        return 256 if self._uses_4over6(role) and wide else 448

    def qparams(self, role: str) -> QParams:
        """The role's parameters, as TE's recipe state picks them: the weight's, the
        gradients' (every backward role) or the input's (input and output)."""
        if _check_role(role) == "weight":
            name = "fp4_quant_fwd_weight"
        elif role in BACKWARD_ROLES:
            name = "fp4_quant_bwd_grad"
        else:
            name = "fp4_quant_fwd_inp"
        qp = getattr(self, name)
        owner = f"{self._owner()}.{name}"
        if not isinstance(qp, QParams):
            raise TypeError(f"{owner} must be a QParams, got {qp!r} ({type(qp).__name__})")
        qp.check(owner)
        return qp

    def make_quantizer(self, role: str) -> Quantizer:
        self._check_combination(role)
        qp = self.qparams(role)
        return NVFP4Quantizer(
            with_2d_quantization=qp.fp4_2d_quantization,
            with_rht=qp.random_hadamard_transform,
            with_post_rht_amax=qp.random_hadamard_transform,
            stochastic_rounding=qp.stochastic_rounding,
            row_scaled_nvfp4=self._row_scaled(role),
            nvfp4_use_4over6=self._uses_4over6(role),
            nvfp4_e4m3_max=self._e4m3_max(role),
            nvfp4_4over6_err_mode=self.nvfp4_4over6_err_mode,
            fp8_all_gather=self.fp8_all_gather,
        )


@dataclasses.dataclass(frozen=True)
class QuantizerRole:
    """TE's identity of a tensor slot asking a :class:`CustomRecipe` for a quantizer
    (``transformer_engine.pytorch.QuantizerRole``): the module type (``"linear"``,
    ``"grouped_linear"``), what is quantized (``"input"``, ``"weight"``,
    ``"grad_output"``) and the module's ``name`` (``"<name>.fc1"``/``"<name>.fc2"`` for
    LayerNormMLP's GEMMs); empty strings where not known."""

    module_type: str = ""
    tensor_type: str = ""
    name: str = ""

    def __str__(self) -> str:
        parts = [
            f"{field}={value}"
            for field, value in (
                ("module_type", self.module_type),
                ("tensor_type", self.tensor_type),
                ("name", self.name),
            )
            if value
        ]
        return "|".join(parts) if parts else "QuantizerRole()"


@dataclasses.dataclass(frozen=True)
class QuantizerRequest:
    """TE's base of what a :class:`CustomRecipe` factory returns in place of a
    quantizer whose state the module keeps (``transformer_engine.pytorch.
    QuantizerRequest``): each module makes and owns the quantizer, per GEMM."""

    # A request is module state, never a graph constant (modules/autocast.py).
    value_opaque: ClassVar[bool] = False
    not_value_opaque_reason: ClassVar[Optional[str]] = (
        "a CustomRecipe factory's QuantizerRequest is answered by each module's own "
        "stateful quantizer, which runs eagerly"
    )


@dataclasses.dataclass(frozen=True)
class DelayedScalingRequest(QuantizerRequest):
    """TE's request for a delayed-scaling ``Float8Quantizer`` in a :class:`CustomRecipe`
    slot: the module answers it with its own delayed-scaling state, as under
    ``DelayedScaling`` with these arguments (the slot's FP8 dtype from ``fp8_format``
    and its direction), saved in ``_extra_state`` the same way. Every request of one
    module's GEMM must be equal (TE's rule)."""

    fp8_format: Format = Format.HYBRID
    margin: int = 0
    amax_history_len: int = 1024
    amax_compute_algo: Any = "max"
    scaling_factor_compute_algo: Optional[Callable[..., Any]] = None
    reduce_amax: bool = True

    def __post_init__(self) -> None:
        self.recipe()  # TE's checks of these values, naming the argument

    def recipe(self) -> DelayedScaling:
        """The ``DelayedScaling`` recipe of these arguments."""
        return DelayedScaling(
            margin=self.margin,
            fp8_format=self.fp8_format,
            amax_history_len=self.amax_history_len,
            amax_compute_algo=self.amax_compute_algo,
            scaling_factor_compute_algo=self.scaling_factor_compute_algo,
            reduce_amax=self.reduce_amax,
        )


@dataclasses.dataclass(frozen=True)
class IdentityQuantizer:
    """TE's high-precision passthrough (``transformer_engine.pytorch.IdentityQuantizer``):
    ``quantize(x)`` is ``x`` itself (cast to ``dtype`` when given). In a
    :class:`CustomRecipe` slot it means "not quantized": that operand enters its GEMM in
    the activation dtype (``dtype`` must be None there)."""

    _: dataclasses.KW_ONLY
    dtype: Optional[torch.dtype] = None
    rowwise: bool = True
    columnwise: bool = True

    def __post_init__(self) -> None:
        if self.dtype is not None and not (
            isinstance(self.dtype, torch.dtype) and self.dtype.is_floating_point
        ):
            raise TypeError(f"IdentityQuantizer: dtype must be a float dtype, got {self.dtype!r}")
        check_bool("IdentityQuantizer", "rowwise", self.rowwise)
        check_bool("IdentityQuantizer", "columnwise", self.columnwise)

    @property
    def rowwise_usage(self) -> bool:
        return self.rowwise

    @property
    def columnwise_usage(self) -> bool:
        return self.columnwise

    def quantize(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor if self.dtype is None else tensor.to(self.dtype)

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.quantize(tensor)

    def copy(self) -> IdentityQuantizer:
        return dataclasses.replace(self)

    def is_requantization_safe(self) -> bool:
        return True


# What a CustomRecipe slot holds: a quantizer, a module's request, or None (the
# factory's IdentityQuantizer: the operand is not quantized).
SlotQuantizer = Optional[Union[Quantizer, QuantizerRequest]]


@dataclasses.dataclass
class CustomRecipe(Recipe):
    """TE 2.20.2's ``CustomRecipe``: ``qfactory(role)`` returns the quantizer of each
    tensor slot, ``role`` a :class:`QuantizerRole` or None (the slots whose consumer TE
    does not know: a module's output and its input gradient). Each module asks with its
    own roles, as TE's ``get_quantizer_roles`` builds them (see ``modules/_base.py``),
    when it first runs under the recipe's value; the answers are kept per (recipe value,
    roles), as TE keeps a module's recipe state, so the factory is not called per step.

    The factory returns this library's quantizers (``te.Float8CurrentScalingQuantizer``,
    ``te.MXFP8Quantizer``, ``te.Float8BlockQuantizer``, ``te.NVFP4Quantizer``, a
    ``te.Float8Quantizer`` with the caller's scale and amax), TE's
    ``te.IdentityQuantizer()`` for a slot left in high precision, or TE's
    ``te.DelayedScalingRequest`` for a slot under delayed scaling, which each module
    answers with its own state (a stateful slot runs eagerly, as ``DelayedScaling``
    does). None or anything else raises naming the role. Under ``torch.compile`` the
    graph is guarded on the factory's identity, which needs a plain function (``def``
    or ``lambda``); another callable runs its region eagerly (``fullgraph=True`` raises
    naming it). ``fp8_format`` and ``quantization_alignment`` are accepted as TE's (the
    quantizers decide the formats; nothing here pads by the alignment)."""

    qfactory: Callable[..., Any]
    fp8_format: Format = Format.HYBRID
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: Optional[str] = os.getenv("NVTE_BACKWARD_OVERRIDE", None)
    quantization_alignment: int = 128

    def __post_init__(self) -> None:
        owner = self._owner()
        if self.qfactory is None or not callable(self.qfactory):
            raise ValueError(f"{owner} requires `qfactory`, a callable; got {self.qfactory!r}")
        self._check_format("fp8_format", (Format.E4M3, Format.E5M2, Format.HYBRID))
        self._check_common()
        self._set(
            "quantization_alignment",
            check_int(owner, "quantization_alignment", self.quantization_alignment, 1, 2**31),
        )

    @classmethod
    def custom(cls) -> bool:
        return True

    def quantizer_for(self, role: Optional[QuantizerRole]) -> SlotQuantizer:
        """``qfactory(role)``, checked: a quantizer of this library (a sealed copy: the
        factory's caller may change its own), a request, or None for an
        ``IdentityQuantizer``."""
        made = self.qfactory(role)
        where = f"{self._owner()}.qfactory({role})"
        if made is None:
            raise ValueError(
                f"{where} returned None; every slot needs a quantizer (TE's rule: an "
                "intentional high-precision slot returns an IdentityQuantizer)"
            )
        if isinstance(made, IdentityQuantizer):
            if made.dtype is not None:
                raise NotImplementedError(
                    f"{where} returned IdentityQuantizer(dtype={made.dtype}): casting a "
                    "slot's operand to another dtype is not implemented by "
                    "transformer_engine_ops; leave dtype None (the operand enters its GEMM "
                    "in the activation dtype)"
                )
            return None
        if isinstance(made, QuantizerRequest):
            return made
        if not isinstance(made, Quantizer):
            raise NotImplementedError(
                f"{where} returned a {type(made).__module__}.{type(made).__qualname__}; "
                "transformer_engine_ops runs its own quantizers (te.Float8CurrentScalingQuantizer, "
                "te.MXFP8Quantizer, te.Float8BlockQuantizer, te.NVFP4Quantizer, "
                "te.Float8Quantizer), te.IdentityQuantizer and te.DelayedScalingRequest, not "
                "TE's quantizers"
            )
        return made._sealed()

    def make_quantizer(self, role: str) -> SlotQuantizer:  # type: ignore[override]
        """The quantizer of ``role`` for a Linear without a name (TE's roles of an
        unnamed ``te.Linear``; the output and input gradient ask with None)."""
        if _check_role(role) in ("output", "grad_input"):
            return self.quantizer_for(None)
        tensor_type = "grad_output" if role == "grad_weight" else role
        return self.quantizer_for(QuantizerRole("linear", tensor_type, ""))


def compatible_recipe(quantizer: Any) -> Optional[type[Recipe]]:
    """TE's ``quantizer._get_compatible_recipe()``: the recipe class whose quantized
    weights ``quantizer`` makes, None where any recipe may use them."""
    name = getattr(quantizer, "_COMPATIBLE_RECIPE", None)
    recipes = (
        DelayedScaling,
        Float8CurrentScaling,
        Float8BlockScaling,
        MXFP8BlockScaling,
        NVFP4BlockScaling,
    )
    return None if name is None else {r.__name__: r for r in recipes}[name]


def _delayed_scaling_of(quantizer: Float8Quantizer) -> DelayedScaling:
    """The ``DelayedScaling`` of a delayed-scaling quantizer's own settings."""
    fmt = Format.E4M3 if quantizer.fp8_dtype == torch.float8_e4m3fn else Format.HYBRID
    return DelayedScaling(
        margin=quantizer.margin,
        fp8_format=fmt,
        amax_history_len=quantizer.amax_history_len,
        amax_compute_algo=quantizer.amax_compute_algo,
        scaling_factor_compute_algo=quantizer.scaling_factor_compute_algo,
    )


Float8Quantizer.recipe_of_settings = _delayed_scaling_of
