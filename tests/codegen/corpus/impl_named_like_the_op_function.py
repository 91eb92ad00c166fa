# expect: 43:6 imported into the generated module as `lin_fwd`, which clashes with the generated `lin_fwd = ...`
"""Corpus: an impl named like the op function the generator defines (`<op>_fwd`)."""

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


def lin_fwd(args):
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
    name="lin",
    forward=FwdArgs,
    backward=BwdArgs,
    grad_fields=("inp",),
    forward_impl=lin_fwd,
    backward_impl=bwd,
    forward_spec=fwd_spec,
    backward_spec=bwd_spec,
    setup_context=setup,
)
