"""What each rank runs for the sequence-parallel communication tests: amax reduction
over the TP group and the FP8 all-gather (dispatched from ``dist_cases.run_case``).

Every recipe that runs sequence parallelism, column- and row-parallel ``Linear``:

* compiled (fullgraph, aot_eager) bitwise equal to eager on two ranks, one graph;
* eager bitwise equal to the single-process reference of the same algorithm: a
  ``Linear`` holding this rank's weight shard, run on the *whole* sequence, so every
  tensor the distributed layer gathers is quantized whole (the amax of the whole
  tensor) there. Its input gradient is the sum of both shards' references (each rank
  builds both from the shared seed), as the reduce-scatter sums them; a row-parallel
  bias gradient is the rank-ordered sum of each rank's fp32 column sums;
* every quantized gather (FP8 current scaling, MXFP8, 1-D FP8 blocks, NVFP4) gives
  the same bits as the same recipe with ``fp8_all_gather=False`` (high precision on
  the wire);
* ``bytes-*`` counts what each all-gather moves: FP8 about half of bf16, NVFP4 about
  a quarter (codes and scales);
* ``inductor-*``: the NVFP4 gather compiled with Inductor, bitwise equal to eager.

Each rank compares locally; no assertion can strand the other rank in a collective.
"""

from __future__ import annotations

from typing import Any

import torch
from dist_cases import SEED, World, _assert_equal, _chunk, _graph_breaks
from torch._dynamo.utils import counters

import transformer_engine_ops as te
from transformer_engine_ops.modules.autocast import autocast
from transformer_engine_ops.ops import tensor_parallel
from transformer_engine_ops.quantization import (
    Float8BlockScaling,
    Float8CurrentScaling,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
)

# (seq, batch, hidden): 32 local rows on each rank, 64 gathered (MXFP8's 32-row blocks).
SEQ, BATCH, IN, OUT = 32, 2, 64, 64

RECIPES: dict[str, Any] = {
    "bf16": None,
    "fp8_current": Float8CurrentScaling,
    "fp8_current_hp_gather": lambda: Float8CurrentScaling(fp8_all_gather=False),
    "mxfp8": MXFP8BlockScaling,
    "mxfp8_hp_gather": lambda: MXFP8BlockScaling(fp8_all_gather=False),
    "fp8_block": Float8BlockScaling,  # 128-row blocks, 32-row shards: high precision
    # 16-row blocks (TE's 128 scaled down) on 32-row shards: gathered quantized.
    "fp8_block16": lambda: Float8BlockScaling(block_len=16),
    "fp8_block16_hp_gather": lambda: Float8BlockScaling(block_len=16, fp8_all_gather=False),
    # Stochastic rounding draws per call; off, so the reference can match bit for bit.
    # TE's other defaults stay: 16x16 weight blocks, the Hadamard transform on the
    # input's and dy's columnwise data (exact on shards of whole 16-row runs).
    "nvfp4": lambda: NVFP4BlockScaling(disable_stochastic_rounding=True),
    "nvfp4_hp_gather": lambda: NVFP4BlockScaling(
        disable_stochastic_rounding=True, fp8_all_gather=False
    ),
}
QUANTIZED_GATHERS = ("fp8_current", "mxfp8", "fp8_block16", "nvfp4")
SP_FP8 = [f"spfp8-{mode}-{recipe}" for mode in ("column", "row") for recipe in RECIPES]
# MXFP8 with 16-row shards: a 32-row columnwise block would straddle two shards, so
# the input is gathered in high precision (as TE falls back).
SP_FP8 += ["spfp8-column-mxfp8-shortshards", "spfp8-row-mxfp8-shortshards"]
# NVFP4 with 8-row shards: a columnwise 16-block would straddle two shards (TE's
# is_quantizable refuses them), so the input and dy are gathered in high precision.
SP_FP8 += ["spfp8-column-nvfp4-8rows", "spfp8-row-nvfp4-8rows"]
SP_FP8 += [
    f"spfp8-gather-options-agree-{mode}-{recipe}"
    for mode in ("column", "row")
    for recipe in QUANTIZED_GATHERS
]
SP_FP8 += [
    f"spfp8-bytes-{mode}-{recipe}" for mode in ("column", "row") for recipe in QUANTIZED_GATHERS
]
SP_FP8 += ["spfp8-lnmlp-fp8_current", "spfp8-lnmlp-mxfp8", "spfp8-lnmlp-nvfp4"]
SP_FP8 += ["spfp8-inductor-column-nvfp4"]
# TE's save_original_input: the input kept unquantized (the local shard), quantized in
# the backward after its re-gather; the gradients of the layer keeping it quantized.
SP_FP8 += [f"spfp8-save-original-column-{recipe}" for recipe in QUANTIZED_GATHERS]
SP_FP8 += ["spfp8-save-original-row-fp8_current"]

