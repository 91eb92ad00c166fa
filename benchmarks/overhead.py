"""Figure 7: the per-call overhead of the op path, against its kernel and torch.nn.Linear.

One layer (``rows x hidden`` input, ``hidden x hidden`` weight, bias), each contender
called in turn (``common.interleaved``):

* no grad: ``torch.nn.Linear``; ``kernel`` (``linear_forward`` on a ready bundle, the
  impl alone); ``op`` (``teops::linear_fwd`` on ready slots: the dispatcher, argument
  conversion, unflatten, result packing); ``compiled call`` (``linear_compiled``:
  flatten + op + user outputs, what a compiled graph's trace is made of, run eagerly);
  ``eager call`` (``linear_eager``: field checks + impl); ``module`` (our ``Linear``:
  its fields by name into ``call_linear``, whose plain call serves this one);
* forward + backward (autograd): the same, each followed by ``backward`` (``kernel``:
  ``linear_forward`` + ``LINEAR.backward_args`` + ``linear_backward`` called directly).

Then one training step (forward + backward) of an 8-layer MLP (ReLU between layers) of
our ``Linear`` and of ``torch.nn.Linear``, eager and ``torch.compile(fullgraph=True)``
(and, on CUDA, ``mode="reduce-overhead"``). *per layer over torch.nn.Linear* is (our
step - its step) / 8, the fixed cost our op path adds per layer.

On the CPU both run in float32 (our ``gemm`` computes in fp32 there, and this CPU's
bf16 GEMMs are ~10x slower than fp32 ones, which would bury the overhead); on CUDA in
bfloat16. Importable without running: :func:`run` is what ``python -m benchmarks``
calls (``--only overhead`` on the CPU; on ``--device cuda`` it adds this figure).
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch.utils import benchmark

from transformer_engine_ops.generated import linear as g
from transformer_engine_ops.modules.linear import Linear
from transformer_engine_ops.ops.linear import (
    LINEAR,
    LinearFwdArgs,
    linear_backward,
    linear_forward,
)
from transformer_engine_ops.runtime.lowering import inductor_backend

from .common import progress, ratio_stats, stats

LAYERS = 8
# ``ours`` compiled is a plain ``torch.compile``: plain op calls lowered into Inductor's
# graph (bitwise equal to eager). Beside it, our MLP compiled with every op call kept as
# a node (``inductor_backend(lowering="off")``), and with every piece left to Inductor
# (``lowering="rounding"``, equal to eager to rounding).
OP_NODES = "ours-op-nodes"
LOWERED_ROUNDING = "ours-lowered-rounding"
_LOWERINGS = {OP_NODES: "off", LOWERED_ROUNDING: "rounding"}
CALLS = ("torch", "kernel", "op", "compiled call", "eager call", "module")


def _dtype(device: str) -> torch.dtype:
    return torch.float32 if device == "cpu" else torch.bfloat16


def module_call_fields(module: Linear, x: torch.Tensor) -> dict[str, Any]:
    """The fields our module's call on ``x`` hands ``call_linear`` (recorded)."""
    from transformer_engine_ops.modules import linear as linear_module

    seen: list[dict[str, Any]] = []
    entry = linear_module.call_linear
    linear_module.call_linear = lambda **kw: seen.append(kw) or entry(**kw)
    try:
        module(x)
    finally:
        linear_module.call_linear = entry
    return {k: v for k, v in seen[0].items() if k != "keep"}


