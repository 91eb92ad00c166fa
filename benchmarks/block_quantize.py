"""The FP8 block-scaling quantize on CUDA: the Triton kernel against the reference ops.

``python -m benchmarks.block_quantize [--no-sweep] [--shapes 4096x4096,...]`` (CUDA and
Triton required) times ``Float8BlockQuantizer``'s quantize of bf16 tensors (default
4096x4096, 4096x14336 and 14336x4096, a Llama-8B layer's activations and weights) for
1-D blocks with both usages (activations, gradients), 1-D rowwise only, and 2-D blocks
with both usages (weights): the reference torch ops, the kernel as configured
(``block_kernels.TILES``) and, unless ``--no-sweep``, every tile shape and warp count
of :data:`SWEEP`, each checked to write the configured launch's bits (and the default
to write the reference's). Prints one JSON line per shape and mode, median us, the
fastest variant and a bf16 copy (the bandwidth yardstick); the fastest correct variant
is what ``block_kernels.TILES`` should hold.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import torch

from transformer_engine_ops.kernels import block_kernels as bk
from transformer_engine_ops.quantization import Float8BlockQuantizer

SHAPES = ((4096, 4096), (4096, 14336), (14336, 4096))
# mode -> (block_scaling_dim, rowwise, columnwise)
MODES = {
    "1d_both": (1, True, True),
    "1d_rowwise": (1, True, False),
    "1d_columnwise": (1, False, True),
    "2d_both": (2, True, True),
}
# mode -> (BM, BK, warps) variants: multiples of 128 where the blocks run, 16 to 128
# elements a thread (bigger tiles spill, and take ptxas minutes to compile).
_BIG = ((128, 128, 4), (128, 128, 8), (128, 128, 16), (128, 256, 8), (128, 256, 16))
_BIG += ((256, 128, 8), (256, 128, 16))
SWEEP: dict[str, tuple[tuple[int, int, int], ...]] = {
    "1d_both": _BIG,
    "1d_rowwise": tuple(
        (m, k, w)
        for m, k in ((8, 128), (16, 128), (32, 128), (64, 128), (16, 256), (32, 256), (128, 128))
        for w in (2, 4, 8)
        if 16 <= m * k // (32 * w) <= 128
    ),
    "1d_columnwise": tuple(
        (m, k, w)
        for m, k in ((128, 16), (128, 32), (128, 64), (128, 128), (256, 32), (256, 64))
        for w in (2, 4, 8)
        if 16 <= m * k // (32 * w) <= 128
    ),
    "2d_both": _BIG,
}


def _bench(fn: Any) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")) * 1e3


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return set(a) == set(b) and all(
        a[n].shape == b[n].shape and torch.equal(a[n].view(torch.uint8), b[n].view(torch.uint8))
        for n in a
    )


def run(m: int, k: int, mode: str, sweep: bool) -> dict[str, Any]:
    dim, rowwise, columnwise = MODES[mode]
    q = Float8BlockQuantizer(
        block_scaling_dim=dim, rowwise_usage=rowwise, columnwise_usage=columnwise
    )
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    args = (x, q.fp8_dtype, q.block_len, dim, q.force_pow_2_scales, q.amax_epsilon)
    usage = (rowwise, columnwise)
    default = bk.fused_quantize(*args, *usage)
    out: dict[str, Any] = {
        "shape": [m, k],
        "mode": mode,
        "tile": list(bk.tile(q.block_len, dim == 2, rowwise, columnwise)),
        "bitwise_reference": _same(q._quantize_reference(x), default),
        "reference_us": _bench(lambda: q._quantize_reference(x)),
        "kernel_us": _bench(lambda: bk.fused_quantize(*args, *usage)),
        "quantize_us": _bench(lambda: q.quantize(x)),  # the quantizer's own path
        "bf16_copy_us": _bench(lambda: x.clone()),
    }
    out["speedup"] = out["reference_us"] / out["kernel_us"]
    if sweep:
        times: dict[str, Any] = {}
        wrong = []
        for launch in SWEEP[mode]:
            name = "x".join(map(str, launch[:2])) + f"/w{launch[2]}"
            try:
                got = bk.fused_quantize(*args, *usage, launch=launch)
                if not _same(default, got):
                    wrong.append(name)
                    continue
                times[name] = _bench(
                    lambda launch=launch: bk.fused_quantize(*args, *usage, launch=launch)
                )
            except Exception as exc:  # a variant that does not compile: report it
                times[name] = f"{type(exc).__name__}: {exc}"[:200]
        timed = {n: t for n, t in times.items() if isinstance(t, float)}
        out["us"] = times
        out["wrong"] = wrong
        out["fastest"] = min(timed, key=timed.__getitem__) if timed else None
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--no-sweep", action="store_true", help="default launch only")
    parser.add_argument("--shapes", default=",".join(f"{m}x{k}" for m, k in SHAPES))
    parser.add_argument("--modes", default=",".join(MODES))
    opts = parser.parse_args(argv)
    if not torch.cuda.is_available() or not bk.available():
        print("needs CUDA and Triton", bk.unavailable_reason(), file=sys.stderr)
        return 1
    for shape in opts.shapes.split(","):
        m, k = (int(d) for d in shape.split("x"))
        for mode in opts.modes.split(","):
            print(json.dumps(run(m, k, mode, not opts.no_sweep)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
