"""``WeightWorkspace``: one GEMM's cached quantized weight (TE's weight workspace),
kept at fixed addresses once an eager call has made it.

A first microbatch (``is_first_microbatch=True``) quantizes the weight; later ones read
the kept copy. Replacing the kept copy with each first microbatch's fresh one is what
CUDA graphs cannot take: compiled, the fresh copy is an output of the flag-True graph,
and under ``mode="reduce-overhead"`` graph outputs live in the CUDA-graph pool, which
the next step's replays overwrite while the module still reads them. So a workspace
made by an *eager* call (ordinary memory, e.g. the warm-up call CUDA graphs are given
anyway) is written *in place* from then on, eagerly and compiled: the flag-True graph
copies the fresh quantized buffers into the kept ones, a mutation of graph inputs with
fixed addresses (module tensor attributes, static inputs to CUDA graphs), and every
graph reads them where they are. A workspace first made inside a compiled call is a
graph output; it is replaced, not written, by each later first microbatch (one graph
per flag value either way), which is right under a plain compile and the reason a
``reduce-overhead`` loop makes its first workspace eagerly (docs/te.md, departure 9).

The rule is TE's: TE quantizes into an existing workspace in place
(``quantize_weight``'s ``update_workspace``), so the kept object stays the same across
steps; a workspace whose layout no longer fits (another recipe, or usages it was made
without) is replaced.

A later microbatch reads the kept copy only through :meth:`WeightWorkspace.read`, with
the weight quantizer of its own call: a copy made by another quantizer (another recipe
type, as TE's dropped workspaces on a recipe-type change, or the same recipe type with
other settings, e.g. another FP8 format, which TE 2.20 still reuses) is never read;
the call quantizes the weight afresh and keeps that instead. Compiled, the kept
quantizer's text is a constant the flag-False graph is guarded on, so a copy made under
another quantizer retraces that graph instead of being read.
"""

from __future__ import annotations

from typing import Any

import torch

from ..quantization.quantizer import Quantizer
from ..runtime.boundary import code


def _layout(made: Any) -> tuple[Any, ...]:
    """What must match, besides the quantizer, for ``made``'s buffers to be written into
    a kept workspace's: its class, shape and fake dtype and its buffers (the usages it
    was made with). Spelled with what Dynamo traces on a wrapper tensor built inside the
    graph (its ``__tensor_flatten__`` is not)."""
    return (
        type(made).__qualname__,
        tuple(made.shape),
        str(made.dtype),
        tuple(made._present_names),
    )


def _quantizer_text(quantizer: Quantizer | None) -> str | None:
    """The quantizer's canonical text (its configuration; a stateful quantizer's
    identity), which a copy is kept and read under."""
    return None if quantizer is None else code(quantizer, Quantizer, "the weight quantizer")


class WeightWorkspace:
    """One cached quantized weight: ``value`` is what the op reads (None until a
    caching call made one), ``buffers`` its inner tensors (the same tensor objects),
    ``made_with`` the canonical text of the quantizer that made it, ``in_place``
    whether later keeps write into them (made by an eager call) or replace them (made
    inside a compiled call, or none yet)."""

    def __init__(self) -> None:
        self.value: Any = None
        self.buffers: tuple[torch.Tensor, ...] = ()
        self.layout: tuple[Any, ...] = ()
        self.made_with: str | None = None
        self.in_place = False

    def read(self, quantizer: Quantizer | None) -> Any:
        """The kept copy if ``quantizer`` (this call's weight quantizer) is the one that
        made it, else None (the call quantizes the weight and keeps its own copy)."""
        value = self.value
        if value is None or self.made_with != _quantizer_text(quantizer):
            return None
        return value

    def keep(self, made: Any, quantizer: Quantizer | None) -> None:
        """Keep ``made``, the quantized weight a call just made with ``quantizer`` (a
        wrapper tensor): written into the kept buffers where they take it in place,
        else kept as it is. None (a call that quantized no weight) forgets the kept
        one."""
        if made is None:
            self.value, self.buffers, self.layout, self.in_place = None, (), (), False
            self.made_with = None
            return
        layout, made_with = _layout(made), _quantizer_text(quantizer)
        inner = tuple(getattr(made, name) for name in made._present_names)
        if self.in_place and layout == self.layout and made_with == self.made_with:
            with torch.no_grad():
                for kept, fresh in zip(self.buffers, inner, strict=True):
                    kept.copy_(fresh)
            return
        self.value, self.buffers, self.layout, self.made_with = made, inner, layout, made_with
        # Eagerly made: ordinary memory at a fixed address, written in place from now
        # on (unless made under inference_mode: torch refuses writes to inference
        # tensors outside it). Made inside a graph: a graph output, replaced by the next
        # keep.
        self.in_place = not torch.compiler.is_compiling() and not inner[0].is_inference()

    def __getstate__(self) -> dict[str, Any]:
        # ``buffers`` are ``value``'s own inner tensors: a copy (``copy.deepcopy`` of the
        # module, pickling) takes them from the copied value, never copies them apart,
        # or writes into the copy's buffers would miss the value its ops read.
        return {
            "value": self.value,
            "layout": self.layout,
            "made_with": self.made_with,
            "in_place": self.in_place,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.value, self.layout, self.in_place = state["value"], state["layout"], state["in_place"]
        self.made_with = state.get("made_with")
        value = self.value
        self.buffers = (
            () if value is None else tuple(getattr(value, n) for n in value._present_names)
        )
