"""A model built under ``quantized_model_init`` then converted (``.to(dtype)``,
``.half()``, ``.float()``, ``.bfloat16()``, ``.to(device)``) keeps its weights as TE's
quantized parameters do: the same ``Parameter`` objects, still quantized, holding
``quantize(value)`` in the new dtype (TE's ``Float8Tensor.data`` setter), and an
optimizer then trains them with in-place requantization, bit for bit as the reference
(``test_quantized_parameter_training.train``) for every recipe."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from module_cases import make_mlp
from test_quantized_parameter_training import RECIPE_FACTORIES, train

from transformer_engine_ops.modules.autocast import autocast, quantized_model_init
from transformer_engine_ops.quantization import Float8Quantizer
from transformer_engine_ops.quantization.quantizer import QuantizedTensor

CONVERSIONS: dict[str, tuple[Any, torch.dtype]] = {
    # name -> (conversion of the bf16-built model, the dtype it leaves the weights in)
    "float": (lambda m: m.float(), torch.float32),
    "to_float32": (lambda m: m.to(torch.float32), torch.float32),
    "half": (lambda m: m.half(), torch.float16),
    "float_then_to_bfloat16": (lambda m: m.float().to(torch.bfloat16), torch.bfloat16),
    "to_device_and_dtype": (lambda m: m.to("cpu", torch.float32), torch.float32),
    "to_device": (lambda m: m.to("cpu"), torch.bfloat16),
}


def _built(recipe: str) -> torch.nn.Module:
    with quantized_model_init(recipe=RECIPE_FACTORIES[recipe]()):
        return make_mlp()


@pytest.mark.parametrize("conversion", list(CONVERSIONS))
@pytest.mark.parametrize("recipe", list(RECIPE_FACTORIES))
def test_converted_weights_stay_quantized_parameters_of_the_new_dtype(recipe, conversion):
    convert, dtype = CONVERSIONS[conversion]
    model = _built(recipe)
    before = {name: p for name, p in model.named_parameters() if isinstance(p, QuantizedTensor)}
    quantizers = {name: p.quantizer for name, p in before.items()}
    values = {name: p.dequantize().detach().clone() for name, p in before.items()}
    model = convert(model)
    assert len(before) == 2
    for name, p in model.named_parameters():
        if name not in before:
            assert type(p) is torch.nn.Parameter and p.dtype == dtype, name
            continue
        assert p is before[name], f"{name}: a new object (an optimizer would lose it)"
        assert isinstance(p, QuantizedTensor) and isinstance(p, torch.nn.Parameter), name
        assert p.dtype == dtype and p.dequantize().dtype == dtype, name
        assert p.requires_grad and p.is_leaf, name
        # quantize(value in the new dtype), with the weight's own quantizer.
        q = quantizers[name]
        q = q.snapshot() if isinstance(q, Float8Quantizer) else q
        want = q.with_internal(True).quantize(values[name].to(dtype)).dequantize()
        assert torch.equal(p.dequantize(), want), name


# SGD and AdamW at settings that keep float16 finite (AdamW's default eps of 1e-8 is 0
# in float16, so a zero gradient divides 0 by 0: NaN with plain weights as well).
OPTIMIZERS: dict[str, Any] = {
    "sgd": lambda params, foreach: torch.optim.SGD(
        params, lr=0.05, momentum=0.9, weight_decay=0.01, foreach=foreach
    ),
    "adamw": lambda params, foreach: torch.optim.AdamW(
        params, lr=0.01, weight_decay=0.1, eps=1e-4, foreach=foreach
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("conversion", ["float", "half", "float_then_to_bfloat16"])
@pytest.mark.parametrize("recipe", list(RECIPE_FACTORIES))
def test_sgd_and_adamw_train_converted_weights_as_the_reference(recipe, conversion):
    convert, dtype = CONVERSIONS[conversion]
    for opt_name, foreach in (("sgd", False), ("sgd", True), ("adamw", True), ("adamw", False)):
        train(recipe, opt_name, foreach, None, convert=convert, dtype=dtype, optimizers=OPTIMIZERS)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["fp8_current", "fp8_delayed"])
def test_every_modules_converted_weights_train_as_the_reference(recipe):
    # LayerNormLinear, LayerNormMLP (fc1, fc2) and GroupedLinear (two GEMMs).
    for opt_name, foreach in (("sgd", True), ("adamw", False)):
        train(
            recipe,
            opt_name,
            foreach,
            None,
            "family",
            convert=lambda m: m.float(),
            dtype=torch.float32,
            optimizers=OPTIMIZERS,
        )


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["fp8_current", "mxfp8"])
def test_converted_model_trains_compiled_as_eagerly(recipe):
    convert, dtype = CONVERSIONS["float"]
    kwargs: dict[str, Any] = dict(convert=convert, dtype=dtype, optimizers=OPTIMIZERS)
    compiled = train(recipe, "adamw", True, "aot_eager", **kwargs)
    eager = train(recipe, "adamw", True, None, **kwargs)
    for i, (c, e) in enumerate(zip(compiled, eager, strict=True)):
        assert torch.equal(c, e), f"parameter {i}"


def test_data_of_another_shape_or_a_storage_is_refused_naming_it():
    w = _built("fp8_current").fc1.weight
    with pytest.raises(ValueError, match=r"shape \(3,\)"):
        w.data = torch.zeros(3)
    other = _built("mxfp8").fc1.weight
    with pytest.raises(TypeError, match="same format"):
        w.data = other


def test_data_from_a_quantized_tensor_of_its_format_takes_its_codes():
    a, b = _built("mxfp8").fc1.weight, _built("mxfp8").fc1.weight
    with torch.no_grad():
        b.add_(1.0)
    a.data = b
    assert torch.equal(a.dequantize(), b.dequantize())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("recipe", list(RECIPE_FACTORIES))
def test_cuda_then_dtype_keeps_quantized_parameters_that_train(recipe):
    model = _built(recipe)
    before = {n: p for n, p in model.named_parameters() if isinstance(p, QuantizedTensor)}
    model = model.cuda().float()
    params = dict(model.named_parameters())
    for name, p in before.items():
        assert params[name] is p and isinstance(p, QuantizedTensor), name
        assert (p.device.type, p.dtype) == ("cuda", torch.float32), name
    values = {name: p.dequantize().clone() for name, p in before.items()}
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    x = torch.randn(64, 64, device="cuda")
    with autocast(recipe=RECIPE_FACTORIES[recipe]()):
        y = model(x)
    y.square().sum().backward()
    opt.step()
    for name, p in before.items():
        assert isinstance(p, QuantizedTensor) and not torch.equal(p.dequantize(), values[name])
