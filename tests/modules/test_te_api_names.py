"""TE's everyday names and arguments: the deprecated aliases, the availability queries,
the classes at top level, ``autocast``/``quantized_model_init``/``checkpoint``'s
arguments, ``Linear.forward(fp8_grad=)`` and ``set_tensor_parallel_group``."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

import transformer_engine_ops as te
from transformer_engine_ops import recipe
from transformer_engine_ops.quantization.float8 import Float8Tensor

TOP_LEVEL = (
    "DType",
    "Float8BlockQuantizer",
    "Float8BlockwiseQTensor",
    "Float8CurrentScalingQuantizer",
    "Float8Quantizer",
    "Float8Tensor",
    "Fp8Padding",
    "Fp8Unpadding",
    "MXFP8Quantizer",
    "MXFP8Tensor",
    "NVFP4Quantizer",
    "NVFP4Tensor",
    "QuantizedTensor",
    "Quantizer",
    "fp8_autocast",
    "fp8_model_init",
    "get_default_recipe",
    "get_device_compute_capability",
    "is_bf16_available",
    "is_fp8_available",
    "is_fp8_block_scaling_available",
    "is_mxfp8_available",
    "is_nvfp4_available",
    "moe_permute",
    "moe_permute_and_pad_with_probs",
    "moe_permute_with_probs",
    "moe_sort_chunks_by_index",
    "moe_sort_chunks_by_index_with_probs",
    "moe_unpermute",
)


def test_top_level_names() -> None:
    for name in TOP_LEVEL:
        assert name in te.__all__ and getattr(te, name) is not None, name
    assert te.Float8Tensor is Float8Tensor
    assert issubclass(te.Float8Tensor, te.QuantizedTensor)
    assert te.DType.kFloat8E4M3 == 7 and te.DType.kFloat8E4M3.torch_dtype == torch.float8_e4m3fn


@pytest.mark.parametrize(
    "query",
    [
        "is_fp8_available",
        "is_mxfp8_available",
        "is_fp8_block_scaling_available",
        "is_nvfp4_available",
    ],
)
def test_format_queries_answer_a_bool_or_a_bool_and_a_reason(query: str) -> None:
    """TE's two forms. On the CPU every format runs, emulated; on CUDA the answers are
    TE's for the device (``test_recipe_availability.py``)."""
    available, reason = getattr(te, query)(return_reason=True)
    assert getattr(te, query)() is available and isinstance(reason, str)
    if not torch.cuda.is_available():
        assert available is True and "emulated on the CPU" in reason


def test_bf16_default_recipe_and_capability() -> None:
    assert te.is_bf16_available() is True or torch.cuda.is_available()
    assert isinstance(te.get_default_recipe(), recipe.Float8CurrentScaling)
    if torch.cuda.is_available():
        assert te.get_device_compute_capability() == torch.cuda.get_device_capability()
    else:  # the CPU runs every format TE runs on Blackwell, emulated
        assert te.get_device_compute_capability() == (10, 0)
        for query in ("is_fp8_available", "is_mxfp8_available", "is_nvfp4_available"):
            assert getattr(te, query)() is True


def test_fp8_autocast_is_autocast_with_a_deprecation_warning() -> None:
    torch.manual_seed(0)
    module = te.Linear(32, 32)
    x = torch.randn(32, 32)
    with te.autocast(recipe=recipe.Float8CurrentScaling()):
        expected = module(x)
    with pytest.warns(DeprecationWarning, match="fp8_autocast is deprecated"):
        context = te.fp8_autocast(enabled=True, fp8_recipe=recipe.Float8CurrentScaling())
    with context:
        got = module(x)
    assert torch.equal(got, expected)
    assert not torch.equal(got, module(x))  # the alias really quantized


def test_fp8_model_init_is_quantized_model_init_with_a_deprecation_warning() -> None:
    with pytest.warns(DeprecationWarning, match="fp8_model_init is deprecated"):
        context = te.fp8_model_init(recipe=recipe.MXFP8BlockScaling())
    with context:
        module = te.Linear(32, 32)
    assert type(module.weight).__name__ == "MXFP8Tensor"


def test_preserve_high_precision_init_val() -> None:
    torch.manual_seed(0)
    reference = te.LayerNormMLP(32, 64)
    torch.manual_seed(0)
    with te.quantized_model_init(
        recipe=recipe.Float8CurrentScaling(), preserve_high_precision_init_val=True
    ):
        module = te.LayerNormMLP(32, 64)
    for name in ("fc1_weight", "fc2_weight"):
        weight = getattr(module, name)
        value = weight.get_high_precision_init_val()
        assert value.device.type == "cpu"
        assert torch.equal(value, getattr(reference, name).detach())
        weight.clear_high_precision_init_val()
        assert weight.get_high_precision_init_val() is None
    with te.quantized_model_init(recipe=recipe.Float8CurrentScaling()):
        plain = te.Linear(32, 32)
    assert not hasattr(plain.weight, "get_high_precision_init_val")


