"""What each rank of the distributed Linear tests runs (imported by the spawned workers).

One launch runs every case of a list in the same order on every rank and writes one
JSON file per rank (rewritten after every case, so a killed launch keeps what it
finished). A case returns a small dict of facts, or raises; the pytest side asserts on
both ranks' records. Cases communicate only through the Linear under test: every
comparison is local (each rank slices the single-process reference itself), so a
failing assertion never leaves the other rank waiting in a collective.
"""

from __future__ import annotations

import json
import os
import time
import traceback
import warnings
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._dynamo.utils import counters

from transformer_engine_ops.modules.autocast import autocast
from transformer_engine_ops.modules.linear import Linear
from transformer_engine_ops.quantization import Float8CurrentScaling
from transformer_engine_ops.runtime.fallback import reset_warnings

# (seq, batch, hidden): dim 0 is the sequence dim sequence parallelism splits.
SEQ, BATCH, IN, OUT = 8, 2, 64, 32
SEED = 1234
# Process-group timeout: a rank left waiting in a collective errors out after this.
PG_TIMEOUT_S = 30

RECIPES = {"bf16": None, "fp8_current": Float8CurrentScaling}
# Single-process reference within: relative Frobenius error (bf16: rounding of split
# sums; FP8 current scaling: per-shard scales differ from the full tensor's, see
# docs/distributed.md).
REF_TOL = {"bf16": 2e-2, "fp8_current": 1.5e-1}

PARITY = [
    f"parity-{mode}-{'sp' if sp else 'nosp'}-{recipe}"
    for mode in ("column", "row")
    for sp in (False, True)
    for recipe in RECIPES
]
MLP = [f"mlp-{'sp' if sp else 'nosp'}-{recipe}" for sp in (False, True) for recipe in RECIPES]
# The MLP compiled on Inductor (which lowers plain calls): its calls carry a process
# group, so none is lowered (collectives need the op) and compiled stays bitwise equal to eager.
LOWERED = [f"lowered-{name}" for name in MLP if name.endswith("-bf16")]
UNUSED = ["unused-output-aot_eager", "unused-output-inductor"]
ERRORS = [
    "error-bad-parallel-mode",
    "error-tp-size-does-not-divide-out-features",
    "error-tp-size-does-not-divide-in-features",
    "error-tp-size-differs-from-group-size",
    "error-missing-group",
    "error-row-sp-sequence-not-divisible",
    "error-group-not-registered-eager",
    "error-group-not-registered-compiled",
    "ranks-still-in-step",
]
# reduce-overhead (CUDA graphs) only where there is CUDA: the NCCL launch.
REDUCE_OVERHEAD = [f"ro-{name}" for name in PARITY]


def cases_for(backend: str) -> list[str]:
    names = PARITY + MLP + LOWERED + UNUSED + ERRORS
    if backend == "nccl":
        names = PARITY + REDUCE_OVERHEAD + MLP + LOWERED + UNUSED + ERRORS
    return names


# --- the world each case sees --------------------------------------------------------


class World:
    def __init__(self, rank: int, size: int, device: torch.device, group: Any) -> None:
        self.rank, self.size, self.device, self.group = rank, size, device, group


def _chunk(t: torch.Tensor, dim: int, rank: int, parts: int) -> torch.Tensor:
    return t.chunk(parts, dim)[rank].contiguous()


def _full_tensors(device: torch.device) -> dict[str, torch.Tensor]:
    """The full-size input, output grad and biases; identical on every rank."""
    gen = torch.Generator().manual_seed(SEED + 1)
    t = {
        "x": torch.randn(SEQ, BATCH, IN, generator=gen),
        "dy": torch.randn(SEQ, BATCH, OUT, generator=gen),
        "bias": torch.randn(OUT, generator=gen),
        "x_mlp": torch.randn(SEQ, BATCH, IN, generator=gen),
        "dy_mlp": torch.randn(SEQ, BATCH, IN, generator=gen),
        "bias1": torch.randn(OUT, generator=gen),
        "bias2": torch.randn(IN, generator=gen),
    }
    return {k: v.to(torch.bfloat16).to(device) for k, v in t.items()}


