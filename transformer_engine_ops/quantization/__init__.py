"""Reference quantizers, quantized tensors, recipes and GEMM in plain PyTorch."""

from .float8 import (
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    Float8Tensor,
    Float8TensorStorage,
)
from .float8_block import (
    Float8BlockQuantizer,
    Float8BlockwiseQTensor,
    Float8BlockwiseQTensorStorage,
)
from .gemm import gemm
from .mxfp8 import MXFP8Quantizer, MXFP8Tensor, MXFP8TensorStorage
from .nvfp4 import NVFP4Quantizer, NVFP4Tensor, NVFP4TensorStorage
from .recipes import (
    DelayedScaling,
    Float8BlockScaling,
    Float8CurrentScaling,
    Format,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
    Recipe,
)

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


def _register_safe_globals() -> None:
    """Let ``torch.load(weights_only=True)`` (torch's default) rebuild quantized weights:
    the wrapper and storage classes and the quantizers they hold."""
    import torch

    torch.serialization.add_safe_globals(
        [
            Float8Tensor,
            Float8TensorStorage,
            Float8CurrentScalingQuantizer,
            Float8Quantizer,
            MXFP8Tensor,
            MXFP8TensorStorage,
            MXFP8Quantizer,
            NVFP4Tensor,
            NVFP4TensorStorage,
            NVFP4Quantizer,
            Float8BlockwiseQTensor,
            Float8BlockwiseQTensorStorage,
            Float8BlockQuantizer,
        ]
    )


_register_safe_globals()
