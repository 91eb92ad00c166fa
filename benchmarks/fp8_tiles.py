"""The tile sweep behind the fused FP8 cast + transpose kernel's launch configuration.

``python -m benchmarks.fp8_tiles [--tiles] [--amax]`` (CUDA and Triton required) times
the launch as configured, and with ``--tiles``/``--amax`` every variant of the cast +
transpose kernel of ``kernels/cuda_kernels.py`` for each tile shape, warp count and
transpose store (bytes, or four codes per int32 word), and the amax kernel for each chunk,
program count and warp count, on a
4096x8192 activation and an 8192x8192 weight, checks that every variant writes the same
bits as the default launch, and prints one JSON line per shape with the median times,
next to the amax pass and a bf16 copy (the bandwidth yardstick). The fastest correct
variant is what ``cuda_kernels`` launches; docs/benchmarks.md records the run.
"""

from __future__ import annotations

import itertools
import json
import sys
from typing import Any

import torch

from transformer_engine_ops.kernels import cuda_kernels as ck

TILES = (
    *((16, 128), (16, 256), (16, 512), (32, 64), (32, 128), (32, 256)),
    *((64, 64), (64, 128), (64, 256), (128, 64), (128, 128), (256, 64)),
)
WARPS = (2, 4, 8)
PACKS = (False, True)  # transpose stored as int32 words
# amax pass: (BLOCK, most programs, warps)
AMAX = tuple(itertools.product((2048, 4096, 8192, 16384), (264, 528, 1056, 2112, 4224), (4, 8, 16)))
SHAPES = ((4096, 8192), (8192, 8192))


def _bench(fn: Any) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")) * 1e3


def _launch(x2: torch.Tensor, partial: torch.Tensor, bufs: dict[str, torch.Tensor], cfg: tuple):
    (bm, bk), warps, pack_t = cfg
    m, k = x2.shape
    _, _, cast = ck._kernels(False)
    fmax, eps32, constants = ck.fp8_constants(torch.float8_e4m3fn, 0.0)
    data, t = bufs["data"], bufs["t"]
    cast(
        (ck.triton_cdiv(m, bm), ck.triton_cdiv(k, bk), 1),
        (
            x2,
            partial,
            data,
            t.view(-1).view(torch.int32) if pack_t else t,
            bufs["scale_inv"],
            m,
            k,
            fmax,
            eps32,
            partial.numel(),
            partial,  # no bias gradient (BGRAD off): these three are never read
            partial,
            0,
        ),
        {
            "PARTIAL_BLOCK": ck.PARTIAL_BLOCK,
            **constants,
            "FORCE_POW2": False,
            "ROWWISE": True,
            "COLUMNWISE": True,
            "PACK_T": pack_t,
            "BGRAD": False,
            "BM": bm,
            "BK": bk,
        },
        num_warps=warps,
    )


def _amax_of(words: torch.Tensor) -> tuple[int, bool]:
    """(the finite amax's bits, whether an Inf was seen) from the amax kernel's words."""
    return int((words & 0x7FFFFFFF).max()), bool((words < 0).any())


def sweep(m: int, k: int, tiles: Any = (), amax_configs: Any = ()) -> dict[str, Any]:
    """Microseconds of the fused quantize of an (m, k) bf16 tensor as launched, its
    amax pass with each of ``amax_configs`` ((BLOCK, most programs, warps)) and its cast
    kernel with each of ``tiles`` (((BM, BK), warps, int32-word transpose)); ``wrong``
    names every variant whose bits differ from the launch's."""
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) * 3
    amax, _, _ = ck._kernels(False)
    n = m * k
    programs = min(ck.triton_cdiv(n, ck.AMAX_BLOCK), ck.AMAX_MAX_PROGRAMS)
    partial = torch.empty(programs, dtype=torch.int32, device="cuda")

    def amax_pass(words: torch.Tensor, block: int, warps: int) -> None:
        amax((words.numel(), 1, 1), (x, words, n), {"BLOCK": block}, num_warps=warps)

    amax_pass(partial, ck.AMAX_BLOCK, ck.AMAX_WARPS)
    want = _amax_of(partial)
    ref = ck.fp8_current_scaling_quantize(x, torch.float8_e4m3fn)
    out: dict[str, Any] = {"shape": [m, k], "us": {}, "wrong": []}
    dst = torch.empty_like(x)
    out["us"]["bf16 copy"] = _bench(lambda: dst.copy_(x))
    out["us"]["amax pass"] = _bench(lambda: amax_pass(partial, ck.AMAX_BLOCK, ck.AMAX_WARPS))
    out["us"]["fused quantize as launched"] = _bench(
        lambda: ck.fp8_current_scaling_quantize(x, torch.float8_e4m3fn)
    )
    for block, most, warps in amax_configs:
        words = torch.empty(min(ck.triton_cdiv(n, block), most), dtype=torch.int32, device="cuda")
        amax_pass(words, block, warps)
        name = f"amax BLOCK={block} programs={most} warps={warps}"
        if _amax_of(words) != want:
            out["wrong"].append(name)
        out["us"][name] = _bench(lambda w=words, b=block, nw=warps: amax_pass(w, b, nw))
    amax_bits = partial
    for cfg in ((ck.BLOCK_M, ck.BLOCK_K), ck.CAST_WARPS, True), *tiles:
        name = f"BM={cfg[0][0]} BK={cfg[0][1]} warps={cfg[1]} pack_t={cfg[2]}"
        bufs = {
            "data": torch.zeros(m, k, dtype=torch.uint8, device="cuda"),
            "t": torch.zeros(k, m, dtype=torch.uint8, device="cuda"),
            "scale_inv": torch.empty(1, device="cuda"),
        }
        try:
            _launch(x, amax_bits, bufs, cfg)
        except Exception as exc:  # a config Triton cannot build: reported
            out["us"][name] = f"{type(exc).__name__}: {str(exc)[:200]}"
            continue
        torch.cuda.synchronize()
        same = (
            torch.equal(bufs["data"], ref["_data"])
            and torch.equal(bufs["t"], ref["_transpose"])
            and torch.equal(bufs["scale_inv"], ref["_scale_inv"])
        )
        if not same:
            out["wrong"].append(name)
        out["us"][name] = _bench(lambda cfg=cfg, bufs=bufs: _launch(x, amax_bits, bufs, cfg))
    return out


def main() -> int:
    if not torch.cuda.is_available() or not ck.available():
        print("needs CUDA and Triton", file=sys.stderr)
        return 2
    for m, k in SHAPES:
        tiles = itertools.product(TILES, WARPS, PACKS) if "--tiles" in sys.argv else ()
        amax_configs = AMAX if "--amax" in sys.argv else ()
        print(json.dumps(sweep(m, k, tiles, amax_configs)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