def _make_linear(w: World, in_f: int, out_f: int, mode: str | None, sp: bool) -> Linear:
    torch.manual_seed(SEED)  # the same full weight on every rank and in the reference
    return Linear(
        in_f,
        out_f,
        params_dtype=torch.bfloat16,
        device=w.device,
        tp_group=w.group if mode else None,
        tp_size=w.size if mode else 1,
        parallel_mode=mode,
        sequence_parallel=sp,
    )


def _set_bias(layer: Linear, full: torch.Tensor, w: World) -> None:
    with torch.no_grad():
        local = _chunk(full, 0, w.rank, w.size) if layer.parallel_mode == "column" else full
        layer.bias.copy_(local)


def _recipe(name: str) -> Any:
    factory = RECIPES[name]
    return autocast(recipe=factory()) if factory is not None else _Null()


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def _step(model: Any, params: list[torch.nn.Parameter], x: torch.Tensor, dy: torch.Tensor, recipe):
    """One forward and backward with output grad ``dy``: (out, dx, param grads), cloned."""
    for p in params:
        p.grad = None
    x = x.detach().clone().requires_grad_(True)
    with _recipe(recipe):
        y = model(x)
    y.backward(dy)
    return [y.detach().clone(), x.grad.clone(), *[p.grad.clone() for p in params]]


def _graph_breaks() -> int:
    return sum(counters["graph_break"].values())


def _assert_equal(got: list[torch.Tensor], want: list[torch.Tensor], names: list[str]) -> None:
    for g, e, n in zip(got, want, names, strict=True):
        assert g.shape == e.shape, f"{n}: shape {tuple(g.shape)} != {tuple(e.shape)}"
        assert torch.equal(g, e), f"{n}: compiled differs from eager (max |diff| " + (
            f"{(g.float() - e.float()).abs().max().item():.3g})"
        )


def _rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.float(), want.float()
    return ((got - want).norm() / want.norm().clamp_min(1e-12)).item()


def _compare_reference(
    got: list[torch.Tensor], want: list[torch.Tensor], names: list[str], tol: float
) -> dict[str, float]:
    errors = {}
    for g, e, n in zip(got, want, names, strict=True):
        assert g.shape == e.shape, f"{n}: shape {tuple(g.shape)} != reference {tuple(e.shape)}"
        errors[n] = _rel_error(g, e)
        assert errors[n] <= tol, f"{n}: relative error {errors[n]:.3g} vs single process > {tol}"
    return errors


def _compiled_matches_eager(
    model: torch.nn.Module,
    params: list[torch.nn.Parameter],
    x: torch.Tensor,
    dy: torch.Tensor,
    recipe: str,
    backend: str,
    mode: str | None,
    names: list[str],
) -> tuple[list[torch.Tensor], dict[str, Any]]:
    """Eager distributed vs compiled (fullgraph) distributed, three compiled steps:
    bitwise equal, no graph break, one graph. Returns the eager results."""
    eager = _step(model, params, x, dy, recipe)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, fullgraph=True, backend=backend, mode=mode)
    skips_before = None
    for i in range(3):
        got = _step(compiled, params, x, dy, recipe)
        _assert_equal(got, eager, names)
        if i == 0:
            skips_before = counters["inductor"]["cudagraph_skips"]
    info = {
        "graph_breaks": _graph_breaks(),
        "unique_graphs": counters["stats"]["unique_graphs"],
        "cudagraph_skips": counters["inductor"]["cudagraph_skips"] - (skips_before or 0),
    }
    assert info["graph_breaks"] == 0, dict(counters["graph_break"])
    assert info["unique_graphs"] == 1, f"{info['unique_graphs']} graphs (recompiled)"
    assert info["cudagraph_skips"] == 0, "CUDA graphs were skipped"
    return eager, info


