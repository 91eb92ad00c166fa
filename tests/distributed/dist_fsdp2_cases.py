"""What each of four ranks runs for the FSDP2 tests (dispatched from
``dist_cases.run_case``).

2-D: ``init_device_mesh("cpu", (2, 2), ("dp", "tp"))`` ("cuda" under NCCL); our modules take the mesh's
``tp`` group as their ``tp_group`` and ``fully_shard`` shards each layer (then the root)
over ``dp``. 1-D: four-way ``fully_shard`` of modules without tensor parallelism. Each
case trains two models built from one seed for ``STEPS`` SGD steps on the same data
(each data-parallel rank its own batch rows): eager, and compiled per layer
(``layer.compile(fullgraph=True)``; Dynamo skips FSDP2's hooks, so the gathers run
eagerly around each graph). Compiled equals eager bit for bit (outputs every step, the
sharded parameters and gradients after the last), with no graph break and one graph
per layer; eager is close to a single-process model trained on the whole batch
(``REF_TOL``: bf16 rounding; FP8's per-tensor scales of each rank's TP shard and of
its own batch rows, requantized weights; docs/distributed.md). Under
FP8 current scaling the weights are ``quantized_model_init`` parameters: gathered as
uint8 codes plus one fp32 scale per shard, checked on what FSDP2 gathered.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from dist_cases import REF_TOL, SEED, World, _chunk, _compare_reference, _graph_breaks, _recipe
from torch._dynamo.utils import counters
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

import transformer_engine_ops as te
from transformer_engine_ops.quantization import DelayedScaling, Float8CurrentScaling, Float8Tensor

WORLD = 4
SEQ, BATCH, HIDDEN, FFN, HEADS = 8, 4, 64, 128, 4
STEPS, LR = 3, 0.05

FSDP2 = [
    f"fsdp2-{dims}-{model}-{recipe}"
    for dims, model in (("2d", "block"), ("2d", "transformer"), ("1d", "block"))
    for recipe in ("bf16", "fp8_current")
]
FSDP2 += ["fsdp2-refused-delayed", "fsdp2-refused-uneven"]


class _Block(torch.nn.Module):
    """Linear, LayerNormLinear and LayerNormMLP with tensor parallelism inside: an
    attention-shaped column -> row pair after the MLP, residual around each."""

    def __init__(self, tp_group: Any, tp: int, device: torch.device) -> None:
        super().__init__()
        kw: dict[str, Any] = {
            "params_dtype": torch.bfloat16,
            "tp_group": tp_group,
            "tp_size": tp,
            "device": device,
        }
        mode = "column" if tp > 1 else None
        self.mlp = te.LayerNormMLP(HIDDEN, FFN, set_parallel_mode=tp > 1, **kw)
        self.qkv = te.LayerNormLinear(HIDDEN, HIDDEN, parallel_mode=mode, **kw)
        self.proj = te.Linear(HIDDEN, HIDDEN, parallel_mode="row" if tp > 1 else None, **kw)

    def layers(self) -> list[torch.nn.Module]:
        return [self.mlp, self.qkv, self.proj]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.mlp(x)
        return x + self.proj(torch.nn.functional.gelu(self.qkv(x)))


class _Transformer(torch.nn.Module):
    def __init__(self, tp_group: Any, tp: int, device: torch.device) -> None:
        super().__init__()
        self.layer = te.TransformerLayer(
            HIDDEN,
            FFN,
            HEADS,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            fuse_qkv_params=True,  # quantized_model_init refuses split QKV weights
            set_parallel_mode=tp > 1,
            tp_group=tp_group,
            tp_size=tp,
            params_dtype=torch.bfloat16,
            device=device,
        )

    def layers(self) -> list[torch.nn.Module]:
        return [self.layer]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


_MODELS = {"block": _Block, "transformer": _Transformer}


def _build(w: World, model: str, recipe: str, tp_group: Any, tp: int) -> torch.nn.Module:
    torch.manual_seed(SEED)  # every rank and the reference draw the same full weights
    if recipe == "bf16":
        return _MODELS[model](tp_group, tp, w.device)
    factory = DelayedScaling if recipe == "delayed" else Float8CurrentScaling
    with te.quantized_model_init(enabled=True, recipe=factory()):
        return _MODELS[model](tp_group, tp, w.device)


def _shard(model: torch.nn.Module, dp_mesh: DeviceMesh) -> torch.nn.Module:
    for layer in model.layers():
        fully_shard(layer, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)
    return model


def _value(t: torch.Tensor) -> torch.Tensor:
    """A parameter's or gradient's local value, dequantized."""
    t = t._local_tensor if isinstance(t, DTensor) else t
    return t.dequantize() if hasattr(t, "dequantize") and hasattr(t, "_quantizer") else t.detach()


def _train(
    model: torch.nn.Module,
    recipe: str,
    x: torch.Tensor,
    dy: torch.Tensor,
    dp_group: Any = None,
) -> list[torch.Tensor]:
    """``STEPS`` SGD steps on ``y.backward(dy)``: each step's output, then the local
    sharded parameters and their last gradients. With ``dp_group``, every step of each
    FP8 parameter is checked against requantizing the whole parameter."""
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    outs = []
    for _ in range(STEPS):
        opt.zero_grad()
        with _recipe(recipe):
            y = model(x)
        y.backward(dy)
        outs.append(y.detach().clone())
        expected = _whole_tensor_updates(model, dp_group) if dp_group is not None else {}
        opt.step()
        for p, (codes, scale_inv) in expected.items():
            local = p._local_tensor
            assert torch.equal(local._data, codes), "FP8 shard codes after the step"
            assert torch.equal(local._scale_inv, scale_inv), "FP8 shard scale after the step"
    params = list(model.parameters())
    return outs + [_value(p).clone() for p in params] + [_value(p.grad).clone() for p in params]


def _whole_tensor_updates(model: torch.nn.Module, dp_group: Any) -> dict[Any, Any]:
    """For each FP8 parameter: this rank's rows of the codes and the scale of the SGD
    step applied to the whole (dp-gathered) parameter and quantized as one tensor, which
    is what the sharded step must give (its amax all-reduced over the dp group)."""
    expected = {}
    for p in model.parameters():
        local = p._local_tensor
        if not isinstance(local, Float8Tensor):
            continue
        parts = [torch.empty_like(local._data) for _ in range(dist.get_world_size(dp_group))]
        grads = [torch.empty_like(p.grad._local_tensor) for _ in parts]
        dist.all_gather(parts, local._data, group=dp_group)
        dist.all_gather(grads, p.grad._local_tensor, group=dp_group)
        whole = Float8Tensor(
            {"_data": torch.cat(parts), "_scale_inv": local._scale_inv},
            quantizer=local.quantizer.with_usage(rowwise=True, columnwise=False),
            dtype=local.dtype,
        )
        value = whole.dequantize().add(torch.cat(grads), alpha=-LR)
        new = whole.quantizer.quantize(value)
        rows = local.shape[0]
        start = dist.get_group_rank(dp_group, dist.get_rank()) * rows
        expected[p] = (new._data[start : start + rows], new._scale_inv)
    return expected


def _gathered_bytes(model: torch.nn.Module) -> dict[str, Any]:
    """What FSDP2 all-gathered for each parameter (dtype and bytes of its gather outputs,
    summed over the ranks' shards) and what a bf16 gather of the same parameters moves."""
    moved = bf16 = 0
    dtypes: dict[str, list[str]] = {}
    for module in model.modules():
        state = getattr(module, "_get_fsdp_state", None)
        group = state()._fsdp_param_group if state is not None else None
        for fsdp_param in group.fsdp_params if group is not None else ():
            outputs = fsdp_param.all_gather_outputs
            dtypes[fsdp_param._param_fqn] = [str(o.dtype).removeprefix("torch.") for o in outputs]
            moved += sum(o.numel() * o.element_size() for o in outputs)
            bf16 += fsdp_param._orig_size.numel() * 2
    return {"dtypes": dtypes, "bytes": moved, "bf16_bytes": bf16}


def _meshes(w: World, dims: str) -> tuple[DeviceMesh, Any, int, int, int]:
    """(dp mesh, tp group or None, tp size, dp rank, tp rank)."""
    if dims == "2d":
        mesh = init_device_mesh(w.device.type, (2, 2), mesh_dim_names=("dp", "tp"))
        tp_mesh = mesh["tp"]
        return (
            mesh["dp"],
            tp_mesh.get_group(),
            2,
            mesh["dp"].get_local_rank(),
            tp_mesh.get_local_rank(),
        )
    mesh = init_device_mesh(w.device.type, (WORLD,), mesh_dim_names=("dp",))
    return mesh, None, 1, mesh.get_local_rank(), 0


def _parity(w: World, name: str) -> dict[str, Any]:
    _, dims, model_name, recipe = name.split("-", 3)
    dp_mesh, tp_group, tp, dp_rank, tp_rank = _meshes(w, dims)
    dp = dp_mesh.size()
    gen = torch.Generator().manual_seed(SEED + 11)
    x = torch.randn(SEQ, BATCH, HIDDEN, generator=gen).to(torch.bfloat16).to(w.device)
    dy = torch.randn(SEQ, BATCH, HIDDEN, generator=gen).to(torch.bfloat16).to(w.device)
    x_local, dy_local = _chunk(x, 1, dp_rank, dp), _chunk(dy, 1, dp_rank, dp)

    eager = _shard(_build(w, model_name, recipe, tp_group, tp), dp_mesh)
    compiled = _shard(_build(w, model_name, recipe, tp_group, tp), dp_mesh)
    for layer in compiled.layers():
        layer.compile(fullgraph=True, backend="aot_eager")
    names = [f"output step {i}" for i in range(STEPS)]
    param_names = [n for n, _ in eager.named_parameters()]
    names += [f"{n} after step {STEPS}" for n in param_names]
    names += [f"{n}.grad step {STEPS}" for n in param_names]

    want = _train(eager, recipe, x_local, dy_local, dp_mesh.get_group())
    info: dict[str, Any] = {"gather": _gathered_bytes(eager)}
    torch._dynamo.reset()
    counters.clear()
    got = _train(compiled, recipe, x_local, dy_local)
    for g, e, n in zip(got, want, names, strict=True):
        assert torch.equal(g, e), f"{n}: compiled per layer differs from eager"
    info["graph_breaks"] = _graph_breaks()
    info["unique_graphs"] = counters["stats"]["unique_graphs"]
    assert info["graph_breaks"] == 0, dict(counters["graph_break"])
    assert info["unique_graphs"] == len(compiled.layers()), f"{info['unique_graphs']} graphs"

    if recipe == "fp8_current":  # weights gathered as FP8 codes + one scale a shard
        for fqn, dtypes in info["gather"]["dtypes"].items():
            want_dtypes = ["uint8", "float32"] if "weight" in fqn and "norm" not in fqn else None
            if want_dtypes is not None:
                assert dtypes == want_dtypes, f"{fqn} gathered as {dtypes}"
        assert info["gather"]["bytes"] < 0.6 * info["gather"]["bf16_bytes"], info["gather"]
    else:
        assert info["gather"]["bytes"] == info["gather"]["bf16_bytes"], info["gather"]

    ref = _build(w, model_name, recipe, None, 1)
    full = _train(ref, recipe, x, dy / dp)  # FSDP2 averages the gradients over dp
    expect = [_chunk(y, 1, dp_rank, dp) for y in full[:STEPS]]
    # Outputs of every step (each after the previous steps' updates) and, where each
    # parameter is a plain slice of the reference's, the parameters after the last
    # (the fused QKV weight of TransformerLayer holds each rank's rows of q, k and v).
    n_params = len(param_names) if model_name == "block" else 0
    ref_values = full[STEPS : STEPS + n_params]
    for local, ref_value in zip(want[STEPS : STEPS + n_params], ref_values, strict=True):
        # ``local`` is this rank's dp rows of its TP shard of the reference parameter.
        dim = _expected_shard_of(local, ref_value, tp, dp)
        value = _chunk(ref_value, dim, tp_rank, tp) if dim >= 0 else ref_value
        expect.append(_chunk(value, 0, dp_rank, dp))
    kept = STEPS + n_params
    info["ref_rel_error"] = _compare_reference(want[:kept], expect, names[:kept], REF_TOL[recipe])
    return info


def _expected_shard_of(local: torch.Tensor, full: torch.Tensor, tp: int, dp: int) -> int:
    """The TP split dim of a parameter whose local value is ``local`` (dp rows of it)."""
    shape = list(local.shape)
    shape[0] *= dp
    dims = [d for d in range(full.dim()) if shape[d] != full.shape[d]]
    assert len(dims) <= 1 and all(shape[d] * tp == full.shape[d] for d in dims), (
        f"shard {tuple(local.shape)} of {tuple(full.shape)}"
    )
    return dims[0] if dims else -1


def _refused(w: World, name: str) -> dict[str, Any]:
    """Refusals: every rank raises the same error in its first forward, before any
    all-gather, so no rank is left waiting."""
    dp_mesh, tp_group, tp, _, _ = _meshes(w, "1d")
    if name.endswith("delayed"):
        model = _shard(_build(w, "block", "delayed", tp_group, tp), dp_mesh)
        recipe, fragment = "bf16", "FP8 delayed scaling parameter"
    else:  # 4 ranks, 6 rows
        torch.manual_seed(SEED)
        with te.quantized_model_init(enabled=True, recipe=Float8CurrentScaling()):
            model = te.Linear(HIDDEN, 6, params_dtype=torch.bfloat16, device=w.device)
        fully_shard(model, mesh=dp_mesh)
        recipe, fragment = "fp8_current", "dim 0 must divide evenly"
    x = torch.randn(SEQ, 1, HIDDEN, dtype=torch.bfloat16, device=w.device)
    try:
        with _recipe(recipe):
            model(x)
    except RuntimeError as e:
        assert fragment in str(e), str(e)
        message = str(e)
    else:
        raise AssertionError("fully_shard forward did not refuse")
    # Every rank refused before any all-gather: the next collective pairs up.
    ranks = torch.ones(1, device=w.device)
    dist.all_reduce(ranks)
    assert ranks.item() == WORLD, ranks
    return {"error": message}


def run_fsdp2_case(w: World, name: str) -> dict[str, Any]:
    assert w.size == WORLD, f"the FSDP2 cases run on {WORLD} ranks, not {w.size}"
    if name.startswith("fsdp2-refused-"):
        return _refused(w, name)
    return _parity(w, name)
