"""What a Linear keeps for its backward, counted through saved-tensor hooks:
only the usages the backward reads, the same eager and compiled, visible to (and moved
by) ``torch.autograd.graph.save_on_cpu``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from module_cases import QUANTIZED, RECIPES, recipe_context

from transformer_engine_ops.modules.linear import Linear

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.memory import QUICK_SHAPE, TARGETS, SavedTensors, measure  # noqa: E402

AOT = "aot_eager"
MODES = [pytest.param(False, id="eager"), pytest.param(True, id="compiled")]


def test_targets_cover_every_quantized_recipe():
    assert sorted(TARGETS) == sorted(QUANTIZED)


@pytest.mark.parametrize("compiled", MODES)
def test_bf16_saves_exactly_what_torch_nn_linear_saves(compiled):
    if compiled and torch.__version__ < (2, 12):
        pytest.skip(
            "torch 2.11's compiled torch.nn.Linear saves one tensor for both backward "
            "GEMMs, so the reference's per-GEMM attribution does not add up there"
        )
    ours = measure("bf16", "ours", compiled, QUICK_SHAPE, AOT)
    torch._dynamo.reset()
    ref = measure("bf16", "torch", compiled, QUICK_SHAPE, AOT)
    assert ours == ref
    rows, k, n = QUICK_SHAPE
    # The input for wgrad; the weight parameter itself for dgrad (no copy).
    assert ours["activation"] == rows * k * 2
    assert ours["weight_copy"] == 0
    assert ours["parameters"] == n * k * 2


@pytest.mark.parametrize("recipe", QUANTIZED)
def test_quantized_saved_activation_meets_target_and_compiled_equals_eager(recipe):
    bf16 = measure("bf16", "ours", False, QUICK_SHAPE, AOT)
    eager = measure(recipe, "ours", False, QUICK_SHAPE, AOT)
    torch._dynamo.reset()
    compiled = measure(recipe, "ours", True, QUICK_SHAPE, AOT)
    assert compiled == eager
    ratio = eager["activation"] / bf16["activation"]
    assert ratio <= TARGETS[recipe], f"{recipe}: saved activation {ratio:.3f}x of bf16"
    # The weight copy made for dgrad has one usage too (bf16 keeps the parameter itself).
    copy_ratio = eager["weight_copy"] / bf16["parameters"]
    assert copy_ratio <= TARGETS[recipe], f"{recipe}: weight copy {copy_ratio:.3f}x of bf16"
    assert eager["parameters"] == 0  # the bf16 weight itself is not kept besides its copy


@pytest.mark.parametrize("recipe", QUANTIZED)
def test_before_the_usage_reduction_the_same_layer_would_keep_both_usages(recipe):
    """The measurement can fail: quantizing the saved input with both usages (what the
    forward makes for its own GEMM before dropping rowwise) exceeds the target."""
    from transformer_engine_ops.ops.linear import _internal, _Usage

    rows, k, _ = QUICK_SHAPE
    x = torch.randn(rows, k).to(torch.bfloat16)
    quantizer = RECIPES[recipe]().make_quantizer("input")
    both = _internal(quantizer, _Usage(True, True)).quantize(x)
    kept = _internal(quantizer, _Usage(False, True)).quantize(x)
    nbytes = lambda v: sum(t.numel() * t.element_size() for t in v.inner_tensors())  # noqa: E731
    assert nbytes(both) / (rows * k * 2) > TARGETS[recipe]
    assert nbytes(kept) / (rows * k * 2) <= TARGETS[recipe]


class CountingSaveOnCpu(torch.autograd.graph.save_on_cpu):
    """``save_on_cpu`` (pinned copies), recording each tensor it packs and unpacks."""

    def __init__(self) -> None:
        super().__init__(pin_memory=True)
        pack, unpack = self.pack_hook, self.unpack_hook
        self.packed: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.unpacked = 0

        def counting_pack(t: torch.Tensor) -> Any:
            device, copy = packed = pack(t)
            self.packed.append((t, copy))
            return packed

        def counting_unpack(packed: Any) -> torch.Tensor:
            self.unpacked += 1
            return unpack(packed)

        self.pack_hook, self.unpack_hook = counting_pack, counting_unpack


def _grads(*tensors: torch.Tensor) -> list[torch.Tensor]:
    out = [t.grad.clone() for t in tensors]
    for t in tensors:
        t.grad = None
    return out


@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("compiled", MODES)
def test_save_on_cpu_moves_every_saved_tensor_and_grads_stay_bitwise(recipe, compiled):
    rows, k, n = QUICK_SHAPE
    torch.manual_seed(0)
    layer = Linear(k, n, params_dtype=torch.bfloat16)
    run = torch.compile(layer, fullgraph=True, backend=AOT) if compiled else layer
    x = torch.randn(rows, k).to(torch.bfloat16).requires_grad_(True)
    seen = SavedTensors()
    with seen.hooks(), recipe_context(recipe):
        run(x).sum().backward()
    want = _grads(x, layer.weight, layer.bias)
    count, own, params = seen.split(list(layer.parameters()))

    offload = CountingSaveOnCpu()
    with offload, recipe_context(recipe):
        y = run(x)
    # Every tensor the backward keeps went through save_on_cpu, as a separate CPU copy.
    assert len(offload.packed) == count > 0
    nbytes = sum(c.numel() * c.element_size() for _, c in offload.packed)
    assert nbytes == own + params
    for original, copy in offload.packed:
        assert copy.device.type == "cpu"
        assert copy.untyped_storage().data_ptr() != original.untyped_storage().data_ptr()
        assert torch.equal(copy, original)
    offload.packed.clear()  # the graph now holds the only references to the copies
    y.sum().backward()
    assert offload.unpacked == count
    for got, ref in zip(_grads(x, layer.weight, layer.bias), want, strict=True):
        assert torch.equal(got, ref)
