"""Boundary cost: generated flatten+unflatten of LinearFwdArgs vs torch.utils._pytree.

Run: python benchmarks/boundary.py. Both sides are timed in one process with
torch.utils.benchmark (medians over repeated blocks), interleaved.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.utils._pytree as pytree
from torch.utils import benchmark
from transformer_engine_ops.generated.linear import (
    flatten_linear_fwd_args,
    unflatten_linear_fwd_args,
)

from transformer_engine_ops.modules.autocast import RecipeQuantizers
from transformer_engine_ops.ops.linear import LinearFwdArgs
from transformer_engine_ops.quantization import Float8CurrentScaling
from transformer_engine_ops.runtime.values import GemmConfig


def realistic_args() -> LinearFwdArgs:
    q = RecipeQuantizers.from_recipe(Float8CurrentScaling())
    weight = q.weight.with_internal(True).quantize(torch.randn(32, 64))
    return LinearFwdArgs(
        weight=weight,
        inp=torch.randn(8, 64),
        bias=torch.randn(32),
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
        fprop_gemm=GemmConfig(),
        dgrad_gemm=GemmConfig(),
        wgrad_gemm=GemmConfig(),
        is_first_microbatch=None,
        cache_weight=False,
        parallel_mode=None,
        tp_group=None,
        tp_size=1,
        sequence_parallel=False,
        in_features=64,
        out_features=32,
        ub_overlap_ag_fprop=False,
        ub_overlap_rs_fprop=False,
        ub_name=None,
        wgrad_store=None,
        is_grad_enabled=True,
    )


def main() -> None:
    args = realistic_args()
    names = [f.name for f in dataclasses.fields(LinearFwdArgs)]
    pytree.register_dataclass(LinearFwdArgs, field_names=names)

    def generated() -> None:
        unflatten_linear_fwd_args(*flatten_linear_fwd_args(args))

    def with_pytree() -> None:
        leaves, spec = pytree.tree_flatten(args)
        pytree.tree_unflatten(leaves, spec)

    assert unflatten_linear_fwd_args(*flatten_linear_fwd_args(args)).inp is args.inp
    results = {}
    for _ in range(3):  # interleave the two so machine noise hits both
        for label, fn in (("generated", generated), ("pytree", with_pytree)):
            m = benchmark.Timer("fn()", globals={"fn": fn}).blocked_autorange(min_run_time=0.5)
            results.setdefault(label, []).append(m.median * 1e6)
    gen, tree = sorted(results["generated"])[1], sorted(results["pytree"])[1]
    print(f"generated flatten+unflatten: {gen:.2f} us (runs {results['generated']})")
    print(f"pytree    flatten+unflatten: {tree:.2f} us (runs {results['pytree']})")
    print(f"ratio pytree/generated: {tree / gen:.1f}x")


if __name__ == "__main__":
    main()
