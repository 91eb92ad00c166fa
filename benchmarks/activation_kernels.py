"""LayerNormMLP's fused activation kernels against the torch ops they replace on CUDA.

``python -m benchmarks.activation_kernels [--sweep]`` (CUDA and Triton required) times
the forward plus backward of each activation at the Llama-8B-sized layer's shape (4096
tokens, FFN 14336, bf16) through ``layernorm_mlp.activation_forward`` /
``activation_backward``: the fused kernels as launched (``kernels/activation_kernels.py``),
the torch ops (the reference the CPU runs), and a bf16 copy of fc1's output (the
bandwidth yardstick). ``--sweep`` also times every launch configuration (columns per
program x warps) and checks that each writes the default launch's bits. One JSON line
per activation.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from typing import Any

import torch
from torch.utils.benchmark import Timer

from transformer_engine_ops.kernels import activation_kernels as ak
from transformer_engine_ops.ops import layernorm_mlp as mlp

TOKENS, FFN = 4096, 14336
PARAMS = (7.0, 1.702, 1.0)  # clamped_swiglu's (TE's defaults); the others ignore them
BLOCKS = (256, 512, 1024, 2048, 4096)
WARPS = (2, 4, 8)


def _median_ms(fn: Any) -> float:
    return Timer("fn()", globals={"fn": fn}).blocked_autorange(min_run_time=0.5).median * 1e3


def _torch_ops(fn: Any) -> Any:
    """``fn`` with the kernels declined (the reference torch ops run)."""

    def run() -> None:
        eligible, ak.eligible = ak.eligible, lambda *args: False
        try:
            fn()
        finally:
            ak.eligible = eligible

    return run


def measure(name: str, device: str, tokens: int, ffn: int, sweep: bool) -> dict[str, Any]:
    gated = ak.CODES[name][1]
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(tokens, 2 * ffn if gated else ffn, device=device, generator=gen)
    x = x.to(torch.bfloat16)
    dy = torch.randn(tokens, ffn, device=device, generator=gen).to(torch.bfloat16)

    def step() -> None:
        mlp.activation_forward(name, x, x.dtype, *PARAMS)
        mlp.activation_backward(name, dy, x, x.dtype, *PARAMS)

    result: dict[str, Any] = {
        "activation": name,
        "shape": list(x.shape),
        "fused_fwd_bwd_ms": _median_ms(step),
        "torch_ops_fwd_bwd_ms": _median_ms(_torch_ops(step)),
        "bf16_copy_of_input_ms": _median_ms(x.clone),
    }
    if sweep:
        want = (
            ak.fused_activation_forward(name, x, x.dtype, *PARAMS),
            ak.fused_activation_backward(name, dy, x, x.dtype, *PARAMS),
        )
        configs = {}
        for config in itertools.product(BLOCKS, WARPS):
            got = (
                ak.fused_activation_forward(name, x, x.dtype, *PARAMS, config=config),
                ak.fused_activation_backward(name, dy, x, x.dtype, *PARAMS, config=config),
            )
            same = all(torch.equal(g, w) for g, w in zip(got, want, strict=True))

            def launch(config: tuple[int, int] = config) -> None:
                ak.fused_activation_forward(name, x, x.dtype, *PARAMS, config=config)
                ak.fused_activation_backward(name, dy, x, x.dtype, *PARAMS, config=config)

            configs[f"{config[0]}x{config[1]}"] = {"ms": _median_ms(launch), "same_bits": same}
        result["configs"] = configs
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.activation_kernels", description=__doc__)
    p.add_argument("--sweep", action="store_true", help="time every launch configuration")
    p.add_argument("--activations", nargs="*", default=["swiglu", "gelu", "geglu", "silu"])
    p.add_argument("--tokens", type=int, default=TOKENS)
    p.add_argument("--ffn", type=int, default=FFN)
    args = p.parse_args(argv)
    if not torch.cuda.is_available() or not ak.available():
        print("benchmarks.activation_kernels: needs CUDA and Triton", file=sys.stderr)
        return 2
    for name in args.activations:
        print(json.dumps(measure(name, "cuda", args.tokens, args.ffn, args.sweep)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
