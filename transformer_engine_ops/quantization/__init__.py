"""Reference quantizers, quantized tensors, recipes and GEMM in plain PyTorch.

The public names load on first use: the quantized-tensor base (``quantizer``) sits below
the op glue (runtime/) and the kernels, which import it, so importing this package must
not import the formats, which import the kernels (docs/architecture.md, "Import layering").
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

# public name -> the module that defines it
_EXPORTS = {
    "DelayedScaling": ".recipes",
    "Float8BlockQuantizer": ".float8_block",
    "Float8BlockScaling": ".recipes",
    "Float8BlockwiseQTensor": ".float8_block",
    "Float8BlockwiseQTensorStorage": ".float8_block",
    "Float8CurrentScaling": ".recipes",
    "Float8CurrentScalingQuantizer": ".float8",
    "Float8Quantizer": ".float8",
    "Float8Tensor": ".float8",
    "Float8TensorStorage": ".float8",
    "Format": ".recipes",
    "MXFP8BlockScaling": ".recipes",
    "MXFP8Quantizer": ".mxfp8",
    "MXFP8Tensor": ".mxfp8",
    "MXFP8TensorStorage": ".mxfp8",
    "NVFP4BlockScaling": ".recipes",
    "NVFP4Quantizer": ".nvfp4",
    "NVFP4Tensor": ".nvfp4",
    "NVFP4TensorStorage": ".nvfp4",
    "Recipe": ".recipes",
    "gemm": ".gemm",
}

__all__ = [
    "DelayedScaling",
    "Float8BlockQuantizer",
    "Float8BlockScaling",
    "Float8BlockwiseQTensor",
    "Float8BlockwiseQTensorStorage",
    "Float8CurrentScaling",
    "Float8CurrentScalingQuantizer",
    "Float8Quantizer",
    "Float8Tensor",
    "Float8TensorStorage",
    "Format",
    "MXFP8BlockScaling",
    "MXFP8Quantizer",
    "MXFP8Tensor",
    "MXFP8TensorStorage",
    "NVFP4BlockScaling",
    "NVFP4Quantizer",
    "NVFP4Tensor",
    "NVFP4TensorStorage",
    "Recipe",
    "gemm",
]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])


class _Package(types.ModuleType):
    """``gemm`` names both a submodule and the function exported under that name; the
    import system sets the submodule on the package once it has loaded, and the
    function must stay the package's ``gemm``."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _EXPORTS and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
