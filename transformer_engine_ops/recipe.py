"""``te.recipe``: the quantization recipes, under the name TE users import them by
(``transformer_engine.common.recipe``)."""

from .quantization.recipes import (
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
    "Float8BlockScaling",
    "Float8CurrentScaling",
    "Format",
    "MXFP8BlockScaling",
    "NVFP4BlockScaling",
    "Recipe",
]
