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
"""

from __future__ import annotations

from typing import Any

import torch

from ..runtime.boundary import code
from ..runtime.quantizer import Quantizer


def _layout(made: Any, quantizer: Quantizer | None) -> tuple[Any, ...]:
    """What must match for ``made``'s buffers to be written into a kept workspace's:
    its class, shape and fake dtype, its buffers (the usages it was made with) and the
    quantizer's configuration. Spelled with what Dynamo traces on a wrapper tensor built
    inside the graph (its ``__tensor_flatten__`` is not)."""
    return (
        type(made).__qualname__,
        tuple(made.shape),
        str(made.dtype),
        tuple(made._present_names),
        None if quantizer is None else code(quantizer, Quantizer, "the weight quantizer"),
    )


class WeightWorkspace:
    """One cached quantized weight: ``value`` is what the op reads (None until a
    caching call made one), ``buffers`` its inner tensors (the same tensor objects),
    ``in_place`` whether later keeps write into them (made by an eager call) or
    replace them (made inside a compiled call, or none yet)."""

    def __init__(self) -> None:
        self.value: Any = None
        self.buffers: tuple[torch.Tensor, ...] = ()
        self.layout: tuple[Any, ...] = ()
        self.in_place = False

    def keep(self, made: Any, quantizer: Quantizer | None) -> None:
        """Keep ``made``, the quantized weight a call just made with ``quantizer`` (a
        wrapper tensor): written into the kept buffers where they take it in place,
        else kept as it is. None (a call that quantized no weight) forgets the kept
        one."""
        if made is None:
            self.value, self.buffers, self.layout, self.in_place = None, (), (), False
            return
        layout = _layout(made, quantizer)
        inner = tuple(getattr(made, name) for name in made._present_names)
        if self.in_place and layout == self.layout:
            with torch.no_grad():
                for kept, fresh in zip(self.buffers, inner, strict=True):
                    kept.copy_(fresh)
            return
        self.value, self.buffers, self.layout = made, inner, layout
        # Eagerly made: ordinary memory at a fixed address, written in place from now
        # on (unless made under inference_mode: torch refuses writes to inference
        # tensors outside it). Made inside a graph: a graph output, replaced by the next
        # keep.
        self.in_place = not torch.compiler.is_compiling() and not inner[0].is_inference()

    def __getstate__(self) -> dict[str, Any]:
        # ``buffers`` are ``value``'s own inner tensors: a copy (``copy.deepcopy`` of the
        # module, pickling) takes them from the copied value, never copies them apart,
        # or writes into the copy's buffers would miss the value its ops read.
        return {"value": self.value, "layout": self.layout, "in_place": self.in_place}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.value, self.layout, self.in_place = state["value"], state["layout"], state["in_place"]
        value = self.value
        self.buffers = (
            () if value is None else tuple(getattr(value, n) for n in value._present_names)
        )