# --- cases ---------------------------------------------------------------------------


def _parity(w: World, name: str) -> dict[str, Any]:
    parts = name.split("-")
    ro = parts[0] == "ro"
    _, mode, sp_name, recipe = parts[1:] if ro else parts
    sp = sp_name == "sp"
    t = _full_tensors(w.device)
    ref = _make_linear(w, IN, OUT, None, False)
    _set_bias(ref, t["bias"], w)
    layer = _make_linear(w, IN, OUT, mode, sp)
    _set_bias(layer, t["bias"], w)

    x, dy, r, n = t["x"], t["dy"], w.rank, w.size
    if mode == "column":
        # The weight is the reference's row block; the output is sharded on features.
        assert torch.equal(layer.weight, _chunk(ref.weight, 0, r, n)), "weight shard"
        x_local = _chunk(x, 0, r, n) if sp else x
        dy_local = _chunk(dy, -1, r, n)
    else:
        assert torch.equal(layer.weight, _chunk(ref.weight, 1, r, n)), "weight shard"
        x_local = _chunk(x, -1, r, n)
        dy_local = _chunk(dy, 0, r, n) if sp else dy

    names = ["output", "input grad", "weight grad", "bias grad"]
    params = [layer.weight, layer.bias]
    backend = "inductor" if ro else "aot_eager"
    eager, info = _compiled_matches_eager(
        layer, params, x_local, dy_local, recipe, backend, "reduce-overhead" if ro else None, names
    )

    out, dx, dw, db = _step(ref, [ref.weight, ref.bias], x, dy, recipe)
    if mode == "column":
        want = [
            _chunk(out, -1, r, n),
            _chunk(dx, 0, r, n) if sp else dx,
            _chunk(dw, 0, r, n),
            _chunk(db, 0, r, n),
        ]
    else:
        want = [_chunk(out, 0, r, n) if sp else out, _chunk(dx, -1, r, n), _chunk(dw, 1, r, n), db]
    info["ref_rel_error"] = _compare_reference(eager, want, names, REF_TOL[recipe])
    info["output_shape"] = list(eager[0].shape)
    return info


