# expect: 43:6 imported into the generated module as `_b`, which clashes with the import of `transformer_engine_ops.runtime.boundary`
"""Corpus: an impl named `_b`, the name generated code gives the boundary helpers."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from transformer_engine_ops.runtime.declaration import OpDeclaration


@dataclass
class FwdArgs:
    inp: torch.Tensor


@dataclass
class BwdArgs:
    grad_outputs: list[torch.Tensor]


def _b(args):
    return (args.inp,), ()


def bwd(args):
    return (args.grad_outputs[0],)


def fwd_spec(args):
    return (args.inp,), ()


def bwd_spec(args):
    return (args.grad_outputs[0],)


def setup(ctx, args, outputs, saved):
    return BwdArgs(grad_outputs=[])


OP = OpDeclaration(
    name="shadowed",
    forward=FwdArgs,
    backward=BwdArgs,
    grad_fields=("inp",),
    forward_impl=_b,
    backward_impl=bwd,
    forward_spec=fwd_spec,
    backward_spec=bwd_spec,
    setup_context=setup,
)
