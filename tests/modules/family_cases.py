"""Builders of the Linear-family module tests: seeded modules with non-trivial
parameters, plain-PyTorch reference formulas, and a compile-vs-eager check."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from module_cases import assert_bitwise, graph_breaks, step, unique_graphs

import transformer_engine_ops as te

DTYPE = torch.bfloat16
HIDDEN, OUT, FFN = 64, 32, 128


def randomize(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every plain parameter drawn from a seeded normal (norm weights around 1)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if type(p.data) is not torch.Tensor:
                continue  # a quantized weight keeps its values
            noise = torch.randn(p.shape, generator=gen) * (0.2 if "layer_norm" in name else 0.1)
            if name in ("weight", "layer_norm_weight") and p.dim() == 1:
                noise = noise + 1.0
            p.copy_(noise.to(p.dtype))
    return module


def make(
    kind: str, bias: bool = True, seed: int = 0, dtype: torch.dtype = DTYPE, **kwargs: Any
) -> torch.nn.Module:
    torch.manual_seed(seed)
    if kind == "layernorm":
        module = te.LayerNorm(HIDDEN, params_dtype=dtype, **kwargs)
    elif kind == "rmsnorm":
        module = te.RMSNorm(HIDDEN, params_dtype=dtype, **kwargs)
    elif kind == "layernorm_linear":
        module = te.LayerNormLinear(HIDDEN, OUT, bias=bias, params_dtype=dtype, **kwargs)
    elif kind == "layernorm_mlp":
        module = te.LayerNormMLP(HIDDEN, FFN, bias=bias, params_dtype=dtype, **kwargs)
    else:
        raise ValueError(kind)
    return randomize(module, seed)


def make_input(
    batch: int = 4, seq: int = 32, seed: int = 1, dtype: torch.dtype = DTYPE
) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, seq, HIDDEN, generator=gen).to(dtype)


def compile_and_compare(
    module: torch.nn.Module, recipe: str, backend: str = "aot_eager", x: Any = None
) -> None:
    """Compiled (fullgraph) output and every gradient equal eager's, bit for bit."""
    x = make_input() if x is None else x
    eager = step(module, x, recipe)
    compiled = torch.compile(module, fullgraph=True, backend=backend)
    got = step(compiled, x, recipe)
    assert graph_breaks() == 0
    assert unique_graphs() == 1
    assert_bitwise(got, eager)


# --- plain PyTorch references (fp32) --------------------------------------------------


def ref_norm(x: torch.Tensor, normalization: str, w: Any, b: Any, zc: bool = False) -> Any:
    gamma = w + 1 if zc else w
    if normalization == "LayerNorm":
        return F.layer_norm(x, (x.shape[-1],), gamma, b, eps=1e-5)
    return F.rms_norm(x, (x.shape[-1],), gamma, eps=1e-5)


def _gelu(t: torch.Tensor) -> torch.Tensor:
    return F.gelu(t, approximate="tanh")


UNARY = {
    "gelu": _gelu,
    "relu": F.relu,
    "qgelu": lambda t: t * torch.sigmoid(1.702 * t),
    "srelu": lambda t: F.relu(t).square(),
    "silu": F.silu,
}
GATES = {
    "glu": torch.sigmoid,
    "swiglu": F.silu,
    "geglu": _gelu,
    "qgeglu": UNARY["qgelu"],
    "reglu": F.relu,
    "sreglu": UNARY["srelu"],
}


def ref_clamped_swiglu(h: torch.Tensor, params: dict[str, float] | None) -> torch.Tensor:
    """TE 2.20.2's clamped_swiglu (its defaults for what ``params`` leaves out)."""
    p = {"limit": 7.0, "alpha": 1.702, "glu_linear_offset": 1.0, **(params or {})}
    gate, linear = h.chunk(2, dim=-1)
    gate = gate.clamp(max=p["limit"])
    linear = linear.clamp(-p["limit"], p["limit"])
    return gate * torch.sigmoid(p["alpha"] * gate) * (linear + p["glu_linear_offset"])


def ref_activation(
    name: str, h: torch.Tensor, params: dict[str, float] | None = None
) -> torch.Tensor:
    if name == "clamped_swiglu":
        return ref_clamped_swiglu(h, params)
    if name in GATES:
        a, b = h.chunk(2, dim=-1)
        return GATES[name](a) * b
    return UNARY[name](h)


def reference_step(module: torch.nn.Module, kind: str, x: torch.Tensor) -> tuple[Any, ...]:
    """``step``'s (output, input grad, parameter grads) from the plain formula, in fp32."""
    params = {n: p.detach().float().requires_grad_(True) for n, p in module.named_parameters()}
    xf = x.detach().float().requires_grad_(True)
    if kind in ("layernorm", "rmsnorm"):
        y = ref_norm(
            xf,
            module.normalization,
            params["weight"],
            params.get("bias"),
            module.zero_centered_gamma,
        )
    else:
        ln = ref_norm(
            xf,
            module.normalization,
            params["layer_norm_weight"],
            params.get("layer_norm_bias"),
            module.zero_centered_gamma,
        )
        if kind == "layernorm_linear":
            y = F.linear(ln, params["weight"], params.get("bias"))
        else:
            h = F.linear(ln, params["fc1_weight"], params.get("fc1_bias"))
            y = F.linear(
                ref_activation(module.activation, h, module.activation_params),
                params["fc2_weight"],
                params.get("fc2_bias"),
            )
    y.sum().backward()
    return y.detach(), xf.grad, [p.grad for p in params.values()]


def assert_close_to_reference(got: tuple[Any, ...], ref: tuple[Any, ...], rtol: float) -> None:
    """Every tensor within ``rtol`` of the reference, relative to the reference's max."""

    def check(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
        err = (a.float() - b).abs().max().item()
        scale = b.abs().max().item() or 1.0
        assert err <= rtol * scale, f"{what}: max error {err:.4g} > {rtol} x {scale:.4g}"

    check(got[0], ref[0], "output")
    check(got[1], ref[1], "input grad")
    assert len(got[2]) == len(ref[2])
    for i, (a, b) in enumerate(zip(got[2], ref[2], strict=True)):
        check(a, b, f"grad of parameter {i}")
