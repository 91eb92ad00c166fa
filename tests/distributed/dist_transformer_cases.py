"""What each rank runs for the distributed TransformerLayer test (dispatched from
``dist_cases.run_case``).

The layer with ``set_parallel_mode=True`` over two ranks (QKV column-, proj
row-parallel; fc1 column-, fc2 row-parallel), with and without sequence parallelism,
GQA (4 heads, 2 KV groups, one of each per rank), RMSNorm and SwiGLU, bf16: compiled
(fullgraph) bitwise equal to eager on the ranks, one graph; eager close to the
single-process layer built from the same seed (every rank draws the same full weights
and keeps its shard of each QKV part): output, input gradient and the gradients of the
sharded weights.
"""

from __future__ import annotations

from typing import Any

import torch
from dist_cases import (
    REF_TOL,
    SEED,
    World,
    _chunk,
    _compare_reference,
    _compiled_matches_eager,
    _step,
)

import transformer_engine_ops as te

SEQ, BATCH, HIDDEN, FFN, HEADS, GROUPS = 8, 2, 64, 128, 4, 2

TRANSFORMER = [
    f"transformer-{'sp' if sp else 'nosp'}-{recipe}"
    for sp in (False, True)
    for recipe in ("bf16", "fp8_current")
]


def _make(w: World, sp: bool, parallel: bool) -> te.TransformerLayer:
    torch.manual_seed(SEED)
    layer = te.TransformerLayer(
        HIDDEN,
        FFN,
        HEADS,
        num_gqa_groups=GROUPS,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        normalization="RMSNorm",
        activation="swiglu",
        set_parallel_mode=parallel,
        sequence_parallel=sp and parallel,
        tp_group=w.group if parallel else None,
        tp_size=w.size if parallel else 1,
        params_dtype=torch.bfloat16,
        device=w.device,
    )
    gen = torch.Generator().manual_seed(SEED + 5)
    with torch.no_grad():  # non-zero biases, the same full values on every rank
        for name, p in layer.named_parameters():
            if name.endswith("bias"):
                full = 0.1 * torch.randn(
                    p.shape[0] * (w.size if parallel and _sharded(name) else 1), generator=gen
                )
                if parallel and _sharded(name):
                    full = _chunk_bias(name, full, w.rank, w.size)
                p.copy_(full.to(p.dtype))
    return layer


def _sharded(name: str) -> bool:
    """Biases split over the ranks (column-parallel outputs); proj's and fc2's are full."""
    return "layernorm_qkv" in name or name == "layernorm_mlp.fc1_bias"


def _chunk_bias(name: str, full: torch.Tensor, r: int, n: int) -> torch.Tensor:
    if name == "layernorm_mlp.fc1_bias":  # this rank's rows of each SwiGLU half
        return torch.cat([_chunk(h, 0, r, n) for h in full.chunk(2)])
    return _chunk(full, 0, r, n)


def run_transformer_case(w: World, name: str) -> dict[str, Any]:
    _, sp_name, recipe = name.split("-", 2)
    sp = sp_name == "sp"
    r, n = w.rank, w.size
    layer, ref = _make(w, sp, True), _make(w, sp, False)
    qkv = "self_attention.layernorm_qkv."
    mine, full = dict(layer.named_parameters()), dict(ref.named_parameters())
    for part in ("query", "key", "value"):
        key = f"{qkv}{part}_weight"
        assert torch.equal(mine[key], _chunk(full[key], 0, r, n)), f"{key} shard"
    gen = torch.Generator().manual_seed(SEED + 9)
    x = torch.randn(SEQ, BATCH, HIDDEN, generator=gen).to(torch.bfloat16).to(w.device)
    dy = torch.randn(SEQ, BATCH, HIDDEN, generator=gen).to(torch.bfloat16).to(w.device)
    x_local = _chunk(x, 0, r, n) if sp else x
    dy_local = _chunk(dy, 0, r, n) if sp else dy
    checked = [
        f"{qkv}query_weight",
        f"{qkv}key_weight",
        "self_attention.proj.weight",
        "layernorm_mlp.fc2_weight",
    ]
    params = [mine[k] for k in checked]
    names = ["output", "input grad", *checked]
    eager, info = _compiled_matches_eager(
        layer, params, x_local, dy_local, recipe, "aot_eager", None, names
    )
    out, dx, dq, dk, dproj, dfc2 = _step(ref, [full[k] for k in checked], x, dy, recipe)
    want = [
        _chunk(out, 0, r, n) if sp else out,
        _chunk(dx, 0, r, n) if sp else dx,
        _chunk(dq, 0, r, n),
        _chunk(dk, 0, r, n),
        _chunk(dproj, 1, r, n),
        _chunk(dfc2, 1, r, n),
    ]
    info["ref_rel_error"] = _compare_reference(eager, want, names, REF_TOL[recipe])
    return info
