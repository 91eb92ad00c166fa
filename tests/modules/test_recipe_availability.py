"""The availability queries and the refusal of a recipe the GPU cannot run natively
(``transformer_engine_ops/quantization/availability.py``).

On CUDA the queries answer TE 2.20's answers for the current device, with TE's reasons,
and a module whose weights are on a CUDA device refuses a recipe needing a format that
device lacks, unless ``TEOPS_EMULATE_UNSUPPORTED_RECIPES=1``. There is no GPU on the
CPU test bed, so the CUDA decisions are checked here with the device faked
(``availability._cuda_target``, what every decision reads of the device); the tests
marked ``gpu`` check them on the real one. On the CPU the queries answer True and every
recipe runs."""

from __future__ import annotations

import types

import pytest
import torch

import transformer_engine_ops as te
from transformer_engine_ops import recipe
from transformer_engine_ops.modules._call import refuse_unsupported
from transformer_engine_ops.modules.autocast import RecipeQuantizers, custom_quantizers
from transformer_engine_ops.quantization import NVFP4Quantizer, availability

SWITCH = "TEOPS_EMULATE_UNSUPPORTED_RECIPES"
QUERIES = {
    "fp8": te.is_fp8_available,
    "mxfp8": te.is_mxfp8_available,
    "fp8_block": te.is_fp8_block_scaling_available,
    "nvfp4": te.is_nvfp4_available,
}
# TE 2.20's reasons (transformer_engine/pytorch/quantization.py).
MXFP8_REASON = "Device compute capability 10.0 or higher required for MXFP8 execution."
NVFP4_REASON = "Device compute capability 10.0 or higher required for NVFP4 execution."
FP8_REASON = "Device compute capability 8.9 or higher required for FP8 execution."
BLOCK_REASON = "FP8 block scaled GEMM requires compute capability 9.0 or higher and CUDA >= 12.9."
H100 = ((9, 0), "NVIDIA H100 80GB HBM3", (12, 8))
H100_CUDA_12_9 = ((9, 0), "NVIDIA H100 80GB HBM3", (12, 9))
B200 = ((10, 0), "NVIDIA B200", (12, 9))
RTX_5090 = ((12, 0), "NVIDIA GeForce RTX 5090", (12, 9))
A100 = ((8, 0), "NVIDIA A100-SXM4-80GB", (12, 8))
L40_CUDA_12_0 = ((8, 9), "NVIDIA L40", (12, 0))


@pytest.fixture
def device(monkeypatch: pytest.MonkeyPatch):
    """Fakes the CUDA device every decision reads (``fake(target)``), switch off."""
    monkeypatch.delenv(SWITCH, raising=False)

    def fake(target):
        monkeypatch.setattr(availability, "_cuda_target", lambda device_index=None: target)

    return fake


def test_on_the_cpu_every_query_answers_true_with_how(monkeypatch):
    monkeypatch.delenv(SWITCH, raising=False)
    if torch.cuda.is_available():
        pytest.skip("the CPU's answer")
    for fmt, query in QUERIES.items():
        assert query() is True
        available, reason = query(return_reason=True)
        assert available is True
        assert "emulated on the CPU" in reason, (fmt, reason)


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (
            H100,
            {
                "fp8": (True, ""),
                "mxfp8": (False, MXFP8_REASON),
                "fp8_block": (False, BLOCK_REASON),
                "nvfp4": (False, NVFP4_REASON),
            },
        ),
        (
            H100_CUDA_12_9,
            {
                "fp8": (True, ""),
                "mxfp8": (False, MXFP8_REASON),
                "fp8_block": (True, ""),
                "nvfp4": (False, NVFP4_REASON),
            },
        ),
        (
            B200,
            {"fp8": (True, ""), "mxfp8": (True, ""), "fp8_block": (True, ""), "nvfp4": (True, "")},
        ),
        (
            RTX_5090,
            {
                "fp8": (True, ""),
                "mxfp8": (
                    False,
                    "MXFP8 (for all gemm layouts) is not supported on 12.0+ architectures yet.",
                ),
                "fp8_block": (True, ""),
                "nvfp4": (True, ""),
            },
        ),
        (
            A100,
            {
                "fp8": (False, FP8_REASON),
                "mxfp8": (False, MXFP8_REASON),
                "fp8_block": (False, BLOCK_REASON),
                "nvfp4": (False, NVFP4_REASON),
            },
        ),
        (
            L40_CUDA_12_0,
            {"fp8": (False, "Cuda version 12.1 or higher required for FP8 execution on Ada.")},
        ),
    ],
    ids=["h100", "h100-cuda-12.9", "b200", "rtx-5090", "a100", "l40-cuda-12.0"],
)
def test_on_cuda_the_queries_answer_as_te_for_the_device(device, target, expected):
    device(target)
    for fmt, answer in expected.items():
        assert QUERIES[fmt](return_reason=True) == answer, fmt
        assert QUERIES[fmt]() is answer[0], fmt


def test_the_emulation_switch_makes_the_queries_true_and_says_so(device, monkeypatch):
    device(H100)
    monkeypatch.setenv(SWITCH, "1")
    available, reason = te.is_mxfp8_available(return_reason=True)
    assert available is True
    assert reason == (
        "MXFP8 block scaling runs emulated on NVIDIA H100 80GB HBM3 (compute capability "
        f"9.0) ({SWITCH}=1); natively: {MXFP8_REASON}"
    )
    assert te.is_nvfp4_available() is True
    # A format the device runs natively keeps TE's answer.
    assert te.is_fp8_available(return_reason=True) == (True, "")
    monkeypatch.setenv(SWITCH, "0")
    assert te.is_mxfp8_available() is False