class _MegatronMLP(torch.nn.Module):
    """Column-parallel fc1 then row-parallel fc2 (the activations stay sharded between)."""

    def __init__(self, w: World, sp: bool, t: dict[str, torch.Tensor], parallel: bool) -> None:
        super().__init__()
        self.fc1 = _make_linear(w, IN, OUT, "column" if parallel else None, sp and parallel)
        self.fc2 = _make_linear(w, OUT, IN, "row" if parallel else None, sp and parallel)
        _set_bias(self.fc1, t["bias1"], w)
        _set_bias(self.fc2, t["bias2"], w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


def _mlp(w: World, name: str) -> dict[str, Any]:
    lowered = name.startswith("lowered-")
    _, sp_name, recipe = name.removeprefix("lowered-").split("-")
    sp = sp_name == "sp"
    t = _full_tensors(w.device)
    r, n = w.rank, w.size
    model = _MegatronMLP(w, sp, t, parallel=True)
    ref = _MegatronMLP(w, sp, t, parallel=False)
    x, dy = t["x_mlp"], t["dy_mlp"]
    x_local = _chunk(x, 0, r, n) if sp else x
    dy_local = _chunk(dy, 0, r, n) if sp else dy
    names = ["output", "input grad", "fc1.weight grad", "fc1.bias grad"]
    names += ["fc2.weight grad", "fc2.bias grad"]
    params = list(model.parameters())
    backend = "inductor" if lowered else "aot_eager"
    eager, info = _compiled_matches_eager(
        model, params, x_local, dy_local, recipe, backend, None, names
    )
    out, dx, dw1, db1, dw2, db2 = _step(ref, list(ref.parameters()), x, dy, recipe)
    want = [
        _chunk(out, 0, r, n) if sp else out,
        _chunk(dx, 0, r, n) if sp else dx,
        _chunk(dw1, 0, r, n),
        _chunk(db1, 0, r, n),
        _chunk(dw2, 1, r, n),
        db2,
    ]
    info["ref_rel_error"] = _compare_reference(eager, want, names, REF_TOL[recipe])
    return info


def _unused_output(w: World, name: str) -> dict[str, Any]:
    """Rank 0 runs a compiled function that discards a row-parallel Linear's output;
    rank 1 runs the same Linear eagerly. Were the op dead-code eliminated on rank 0,
    rank 1 would wait in its all-reduce until the process-group timeout."""
    backend = name.rsplit("-", 1)[1]
    layer = _make_linear(w, IN, OUT, "row", False)
    x = _chunk(_full_tensors(w.device)["x"], -1, w.rank, w.size)
    calls = []
    original = dist.all_reduce

    def counting_all_reduce(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return original(*args, **kwargs)

    def discard(inp: torch.Tensor) -> torch.Tensor:
        layer(inp)  # output unused
        return inp * 2

    dist.all_reduce = counting_all_reduce
    try:
        if w.rank == 0:
            fn = torch.compile(discard, fullgraph=True, backend=backend)
            out = fn(x)
            assert torch.equal(out, x * 2)
        else:
            layer(x)
    finally:
        dist.all_reduce = original
    assert len(calls) == 1, f"{len(calls)} all-reduces ran on rank {w.rank}, expected 1"
    return {"all_reduces": len(calls), "graph_breaks": _graph_breaks()}


def _expect_error(fn: Callable[[], Any], exc: type[BaseException], *fragments: str) -> str:
    try:
        fn()
    except exc as e:
        message = str(e)
        for fragment in fragments:
            assert fragment in message, f"{fragment!r} not in the error: {message}"
        # The line naming the problem (a compiled call wraps it in dynamo's report).
        lines = [line for line in message.splitlines() if fragments[-1] in line]
        return (lines or [message])[0].strip()
    raise AssertionError(f"no {exc.__name__} raised")


def _errors(w: World, name: str) -> dict[str, Any]:
    def make(**kw: Any) -> Callable[[], Linear]:
        base = dict(params_dtype=torch.bfloat16, device=w.device, tp_group=w.group, tp_size=2)
        return lambda: Linear(kw.pop("in_f", IN), kw.pop("out_f", OUT), **{**base, **kw})

    if name == "error-bad-parallel-mode":
        msg = _expect_error(make(parallel_mode="diagonal"), ValueError, "parallel_mode")
    elif name == "error-tp-size-does-not-divide-out-features":
        msg = _expect_error(
            make(out_f=33, parallel_mode="column"), ValueError, "out_features=33", "by 2"
        )
    elif name == "error-tp-size-does-not-divide-in-features":
        msg = _expect_error(make(in_f=63, parallel_mode="row"), ValueError, "in_features=63")
    elif name == "error-tp-size-differs-from-group-size":
        msg = _expect_error(
            make(parallel_mode="row", tp_size=4), ValueError, "tp_size=4", f"has {w.size} ranks"
        )
    elif name == "error-missing-group":
        msg = _expect_error(
            make(parallel_mode="column", tp_group=None), ValueError, "needs a tp_group"
        )
    elif name == "error-row-sp-sequence-not-divisible":
        layer = make(parallel_mode="row", sequence_parallel=True)()
        x = torch.randn(SEQ + 1, BATCH, IN // w.size, dtype=torch.bfloat16, device=w.device)
        compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
        msg = _expect_error(lambda: layer(x), ValueError, "divisible by tp_size")
        _expect_error(lambda: compiled(x), Exception, "divisible by tp_size")
    elif name == "error-group-not-registered-eager":
        doomed = dist.new_group(list(range(w.size)))
        dist.destroy_process_group(doomed)
        msg = _expect_error(
            make(parallel_mode="column", tp_group=doomed), ValueError, "not registered with c10d"
        )
    elif name == "error-group-not-registered-compiled":
        doomed = dist.new_group(list(range(w.size)))
        layer = make(parallel_mode="column", tp_group=doomed)()
        compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
        dist.destroy_process_group(doomed)
        x = torch.randn(SEQ, BATCH, IN, dtype=torch.bfloat16, device=w.device)
        # The generated unflatten (or the eager path's check) resolves the name.
        msg = _expect_error(lambda: compiled(x), Exception, "not registered with c10d")
        _expect_error(lambda: layer(x), ValueError, "not registered with c10d")
    elif name == "ranks-still-in-step":
        # After every error case, both ranks still meet in the same collective.
        v = torch.ones(1, device=w.device)
        dist.all_reduce(v, group=w.group)
        assert v.item() == w.size
        msg = "ok"
    else:
        raise KeyError(name)
    return {"message": msg[:400]}


class Skip(Exception):  # noqa: N818 - mirrors pytest.skip
    """A case that does not apply on this torch (reported as a skip)."""


def run_case(w: World, name: str) -> dict[str, Any]:
    if name.startswith("parity-") or name.startswith("ro-"):
        return _parity(w, name)
    if name.startswith("mlp-") or name.startswith("lowered-mlp-"):
        return _mlp(w, name)
    if name.startswith("unused-output-"):
        return _unused_output(w, name)
    if name.startswith("family-"):
        # The Linear family's cases (they build on the helpers above).
        from dist_family_cases import run_family_case

        return run_family_case(w, name)
    if name.startswith("transformer-"):
        from dist_transformer_cases import run_transformer_case

        return run_transformer_case(w, name)
    if name.startswith("fsdp2-"):
        from dist_fsdp2_cases import run_fsdp2_case

        return run_fsdp2_case(w, name)
    if name.startswith("spfp8-"):
        from dist_sp_fp8_cases import run_sp_fp8_case

        return run_sp_fp8_case(w, name)
    if name.startswith("grouped-"):
        from dist_grouped_cases import run_grouped_case

        return run_grouped_case(w, name)
    if name.startswith("overlap-"):
        from dist_overlap_cases import run_overlap_case

        return run_overlap_case(w, name)
    return _errors(w, name)


# --- the worker ------------------------------------------------------------------------


def worker(rank: int, world_size: int, backend: str, out_dir: str, names: list[str]) -> None:
    """Entry point of one spawned rank: run ``names`` in order, record each result."""
    warnings.filterwarnings("ignore")
    path = os.path.join(out_dir, f"rank{rank}.json")
    results: dict[str, Any] = {}

    def save() -> None:
        with open(path + ".tmp", "w") as f:
            json.dump(results, f)
        os.replace(path + ".tmp", path)

    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
            device = torch.device("cuda", rank)
        else:
            device = torch.device("cpu")
        dist.init_process_group(
            backend, rank=rank, world_size=world_size, timeout=timedelta(seconds=PG_TIMEOUT_S)
        )
        # The tensor-parallel group: a named subgroup, not the default group.
        group = dist.new_group(list(range(world_size)))
        w = World(rank, world_size, device, group)
    except Exception:
        results["__init__"] = {"ok": False, "error": traceback.format_exc()}
        save()
        raise
    for name in names:
        torch._dynamo.reset()
        counters.clear()
        reset_warnings()
        start = time.perf_counter()
        try:
            record = {"ok": True, "info": run_case(w, name)}
        except Skip as reason:
            record = {"ok": True, "skipped": str(reason), "info": {}}
        except Exception:  # noqa: BLE001 - reported to the parent, next case runs
            record = {"ok": False, "error": traceback.format_exc()[-4000:]}
        record["seconds"] = round(time.perf_counter() - start, 2)
        results[name] = record
        save()
    results["__done__"] = {"ok": True}
    save()
    dist.destroy_process_group()