NAMES = ["output", "input grad", "weight grad", "bias grad"]


def _recipe(name: str) -> Any:
    factory = RECIPES[name]
    if factory is None:
        return _Null()
    return autocast(recipe=factory())


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def _tensors(w: World, seq: int = SEQ) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(SEED + 29)
    t = {
        "x": torch.randn(seq, BATCH, IN, generator=gen),
        "dy": torch.randn(seq, BATCH, OUT, generator=gen),
        "bias": torch.randn(OUT, generator=gen),
    }
    # Make rank 1's rows hold the largest magnitudes: a per-shard amax would differ.
    t["x"][seq // 2 :] *= 4
    t["dy"][seq // 2 :] *= 4
    return {k: v.to(torch.bfloat16).to(w.device) for k, v in t.items()}


def _layer(w: World, in_f: int, out_f: int, mode: str | None) -> te.Linear:
    torch.manual_seed(SEED)
    return te.Linear(
        in_f,
        out_f,
        params_dtype=torch.bfloat16,
        device=w.device,
        tp_group=w.group if mode else None,
        tp_size=w.size if mode else 1,
        parallel_mode=mode,
        sequence_parallel=mode is not None,
    )


def _step(layer: Any, x: torch.Tensor, dy: torch.Tensor, recipe: str) -> list[torch.Tensor]:
    """One forward and backward: (output, input grad, every parameter's grad), cloned."""
    params = list(layer.parameters())
    for p in params:
        p.grad = None
    x = x.detach().clone().requires_grad_(True)
    with _recipe(recipe):
        y = layer(x)
    y.backward(dy)
    return [y.detach().clone(), x.grad.clone(), *[p.grad.clone() for p in params]]


def _compiled_matches_eager(
    model: torch.nn.Module,
    x: torch.Tensor,
    dy: torch.Tensor,
    recipe: str,
    names: list[str],
    backend: str = "aot_eager",
) -> tuple[list[torch.Tensor], dict[str, Any]]:
    """Eager vs compiled (fullgraph, ``backend``), two compiled steps: bitwise equal,
    no graph break, one graph. Returns the eager results."""
    eager = _step(model, x, dy, recipe)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    for _ in range(2):
        _assert_equal(_step(compiled, x, dy, recipe), eager, names)
    info = {"graph_breaks": _graph_breaks(), "unique_graphs": counters["stats"]["unique_graphs"]}
    assert info["graph_breaks"] == 0, dict(counters["graph_break"])
    assert info["unique_graphs"] == 1, f"{info['unique_graphs']} graphs (recompiled)"
    return eager, info


def _shard_reference(
    w: World, mode: str, rank: int, t: dict[str, torch.Tensor], recipe: str
) -> list[torch.Tensor]:
    """Rank ``rank``'s shard of the distributed layer as a single-process Linear, run
    on the whole sequence: ``(output, input grad, weight grad, bias grad)``."""
    n = w.size
    full = _layer(w, IN, OUT, None)
    if mode == "column":
        ref = _layer(w, IN, OUT // n, None)
        weight, x, dy = _chunk(full.weight, 0, rank, n), t["x"], _chunk(t["dy"], -1, rank, n)
        bias = _chunk(t["bias"], 0, rank, n)
    else:
        ref = _layer(w, IN // n, OUT, None)
        weight, x, dy = _chunk(full.weight, 1, rank, n), _chunk(t["x"], -1, rank, n), t["dy"]
        bias = t["bias"]
    with torch.no_grad():
        ref.weight.copy_(weight)
        ref.bias.copy_(bias)
    return _step(ref, x, dy, recipe)


def _same_algorithm_reference(
    w: World, mode: str, t: dict[str, torch.Tensor], recipe: str, quantized_gather: bool
) -> list[torch.Tensor | None]:
    """What the distributed layer must give on this rank, bit for bit (output of the
    row-parallel layer excluded: its partial sums are reduced across ranks)."""
    r, n = w.rank, w.size
    mine = _shard_reference(w, mode, r, t, recipe)
    if mode == "column":
        # The input gradient is reduce-scattered: both shards' partial sums, added.
        other = _shard_reference(w, mode, 1 - r, t, recipe)
        dx = mine[1] + other[1]
        return [mine[0], _chunk(dx, 0, r, n), mine[2], mine[3]]
    if not quantized_gather:  # dy gathered in high precision: one sum over all rows
        return [None, mine[1], mine[2], mine[3]]
    dy_rows = t["dy"].reshape(-1, OUT).chunk(n, 0)
    bias_grad = torch.stack([rows.sum(0, dtype=torch.float32) for rows in dy_rows]).sum(0)
    return [None, mine[1], mine[2], bias_grad.to(torch.bfloat16)]


def _assert_bitwise(
    got: list[torch.Tensor], want: list[torch.Tensor], names: list[str], what: str
) -> None:
    for g, e, n in zip(got, want, names, strict=True):
        assert g.shape == e.shape, f"{n}: shape {tuple(g.shape)} != {what}'s {tuple(e.shape)}"
        diff = (g.float() - e.float()).abs().max().item()
        assert torch.equal(g, e), f"{n}: differs from {what} (max |diff| {diff:.3g})"


def _inputs(w: World, mode: str, t: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    r, n = w.rank, w.size
    if mode == "column":
        return _chunk(t["x"], 0, r, n), _chunk(t["dy"], -1, r, n)
    return _chunk(t["x"], -1, r, n), _chunk(t["dy"], 0, r, n)


def _distributed(w: World, mode: str, seq: int = SEQ) -> tuple[te.Linear, dict[str, torch.Tensor]]:
    t = _tensors(w, seq)
    layer = _layer(w, IN, OUT, mode)
    with torch.no_grad():
        layer.bias.copy_(_chunk(t["bias"], 0, w.rank, w.size) if mode == "column" else t["bias"])
    return layer, t


def _parity(
    w: World, mode: str, recipe: str, seq: int = SEQ, backend: str = "aot_eager"
) -> dict[str, Any]:
    layer, t = _distributed(w, mode, seq)
    x, dy = _inputs(w, mode, t)
    eager, info = _compiled_matches_eager(layer, x, dy, recipe, NAMES, backend)
    # Quantized gathers in these cases: FP8 current scaling, 1-D FP8 blocks of 16,
    # and NVFP4 and MXFP8 with 32-row shards (of whole 16- and 32-row blocks).
    quantized_gather = recipe in ("fp8_current", "fp8_block16") or (
        recipe in ("mxfp8", "nvfp4") and seq == SEQ
    )
    want = _same_algorithm_reference(w, mode, t, recipe, quantized_gather)
    pairs = [(g, e, n) for g, e, n in zip(eager, want, NAMES, strict=True) if e is not None]
    _assert_bitwise(*map(list, zip(*pairs, strict=True)), "the single-process reference")
    info["bitwise_equal_to_reference"] = [n for _, _, n in pairs]
    return info


def _gather_options_agree(w: World, mode: str, recipe: str) -> dict[str, Any]:
    """Quantized all-gather and high-precision all-gather: the same bits (a row-parallel
    bias gradient sums per-rank partials under the quantized gather: close, not equal)."""
    layer, t = _distributed(w, mode)
    x, dy = _inputs(w, mode, t)
    quantized = _step(layer, x, dy, recipe)
    high = _step(layer, x, dy, f"{recipe}_hp_gather")
    exact = NAMES if mode == "column" else NAMES[:3]
    _assert_bitwise(quantized[: len(exact)], high[: len(exact)], exact, "the high-precision gather")
    info: dict[str, Any] = {"bitwise_equal": exact}
    if mode == "row":
        diff = (quantized[3].float() - high[3].float()).abs().max().item()
        scale = high[3].float().abs().max().item()
        assert diff <= 1e-2 * scale, f"bias grad: |diff| {diff} vs max {scale}"
        info["bias_grad_max_abs_diff"] = diff
    return info


def _bytes(w: World, mode: str, recipe: str) -> dict[str, Any]:
    """Bytes each rank sends per all-gather (eager and compiled alike call the op's
    kernel, which calls ``tensor_parallel._all_gather_tensor``): quantized vs high-precision
    gather of the same recipe, and bf16."""
    layer, t = _distributed(w, mode)
    x, dy = _inputs(w, mode, t)
    original = tensor_parallel._all_gather_tensor
    sent: list[tuple[str, int]] = []

    def counting(out: torch.Tensor, inp: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        sent.append((str(inp.dtype).removeprefix("torch."), inp.numel() * inp.element_size()))
        return original(out, inp, *args, **kwargs)

    tensor_parallel._all_gather_tensor = counting
    try:
        moved = {}
        for name in ("bf16", recipe, f"{recipe}_hp_gather"):
            sent.clear()
            _step(layer, x, dy, name)
            moved[name] = list(sent)
    finally:
        tensor_parallel._all_gather_tensor = original
    rows = SEQ // w.size * BATCH  # local rows of the gathered tensor
    k = IN if mode == "column" else OUT
    elems = rows * k
    bf16 = [("bfloat16", 2 * elems)]
    # Column: gathered for the fprop GEMM and, from the kept local shard, for wgrad
    # (gathered in high precision, the quantized input is kept full-length instead).
    assert moved["bf16"] == bf16 * (2 if mode == "column" else 1), moved["bf16"]
    assert moved[f"{recipe}_hp_gather"] == bf16, moved
    # Per-tensor FP8: the codes (the scale is the same on every rank: not sent). Block
    # formats: codes and scales, rowwise (the fprop GEMM) then columnwise (wgrad).
    codes = [("uint8", elems)]
    if recipe == "nvfp4":  # two E2M1 codes a byte, one E4M3 scale per 16 elements
        forward = for_wgrad = [("uint8", elems // 2), ("uint8", elems // 16)]
    elif recipe == "mxfp8":  # one E8M0 byte per 32 elements
        forward = codes + [("uint8", elems // 32)]
        for_wgrad = codes + [("uint8", elems // 32)]
    elif recipe == "fp8_block16":  # one fp32 scale per 16 elements (1x16, then 16x1)
        forward = codes + [("float32", 4 * elems // 16)]
        for_wgrad = codes + [("float32", 4 * elems // 16)]
    else:
        forward = for_wgrad = codes
    if mode == "column":
        want = forward + for_wgrad
    else:  # dy for dgrad (rowwise) and wgrad (columnwise), after the bias partials
        both = forward if recipe == "fp8_current" else forward + for_wgrad
        want = [("float32", 4 * OUT)] + both
    assert moved[recipe] == want, moved[recipe]
    total = {name: sum(b for _, b in v) for name, v in moved.items()}
    info: dict[str, Any] = {"bytes": {k: [b for _, b in v] for k, v in moved.items()}}
    info["total"] = total
    if recipe == "nvfp4":
        # The "about a quarter": each usage gathered moves 0.28 of the bf16
        # tensor's bytes. Column: two gathers as in bf16; row: dy's two usages (dgrad
        # and wgrad) and the bias partials against one bf16 gather.
        per_usage = sum(b for _, b in forward) / (2 * elems)
        assert per_usage < 0.3, f"NVFP4 moves {per_usage:.3f} of bf16's bytes per usage"
        info["per_usage_vs_bf16"] = per_usage
        info["total_vs_bf16"] = total[recipe] / total["bf16"]
    return info


def _lnmlp(w: World, recipe: str) -> dict[str, Any]:
    """LayerNormMLP (fc1 column-, fc2 row-parallel) with SP: compiled equal to eager,
    and quantized gathers equal to high-precision gathers except the fc2 bias gradient
    (per-rank partial sums)."""
    gen = torch.Generator().manual_seed(SEED + 31)
    x = torch.randn(SEQ, BATCH, IN, generator=gen).to(torch.bfloat16).to(w.device)
    dy = torch.randn(SEQ, BATCH, IN, generator=gen).to(torch.bfloat16).to(w.device)
    x_local, dy_local = _chunk(x, 0, w.rank, w.size), _chunk(dy, 0, w.rank, w.size)
    torch.manual_seed(SEED)
    model = te.LayerNormMLP(
        IN,
        OUT,
        sequence_parallel=True,
        set_parallel_mode=True,
        tp_group=w.group,
        tp_size=w.size,
        params_dtype=torch.bfloat16,
        device=w.device,
    )
    names = ["output", "input grad"] + [f"{name} grad" for name, _ in model.named_parameters()]
    eager, info = _compiled_matches_eager(model, x_local, dy_local, recipe, names)
    high = _step(model, x_local, dy_local, f"{recipe}_hp_gather")
    exact = [i for i, n in enumerate(names) if n != "fc2_bias grad"]
    got, want = [eager[i] for i in exact], [high[i] for i in exact]
    _assert_bitwise(got, want, [names[i] for i in exact], "the high-precision gather")
    info["bitwise_equal_hp_gather"] = [names[i] for i in exact]
    return info


def _save_original(w: World, mode: str, recipe: str) -> dict[str, Any]:
    """``save_original_input=True`` under sequence parallelism: column-parallel, the
    local input shard is kept and re-gathered in high precision, then quantized whole
    (the bits of the quantized shards gathered: one amax over the group, whole blocks);
    row-parallel, the wgrad GEMM reads the input quantized again, so the output gradient
    is still gathered quantized. Bitwise the layer without it; compiled equals eager."""
    layer, t = _distributed(w, mode)
    x, dy = _inputs(w, mode, t)
    want = _step(layer, x, dy, recipe)
    layer.save_original_input = True
    eager, info = _compiled_matches_eager(layer, x, dy, recipe, NAMES)
    _assert_bitwise(eager, want, NAMES, "the layer keeping its quantized input")
    return info


def run_sp_fp8_case(w: World, name: str) -> dict[str, Any]:
    parts = name.split("-")
    if name.startswith("spfp8-save-original-"):
        return _save_original(w, parts[-2], parts[-1])
    if name.startswith("spfp8-gather-options-agree-"):
        return _gather_options_agree(w, parts[-2], parts[-1])
    if name.startswith("spfp8-bytes-"):
        return _bytes(w, parts[-2], parts[-1])
    if name.startswith("spfp8-lnmlp-"):
        return _lnmlp(w, parts[-1])
    if name.startswith("spfp8-inductor-"):
        return _parity(w, parts[2], parts[3], backend="inductor")
    if name.endswith("-shortshards"):  # 16 local rows
        return _parity(w, parts[1], parts[2], seq=SEQ // 2)
    if name.endswith("-8rows"):
        return _parity(w, parts[1], parts[2], seq=SEQ // 4)
    return _parity(w, parts[1], parts[2])