def test_a_bad_switch_value_is_refused_naming_the_variable(device, monkeypatch):
    device(H100)
    monkeypatch.setenv(SWITCH, "yes")
    with pytest.raises(ValueError, match=rf"^{SWITCH}='yes': expected 1 .* or 0"):
        te.is_mxfp8_available()


def _cuda_weight() -> types.SimpleNamespace:
    """What ``refuse_unsupported`` reads of a module's weight on ``cuda:0``."""
    return types.SimpleNamespace(is_cuda=True, device=torch.device("cuda", 0))


@pytest.mark.parametrize(
    ("make_recipe", "reason"),
    [
        (recipe.MXFP8BlockScaling, MXFP8_REASON),
        (recipe.NVFP4BlockScaling, NVFP4_REASON),
    ],
    ids=["mxfp8", "nvfp4"],
)
def test_a_module_on_a_gpu_without_the_format_refuses_the_recipe(device, make_recipe, reason):
    device(H100)
    q = RecipeQuantizers.from_recipe(make_recipe())
    name = type(make_recipe()).__name__
    with pytest.raises(RuntimeError) as error:
        refuse_unsupported(q, _cuda_weight())
    assert str(error.value) == (
        f"{name} cannot run natively on NVIDIA H100 80GB HBM3 (compute capability 9.0): "
        f"{reason} Set {SWITCH}=1 to run it emulated (reference quantize kernels and "
        "GEMMs on dequantized operands, several times slower than bf16)"
    )


def test_the_switch_lets_the_module_emulate_and_a_native_recipe_runs(device, monkeypatch):
    device(H100)
    mxfp8 = RecipeQuantizers.from_recipe(recipe.MXFP8BlockScaling())
    refuse_unsupported(RecipeQuantizers.from_recipe(recipe.Float8CurrentScaling()), _cuda_weight())
    refuse_unsupported(None, _cuda_weight())  # no recipe
    monkeypatch.setenv(SWITCH, "1")
    refuse_unsupported(mxfp8, _cuda_weight())
    device(B200)
    monkeypatch.delenv(SWITCH)
    refuse_unsupported(mxfp8, _cuda_weight())


def test_a_custom_recipe_is_refused_by_what_its_quantizers_are(device):
    """A CustomRecipe is checked by the format of each quantizer its factory returns,
    named by the role."""
    device(H100)

    def factory(role):
        if role is not None and role.tensor_type == "weight":
            return NVFP4Quantizer()
        return te.Float8CurrentScalingQuantizer()

    shared = RecipeQuantizers.from_recipe(recipe.CustomRecipe(qfactory=factory))
    assert shared.needs == ()  # the recipe asks its factory nothing; each module does
    # An unnamed Linear's roles: input, weight, output, grad_output, grad_input.
    roles = (("linear", "input", ""), ("linear", "weight", ""), None)
    q = custom_quantizers(shared, roles + (("linear", "grad_output", ""), None))
    with pytest.raises(
        RuntimeError,
        match=r"^CustomRecipe \(its weight quantizer NVFP4Quantizer\) cannot run natively "
        rf"on NVIDIA H100 80GB HBM3 \(compute capability 9.0\): {NVFP4_REASON}",
    ):
        refuse_unsupported(q, _cuda_weight())


def test_on_the_cpu_nothing_is_refused_even_with_a_gpu_without_the_format(device):
    """The weights say where a module computes: a module on the CPU emulates every
    recipe whatever GPU the machine has."""
    device(H100)
    module = te.Linear(32, 32)
    with te.autocast(recipe=recipe.MXFP8BlockScaling()):
        assert module(torch.randn(32, 32)).shape == (32, 32)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kind", ["linear", "layernorm_linear", "layernorm_mlp", "grouped_linear"])
@pytest.mark.parametrize("make_recipe", [recipe.MXFP8BlockScaling, recipe.NVFP4BlockScaling])
def test_on_a_gpu_below_blackwell_the_modules_refuse_unless_emulating(
    kind, make_recipe, monkeypatch
):
    """On the real device: below compute capability 10.0 every module refuses MXFP8 and
    NVFP4 with TE's reason, and runs them with the switch on (eager and compiled)."""
    if torch.cuda.get_device_capability() >= (10, 0):
        pytest.skip("this GPU runs MXFP8 and NVFP4 natively")
    torch.manual_seed(0)
    modules = {
        "linear": lambda: te.Linear(64, 64, device="cuda"),
        "layernorm_linear": lambda: te.LayerNormLinear(64, 64, device="cuda"),
        "layernorm_mlp": lambda: te.LayerNormMLP(64, 128, device="cuda"),
        "grouped_linear": lambda: te.GroupedLinear(2, 64, 64, device="cuda"),
    }
    module = modules[kind]()
    x = torch.randn(64, 64, device="cuda")
    args = (x, [32, 32]) if kind == "grouped_linear" else (x,)
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    monkeypatch.delenv(SWITCH, raising=False)
    assert not (
        te.is_mxfp8_available()
        if make_recipe is recipe.MXFP8BlockScaling
        else te.is_nvfp4_available()
    )
    for run in (module, compiled):
        with pytest.raises(Exception, match="cannot run natively on .*required for"):
            with te.autocast(recipe=make_recipe()):
                run(*args)
    monkeypatch.setenv(SWITCH, "1")
    torch._dynamo.reset()
    for run in (module, torch.compile(module, fullgraph=True, backend="aot_eager")):
        with te.autocast(recipe=make_recipe()):
            assert run(*args).isfinite().all()
