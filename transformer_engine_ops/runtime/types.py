"""The annotation types that argument bundles use and the generator recognises.

``codegen`` maps these qualified names to field kinds through the table in
``pyproject.toml`` (``[tool.transformer_engine_ops.codegen.kinds]``); at run
time they are ordinary Python types used for ``isinstance`` checks.
"""

from __future__ import annotations

from typing import Union

import torch
import torch.distributed

from ..quantization.quantizer import QuantizedStorage

# A plain tensor, a quantized wrapper tensor subclass (a ``torch.Tensor``) or a
# bare quantized storage: what a weight, a cached weight workspace or a saved
# activation may be. It crosses an op boundary as three slots.
TensorOrQuantized = Union[torch.Tensor, QuantizedStorage]

# A c10d process group. It crosses an op boundary as its registry name.
ProcessGroup = torch.distributed.ProcessGroup
