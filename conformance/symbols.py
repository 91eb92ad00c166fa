"""What the conformance runner does with each Transformer Engine name that TE's tests use.

Every TE name a test reaches (an import, ``te.X``, ``transformer_engine.common.recipe.X``,
``tex.X``) is classified once, by the longest entry below that is a dotted prefix of
it, then by TE's public names:

* ``MODULES``: a TE module that this package stands in for as a whole
  (``transformer_engine.common.recipe`` -> ``transformer_engine_ops.recipe``).
* ``MAPPED``: one TE object this package offers under another path.
* ``SUPPORT``: a TE test-support helper (an init method, a mask function, the
  teardown of TE's global FP8 state) that the injected ``_teops_te`` module provides;
  the tests pass them to the modules under test, they are not themselves under test.
* ``INTERNAL``: a TE internal: a test that reaches one (in its body, its fixtures,
  its parametrization or a helper it calls) is skipped, the reason naming the entry.
* ``MISSING``: a public TE name this package does not offer whose name would otherwise
  resolve to something else here (``transformer_engine.pytorch.ops`` is TE's
  fusible-op API; ``transformer_engine_ops.ops`` holds this package's op modules). It
  binds a placeholder that fails the test that uses it.
* ``TE_PUBLIC``: the names ``transformer_engine/pytorch/__init__.py`` binds (read at TE
  d0067d0). ``transformer_engine.pytorch.X`` and a deep import of a public name
  (``transformer_engine.pytorch.tensor.float8_tensor.Float8Quantizer``) become
  ``transformer_engine_ops.X``; one this package lacks binds a placeholder that fails
  the test that uses it (a conformance gap, not a skip).

A name none of these covers is an error of the rewrite (the list is fixed: a new TE
commit that reaches a new name needs an entry here).

``INTERNAL_ATTRIBUTES`` are attributes of TE objects (``module.fp8_meta``,
``tensor._data``) that are TE internals wherever they are read (``obj.name`` on a
receiver other than ``self``/``cls``, or ``hasattr``/``getattr``/``setattr`` with the
name as a literal). ``CUDA_ONLY`` are ``torch.cuda`` functions with no CPU
counterpart: on the CPU a test reaching one is skipped, naming it.

Every entry was found by reading the tests it serves (TE's ``tests/pytorch`` at
d0067d0: the eight files of ``DEFAULT_FILES`` and their helpers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# The test files a run takes by default, and the helpers every run copies beside them.
DEFAULT_FILES = (
    "test_sanity.py",
    "test_numerics.py",
    "test_torch_compile.py",
    "test_recipe.py",
    "test_custom_recipe.py",
    "test_deferred_init.py",
    "test_gqa.py",
    "test_qk_norm.py",
)
HELPER_FILES = ("utils.py", "hybrid_quantization_utils.py")

# TE's top-level Python packages: a name rooted here is TE's.
TE_ROOTS = ("transformer_engine", "transformer_engine_torch")

# The modules this package offers in place of TE's.
PACKAGE = "transformer_engine_ops"
TE_PYTORCH = "transformer_engine.pytorch"

MODULES: dict[str, str] = {
    TE_PYTORCH: PACKAGE,
    "transformer_engine.common.recipe": f"{PACKAGE}.recipe",
    # TE's CustomRecipe factories for the built-in recipes (its zoo and reference
    # quantizers stay INTERNAL, below).
    "transformer_engine.pytorch.custom_recipes.quantizer_factories": (
        f"{PACKAGE}.custom_recipes.quantizer_factories"
    ),
    # TE's MoE helpers and fused router, kept under TE's module names.
    "transformer_engine.pytorch.permutation": f"{PACKAGE}.permutation",
    "transformer_engine.pytorch.router": f"{PACKAGE}.router",
}

# TE object -> (this package's module, attribute).
MAPPED: dict[str, tuple[str, str]] = {
    # TE documents its DType as equal, value for value, to the extension's enum and
    # accepts either wherever a DType is taken.
    "transformer_engine_torch.DType": (PACKAGE, "DType"),
    # TE's window check for a mask type; ModelConfig (tests/pytorch/utils.py) calls it.
    "transformer_engine.pytorch.attention.dot_product_attention.utils.check_set_window_size": (
        f"{PACKAGE}.modules.attention",
        "check_set_window_size",
    ),
    # MultiheadAttention(qk_norm_type="L2Normalization")'s q_norm and k_norm: TE builds
    # its fusible L2Normalization op there, this package its L2Normalization module
    # (test_qk_norm.py checks their class).
    "transformer_engine.pytorch.ops.basic.l2normalization.L2Normalization": (
        f"{PACKAGE}.modules.l2normalization",
        "L2Normalization",
    ),
}

# TE test-support helper -> attribute of the injected ``_teops_te`` module.
SUPPORT: dict[str, str] = {
    "transformer_engine.pytorch.quantization.FP8GlobalStateManager.reset": (
        "fp8_global_state_reset"
    ),
    "transformer_engine.pytorch.utils.init_method_normal": "init_method_normal",
    "transformer_engine.pytorch.utils.scaled_init_method_normal": "scaled_init_method_normal",
    "transformer_engine.pytorch.utils.attention_mask_func": "attention_mask_func",
}

_RECIPE_STATE = "TE's per-module recipe state (amax histories, scales, quantizer factories)"
_DPA = "TE's attention backend selection (flash-attn, cuDNN fused, unfused)"
_EXTRA_STATE = "TE's checkpoint extra-state pickling policy"

INTERNAL: dict[str, str] = {
    "transformer_engine_torch": "TE's compiled extension module (tex): its kernels and enums",
    "transformer_engine.pytorch.cpp_extensions.general_gemm": "TE's GEMM over its C++ kernels",
    "transformer_engine.pytorch.cpp_extensions.fused_attn.FusedAttnBackend": _DPA,
    "transformer_engine.pytorch.quantization.FP8GlobalStateManager": (
        "TE's process-global FP8 state (fp8_meta buffers, recompute stash)"
    ),
    "transformer_engine.pytorch.quantization._amax_and_scale_update": _RECIPE_STATE,
    "transformer_engine.pytorch.quantization._default_sf_compute": _RECIPE_STATE,
    "transformer_engine.pytorch.quantization.CustomRecipeState": _RECIPE_STATE,
    "transformer_engine.pytorch.quantization.Float8BlockScalingRecipeState": _RECIPE_STATE,
    "transformer_engine.pytorch.quantization.NVFP4BlockScalingRecipeState": _RECIPE_STATE,
    "transformer_engine.pytorch.quantization.get_align_size_for_quantization": (
        "TE's padding alignment per recipe (Fp8Padding's)"
    ),
    "transformer_engine.pytorch.constants.FP8FwdTensorIdx": "index into TE's fp8_meta tables",
    "transformer_engine.pytorch.constants.FP8BwdTensorIdx": "index into TE's fp8_meta tables",
    "transformer_engine.pytorch._extra_state": _EXTRA_STATE,
    "transformer_engine.pytorch.distributed.is_fp8_activation_recompute_enabled": (
        "TE's activation-recompute phase flags"
    ),
    "transformer_engine.pytorch.distributed.in_fp8_activation_recompute_phase": (
        "TE's activation-recompute phase flags"
    ),
    "transformer_engine.pytorch.module.base.TransformerEngineBaseModule": (
        "TE's module base class (fp8_meta, quantizer tables)"
    ),
    "transformer_engine.pytorch.module.base.get_dummy_wgrad": (
        "TE's cached dummy weight gradient (Megatron's main_grad protocol)"
    ),
    "transformer_engine.pytorch.module.is_module_grouped_tensor_path_supported": (
        "TE's grouped-tensor kernel path switch"
    ),
    "transformer_engine.pytorch.tensor.utils.replace_raw_data": (
        "TE's in-place swap of a quantized tensor's raw buffer"
    ),
    "transformer_engine.pytorch.dynamo": "TE's Dynamo integration (its TensorSpec)",
    "transformer_engine.pytorch.attention.dot_product_attention": _DPA,
    "transformer_engine.pytorch.custom_recipes": (
        "TE's quantizer-factory zoo and reference quantizers for CustomRecipe"
    ),
    "transformer_engine.debug": "TE's debug tooling (nvdlfw_inspect)",
    "transformer_engine.pytorch.ops.basic.basic_linear.BasicLinear._functional_forward": (
        "private functional core of TE's fusible BasicLinear op"
    ),
    "transformer_engine.pytorch.ops.basic.basic_linear.BasicLinear._functional_backward": (
        "private functional core of TE's fusible BasicLinear op"
    ),
}

MISSING: dict[str, str] = {
    "transformer_engine.pytorch.ops": (
        "TE's fusible-op API, which this package does not offer "
        "(transformer_engine_ops.ops holds this package's op modules)"
    ),
}

# Names bound by TE's transformer_engine/pytorch/__init__.py (d0067d0), less private ones.
TE_PUBLIC = frozenset(
    {
        "CudaRNGStatesTracker",
        "CusolverMpCtx",
        "DType",
        "DelayedScalingRequest",
        "DotProductAttention",
        "Float8BlockQuantizer",
        "Float8BlockwiseQTensor",
        "Float8BlockwiseQTensorStorage",
        "Float8CurrentScalingQuantizer",
        "Float8Quantizer",
        "Float8Tensor",
        "Float8TensorStorage",
        "Fp8Padding",
        "Fp8Unpadding",
        "FusedMLAQUpProjRopeQuant",
        "GroupedLinear",
        "HybridQuantizedTensor",
        "HybridQuantizedTensorStorage",
        "HybridQuantizer",
        "IdentityQuantizer",
        "IdentityTensor",
        "IdentityTensorStorage",
        "InferenceParams",
        "LayerNorm",
        "LayerNormLinear",
        "LayerNormMLP",
        "Linear",
        "MXFP8Quantizer",
        "MXFP8Tensor",
        "MXFP8TensorStorage",
        "ManualOffloadSynchronizer",
        "MultiheadAttention",
        "NVFP4Quantizer",
        "NVFP4Tensor",
        "NVFP4TensorStorage",
        "QuantizedTensor",
        "QuantizedTensorStorage",
        "Quantizer",
        "QuantizerRequest",
        "QuantizerRole",
        "RMSNorm",
        "RotaryPositionEmbedding",
        "TransformerLayer",
        "UserBufferQuantizationMode",
        "autocast",
        "checkpoint",
        "deinterleave_glu_tensor",
        "destroy_ub",
        "fp8_autocast",
        "fp8_model_init",
        "get_cpu_offload_context",
        "get_cudnn_version",
        "get_default_recipe",
        "get_device_compute_capability",
        "initialize_ub",
        "interleave_glu_tensor",
        "is_bf16_available",
        "is_fp8_available",
        "is_fp8_block_scaling_available",
        "is_mxfp8_available",
        "is_nvfp4_available",
        "make_graphed_callables",
        "mark_not_offload",
        "moe_permute",
        "moe_permute_and_pad_with_probs",
        "moe_permute_with_probs",
        "moe_sort_chunks_by_index",
        "moe_sort_chunks_by_index_with_probs",
        "moe_unpermute",
        "newton_schulz",
        "onnx_export",
        "parallel_cross_entropy",
        "prepare_for_saving",
        "quantized_model_init",
        "restore_from_func_ctx",
        "restore_from_saved",
        "torch_version",
    }
)

_FP8_META = "TE module's fp8_meta state (amax histories, scales per GEMM slot)"
_STORAGE = "private buffer of TE's quantized tensor layout"
_CUSTOM_STATE = "private state of TE's CustomRecipeState"

INTERNAL_ATTRIBUTES: dict[str, str] = {
    "fp8_meta": _FP8_META,
    "fp8_meta_tensors_initialized": _FP8_META,
    "init_fp8_meta_tensors": _FP8_META,
    "_fp8_metas": _FP8_META,
    "quantizers": "TE module's quantizer table (quantizers['scaling_fwd'][slot])",
    "_get_quantizer": "private accessor of TE's quantized parameter",
    "_high_precision_init_val": "private field of TE's quantized parameter",
    "_data": _STORAGE,
    "_transpose": _STORAGE,
    "_transpose_invalid": _STORAGE,
    "_rowwise_data": _STORAGE,
    "_columnwise_data": _STORAGE,
    "_amax_rowwise": _STORAGE,
    "_dtype": _STORAGE,
    "_row_scaled_nvfp4": _STORAGE,
    "_nvfp4_use_4over6": _STORAGE,
    "_fsdp_logical_mn": _STORAGE,
    "_FSDP_BLOCK_LEN": _STORAGE,
    "_ds_state": _CUSTOM_STATE,
    "_has_delayed_scaling": _CUSTOM_STATE,
    "_inner_delayed_scaling_recipe": _CUSTOM_STATE,
    "_slot_role": _CUSTOM_STATE,
    "_slot_tensor_type": _CUSTOM_STATE,
}

# torch.cuda functions with no CPU counterpart (CUDA graphs, streams, allocator stats).
CUDA_ONLY = frozenset(
    {
        "CUDAGraph",
        "graph",
        "make_graphed_callables",
        "Stream",
        "stream",
        "current_stream",
        "Event",
        "memory_allocated",
        "max_memory_allocated",
        "reset_peak_memory_stats",
        "memory_reserved",
    }
)

# The rule names counted per file (the report explains each).
RULES = {
    "import-module": "a TE module imported as a module of this package",
    "import-name": "a TE name imported from this package",
    "import-support": "a TE test-support helper imported from _teops_te",
    "bind-internal": "a TE internal bound to a placeholder (its tests are skipped)",
    "bind-missing": "a TE name this package does not offer bound to a failing placeholder",
    "drop-namespace-import": "`import transformer_engine` dropped (its references rewritten)",
    "reference": "a TE-qualified reference rewritten to its resolution",
    "device-cuda-call": "`x.cuda()` -> `x.to(_teops_device.DEVICE)`",
    "device-torch-cuda": "`torch.cuda` -> `_teops_device.cuda`",
    "device-literal": '`"cuda"` naming a device -> `_teops_device.DEVICE`',
}


Kind = Literal["module", "mapped", "support", "internal", "missing", "public"]


@dataclass(frozen=True)
class Resolution:
    """How one TE-qualified name resolves: ``key`` is the entry (or the public name's
    TE path) that decided it, a dotted prefix of the name; ``module``/``attr`` say where
    it lives here (``attr`` None for a module); ``reason`` is an internal's or a
    missing name's."""

    kind: Kind
    key: str
    module: str = ""
    attr: str | None = None
    reason: str = ""

    @property
    def target(self) -> str:
        """The dotted path of what stands in for ``key`` here ('' for an internal or a
        missing name, which bind placeholders)."""
        if self.kind in ("internal", "missing"):
            return ""
        return f"{self.module}.{self.attr}" if self.attr else self.module


