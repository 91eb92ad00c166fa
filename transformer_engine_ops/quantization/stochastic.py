"""Where stochastic rounding's random bits come from, and how a kernel asks for them.

TE reads a (seed, offset) pair from the default CUDA generator on every stochastic
quantize, inside its C++ kernel launch. Inside a custom op that would make the bits
depend on when the op runs, which a compiled graph, a partitioner's recomputation or a
replay does not keep. Here the pair is drawn once per module call, on the calling
side, by :func:`draw_rng_state`: one ``teops_rng::draw_rng_state`` op call that reads
one generator in its kernel (the CUDA device's own when the module's tensors are on
CUDA, else torch's default CPU generator), so an eager call and a compiled graph
consume the generator alike and receive the same pair. On CUDA the pair never leaves
the device: CUDA's Philox generator is graph-safe, so a CUDA-graph replay
(``mode="reduce-overhead"``) draws a fresh pair each time, where a copy from the CPU
could not even be captured. The graph keeps the call as a
node: tagged ``nondeterministic_seeded``, the partitioner never recomputes it in the
backward; reading a fresh empty tensor of its own, no pass merges it with another
draw; reading the module's input, it runs after the draws that input depends on. The pair crosses the op boundary as a plain int64 tensor field
(``sr_rng_state``) of the forward bundle, which the backward bundle takes over; each
stochastic quantize in the backward turns it into bits through Philox
(``philox.py``), so the bits are a pure function of the pair. A call with several
GEMMs gives each its own offset (:func:`stage_rng_state`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Optional, cast

import torch

from .nvfp4 import NVFP4Quantizer
from .philox import RNG_STATE_DTYPE, check_rng_state
from .quantizer import Quantizer

__all__ = [
    "draw_rng_state",
    "quantize_gradient",
    "rng_state_for",
    "stage_rng_state",
    "uses_stochastic_rounding",
]

# Seeds and offsets below 2**62 leave room for the per-stage offsets added to them.
_DRAW_HIGH = 2**62


@torch.library.custom_op(
    "teops_rng::draw_rng_state",
    mutates_args=(),
    # Written out: importing generated code derives no schema (tests/codegen).
    schema="(Tensor after, Tensor nonce) -> Tensor",
    tags=(torch.Tag.nondeterministic_seeded,),
)
def _draw_rng_state_op(after: torch.Tensor, nonce: torch.Tensor) -> torch.Tensor:
    if nonce.device.type == "cuda":  # that device's generator, capturable in a CUDA graph
        return torch.randint(0, _DRAW_HIGH, (2,), dtype=RNG_STATE_DTYPE, device=nonce.device)
    return torch.randint(0, _DRAW_HIGH, (2,), dtype=RNG_STATE_DTYPE).to(nonce.device)


@_draw_rng_state_op.register_fake
def _draw_rng_state_fake(after: torch.Tensor, nonce: torch.Tensor) -> torch.Tensor:
    return torch.empty(2, dtype=RNG_STATE_DTYPE, device=nonce.device)


def draw_rng_state(after: Any, device: Any) -> torch.Tensor:
    """A fresh (seed, offset) pair on ``device`` (int64, shape (2,)), drawn from that
    CUDA device's generator when ``device`` is a CUDA device, else from torch's default
    CPU generator; ``torch.manual_seed`` makes either sequence reproducible, and
    ``torch.utils.checkpoint`` (``preserve_rng_state``, which restores the CPU state and
    that of the CUDA devices of its tensor arguments) redraws the same pair.

    In a graph the draw reads ``after`` (the module's input, when a plain tensor), so it
    runs after every draw that input depends on, in eager's order; and a fresh empty
    ``nonce`` of its own, so AOTAutograd's common-subexpression pass (which does not
    read the ``nondeterministic_seeded`` tag) never merges two draws into one."""
    nonce = torch.empty(0, dtype=RNG_STATE_DTYPE, device=device)
    anchor = after if type(after) is torch.Tensor else nonce
    return _draw_rng_state_op(anchor, nonce)


def uses_stochastic_rounding(quantizer: Optional[Quantizer]) -> bool:
    """Whether ``quantizer`` rounds stochastically (and so needs an rng state)."""
    return isinstance(quantizer, NVFP4Quantizer) and quantizer.stochastic_rounding


def rng_state_for(
    grad_quantizers: Iterable[Optional[Quantizer]], inp: Any, device: Any, backward: bool
) -> Optional[torch.Tensor]:
    """The ``sr_rng_state`` field of a module call on ``inp``: a fresh pair on
    ``device`` when the call will run a backward (``backward``) that quantizes a
    gradient stochastically, else None (no generator state is consumed)."""
    if backward and any(uses_stochastic_rounding(q) for q in grad_quantizers):
        return draw_rng_state(inp, device)
    return None


def stage_rng_state(rng_state: Optional[torch.Tensor], stage: int) -> Optional[torch.Tensor]:
    """The pair of GEMM ``stage`` of a call (stage 0 is the call's own pair; a later
    stage advances the offset by ``stage``), so no two GEMMs share bits."""
    if rng_state is None or stage == 0:
        return rng_state
    # (0, stage) made on the state's device: a host-to-device copy is refused during
    # CUDA-graph capture.
    return rng_state + torch.arange(2, dtype=RNG_STATE_DTYPE, device=rng_state.device) * stage


def quantize_gradient(
    quantizer: Quantizer,
    t: torch.Tensor,
    rng_state: Optional[torch.Tensor],
    field: str,
    *,
    with_bias_grad: bool,
) -> Any:
    """``quantizer.quantize(t)`` (or ``quantize_with_bias_grad``), with ``rng_state``
    when the quantizer rounds stochastically; a missing state is an error naming the
    bundle ``field`` that should have carried it."""
    if not uses_stochastic_rounding(quantizer):
        return quantizer.quantize_with_bias_grad(t) if with_bias_grad else quantizer.quantize(t)
    if rng_state is None:
        raise ValueError(
            f"{field}: the output-gradient quantizer rounds stochastically and needs an "
            "int64 (seed, offset) tensor of shape (2,), got None (a module draws it with "
            "transformer_engine_ops.quantization.stochastic.draw_rng_state)"
        )
    check_rng_state(field, rng_state)
    return cast(NVFP4Quantizer, quantizer).quantize_stochastic(
        t, rng_state, with_bias_grad=with_bias_grad
    )
