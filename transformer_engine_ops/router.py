"""TE's ``transformer_engine.pytorch.router``: the fused MoE router functions
(``modules/router.py``)."""

from __future__ import annotations

from .modules.router import (
    QBHistogramMode,
    RoutingMapFormat,
    fused_compute_score_for_moe_aux_loss,
    fused_moe_aux_loss,
    fused_topk_with_score_function,
)

__all__ = [
    "QBHistogramMode",
    "RoutingMapFormat",
    "fused_compute_score_for_moe_aux_loss",
    "fused_moe_aux_loss",
    "fused_topk_with_score_function",
]