class Unclassified(LookupError):
    """A TE name that no entry of this module covers."""


def is_te_name(qualified: str) -> bool:
    root = qualified.split(".", 1)[0]
    return root in TE_ROOTS


def resolve(qualified: str) -> Resolution:
    """Classify a TE-qualified name (``transformer_engine.pytorch.quantization.X.y``).
    Raises ``Unclassified`` when nothing covers it."""
    parts = qualified.split(".")
    prefixes = [".".join(parts[: i + 1]) for i in range(len(parts))]
    for prefix in reversed(prefixes):
        if prefix in SUPPORT:
            return Resolution("support", prefix, "_teops_te", SUPPORT[prefix])
        if prefix in MAPPED:
            module, attr = MAPPED[prefix]
            return Resolution("mapped", prefix, module, attr)
        if prefix in INTERNAL:
            return Resolution("internal", prefix, reason=INTERNAL[prefix])
        if prefix in MISSING:
            return Resolution("missing", prefix, reason=MISSING[prefix])
        if prefix in MODULES and prefix != TE_PYTORCH:
            return Resolution("module", prefix, MODULES[prefix])
    if qualified == TE_PYTORCH:
        return Resolution("module", TE_PYTORCH, PACKAGE)
    if qualified.startswith(TE_PYTORCH + "."):
        below = parts[2:]
        for i, name in enumerate(below):
            if name in TE_PUBLIC:
                key = ".".join([*parts[:2], *below[: i + 1]])
                return Resolution("public", key, PACKAGE, name)
    raise Unclassified(qualified)