@pytest.mark.parametrize("move", ["cpu", "half", "to_float"])
def test_attributes_of_a_quantized_weight_survive_a_move(move: str) -> None:
    """torch moves a quantized parameter with ``swap_tensors``, which trades its
    ``__dict__``: TE's accessors and a caller's own attributes are attached again,
    reading the kept parameter (TE's test_quantized_param_attrs_survive_apply)."""
    with te.quantized_model_init(
        recipe=recipe.Float8CurrentScaling(), preserve_high_precision_init_val=True
    ):
        module = te.Linear(32, 32)
    expected = module.weight.get_high_precision_init_val()
    module.weight.probe = "attached"
    {"cpu": module.cpu, "half": module.half, "to_float": lambda: module.to(torch.float32)}[move]()
    weight = module.weight
    assert torch.equal(weight.get_high_precision_init_val(), expected)
    assert weight.probe == "attached"
    weight.clear_high_precision_init_val()
    assert weight.get_high_precision_init_val() is None


def test_autocast_te_arguments() -> None:
    torch.manual_seed(0)
    module = te.Linear(32, 32)
    x = torch.randn(32, 32)
    with te.autocast(recipe=recipe.Float8CurrentScaling()):
        expected = module(x)
    # calibrating with a quantized run, or with a stateless recipe, changes nothing.
    with te.autocast(enabled=True, calibrating=True, recipe=recipe.Float8CurrentScaling()):
        assert torch.equal(module(x), expected)
    with te.autocast(enabled=False, calibrating=True, recipe=recipe.Float8CurrentScaling()):
        assert torch.equal(module(x), module(x))
    with te.autocast(recipe=recipe.Float8CurrentScaling(), amax_reduction_group=None):
        assert torch.equal(module(x), expected)
    with te.autocast(enabled=False, calibrating=True, recipe=recipe.DelayedScaling()):
        assert torch.equal(module(x), module(x))  # calibration: tests/modules/test_calibration.py
    with pytest.raises(NotImplementedError, match="_graph=True"):
        te.autocast(_graph=True)


def test_linear_fp8_grad() -> None:
    module = te.Linear(32, 32)
    x = torch.randn(4, 32)
    assert torch.equal(module(x, fp8_grad=False), module(x))
    with pytest.raises(NotImplementedError, match="fp8_grad=True"):
        module(x, fp8_grad=True)


@pytest.mark.parametrize(
    "make",
    [
        lambda: te.Linear(32, 32),
        lambda: te.LayerNormLinear(32, 32),
        lambda: te.LayerNormMLP(32, 64),
        lambda: te.GroupedLinear(2, 32, 32),
    ],
    ids=["Linear", "LayerNormLinear", "LayerNormMLP", "GroupedLinear"],
)
def test_set_tensor_parallel_group(make: Any) -> None:
    module = make()
    module.set_tensor_parallel_group(None)
    assert module.tp_group is None
    with pytest.raises(TypeError, match="tp_group"):
        module.set_tensor_parallel_group("not a group")


class _Tracker:
    """Megatron's/TE's RNG states tracker interface, on a CPU generator."""

    def __init__(self) -> None:
        self.generator = torch.Generator().manual_seed(7)

    def get_states(self) -> dict[str, torch.Tensor]:
        return {"model-parallel-rng": self.generator.get_state()}

    def set_states(self, states: dict[str, torch.Tensor]) -> None:
        self.generator.set_state(states["model-parallel-rng"])


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_checkpoint_megatron_arguments(use_reentrant: bool) -> None:
    """Megatron's call: the tracker's states replay in the recompute (a dropout drawn
    from it gives the forward's mask, so the gradient is the uncheckpointed one); other
    keyword arguments reach the function, as TE's."""
    tracker = _Tracker()
    module = te.Linear(16, 16)
    x = torch.randn(8, 16, requires_grad=True)

    def region(t: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        mask = torch.rand(t.shape, generator=tracker.generator) > 0.5
        return module(t * mask) * scale

    state = tracker.get_states()
    region(x, scale=3.0).sum().backward()
    expected = x.grad.clone()
    x.grad = None
    tracker.set_states(state)
    out = te.checkpoint(
        region,
        x,
        distribute_saved_activations=False,
        get_rng_state_tracker=lambda: tracker,
        tp_group=None,
        use_reentrant=use_reentrant,
        scale=3.0,
    )
    after_forward = tracker.get_states()["model-parallel-rng"]
    out.sum().backward()
    assert torch.equal(x.grad, expected)
    # The recompute leaves the tracker where the forward left it.
    assert torch.equal(tracker.get_states()["model-parallel-rng"], after_forward)
    with pytest.raises(NotImplementedError, match="distribute_saved_activations"):
        te.checkpoint(region, x, distribute_saved_activations=True)


def test_no_warning_from_the_current_names() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with te.autocast(recipe=recipe.Float8CurrentScaling()):
            te.Linear(32, 32)(torch.randn(32, 32))
        with te.quantized_model_init(recipe=recipe.Float8CurrentScaling()):
            te.Linear(32, 32)