def _layer_contenders(rows: int, hidden: int, device: str) -> dict[str, Any]:
    dtype = _dtype(device)
    torch.manual_seed(0)
    ours = Linear(hidden, hidden, params_dtype=dtype, device=device)
    ref = torch.nn.Linear(hidden, hidden, dtype=dtype, device=device)
    x = torch.randn(rows, hidden, dtype=dtype, device=device)
    xg = x.clone().requires_grad_(True)
    dy = torch.ones(rows, hidden, dtype=dtype, device=device)
    with torch.no_grad():
        args = LinearFwdArgs(**module_call_fields(ours, x))
    fields_g = module_call_fields(ours, xg)
    args_g = LinearFwdArgs(**fields_g)
    slots = g.flatten_linear_fwd_args(args)
    op = g.linear_fwd

    def no_grad(fn: Any) -> Any:
        def run() -> None:
            with torch.no_grad():
                fn()

        return run

    def kernel_step() -> None:
        outputs, saved = linear_forward(args_g)
        bwd = LINEAR.backward_args(args_g, outputs, saved)
        bwd.grad_outputs = [dy]
        linear_backward(bwd)

    def bundle() -> Any:  # a fresh bundle per call, as the op path makes
        return LinearFwdArgs(**fields_g)

    fns = {
        "no grad/torch": no_grad(lambda: ref(x)),
        "no grad/kernel": no_grad(lambda: linear_forward(args)),
        "no grad/op": no_grad(lambda: op(*slots)),
        "no grad/compiled call": no_grad(
            lambda: g.linear_compiled(g.flatten_linear_fwd_args(args))
        ),
        "no grad/eager call": no_grad(lambda: g.linear_eager(args)),
        "no grad/module": no_grad(lambda: ours(x)),
        "autograd/torch": lambda: ref(xg).backward(dy),
        "autograd/kernel": kernel_step,
        "autograd/op": lambda: op(*g.flatten_linear_fwd_args(bundle()))[0].backward(dy),
        "autograd/compiled call": lambda: g.linear_compiled(g.flatten_linear_fwd_args(bundle()))[0][
            0
        ].backward(dy),
        "autograd/eager call": lambda: g.linear_eager(bundle())[0][0].backward(dy),
        "autograd/module": lambda: ours(xg).backward(dy),
    }
    return {**fns, **_dispatch_contenders(x, slots)}


_BENCH_LIBRARY: list[Any] = []  # the benchmark's own op library, defined once per process


def _dispatch_contenders(x: torch.Tensor, slots: tuple[Any, ...]) -> dict[str, Any]:
    """The dispatcher's cost by schema width, no grad: ops whose kernel does nothing
    (returns an empty list), called with ``teops::linear_fwd``'s 36 slots and schema,
    with 7 slots (the tensors, one ``str``, two ``SymInt``: what the same op would take
    with its plain values packed) and with 2 tensors; and the same Python kernel called
    directly. What a schema of N plain values costs per call, whatever the kernel does."""
    if not _BENCH_LIBRARY:
        lib = torch.library.Library("teops_bench", "FRAGMENT")
        lib.define("wide" + g.FORWARD_SCHEMA)
        lib.define(
            "packed(Tensor? weight, Tensor inp, Tensor? bias, Tensor? workspace, str config, "
            "SymInt in_features, SymInt out_features) -> Tensor[]"
        )
        lib.define("narrow(Tensor weight, Tensor inp) -> Tensor[]")
        for name in ("wide", "packed", "narrow"):
            lib.impl(name, _nothing, "CompositeExplicitAutograd")
        _BENCH_LIBRARY.append(lib)
    ops = torch.ops.teops_bench
    w = slots[0]
    packed = (w, x, slots[4], None, "input_requires_grad=False;fp8=False;...", 256, 256)

    def no_grad(fn: Any) -> Any:
        def run() -> None:
            with torch.no_grad():
                fn()

        return run

    return {
        "dispatch/36 slots (linear_fwd schema)": no_grad(lambda: ops.wide.default(*slots)),
        "dispatch/7 slots": no_grad(lambda: ops.packed.default(*packed)),
        "dispatch/2 slots": no_grad(lambda: ops.narrow.default(w, x)),
        "dispatch/its kernel called directly": no_grad(lambda: _nothing(*slots)),
    }


def _nothing(*slots: Any) -> list[torch.Tensor]:
    return []


