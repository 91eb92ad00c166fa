# expect: 43:6 the generated module would define `flatten_xy_fwd` twice
"""Corpus: an op name whose `<op>_fwd` is the generated flatten function of a bundle."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from transformer_engine_ops.runtime.declaration import OpDeclaration


@dataclass
class XyFwd:
    inp: torch.Tensor


@dataclass
class BwdArgs:
    grad_outputs: list[torch.Tensor]


def fwd(args):
    return (args.inp,), ()


def bwd(args):
    return (args.grad_outputs[0],)


def fwd_spec(args):
    return (args.inp,), ()


def bwd_spec(args):
    return (args.grad_outputs[0],)


def setup(ctx, args, outputs, saved):
    return dict()


OP = OpDeclaration(
    name="flatten_xy",
    forward=XyFwd,
    backward=BwdArgs,
    grad_fields=("inp",),
    forward_impl=fwd,
    backward_impl=bwd,
    forward_spec=fwd_spec,
    backward_spec=bwd_spec,
    setup_context=setup,
)
