"""``device=None``: TE's CUDA default where CUDA is available, the CPU without it, and
what overrides it (``modules/_device.py``): an explicit device, torch's default device
set by the caller, ``TEOPS_DEFAULT_DEVICE``. Every constructor resolves its device
through that rule (its parameters and buffers land where it says)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import transformer_engine_ops as te
from transformer_engine_ops import recipe
from transformer_engine_ops.modules._device import DEFAULT_DEVICE_ENV, default_device

ENV = DEFAULT_DEVICE_ENV


@pytest.fixture
def no_override(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rule as a program sees it: no ``TEOPS_DEFAULT_DEVICE`` (the suite sets it)."""
    monkeypatch.delenv(ENV, raising=False)


def test_cuda_when_available(no_override: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert default_device(None) == torch.device("cuda", 1)
    assert default_device("cpu") == "cpu"  # an explicit device is used as given
    monkeypatch.setenv(ENV, "cpu")
    assert default_device(None) == torch.device("cpu")
    with torch.device("meta"):  # the caller's default device first
        assert default_device(None) == torch.device("meta")


def test_the_cpu_without_cuda(no_override: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert default_device(None) == torch.device("cpu")
    assert te.Linear(4, 4).weight.device == torch.device("cpu")


def test_a_bad_override_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "gpu0")
    with pytest.raises(ValueError, match="TEOPS_DEFAULT_DEVICE='gpu0' is not a torch device"):
        te.Linear(4, 4)


# Every constructor TE gives ``device`` (and RoPE, whose buffer TE puts on CUDA).
BUILDERS: dict[str, Callable[[], Any]] = {
    "Linear": lambda: te.Linear(32, 32),
    "LayerNormLinear": lambda: te.LayerNormLinear(32, 32),
    "LayerNormMLP": lambda: te.LayerNormMLP(32, 64),
    "GroupedLinear": lambda: te.GroupedLinear(2, 32, 32),
    "LayerNorm": lambda: te.LayerNorm(32),
    "RMSNorm": lambda: te.RMSNorm(32),
    "MultiheadAttention": lambda: te.MultiheadAttention(32, 4, qk_norm_type="RMSNorm"),
    "MultiheadAttention_cross": lambda: te.MultiheadAttention(
        32, 4, attention_type="cross", input_layernorm=True
    ),
    "TransformerLayer": lambda: te.TransformerLayer(32, 64, 4, fuse_qkv_params=True),
    "TransformerLayer_decoder": lambda: te.TransformerLayer(
        32, 64, 4, layer_type="decoder", output_layernorm=True, normalization="RMSNorm"
    ),
    "RotaryPositionEmbedding": lambda: te.RotaryPositionEmbedding(8),
}


def _tensors(module: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    tensors = [*module.named_parameters(), *module.named_buffers()]
    assert tensors, "nothing to place"
    return tensors


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_every_constructor_places_its_tensors_by_the_rule(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Resolved to ``meta`` (which the CPU machine can build), every parameter and buffer
    is there: the constructor, and each submodule it builds, asked the rule."""
    monkeypatch.setenv(ENV, "meta")
    for tensor_name, tensor in _tensors(BUILDERS[name]()):
        assert tensor.device.type == "meta", tensor_name


@pytest.mark.parametrize("name", ["Linear", "LayerNormMLP", "GroupedLinear"])
def test_quantized_model_init_weights_are_placed_by_the_rule(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV, "meta")
    with te.quantized_model_init(recipe=recipe.Float8CurrentScaling()):
        module = BUILDERS[name]()
    for tensor_name, tensor in _tensors(module):
        assert tensor.device.type == "meta", tensor_name


def test_inference_params_cache_is_placed_by_the_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "meta")
    params = te.InferenceParams(2, 16, 2, 8, torch.float32)
    params.allocate_memory(1)
    assert params.device.type == "meta"
    assert all(t.device.type == "meta" for t in params.cache[1])
    assert te.InferenceParams(2, 16, 2, 8, torch.float32, device="cpu").device.type == "cpu"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_modules_built_without_a_device_run_on_cuda_inputs(no_override: None) -> None:
    """TE's ``te.TransformerLayer(...)`` then a CUDA input: the parameters are on the
    current CUDA device, the forward and backward run there."""
    for name, build in BUILDERS.items():
        for tensor_name, tensor in _tensors(build()):
            assert tensor.is_cuda, (name, tensor_name)
    layer = te.TransformerLayer(64, 128, 4, hidden_dropout=0.0, attention_dropout=0.0)
    x = torch.randn(8, 2, 64, device="cuda", requires_grad=True)
    freqs = te.RotaryPositionEmbedding(16)(8)
    layer(x, rotary_pos_emb=freqs).sum().backward()
    assert x.grad is not None and all(p.grad.is_cuda for p in layer.parameters())
    assert te.InferenceParams(2, 16, 4, 16, torch.bfloat16).device.type == "cuda"
