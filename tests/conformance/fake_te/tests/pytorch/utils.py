"""Helpers of the fake TE test tree (a fixture of tests/conformance, written for it)."""

import torch

import transformer_engine
from transformer_engine.pytorch.module.base import get_dummy_wgrad


def make_recipe():
    return transformer_engine.common.recipe.DelayedScaling()


def reads_dummy_wgrad(weight):
    return get_dummy_wgrad(list(weight.shape), weight.dtype)


def reset_rng(seed=1234):
    torch.manual_seed(seed)
    torch.cuda.manual_seed(seed)
