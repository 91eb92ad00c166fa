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
* FP8 current scaling with ``fp8_all_gather=False`` (high precision on the wire)
  gives the same bits as the FP8 all-gather;
* ``bytes-*`` counts what each all-gather moves: FP8 half of bf16.

Each rank compares locally; no assertion can strand the other rank in a collective.
"""

from __future__ import annotations

from typing import Any

import torch
from dist_cases import SEED, World, _assert_equal, _chunk, _graph_breaks
from torch._dynamo.utils import counters

import transformer_engine_ops as te
from transformer_engine_ops.modules.autocast import autocast
from transformer_engine_ops.ops import linear as linear_op
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
    "fp8_block": Float8BlockScaling,
    # Stochastic rounding draws per call; off, so the reference can match bit for bit.
    "nvfp4": lambda: NVFP4BlockScaling(disable_stochastic_rounding=True),
}
SP_FP8 = [f"spfp8-{mode}-{recipe}" for mode in ("column", "row") for recipe in RECIPES]
SP_FP8 += ["spfp8-gather-options-agree-column", "spfp8-gather-options-agree-row"]
SP_FP8 += ["spfp8-bytes-column", "spfp8-bytes-row", "spfp8-lnmlp-fp8_current"]

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


def _tensors(w: World) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(SEED + 29)
    t = {
        "x": torch.randn(SEQ, BATCH, IN, generator=gen),
        "dy": torch.randn(SEQ, BATCH, OUT, generator=gen),
        "bias": torch.randn(OUT, generator=gen),
    }
    # Make rank 1's rows hold the largest magnitudes: a per-shard amax would differ.
    t["x"][SEQ // 2 :] *= 4
    t["dy"][SEQ // 2 :] *= 4
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
    model: torch.nn.Module, x: torch.Tensor, dy: torch.Tensor, recipe: str, names: list[str]
) -> tuple[list[torch.Tensor], dict[str, Any]]:
    """Eager vs compiled (fullgraph, aot_eager), two compiled steps: bitwise equal, no
    graph break, one graph. Returns the eager results."""
    eager = _step(model, x, dy, recipe)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
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


def _same_algorithm_reference(w: World, mode: str, t: dict[str, torch.Tensor], recipe: str):
    """What the distributed layer must give on this rank, bit for bit (output of the
    row-parallel layer excluded: its partial sums are reduced across ranks)."""
    r, n = w.rank, w.size
    mine = _shard_reference(w, mode, r, t, recipe)
    if mode == "column":
        # The input gradient is reduce-scattered: both shards' partial sums, added.
        other = _shard_reference(w, mode, 1 - r, t, recipe)
        dx = mine[1] + other[1]
        return [mine[0], _chunk(dx, 0, r, n), mine[2], mine[3]]
    dy_rows = t["dy"].reshape(-1, OUT).chunk(n, 0)
    bias_grad = torch.stack([rows.sum(0, dtype=torch.float32) for rows in dy_rows]).sum(0)
    if not _fp8_gather(recipe):  # dy gathered in high precision: one sum over all rows
        bias_grad = t["dy"].reshape(-1, OUT).sum(0, dtype=torch.float32)
    return [None, mine[1], mine[2], bias_grad.to(torch.bfloat16)]


def _assert_bitwise(
    got: list[torch.Tensor], want: list[torch.Tensor], names: list[str], what: str
) -> None:
    for g, e, n in zip(got, want, names, strict=True):
        assert g.shape == e.shape, f"{n}: shape {tuple(g.shape)} != {what}'s {tuple(e.shape)}"
        diff = (g.float() - e.float()).abs().max().item()
        assert torch.equal(g, e), f"{n}: differs from {what} (max |diff| {diff:.3g})"


def _fp8_gather(recipe: str) -> bool:
    return recipe == "fp8_current"


def _inputs(w: World, mode: str, t: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    r, n = w.rank, w.size
    if mode == "column":
        return _chunk(t["x"], 0, r, n), _chunk(t["dy"], -1, r, n)
    return _chunk(t["x"], -1, r, n), _chunk(t["dy"], 0, r, n)


def _distributed(w: World, mode: str, recipe: str) -> tuple[te.Linear, dict[str, torch.Tensor]]:
    t = _tensors(w)
    layer = _layer(w, IN, OUT, mode)
    with torch.no_grad():
        layer.bias.copy_(_chunk(t["bias"], 0, w.rank, w.size) if mode == "column" else t["bias"])
    return layer, t


def _parity(w: World, mode: str, recipe: str) -> dict[str, Any]:
    layer, t = _distributed(w, mode, recipe)
    x, dy = _inputs(w, mode, t)
    eager, info = _compiled_matches_eager(layer, x, dy, recipe, NAMES)
    want = _same_algorithm_reference(w, mode, t, recipe)
    pairs = [(g, e, n) for g, e, n in zip(eager, want, NAMES, strict=True) if e is not None]
    _assert_bitwise(*map(list, zip(*pairs, strict=True)), "the single-process reference")
    info["bitwise_equal_to_reference"] = [n for _, _, n in pairs]
    return info


def _gather_options_agree(w: World, mode: str) -> dict[str, Any]:
    """FP8 all-gather and high-precision all-gather: the same bits (a row-parallel bias
    gradient sums per-rank partials under the FP8 gather: close, not equal)."""
    layer, t = _distributed(w, mode, "fp8_current")
    x, dy = _inputs(w, mode, t)
    fp8 = _step(layer, x, dy, "fp8_current")
    high = _step(layer, x, dy, "fp8_current_hp_gather")
    exact = NAMES if mode == "column" else NAMES[:3]
    _assert_bitwise(fp8[: len(exact)], high[: len(exact)], exact, "the high-precision gather")
    info: dict[str, Any] = {"bitwise_equal": exact}
    if mode == "row":
        diff = (fp8[3].float() - high[3].float()).abs().max().item()
        scale = high[3].float().abs().max().item()
        assert diff <= 1e-2 * scale, f"bias grad: |diff| {diff} vs max {scale}"
        info["bias_grad_max_abs_diff"] = diff
    return info


def _bytes(w: World, mode: str) -> dict[str, Any]:
    """Bytes each rank sends per all-gather (eager and compiled alike call the op's
    kernel, which calls ``linear._all_gather_tensor``), FP8 vs high-precision gather."""
    layer, t = _distributed(w, mode, "fp8_current")
    x, dy = _inputs(w, mode, t)
    original = linear_op._all_gather_tensor
    sent: list[tuple[str, int]] = []

    def counting(out: torch.Tensor, inp: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        sent.append((str(inp.dtype).removeprefix("torch."), inp.numel() * inp.element_size()))
        return original(out, inp, *args, **kwargs)

    linear_op._all_gather_tensor = counting
    try:
        moved = {}
        for recipe in ("bf16", "fp8_current", "fp8_current_hp_gather"):
            sent.clear()
            _step(layer, x, dy, recipe)
            moved[recipe] = list(sent)
    finally:
        linear_op._all_gather_tensor = original
    local_rows = SEQ // w.size * BATCH
    if mode == "column":
        elems = local_rows * IN  # the input shard: gathered forward (and for wgrad)
        assert moved["bf16"] == [("bfloat16", 2 * elems)] * 2, moved["bf16"]
        assert moved["fp8_current_hp_gather"] == [("bfloat16", 2 * elems)], moved
        # Forward and the backward's re-gather of the kept local FP8 shard.
        assert moved["fp8_current"] == [("uint8", elems)] * 2, moved["fp8_current"]
    else:
        elems = local_rows * OUT  # dy's shard; the bias gradient's fp32 partials
        assert moved["bf16"] == [("bfloat16", 2 * elems)], moved["bf16"]
        assert moved["fp8_current_hp_gather"] == [("bfloat16", 2 * elems)], moved
        assert moved["fp8_current"] == [("float32", 4 * OUT), ("uint8", elems)], moved
    return {"bytes": {k: [b for _, b in v] for k, v in moved.items()}}


def _lnmlp(w: World) -> dict[str, Any]:
    """LayerNormMLP (fc1 column-, fc2 row-parallel) with SP under FP8 current scaling:
    compiled equal to eager, and FP8 gathers equal to high-precision gathers except the
    fc2 bias gradient (per-rank partial sums)."""
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
    eager, info = _compiled_matches_eager(model, x_local, dy_local, "fp8_current", names)
    high = _step(model, x_local, dy_local, "fp8_current_hp_gather")
    exact = [i for i, n in enumerate(names) if n != "fc2_bias grad"]
    got, want = [eager[i] for i in exact], [high[i] for i in exact]
    _assert_bitwise(got, want, [names[i] for i in exact], "the high-precision gather")
    info["bitwise_equal_hp_gather"] = [names[i] for i in exact]
    return info


def run_sp_fp8_case(w: World, name: str) -> dict[str, Any]:
    if name.startswith("spfp8-gather-options-agree-"):
        return _gather_options_agree(w, name.rsplit("-", 1)[1])
    if name.startswith("spfp8-bytes-"):
        return _bytes(w, name.rsplit("-", 1)[1])
    if name == "spfp8-lnmlp-fp8_current":
        return _lnmlp(w)
    _, mode, recipe = name.split("-", 2)
    return _parity(w, mode, recipe)
