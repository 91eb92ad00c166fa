"""Where a module puts its parameters and buffers (and ``InferenceParams`` its cache)
when its constructor is given no ``device``.

TE's constructors default to ``device="cuda"``; here ``device=None`` resolves, once, at
construction, to the first of:

1. torch's default device where the caller set one other than the CPU
   (``torch.set_default_device("cuda:1")``, a ``with torch.device("meta"):`` block);
2. the device named by the environment variable ``TEOPS_DEFAULT_DEVICE`` (``cpu``,
   ``cuda``, ``cuda:1``, ``meta``): a program written for TE's CUDA default runs on the
   CPU of a CUDA machine with ``TEOPS_DEFAULT_DEVICE=cpu`` (this package's test suite
   sets it for its CPU tests and the processes they start);
3. the current CUDA device when CUDA is available (TE's default);
4. the CPU, so that every module builds and runs on a machine without a GPU.

An explicit ``device`` (``"cpu"`` included) is always used as given.
"""

from __future__ import annotations

import os
from typing import Any

import torch

__all__ = ["DEFAULT_DEVICE_ENV", "default_device"]

DEFAULT_DEVICE_ENV = "TEOPS_DEFAULT_DEVICE"


def default_device(device: Any) -> Any:
    """``device``, or where ``device=None`` puts a module's tensors (the rule above)."""
    if device is not None:
        return device
    default = torch.get_default_device()
    if default.type != "cpu":
        return default
    named = os.environ.get(DEFAULT_DEVICE_ENV)
    if named:
        try:
            return torch.device(named)
        except RuntimeError as error:
            raise ValueError(
                f"{DEFAULT_DEVICE_ENV}={named!r} is not a torch device ({error}); "
                "use e.g. cpu, cuda, cuda:1 or meta"
            ) from None
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return default