class _MLP(torch.nn.Module):
    def __init__(self, kind: str, hidden: int, device: str, dtype: torch.dtype) -> None:
        super().__init__()
        torch.manual_seed(0)
        make = (
            (lambda: Linear(hidden, hidden, params_dtype=dtype, device=device))
            if kind == "ours"
            else (lambda: torch.nn.Linear(hidden, hidden, dtype=dtype, device=device))
        )
        self.layers = torch.nn.ModuleList([make() for _ in range(LAYERS)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i + 1 < len(self.layers):
                x = torch.relu(x)
        return x


def _step_contenders(rows: int, hidden: int, device: str) -> dict[str, Any]:
    dtype = _dtype(device)
    x = torch.randn(rows, hidden, dtype=dtype, device=device, requires_grad=True)
    modes = ("eager", "compiled") + (("reduce-overhead",) if device == "cuda" else ())
    fns: dict[str, Any] = {}
    for kind in ("torch", "ours", *_LOWERINGS):
        for mode in modes:
            if kind in _LOWERINGS and mode == "eager":
                continue  # a lowering is a compile backend
            torch._dynamo.reset()
            model: Any = _MLP("ours" if kind in _LOWERINGS else kind, hidden, device, dtype)
            params = list(model.parameters())
            graph_mode = "reduce-overhead" if mode == "reduce-overhead" else None
            if kind in _LOWERINGS:
                backend = inductor_backend(mode=graph_mode, lowering=_LOWERINGS[kind])
                model = torch.compile(model, fullgraph=True, backend=backend)
            elif mode != "eager":
                model = torch.compile(model, fullgraph=True, mode=graph_mode)

            def step(model: Any = model, params: list = params, graphs: str = mode) -> None:
                if graphs == "reduce-overhead":
                    torch.compiler.cudagraph_mark_step_begin()
                for p in params:
                    p.grad = None
                x.grad = None
                model(x).float().pow(2).mean().backward()

            for _ in range(3):  # compile (and record the CUDA graph) before timing
                step()
            fns[f"{kind}/{mode}"] = step
            progress(f"figure 8: {kind}/{mode} MLP step warmed up")
    return fns


def _interleaved(
    fns: dict[str, Any], rounds: int, min_run_time: float, timer: Any
) -> dict[str, list[float]]:
    """``common.interleaved`` with a chosen clock (seconds per call, per round)."""
    timers = {k: benchmark.Timer("fn()", globals={"fn": f}, timer=timer) for k, f in fns.items()}
    out: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, t in timers.items():
            out[k].append(t.blocked_autorange(min_run_time=min_run_time).median)
    return out


def run(
    device: str = "cpu",
    shape: tuple[int, int] = (64, 256),
    rounds: int = 5,
    min_run_time: float = 0.2,
) -> dict[str, Any]:
    """The figure's numbers (JSON-ready): microseconds per call and per step, medians
    over ``rounds`` interleaved rounds, and the derived overheads."""
    rows, hidden = shape
    progress(f"figure 8: per-call overhead, {device} {rows}x{hidden}, {rounds} rounds")
    # The CPU figure is CPU time of this process on one torch thread: on a shared VM,
    # wall time mostly measures the wait for a core. CUDA: wall time (GPU work is async).
    cpu = device == "cpu"
    timer = time.process_time if cpu else time.perf_counter
    threads = torch.get_num_threads()
    if cpu:
        torch.set_num_threads(1)
    try:
        calls = _interleaved(_layer_contenders(rows, hidden, device), rounds, min_run_time, timer)
        steps = _interleaved(_step_contenders(rows, hidden, device), rounds, min_run_time, timer)
    finally:
        torch.set_num_threads(threads)
    us = {k: stats([s * 1e6 for s in v]) for k, v in {**calls, **steps}.items()}
    over_kernel = {}
    for grad in ("no grad", "autograd"):
        kernel = calls[f"{grad}/kernel"]
        for name in CALLS:
            if name != "kernel":
                key = f"{grad}/{name}"
                over_kernel[key] = stats(
                    [(a - b) * 1e6 for a, b in zip(calls[key], kernel, strict=True)]
                )
    per_layer, vs_torch = {}, {}
    for key, samples in steps.items():
        kind, mode = key.split("/")
        if kind != "torch":
            base = steps[f"torch/{mode}"]
            name = mode if kind == "ours" else f"{kind} {mode}"
            per_layer[name] = stats(
                [(a - b) * 1e6 / LAYERS for a, b in zip(samples, base, strict=True)]
            )
            vs_torch[name] = ratio_stats(samples, base)
    for k, v in us.items():
        progress(f"  {k}: {v['median']:.1f} us (IQR {v['q1']:.1f}-{v['q3']:.1f})")
    return {
        "device": device,
        "clock": "process CPU time, 1 torch thread" if cpu else "wall time",
        "dtype": str(_dtype(device)).removeprefix("torch."),
        "shape": [rows, hidden],
        "layers": LAYERS,
        "us": us,
        "over_kernel_us": over_kernel,
        "step_per_layer_over_torch_us": per_layer,
        "step_ratio_vs_torch": vs_torch,
    }
