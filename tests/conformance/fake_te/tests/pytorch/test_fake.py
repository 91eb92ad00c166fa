"""A fake TE test file (a fixture of tests/conformance, written for it): each test
exercises one rule of the conformance runner."""

import pytest
import torch

import transformer_engine.pytorch as te
import transformer_engine_torch as tex
from transformer_engine.common import recipe
from transformer_engine.pytorch import Linear, CudaRNGStatesTracker
from transformer_engine.pytorch.module.base import TransformerEngineBaseModule
from transformer_engine.pytorch.quantization import FP8GlobalStateManager
from transformer_engine.pytorch.utils import init_method_normal
from utils import make_recipe, reads_dummy_wgrad, reset_rng

reset_rng()


@pytest.fixture(autouse=True)
def reset_global_state():
    yield
    FP8GlobalStateManager.reset()


@pytest.fixture
def fp8_enabled():
    return FP8GlobalStateManager.is_fp8_enabled()


class ToyModule(TransformerEngineBaseModule):
    pass


@pytest.mark.parametrize("out_features", [8, 16])
def test_linear_on_the_device(out_features):
    layer = Linear(16, out_features, device="cuda", init_method=init_method_normal(0.02))
    x = torch.randn(4, 16).cuda()
    y = layer(x)
    torch.cuda.synchronize()
    assert y.shape == (4, out_features)
    assert y.device.type == x.device.type


def test_recipe_through_the_namespace():
    assert isinstance(make_recipe(), recipe.DelayedScaling)
    assert recipe.Format.E4M3 is not None


def test_uses_the_extension():
    tex.quantize(torch.zeros(4))


def test_fixture_reaches_internal(fp8_enabled):
    assert fp8_enabled is False


def test_helper_reaches_internal():
    reads_dummy_wgrad(torch.zeros(2, 2))


def test_reads_internal_attribute():
    layer = te.Linear(4, 4)
    assert layer.fp8_meta is not None


def test_subclasses_internal():
    ToyModule()


@pytest.mark.parametrize("slot", [tex.FP8FwdTensors.GEMM1_INPUT])
def test_parametrized_by_internal(slot):
    assert slot is not None


@pytest.mark.parametrize("mode", ["plain", "internal"])
@pytest.mark.parametrize("flag", [True, False])
def test_internal_under_a_condition(flag, mode):
    if mode == "internal" and flag:
        tex.quantize(torch.zeros(4))
    assert mode in ("plain", "internal")


def test_missing_public_name():
    CudaRNGStatesTracker()


@pytest.mark.parametrize("value", [0, 1, 2])
def test_value_is_zero(value):
    assert value == 0


def test_cuda_memory_statistics():
    assert torch.cuda.max_memory_allocated() >= 0


def test_skips_under_availability():
    available = te.is_fp8_available()
    if available:
        pytest.skip("a skip under an availability condition")


def test_own_skip():
    pytest.skip("this configuration is not supported")


def test_recipe_parameter_shadows_the_import():
    for recipe in ("a", "b"):
        assert recipe.upper() in ("A", "B")


@pytest.mark.parametrize("index", range(40))
def test_many(index):
    assert index >= 0


def test_sleeps():
    import time

    time.sleep(3)
