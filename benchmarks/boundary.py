"""Figure 1: the op boundary. Flatten + unflatten of LinearFwdArgs and LinearBwdArgs.

Three contenders on the same realistic bundles (plain and FP8 tensors, a quantized
weight storage, six quantizers, a c10d process group crossing by name, Nones):

* ``generated``: the checked-in straight-line ``flatten_*`` / ``unflatten_*``;
* ``pytree``: ``torch.utils._pytree`` with the bundles registered by ``register_dataclass``
  (no checks, no quantized-value flattening: it does less work than the other two);
* ``reflection``: :mod:`benchmarks.reflection_plan`, TE 2.20's approach, same checks.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.distributed as dist
import torch.utils._pytree as pytree

from transformer_engine_ops.generated.linear import (
    flatten_linear_bwd_args,
    flatten_linear_fwd_args,
    unflatten_linear_bwd_args,
    unflatten_linear_fwd_args,
)
from transformer_engine_ops.modules.autocast import RecipeQuantizers
from transformer_engine_ops.ops.linear import LinearBwdArgs, LinearFwdArgs
from transformer_engine_ops.quantization import Float8CurrentScaling
from transformer_engine_ops.runtime.values import GemmConfig

from .common import interleaved, progress, ratio_stats, stats
from .reflection_plan import Plan


def process_group() -> dist.ProcessGroup:
    """A real c10d group (single-process gloo), so the group crosses by registry name."""
    if not dist.is_initialized():
        dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    group = dist.group.WORLD
    assert group is not None
    return group


def realistic_args(rows: int = 64, hidden: int = 256) -> tuple[LinearFwdArgs, LinearBwdArgs]:
    q = RecipeQuantizers.from_recipe(Float8CurrentScaling())
    group = process_group()
    weight = q.weight.with_internal(True).quantize(torch.randn(hidden, hidden))
    inputmat = q.input.with_internal(True).quantize(torch.randn(rows, hidden))
    gemm = GemmConfig()
    fwd = LinearFwdArgs(
        weight=weight,
        inp=torch.randn(rows, hidden),
        bias=torch.randn(hidden),
        weight_workspace=None,
        input_requires_grad=True,
        weight_requires_grad=True,
        bias_requires_grad=True,
        input_quantizer=q.input,
        weight_quantizer=q.weight,
        output_quantizer=q.output,
        grad_input_quantizer=q.grad_input,
        grad_weight_quantizer=q.grad_weight,
        grad_output_quantizer=q.grad_output,
        activation_dtype=torch.bfloat16,
        fp8=True,
        fp8_output=False,
        backward_override=None,
        fprop_gemm=gemm,
        dgrad_gemm=gemm,
        wgrad_gemm=gemm,
        is_first_microbatch=None,
        cache_weight=False,
        parallel_mode="column",
        tp_group=group,
        tp_size=1,
        sequence_parallel=False,
        in_features=hidden,
        out_features=hidden,
        ub_overlap_ag_fprop=False,
        ub_overlap_rs_fprop=False,
        ub_name=None,
        wgrad_store=None,
        is_grad_enabled=True,
    )
    bwd = LinearBwdArgs(
        grad_outputs=[torch.randn(rows, hidden)],
        inputmat=inputmat,
        weight_fp8=weight,
        inp_shape=torch.Size((rows, hidden)),
        requires_dgrad=True,
        requires_wgrad=True,
        use_bias=True,
        input_quantizer=q.input,
        weight_quantizer=q.weight,
        grad_input_quantizer=q.grad_input,
        grad_weight_quantizer=q.grad_weight,
        grad_output_quantizer=q.grad_output,
        activation_dtype=torch.bfloat16,
        fp8=True,
        backward_override=None,
        dgrad_gemm=gemm,
        wgrad_gemm=gemm,
        parallel_mode="column",
        tp_group=group,
        tp_size=1,
        sequence_parallel=False,
        ub_overlap_ag_dgrad=False,
        ub_overlap_rs_dgrad=False,
        ub_bulk_wgrad=False,
        wgrad_store=None,
        main_grad_func=None,
    )
    return fwd, bwd


def _register_pytree(cls: type) -> None:
    try:
        pytree.register_dataclass(cls, field_names=[f.name for f in dataclasses.fields(cls)])
    except ValueError:  # already registered in this process
        pass


def _same_fields(a: Any, b: Any) -> None:
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, torch.Tensor) or hasattr(x, "_quantizer"):
            assert type(x) is type(y), f.name
        else:
            assert x == y, f"{f.name}: {x!r} != {y!r}"


def contenders(fwd: LinearFwdArgs, bwd: LinearBwdArgs) -> dict[str, dict[str, Any]]:
    """``{bundle: {contender: round-trip callable}}``, each checked to round-trip."""
    _register_pytree(LinearFwdArgs)
    _register_pytree(LinearBwdArgs)
    out: dict[str, dict[str, Any]] = {}
    for label, args, flatten, unflatten in (
        ("LinearFwdArgs", fwd, flatten_linear_fwd_args, unflatten_linear_fwd_args),
        ("LinearBwdArgs", bwd, flatten_linear_bwd_args, unflatten_linear_bwd_args),
    ):
        plan = Plan(type(args))
        assert plan.flatten(args) == flatten(args)  # the same slots, in the same order
        assert plan.schema.count(",") == len(flatten(args)) - 1

        def generated(args: Any = args, f: Any = flatten, u: Any = unflatten) -> Any:
            return u(*f(args))

        def with_pytree(args: Any = args) -> Any:
            leaves, spec = pytree.tree_flatten(args)
            return pytree.tree_unflatten(leaves, spec)

        def reflection(args: Any = args, plan: Plan = plan) -> Any:
            return plan.unflatten(*plan.flatten(args))

        for fn in (generated, with_pytree, reflection):
            _same_fields(args, fn())
        out[label] = {"generated": generated, "pytree": with_pytree, "reflection": reflection}
    return out


def run(rounds: int = 7, min_run_time: float = 0.2) -> dict[str, Any]:
    progress("figure 1: boundary flatten+unflatten (generated vs pytree vs reflection)")
    fwd, bwd = realistic_args()
    results: dict[str, Any] = {}
    for bundle, fns in contenders(fwd, bwd).items():
        runs = interleaved(fns, rounds=rounds, min_run_time=min_run_time, label=bundle)
        gen = runs["generated"]
        results[bundle] = {
            "us": {k: stats([s * 1e6 for s in v]) for k, v in runs.items()},
            "ratio_vs_generated": {
                k: ratio_stats(v, gen) for k, v in runs.items() if k != "generated"
            },
        }
        r = results[bundle]
        progress(
            f"  {bundle}: generated {r['us']['generated']['median']:.2f} us, "
            f"pytree {r['us']['pytree']['median']:.2f} us "
            f"({r['ratio_vs_generated']['pytree']['median']:.1f}x), "
            f"reflection {r['us']['reflection']['median']:.2f} us "
            f"({r['ratio_vs_generated']['reflection']['median']:.1f}x)"
        )
    return results
