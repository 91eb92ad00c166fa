"""The dot-product attention op: its argument bundles, kernels and op declaration.

The bundles follow TE 2.20.2's ``FusedAttnFwdArgs``/``FusedAttnBwdArgs``
(``attention/dot_product_attention/backends.py``) where their fields apply to high-precision
attention: no FP8 fields (``fp8_dpa``/``fp8_mha`` are refused by the module), no packed or
paged inputs, no generator object. Added: ``softcap``, ``alibi_slopes``, the arbitrary
``attention_mask``, the chosen ``backend`` and the dropout's ``rng_state``.

Kernels:

* ``unfused``: the reference, on every device. Scores in fp32 (float64 for float64
  data): ``QK^T`` (+ a pre-scale bias) times the scale, TE's softcap
  ``softcap * tanh(s / softcap)``, a post-scale bias or ALiBi, the mask, a softmax
  whose log-sum-exp is saved, dropout, ``P V``. The backward recomputes the
  probabilities from the saved log-sum-exp. A query row with no key to attend to
  (a padding row, or a window that leaves none) gives zeros, as TE's fused and flash
  backends give. Padded tokens (sbhd/bshd) are zeroed before any product, so whatever
  they hold reaches no real token.
* ``flash``, ``cudnn``, ``efficient``: torch's fused SDPA kernels on CUDA, called
  through their aten ops for the configurations each supports (:func:`backend_support`).
  The forward saves the output and the kernel's log-sum-exp; the backward calls the
  kernel's backward op on them once, never the forward again.

Dropout draws its bits from the ``rng_state`` (seed, offset) the module passes, through
Philox (``quantization/philox.py``), never from a generator inside the kernel: an eager
call, a compiled graph and the backward's recomputation read the same bits.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, Optional

import torch
import torch.nn.functional as F

from transformer_engine_ops.quantization.philox import RNG_STATE_DTYPE, uniform
from transformer_engine_ops.runtime._torch_private import assert_async, sdpa_kernel_ops
from transformer_engine_ops.runtime.declaration import OpDeclaration
from transformer_engine_ops.runtime.precision import math_dtype
from transformer_engine_ops.runtime.tensor_spec import TensorSpec

QKVFormat = Literal["sbhd", "bshd", "thd"]
AttnMaskType = Literal[
    "no_mask",
    "padding",
    "causal",
    "padding_causal",
    "causal_bottom_right",
    "padding_causal_bottom_right",
    "arbitrary",
]
AttnBiasType = Literal["no_bias", "pre_scale_bias", "post_scale_bias", "alibi"]
Backend = Literal["unfused", "flash", "cudnn", "efficient"]

QKV_FORMATS = ("sbhd", "bshd", "thd")
ATTN_MASK_TYPES = (
    "no_mask",
    "padding",
    "causal",
    "padding_causal",
    "causal_bottom_right",
    "padding_causal_bottom_right",
    "arbitrary",
)
ATTN_BIAS_TYPES = ("no_bias", "pre_scale_bias", "post_scale_bias", "alibi")
BACKENDS = ("unfused", "flash", "cudnn", "efficient")


@dataclass
class DotProductAttnFwdArgs:
    """Everything the attention forward needs (TE's ``FusedAttnFwdArgs``, high precision)."""

    # --- Differentiable tensors ---
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    attn_bias: Optional[torch.Tensor]  # core_attention_bias, broadcastable to [b, h, sq, skv]

    # --- Non-differentiable tensors ---
    cu_seqlens_q: Optional[torch.Tensor]  # [b + 1] int32: thd, and padding masks
    cu_seqlens_kv: Optional[torch.Tensor]
    cu_seqlens_q_padded: Optional[torch.Tensor]  # thd: where each sequence starts
    cu_seqlens_kv_padded: Optional[torch.Tensor]
    attention_mask: Optional[torch.Tensor]  # "arbitrary": bool, True = masked out
    alibi_slopes: Optional[torch.Tensor]  # fp32, [h] or [b, h]
    rng_state: Optional[torch.Tensor]  # dropout's (seed, offset), int64 (2,)

    # --- requires_grad, recorded so the backward does not re-query ---
    q_requires_grad: bool
    k_requires_grad: bool
    v_requires_grad: bool
    attn_bias_requires_grad: bool

    # --- Attention config ---
    is_training: bool
    max_seqlen_q: int
    max_seqlen_kv: int
    attn_scale: float
    dropout_p: float
    qkv_format: QKVFormat
    attn_bias_type: AttnBiasType
    attn_mask_type: AttnMaskType
    window_size: tuple[int, int]
    bottom_right_diagonal: bool
    softcap: float
    backend: Backend

    # --- Autograd state ---
    is_grad_enabled: bool

    # --- TE's checkpoint_core_attention: keep only the inputs; the backward recomputes ---
    checkpoint: bool = False


@dataclass
class DotProductAttnBwdArgs:
    """Everything the attention backward needs (TE's ``FusedAttnBwdArgs``, high precision)."""

    grad_output: Optional[torch.Tensor]

    # --- Saved by the forward ---
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    out: Optional[torch.Tensor]  # the forward's output (fused backends)
    attn_bias: Optional[torch.Tensor]
    cu_seqlens_q: Optional[torch.Tensor]
    cu_seqlens_kv: Optional[torch.Tensor]
    cu_seqlens_q_padded: Optional[torch.Tensor]
    cu_seqlens_kv_padded: Optional[torch.Tensor]
    attention_mask: Optional[torch.Tensor]
    alibi_slopes: Optional[torch.Tensor]
    softmax_stats: Optional[torch.Tensor]  # log-sum-exp, as the backend's kernel returns it
    rng_state: Optional[torch.Tensor]

    # --- What to compute ---
    requires_dq: bool
    requires_dk: bool
    requires_dv: bool
    requires_dbias: bool

    # --- Attention config ---
    max_seqlen_q: int
    max_seqlen_kv: int
    attn_scale: float
    dropout_p: float
    qkv_format: QKVFormat
    attn_bias_type: AttnBiasType
    attn_mask_type: AttnMaskType
    window_size: tuple[int, int]
    bottom_right_diagonal: bool
    softcap: float
    backend: Backend

    # --- The forward kept neither out nor softmax_stats: the backward recomputes them ---
    checkpoint: bool = False


# --- Shapes: the plan the real and fake kernels share ---------------------------------


class _Plan(NamedTuple):
    batch: Any
    heads: Any
    groups: Any  # key/value heads (GQA/MQA groups)
    seq_q: Any  # per sequence: max_seqlen_q for thd
    seq_kv: Any
    head_dim: Any
    head_dim_v: Any
    tokens_q: Any  # thd: the query's first dim; else None


def _bhd(x: Any, fmt: str, name: str) -> tuple[Any, Any, Any, Any]:
    """``(batch or None, seq, heads, dim)`` of one input in ``fmt``."""
    want = 3 if fmt == "thd" else 4
    if len(x.shape) != want:
        raise ValueError(
            f"DotProductAttnFwdArgs.{name}: qkv_format {fmt!r} takes a {want}-D tensor, "
            f"got shape {tuple(x.shape)}"
        )
    if fmt == "sbhd":
        return x.shape[1], x.shape[0], x.shape[2], x.shape[3]
    if fmt == "bshd":
        return x.shape[0], x.shape[1], x.shape[2], x.shape[3]
    return None, x.shape[0], x.shape[1], x.shape[2]


def _plan(args: Any) -> _Plan:
    """Validate the bundle's shapes and configuration (real and fake alike)."""
    where = "DotProductAttnFwdArgs"
    fmt = args.qkv_format
    bq, sq, h, d = _bhd(args.q, fmt, "q")
    bk, sk, hg, dk = _bhd(args.k, fmt, "k")
    bv, sv, hgv, dv = _bhd(args.v, fmt, "v")
    shapes = f"q {tuple(args.q.shape)}, k {tuple(args.k.shape)}, v {tuple(args.v.shape)}"
    if dk != d or hgv != hg or sv != sk or bk != bv or bq != bk:
        raise ValueError(
            f"{where}: q, k and v disagree ({fmt}: {shapes}); k and v need the same "
            "sequence length and heads, q and k the same head dim and batch"
        )
    if h % hg != 0:
        raise ValueError(
            f"{where}: {h} query heads are not a multiple of {hg} key/value heads ({shapes})"
        )
    if not (args.q.dtype == args.k.dtype == args.v.dtype) or not args.q.dtype.is_floating_point:
        raise TypeError(
            f"{where}: q, k and v must share one floating-point dtype, got "
            f"{args.q.dtype}, {args.k.dtype}, {args.v.dtype}"
        )
    padding = "padding" in args.attn_mask_type
    if fmt == "thd":
        for name in ("cu_seqlens_q", "cu_seqlens_kv"):
            if getattr(args, name) is None:
                raise ValueError(f"{where}.{name}: qkv_format 'thd' needs it")
        if not padding:
            raise ValueError(
                f"{where}.attn_mask_type: qkv_format 'thd' takes a padding mask type, "
                f"got {args.attn_mask_type!r}"
            )
        batch = args.cu_seqlens_q.shape[0] - 1
        if args.cu_seqlens_kv.shape[0] - 1 != batch:
            raise ValueError(
                f"{where}: cu_seqlens_q {tuple(args.cu_seqlens_q.shape)} and cu_seqlens_kv "
                f"{tuple(args.cu_seqlens_kv.shape)} describe different batch sizes"
            )
        seq_q, seq_kv, tokens_q = args.max_seqlen_q, args.max_seqlen_kv, sq
    else:
        batch, seq_q, seq_kv, tokens_q = bq, sq, sk, None
        if padding and (args.cu_seqlens_q is None or args.cu_seqlens_kv is None):
            raise ValueError(
                f"{where}: attn_mask_type {args.attn_mask_type!r} needs cu_seqlens_q and "
                "cu_seqlens_kv (the module derives them from a padding attention_mask)"
            )
    for name in ("cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded"):
        cu = getattr(args, name)
        if cu is not None and (len(cu.shape) != 1 or cu.dtype not in (torch.int32, torch.int64)):
            raise ValueError(
                f"{where}.{name}: expected a 1-D int32 tensor [batch + 1], got "
                f"{cu.dtype} {tuple(cu.shape)}"
            )
        if cu is not None and fmt != "thd" and cu.shape[0] != batch + 1:
            raise ValueError(
                f"{where}.{name}: shape {tuple(cu.shape)}, expected ({batch + 1},) for batch {batch}"
            )
    if (args.attention_mask is not None) != (args.attn_mask_type == "arbitrary"):
        raise ValueError(
            f"{where}.attention_mask: given exactly when attn_mask_type is 'arbitrary' "
            f"(attn_mask_type {args.attn_mask_type!r}, mask "
            f"{'given' if args.attention_mask is not None else 'None'})"
        )
    if args.attention_mask is not None:
        _check_broadcast(args.attention_mask, (batch, h, seq_q, seq_kv), "attention_mask")
        if args.attention_mask.dtype != torch.bool:
            raise TypeError(
                f"{where}.attention_mask: expected a bool tensor (True = masked out), got "
                f"{args.attention_mask.dtype}"
            )
    with_bias = args.attn_bias_type in ("pre_scale_bias", "post_scale_bias")
    if (args.attn_bias is not None) != with_bias:
        raise ValueError(
            f"{where}.attn_bias: given exactly when attn_bias_type is pre_scale_bias or "
            f"post_scale_bias (attn_bias_type {args.attn_bias_type!r})"
        )
    if args.attn_bias is not None:
        _check_broadcast(args.attn_bias, (batch, h, seq_q, seq_kv), "attn_bias")
    if (args.alibi_slopes is not None) != (args.attn_bias_type == "alibi"):
        raise ValueError(
            f"{where}.alibi_slopes: given exactly when attn_bias_type is 'alibi' "
            f"(attn_bias_type {args.attn_bias_type!r})"
        )
    if args.alibi_slopes is not None and tuple(args.alibi_slopes.shape) not in (
        (h,),
        (batch, h),
    ):
        raise ValueError(
            f"{where}.alibi_slopes: shape {tuple(args.alibi_slopes.shape)}, expected ({h},) "
            f"or ({batch}, {h})"
        )
    left, right = args.window_size
    if left < -1 or right < -1:
        raise ValueError(f"{where}.window_size: {args.window_size}; each side is -1 or >= 0")
    if not 0.0 <= args.dropout_p < 1.0:
        raise ValueError(f"{where}.dropout_p: {args.dropout_p}, expected 0 <= p < 1")
    if args.softcap < 0.0:
        raise ValueError(f"{where}.softcap: {args.softcap}, expected >= 0 (0 disables it)")
    if _uses_dropout(args):
        _check_rng_state(args.rng_state)
    return _Plan(batch, h, hg, seq_q, seq_kv, d, dv, tokens_q)


def _listed(t: torch.Tensor) -> str:
    values = t.tolist()
    return str(values) if len(values) <= 12 else f"[{', '.join(map(str, values[:12]))}, ...]"


def _seqlen_rules(args: Any, side: str) -> list[tuple[torch.Tensor, Any]]:
    """The rules one side's (``q`` or ``kv``) ``cu_seqlens`` and ``max_seqlen`` keep, as
    ``(ok, message)``: ``ok`` a bool tensor on their device, ``message()`` the error,
    from the host values. cu_seqlens are cumulative lengths from 0, never decreasing;
    in thd each sequence fits ``max_seqlen`` (the layout reads that many tokens of
    each) and the layer's tokens, and a padded start table starts at 0 with room for
    each sequence; in sbhd/bshd each length is at most the layer's sequence length."""
    where, fmt = "DotProductAttnFwdArgs", args.qkv_format
    name = f"cu_seqlens_{side}"
    cu, padded = getattr(args, name), getattr(args, f"{name}_padded")
    x, layer = (args.q, "query") if side == "q" else (args.k, "key")
    if cu is None:
        return []
    lens = cu[1:] - cu[:-1]
    rules = [
        (
            (cu[:1] == 0).all() & (lens >= 0).all(),
            lambda: f"{where}.{name}: {_listed(cu)}; cumulative sequence lengths start at 0 "
            "and never decrease",
        )
    ]
    if fmt != "thd":
        seq = x.shape[0 if fmt == "sbhd" else 1]
        rules.append(
            (
                (lens <= seq).all(),
                lambda: f"{where}.{name}: {_listed(cu)} holds a sequence longer than the "
                f"{layer} layer's {seq} tokens per sequence ({fmt} {tuple(x.shape)})",
            )
        )
        return rules
    max_seqlen = getattr(args, f"max_seqlen_{side}")
    rules.append(
        (
            (lens <= max_seqlen).all(),
            lambda: f"{where}.max_seqlen_{side}: {max_seqlen}, but {name} {_listed(cu)} holds "
            f"a sequence of {int(lens.max())} tokens; thd reads max_seqlen_{side} tokens of "
            "each sequence",
        )
    )
    if padded is None:
        rules.append(
            (
                (cu[-1:] <= x.shape[0]).all(),
                lambda: f"{where}.{name}: {_listed(cu)} ends past the {layer} layer's "
                f"{x.shape[0]} tokens (thd {tuple(x.shape)})",
            )
        )
        return rules
    room = padded[1:] - padded[:-1]
    rules.append(
        (
            (padded[:1] == 0).all() & (room >= lens).all() & (padded[-1:] <= x.shape[0]).all(),
            lambda: f"{where}.{name}_padded: {_listed(padded)}; padded starts from 0 with "
            f"room for each sequence's {name} length ({_listed(lens)}), within the {layer} "
            f"layer's {x.shape[0]} tokens (thd {tuple(x.shape)})",
        )
    )
    return rules


def _check_seqlens(args: Any) -> None:
    """Refuse cu_seqlens and max_seqlen values the kernel would read past or silently
    truncate (:func:`_seqlen_rules`). On the CPU the values are read (no device to
    wait for) and a ValueError names the field and its values, eagerly and in a
    compiled graph alike (the op's kernel runs as one node); on CUDA the rules become
    one device-side assertion (``torch._assert_async``): no host synchronization and
    safe under CUDA graphs, that fails the stream (the error surfaces at the next
    synchronization, without the field's name)."""
    rules = _seqlen_rules(args, "q") + _seqlen_rules(args, "kv")
    if not rules:
        return
    device = rules[0][0].device
    if device.type == "cpu":
        for ok, message in rules:
            if not bool(ok):
                raise ValueError(message())
        return
    ok = torch.stack([r[0] for r in rules]).all()
    assert_async(ok, "DotProductAttention: invalid cu_seqlens or max_seqlen")


def _check_broadcast(t: Any, full: tuple[Any, ...], name: str) -> None:
    shape = tuple(t.shape)
    ok = len(shape) == 4 and all(s == 1 or s == f for s, f in zip(shape, full, strict=True))
    if not ok:
        raise ValueError(
            f"DotProductAttnFwdArgs.{name}: shape {shape} does not broadcast to "
            f"[batch, heads, seq_q, seq_kv] = {tuple(full)}"
        )


def _check_rng_state(rng_state: Any) -> None:
    """Dropout's (seed, offset): an int64 tensor of shape (2,) (a spec in the fake)."""
    dtype, shape = getattr(rng_state, "dtype", None), tuple(getattr(rng_state, "shape", ()))
    if dtype != RNG_STATE_DTYPE or shape != (2,):
        got = "None" if rng_state is None else f"{dtype} of shape {shape}"
        raise ValueError(
            "DotProductAttnFwdArgs.rng_state: dropout needs an int64 (seed, offset) tensor "
            f"of shape (2,), got {got} (the module draws it with "
            "quantization.stochastic.draw_rng_state)"
        )


def _uses_dropout(args: Any) -> bool:
    return getattr(args, "is_training", True) and args.dropout_p > 0.0


def _out_shape(plan: _Plan, fmt: str) -> tuple[Any, ...]:
    hidden = plan.heads * plan.head_dim_v
    if fmt == "sbhd":
        return (plan.seq_q, plan.batch, hidden)
    if fmt == "bshd":
        return (plan.batch, plan.seq_q, hidden)
    return (plan.tokens_q, hidden)


# --- Backend selection (TE's get_attention_backend, for torch's SDPA kernels) -----------


def backend_support(
    *,
    device: torch.device,
    dtype: torch.dtype,
    head_dim: int,
    head_dim_v: int,
    qkv_format: str,
    attn_mask_type: str,
    window_size: tuple[int, int],
    bottom_right_diagonal: bool,
    same_seqlens: bool,
    attn_bias_type: str,
    bias_requires_grad: bool,
    softcap: float,
    dropout: bool,
) -> dict[str, str | None]:
    """Why each backend cannot serve this call (None where it can). ``unfused`` serves all.

    torch's SDPA kernels draw dropout bits from the CUDA generator inside the kernel (not
    reproducible from our (seed, offset)), have no softcap and no varlen (thd) entry, and
    express masks other than causal only as an additive mask (memory-efficient)."""
    reasons: dict[str, str | None] = dict.fromkeys(BACKENDS)
    common = None
    if device.type != "cuda":
        common = f"a {device.type} device (torch's fused SDPA kernels are CUDA only)"
    elif dtype not in (torch.float16, torch.bfloat16, torch.float32):
        common = f"dtype {dtype}"
    elif dropout:
        common = "dropout (the fused kernels draw their own bits; ours come from rng_state)"
    elif softcap != 0.0:
        common = "softcap"
    elif qkv_format == "thd":
        common = "qkv_format 'thd' (no varlen SDPA entry in torch)"
    elif head_dim != head_dim_v:
        common = f"different q/k and v head dims ({head_dim}, {head_dim_v})"
    elif head_dim % 8 != 0:
        common = f"head dim {head_dim}, not a multiple of 8"
    if common is not None:
        return {b: (None if b == "unfused" else common) for b in BACKENDS}
    # flash and cuDNN: no mask, or causal with the diagonal top left (or a square matrix).
    causal_ok = attn_mask_type == "causal" or (
        attn_mask_type == "causal_bottom_right" and same_seqlens
    )
    plain = attn_mask_type == "no_mask" or causal_ok
    no_window = window_size in ((-1, -1), (-1, 0))
    for name, max_dim in (("flash", 256), ("cudnn", 128)):
        if dtype == torch.float32:
            reasons[name] = "dtype torch.float32 (16-bit only)"
        elif not plain:
            reasons[name] = f"attn_mask_type {attn_mask_type!r}"
        elif not no_window:
            reasons[name] = f"window_size {window_size}"
        elif attn_bias_type != "no_bias":
            reasons[name] = f"attn_bias_type {attn_bias_type!r}"
        elif head_dim > max_dim:
            reasons[name] = f"head dim {head_dim} > {max_dim}"
    # memory-efficient: every mask, window and bias as one additive mask; no bias gradient.
    if bias_requires_grad:
        reasons["efficient"] = "a core_attention_bias that requires grad"
    elif "padding" in attn_mask_type:
        reasons["efficient"] = f"attn_mask_type {attn_mask_type!r} (padded rows)"
    return reasons


@torch.compiler.assume_constant_result
def _hopper_or_newer(device_index: Optional[int]) -> bool:
    """Whether a CUDA device is Hopper (compute capability 9) or newer; a graph constant
    under torch.compile (a device query Dynamo would otherwise trace into)."""
    return torch.cuda.get_device_capability(device_index)[0] >= 9


_ENV = (("NVTE_FLASH_ATTN", ("flash",)), ("NVTE_FUSED_ATTN", ("cudnn", "efficient")))


def select_backend(reasons: dict[str, str | None], device: torch.device) -> str:
    """TE's choice among the backends that can serve a call: on Hopper and newer the
    fused (cuDNN) backend first, before it flash; then memory-efficient, then the
    unfused reference. ``NVTE_FLASH_ATTN=0``, ``NVTE_FUSED_ATTN=0`` (cuDNN and
    memory-efficient) and ``NVTE_UNFUSED_ATTN=0`` take a backend out, as in TE."""
    disabled = {b for var, names in _ENV if os.environ.get(var, "1") == "0" for b in names}
    if os.environ.get("NVTE_UNFUSED_ATTN", "1") == "0":
        disabled.add("unfused")
    order = ["flash", "cudnn", "efficient", "unfused"]
    if device.type == "cuda" and _hopper_or_newer(device.index):
        order = ["cudnn", "flash", "efficient", "unfused"]
    for name in order:
        if reasons[name] is None and name not in disabled:
            return name
    why = "; ".join(
        f"{b}: {'disabled by the environment' if b in disabled else reasons[b]}" for b in order
    )
    raise RuntimeError(f"DotProductAttention: no attention backend can serve this call ({why})")


# --- Layouts ------------------------------------------------------------------------


class _Layout(NamedTuple):
    """How one of q/k/v maps to [batch, heads, seq, dim] and back."""

    fmt: str
    index: Optional[torch.Tensor]  # thd: [batch, seq] token of each slot (tokens = none)
    tokens: Any


def _layout(fmt: str, cu: Any, cu_padded: Any, max_seqlen: Any, tokens: Any) -> _Layout:
    if fmt != "thd":
        return _Layout(fmt, None, None)
    lens = cu[1:] - cu[:-1]
    starts = (cu_padded if cu_padded is not None else cu)[:-1]
    pos = torch.arange(max_seqlen, device=cu.device)
    valid = pos.unsqueeze(0) < lens.unsqueeze(1)
    index = torch.where(valid, starts.unsqueeze(1).to(torch.int64) + pos, tokens)
    return _Layout(fmt, index, tokens)


def _to_bhsd(x: torch.Tensor, layout: _Layout) -> torch.Tensor:
    if layout.fmt == "sbhd":
        return x.permute(1, 2, 0, 3)
    if layout.fmt == "bshd":
        return x.permute(0, 2, 1, 3)
    padded = torch.cat([x, x.new_zeros((1, *x.shape[1:]))])[layout.index]  # [b, s, h, d]
    return padded.permute(0, 2, 1, 3)


def _from_bhsd(x: torch.Tensor, layout: _Layout) -> torch.Tensor:
    """[b, h, s, d] back to the format's own 4-D (3-D for thd) layout, contiguous."""
    if layout.fmt == "sbhd":
        return x.permute(2, 0, 1, 3).contiguous()
    if layout.fmt == "bshd":
        return x.permute(0, 2, 1, 3).contiguous()
    b, h, s, d = x.shape
    rows = x.permute(0, 2, 1, 3).reshape(b * s, h, d)
    out = x.new_zeros((layout.tokens + 1, h, d))
    return out.index_add(0, layout.index.reshape(-1), rows)[: layout.tokens]


def _layouts(args: Any, plan: _Plan) -> tuple[_Layout, _Layout]:
    fmt = args.qkv_format
    if fmt != "thd":
        return _Layout(fmt, None, None), _Layout(fmt, None, None)
    q = _layout(fmt, args.cu_seqlens_q, args.cu_seqlens_q_padded, plan.seq_q, args.q.shape[0])
    kv = _layout(fmt, args.cu_seqlens_kv, args.cu_seqlens_kv_padded, plan.seq_kv, args.k.shape[0])
    return q, kv


# --- Masks and biases (TE's get_full_mask and get_alibi, per sequence lengths) ----------


def _seqlens(args: Any, plan: _Plan) -> tuple[Any, Any]:
    """Per-sequence lengths ``[b, 1, 1, 1]`` for padding masks, else None."""
    if "padding" not in args.attn_mask_type:
        return None, None
    lq = (args.cu_seqlens_q[1:] - args.cu_seqlens_q[:-1]).view(-1, 1, 1, 1)
    lk = (args.cu_seqlens_kv[1:] - args.cu_seqlens_kv[:-1]).view(-1, 1, 1, 1)
    return lq, lk


def _diagonal_offset(args: Any, plan: _Plan, lens: tuple[Any, Any], bottom_right: bool) -> Any:
    """How far the diagonal sits right of the top-left one: ``skv - sq`` per sequence
    when aligned bottom right, else 0."""
    if not bottom_right:
        return 0
    lq, lk = lens
    if lq is None:
        return plan.seq_kv - plan.seq_q
    return lk - lq


def _bottom_right(args: Any) -> bool:
    if args.attn_mask_type in ("causal", "padding_causal"):
        return False
    if "bottom_right" in args.attn_mask_type:
        return True
    return args.bottom_right_diagonal


def _keep_mask(args: Any, plan: _Plan, device: torch.device) -> Optional[torch.Tensor]:
    """Which scores take part, broadcastable to [b, h, sq, skv]; None when all do."""
    i = torch.arange(plan.seq_q, device=device).view(1, 1, -1, 1)
    j = torch.arange(plan.seq_kv, device=device).view(1, 1, 1, -1)
    lens = _seqlens(args, plan)
    keep = None
    if lens[0] is not None:
        keep = (i < lens[0]) & (j < lens[1])
    left, right = args.window_size
    if "causal" in args.attn_mask_type:
        right = 0
    if left >= 0 or right >= 0:
        offset = _diagonal_offset(args, plan, lens, _bottom_right(args))
        rel = j - i - offset  # key position right of the diagonal
        window = torch.ones_like(rel, dtype=torch.bool)
        if left >= 0:
            window = window & (rel >= -left)
        if right >= 0:
            window = window & (rel <= right)
        keep = window if keep is None else keep & window
    if args.attention_mask is not None:
        allowed = ~args.attention_mask
        keep = allowed if keep is None else keep & allowed
    return keep


def _alibi_bias(args: Any, plan: _Plan, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``-slope * |i + offset - j|`` (TE's ALiBi), [1 or b, h, sq, skv]."""
    i = torch.arange(plan.seq_q, device=device).view(1, 1, -1, 1)
    j = torch.arange(plan.seq_kv, device=device).view(1, 1, 1, -1)
    offset = _diagonal_offset(args, plan, _seqlens(args, plan), _bottom_right(args))
    distance = (i + offset - j).abs().to(dtype)
    slopes = args.alibi_slopes.to(dtype)
    slopes = slopes.view(1, -1, 1, 1) if slopes.dim() == 1 else slopes.view(*slopes.shape, 1, 1)
    return -slopes * distance


def default_alibi_slopes(num_heads: int, device: Any) -> torch.Tensor:
    """TE's default ALiBi slopes (fp32, [num_heads]): geometric from ``2**(-8/n)`` for the
    largest power of two ``n <= num_heads``, then odd powers of ``2**(-4/n)``."""
    n = 2 ** math.floor(math.log2(num_heads))
    m = torch.pow(2.0 ** (-8.0 / n), torch.arange(1, 1 + n))
    if n < num_heads:
        extra = torch.pow(2.0 ** (-4.0 / n), torch.arange(1, 1 + 2 * (num_heads - n), 2))
        m = torch.cat([m, extra])
    return m.to(dtype=torch.float32, device=device)


def _keep_bits(args: Any, shape: tuple[Any, ...], device: torch.device) -> torch.Tensor:
    """Dropout's keep mask from the call's (seed, offset): a pure function of it."""
    u = uniform(args.rng_state.to(device), math.prod(shape), stream=0)
    return (u >= args.dropout_p).view(shape)


# --- The unfused (reference) kernel -------------------------------------------------


class _Scores(NamedTuple):
    logits: torch.Tensor  # masked logits L [b, h, sq, skv], -inf where masked
    tanh: Optional[torch.Tensor]  # tanh(s / softcap) when softcap
    k: torch.Tensor  # keys and values in the math dtype, [b, h, skv, d] (groups repeated)
    v: torch.Tensor
    q: torch.Tensor


def _expand_groups(x: torch.Tensor, heads: int) -> torch.Tensor:
    return x if x.shape[1] == heads else x.repeat_interleave(heads // x.shape[1], dim=1)


def _padding_zeroed(x: torch.Tensor, lens: Any, fmt: str) -> torch.Tensor:
    """``x`` [b, h, s, d] with each sequence's padding (its rows at and past ``lens``
    [b, 1, 1, 1]) zero, for padding masks in sbhd/bshd: a padded token's query, key,
    value or output gradient, whatever it holds (NaN, Inf), then reaches no real
    token's output or gradient through a zero weight (``0 * nan`` is nan). thd's
    layout already reads padding as zeros."""
    if lens is None or fmt == "thd":
        return x
    pos = torch.arange(x.shape[2], device=x.device).view(1, 1, -1, 1)
    return torch.where(pos < lens, x, torch.zeros((), dtype=x.dtype, device=x.device))


def _scores(args: Any, plan: _Plan, lq: _Layout, lkv: _Layout) -> _Scores:
    dtype = math_dtype(args.q.dtype)
    fmt, (len_q, len_kv) = args.qkv_format, _seqlens(args, plan)
    q = _padding_zeroed(_to_bhsd(args.q, lq), len_q, fmt).to(dtype)
    k = _padding_zeroed(_to_bhsd(args.k, lkv), len_kv, fmt).to(dtype)
    v = _padding_zeroed(_to_bhsd(args.v, lkv), len_kv, fmt).to(dtype)
    k, v = _expand_groups(k, plan.heads), _expand_groups(v, plan.heads)
    s = q @ k.transpose(-1, -2)
    if args.attn_bias_type == "pre_scale_bias":
        s = s + args.attn_bias.to(dtype)
    s = s * args.attn_scale
    tanh = None
    if args.softcap != 0.0:
        tanh = torch.tanh(s / args.softcap)
        s = args.softcap * tanh
    if args.attn_bias_type == "post_scale_bias":
        s = s + args.attn_bias.to(dtype)
    elif args.attn_bias_type == "alibi":
        s = s + _alibi_bias(args, plan, s.device, dtype)
    keep = _keep_mask(args, plan, s.device)
    if keep is not None:
        s = s.masked_fill(~keep, -math.inf)
    return _Scores(s, tanh, k, v, q)


def _log_sum_exp(logits: torch.Tensor) -> torch.Tensor:
    """Row log-sum-exp [b, h, sq, 1]; +inf for a row with no key, so ``exp(L - lse)``
    is 0 there (every row, when there are no keys at all: an empty sequence)."""
    if logits.shape[-1] == 0:
        return logits.new_full((*logits.shape[:-1], 1), math.inf)
    m = logits.amax(-1, keepdim=True)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    total = torch.exp(logits - m).sum(-1, keepdim=True)
    return torch.where(total > 0, m + torch.log(total), torch.full_like(m, math.inf))


def _dropped(args: Any, p: torch.Tensor) -> torch.Tensor:
    if not _uses_dropout(args):
        return p
    keep = _keep_bits(args, tuple(p.shape), p.device)
    return torch.where(keep, p * (1.0 / (1.0 - args.dropout_p)), torch.zeros_like(p))


def _unfused_forward(args: Any, plan: _Plan) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out in the format's layout, log-sum-exp [b, h, sq])``."""
    lq, lkv = _layouts(args, plan)
    sc = _scores(args, plan, lq, lkv)
    lse = _log_sum_exp(sc.logits)
    p = _dropped(args, torch.exp(sc.logits - lse))
    out = _from_bhsd((p @ sc.v).to(args.q.dtype), lq)
    return out.reshape(_out_shape(plan, args.qkv_format)), lse.squeeze(-1)


def _sum_to(x: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    dims = [i for i, (s, f) in enumerate(zip(shape, x.shape, strict=True)) if s == 1 and f != 1]
    return x.sum(dims, keepdim=True) if dims else x


def _group_sum(x: torch.Tensor, groups: int) -> torch.Tensor:
    b, h, s, d = x.shape
    return x if h == groups else x.view(b, groups, h // groups, s, d).sum(2)


def _unfused_backward(args: Any, plan: _Plan) -> tuple[Optional[torch.Tensor], ...]:
    lq, lkv = _layouts(args, plan)
    sc = _scores(args, plan, lq, lkv)
    # A checkpointed forward kept no log-sum-exp: the forward's, from the same logits.
    lse = _log_sum_exp(sc.logits) if args.checkpoint else args.softmax_stats.unsqueeze(-1)
    p = torch.exp(sc.logits - lse)
    dtype = p.dtype
    do = args.grad_output.reshape(*args.grad_output.shape[:-1], plan.heads, plan.head_dim_v)
    do = _padding_zeroed(_to_bhsd(do, lq), _seqlens(args, plan)[0], args.qkv_format).to(dtype)
    dropout = _uses_dropout(args)
    keep = _keep_bits(args, tuple(p.shape), p.device) if dropout else None
    scale_kept = 1.0 / (1.0 - args.dropout_p)
    dv = dq = dk = dbias = None
    if args.requires_dv:
        pd = torch.where(keep, p * scale_kept, torch.zeros_like(p)) if dropout else p
        dv = _from_bhsd(_group_sum(pd.transpose(-1, -2) @ do, plan.groups).to(args.v.dtype), lkv)
    if args.requires_dq or args.requires_dk or args.requires_dbias:
        dp = do @ sc.v.transpose(-1, -2)
        if dropout:
            dp = torch.where(keep, dp * scale_kept, torch.zeros_like(dp))
        dl = p * (dp - (dp * p).sum(-1, keepdim=True))
        if args.requires_dbias and args.attn_bias_type == "post_scale_bias":
            dbias = _sum_to(dl, tuple(args.attn_bias.shape)).to(args.attn_bias.dtype)
        ds = dl * (1.0 - sc.tanh.square()) if sc.tanh is not None else dl
        ds = ds * args.attn_scale
        if args.requires_dbias and args.attn_bias_type == "pre_scale_bias":
            dbias = _sum_to(ds, tuple(args.attn_bias.shape)).to(args.attn_bias.dtype)
        if args.requires_dq:
            dq = _from_bhsd((ds @ sc.k).to(args.q.dtype), lq)
        if args.requires_dk:
            dk = _group_sum(ds.transpose(-1, -2) @ sc.q, plan.groups)
            dk = _from_bhsd(dk.to(args.k.dtype), lkv)
    return dq, dk, dv, dbias


# --- torch's fused SDPA kernels, through their aten ops -------------------------------
#
# The forward calls the kernel's own aten op, which returns the log-sum-exp beside the
# output; the op saves both, and the backward calls the kernel's backward op on them
# once, as torch's autograd formula for SDPA does, without recomputing the forward.
# On the CPU (never selected there by the module: the op's own tests) flash and
# memory-efficient run torch's CPU flash kernel, the latter with its additive mask.


class _FusedInputs(NamedTuple):
    """One fused-kernel call's inputs as [b, h, s, d] views, shared by forward and backward."""

    q: torch.Tensor
    k: torch.Tensor  # grouped, or each group copied once per query head (``expanded``)
    v: torch.Tensor
    expanded: bool
    mask: Optional[torch.Tensor]  # memory-efficient: the additive mask, q's dtype
    causal: bool
    rows: Optional[torch.Tensor]  # query rows with a key, where a mask may leave none
    lq: _Layout
    lkv: _Layout


def _native_gqa(
    backend: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, grad: bool
) -> bool:
    """Whether the flash or cuDNN kernel takes the grouped k and v as they are (as
    ``enable_gqa`` does), so neither is copied once per query head of its group (and their
    gradients are not summed back over the copies); torch's own check of the call
    (``can_use_*_attention``), since which kernels take groups varies by release. ``grad``
    (whether a backward follows) is part of the question, and fixed by the bundle, not by
    the grad mode the impl happens to run under, so eager and compiled decide alike."""
    from torch.backends import cuda as sdp

    if q.device.type != "cuda":
        return False
    can_use = sdp.can_use_flash_attention if backend == "flash" else sdp.can_use_cudnn_attention
    q, k, v = (t.detach().requires_grad_(grad) for t in (q, k, v))
    with torch.set_grad_enabled(grad):
        return bool(can_use(sdp.SDPAParams(q, k, v, None, 0.0, causal, True), False))


_MEM_EFFICIENT_ALIGNMENT = 16  # elements; the additive mask's row stride (F.sdpa's pad_bias)


def _aligned_rows(mask: torch.Tensor) -> torch.Tensor:
    """``mask`` with its rows in a buffer padded to a multiple of 16 elements (values
    unchanged): the memory-efficient kernel reads the mask's rows at aligned addresses,
    which ``F.scaled_dot_product_attention`` arranges the same way before calling it."""
    last = mask.shape[-1]
    pad = -last % _MEM_EFFICIENT_ALIGNMENT
    return mask if pad == 0 else F.pad(mask, (0, pad))[..., :last]


def _fused_inputs(args: Any, plan: _Plan, grad: bool) -> _FusedInputs:
    lq, lkv = _layouts(args, plan)
    qb, kb, vb = _to_bhsd(args.q, lq), _to_bhsd(args.k, lkv), _to_bhsd(args.v, lkv)
    mask, causal, rows, native = None, False, None, False
    grouped = kb.shape[1] != plan.heads
    if args.backend in ("flash", "cudnn"):
        causal = "causal" in args.attn_mask_type
        native = grouped and _native_gqa(args.backend, qb, kb, vb, causal, grad)
    if grouped and not native:
        kb, vb = _expand_groups(kb, plan.heads), _expand_groups(vb, plan.heads)
    if args.backend == "efficient":
        keep = _keep_mask(args, plan, args.q.device)
        bias, dtype = None, math_dtype(args.q.dtype)  # the additive mask is made in fp32
        if args.attn_bias_type == "pre_scale_bias":
            bias = args.attn_bias.to(dtype) * args.attn_scale
        elif args.attn_bias_type == "post_scale_bias":
            bias = args.attn_bias.to(dtype)
        elif args.attn_bias_type == "alibi":
            bias = _alibi_bias(args, plan, args.q.device, dtype)
        if keep is not None:
            # Finite: a row with no key gives a finite average, zeroed below, not NaN.
            hide = torch.finfo(args.q.dtype).min / 2
            hide = torch.full((), hide, dtype=dtype, device=args.q.device)
            bias = (bias if bias is not None else 0.0) + torch.where(keep, 0.0, hide)
            rows = keep.any(-1, keepdim=True)
        if bias is not None:
            mask = _aligned_rows(bias.to(args.q.dtype))
            mask = mask.expand(plan.batch, plan.heads, plan.seq_q, plan.seq_kv)
    return _FusedInputs(qb, kb, vb, grouped and not native, mask, causal, rows, lq, lkv)


def _fused_stats_spec(args: Any, plan: _Plan) -> TensorSpec:
    """The log-sum-exp as the chosen kernel returns it and its backward op reads it:
    fp32 [b, h, sq] (flash; the CPU kernel's in its math dtype), [b, h, sq, 1] (cuDNN),
    [b, h, sq rounded up to 32] (memory-efficient). A test checks these against the aten
    ops' own meta functions on the installed torch."""
    b, h, sq, device = plan.batch, plan.heads, plan.seq_q, args.q.device
    if device.type != "cuda":
        return TensorSpec((b, h, sq), math_dtype(args.q.dtype), device=device)
    shape = {
        "flash": (b, h, sq),
        "cudnn": (b, h, sq, 1),
        "efficient": (b, h, (sq + 31) // 32 * 32),
    }[args.backend]
    return TensorSpec(shape, torch.float32, device=device)


def _fused_forward(args: Any, f: _FusedInputs, with_stats: bool) -> tuple[torch.Tensor, Any]:
    """``(out [b, h, sq, dv], log-sum-exp)`` of the chosen kernel's aten op; dropout 0
    (torch's kernels never serve ours, :func:`backend_support`)."""
    aten, scale = sdpa_kernel_ops(), args.attn_scale
    if f.q.device.type != "cuda":
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(
            f.q, f.k, f.v, 0.0, f.causal, attn_mask=f.mask, scale=scale
        )
        return out, lse.contiguous()  # [b, sq, h] in memory: made what the spec says
    if args.backend == "flash":
        r = aten._scaled_dot_product_flash_attention(
            f.q, f.k, f.v, 0.0, f.causal, False, scale=scale
        )
    elif args.backend == "cudnn":
        r = aten._scaled_dot_product_cudnn_attention(
            f.q, f.k, f.v, None, with_stats, 0.0, f.causal, False, scale=scale
        )
    else:
        r = aten._scaled_dot_product_efficient_attention(
            f.q, f.k, f.v, f.mask, with_stats, 0.0, False, scale=scale
        )
    return r[0], r[1]


def _fused_backward_kernel(
    args: Any, f: _FusedInputs, do: torch.Tensor, out: torch.Tensor
) -> tuple[Optional[torch.Tensor], ...]:
    """``(dq, dk, dv)`` [b, h, s, d] from the chosen kernel's backward op on the saved
    output and log-sum-exp. Dropout is 0, so the kernels read no Philox seed or offset:
    a zero pair stands for the ones the forward returned."""
    aten, scale, lse = sdpa_kernel_ops(), args.attn_scale, args.softmax_stats
    if f.q.device.type != "cuda":
        return aten._scaled_dot_product_flash_attention_for_cpu_backward(
            do, f.q, f.k, f.v, out, lse, 0.0, f.causal, attn_mask=f.mask, scale=scale
        )
    seed = offset = torch.zeros((2,), dtype=torch.int64, device=f.q.device)
    sq, skv = f.q.shape[2], f.k.shape[2]
    if args.backend == "flash":
        return aten._scaled_dot_product_flash_attention_backward(
            do,
            f.q,
            f.k,
            f.v,
            out,
            lse,
            None,
            None,
            sq,
            skv,
            0.0,
            f.causal,
            seed,
            offset,
            scale=scale,
        )
    if args.backend == "cudnn":
        return aten._scaled_dot_product_cudnn_attention_backward(
            do,
            f.q,
            f.k,
            f.v,
            out,
            lse,
            seed,
            offset,
            None,
            None,
            None,
            sq,
            skv,
            0.0,
            f.causal,
            scale=scale,
        )
    wanted = [args.requires_dq, args.requires_dk, args.requires_dv, False]
    return aten._scaled_dot_product_efficient_attention_backward(
        do, f.q, f.k, f.v, f.mask, out, lse, seed, offset, 0.0, wanted, False, scale=scale
    )[:3]


def _fused_forward_call(args: Any, plan: _Plan, with_stats: bool) -> tuple[torch.Tensor, Any]:
    """``(out in the format's layout, log-sum-exp or None)``; ``with_stats``: a backward
    follows (the kernel then returns the log-sum-exp)."""
    f = _fused_inputs(args, plan, with_stats)
    out, lse = _fused_forward(args, f, with_stats)
    if f.rows is not None:
        out = torch.where(f.rows, out, torch.zeros_like(out))
    out = _from_bhsd(out, f.lq).reshape(_out_shape(plan, args.qkv_format))
    return out, (lse if with_stats else None)


def _fused_backward(args: Any, plan: _Plan) -> tuple[Optional[torch.Tensor], ...]:
    """Gradients from the saved output and log-sum-exp: the kernel's backward op, once.
    The saved output is the op's own (zeros in rows with no key, where the incoming
    gradient is zeroed too, as differentiating that zeroing would)."""
    if args.checkpoint:
        # The forward kept neither: the same kernel on the same inputs gives its bits.
        out, lse = _fused_forward_call(args, plan, True)
        args = dataclasses.replace(args, checkpoint=False, out=out, softmax_stats=lse)
    f = _fused_inputs(args, plan, True)
    per_head = (plan.heads, plan.head_dim_v)
    # The output's layout for the gradient too (cuDNN reads them alike).
    do = args.grad_output.contiguous()
    do = _to_bhsd(do.reshape(*do.shape[:-1], *per_head), f.lq)
    out = _to_bhsd(args.out.reshape(*args.out.shape[:-1], *per_head), f.lq)
    if args.backend != "cudnn":
        # Flash and memory-efficient return their output as [b, s, h, d] in memory, and
        # the memory-efficient backward reads the output's rows at that stride whatever
        # the tensor's own: both get it so laid out (a copy only for sbhd with b > 1).
        out, do = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (out, do))
    if f.rows is not None:
        do = torch.where(f.rows, do, torch.zeros_like(do))
    dq, dk, dv = _fused_backward_kernel(args, f, do, out)
    if f.expanded:
        dk = None if dk is None else _group_sum(dk, plan.groups)
        dv = None if dv is None else _group_sum(dv, plan.groups)
    grads = (
        (dq, args.requires_dq, f.lq),
        (dk, args.requires_dk, f.lkv),
        (dv, args.requires_dv, f.lkv),
    )
    return tuple(_from_bhsd(g, layout) if need else None for g, need, layout in grads) + (None,)


# --- Impls --------------------------------------------------------------------------


def _needs_backward(args: DotProductAttnFwdArgs) -> bool:
    wants = (
        args.q_requires_grad
        or args.k_requires_grad
        or args.v_requires_grad
        or args.attn_bias_requires_grad
    )
    return args.is_grad_enabled and wants


def _check_backend(args: Any, bundle: str, bias_grad: bool) -> None:
    """torch's CUDA kernels need CUDA; on the CPU, flash and memory-efficient run torch's
    CPU flash kernel (the op's own tests: the module selects neither there). A bundle
    built by hand may also name a backend that its configuration rules out, whose
    kernel would drop the softcap, mask, window or dropout without a word: refused with
    :func:`backend_support`'s reason. The CPU stand-in takes any dtype and head dim; its
    other limits are the CUDA kernels'."""
    if args.backend == "unfused":
        return
    device = args.q.device.type
    if device != "cuda" and (args.backend == "cudnn" or device != "cpu"):
        raise ValueError(
            f"{bundle}.backend: {args.backend!r} runs on CUDA only; the inputs are on {device}"
        )
    cpu = device == "cpu"
    why = backend_support(
        device=torch.device("cuda"),
        dtype=torch.bfloat16 if cpu else args.q.dtype,
        head_dim=8 if cpu else args.q.shape[-1],
        head_dim_v=8 if cpu else args.v.shape[-1],
        qkv_format=args.qkv_format,
        attn_mask_type=args.attn_mask_type,
        window_size=tuple(args.window_size),
        bottom_right_diagonal=args.bottom_right_diagonal,
        same_seqlens=args.max_seqlen_q == args.max_seqlen_kv,
        attn_bias_type=args.attn_bias_type,
        bias_requires_grad=bias_grad,
        softcap=args.softcap,
        dropout=_uses_dropout(args),
    )[args.backend]
    if why is not None:
        raise ValueError(f"{bundle}.backend: {args.backend!r} cannot serve this call: {why}")


def _bias_grad(args: DotProductAttnFwdArgs) -> bool:
    return args.is_grad_enabled and args.attn_bias is not None and args.attn_bias_requires_grad


def attention_forward(
    args: DotProductAttnFwdArgs,
) -> tuple[tuple[torch.Tensor], tuple[Optional[torch.Tensor]]]:
    """``((out,), (softmax_stats,))``; out is [sq, b, h*dv] (sbhd), [b, sq, h*dv] (bshd)
    or [t, h*dv] (thd), in the inputs' dtype; the log-sum-exp when a backward follows."""
    plan = _plan(args)
    _check_backend(args, "DotProductAttnFwdArgs", _bias_grad(args))
    _check_seqlens(args)
    keep = _needs_backward(args) and not args.checkpoint
    if args.backend == "unfused":
        out, lse = _unfused_forward(args, plan)
        return (out,), (lse if keep else None,)
    out, lse = _fused_forward_call(args, plan, _needs_backward(args))
    return (out,), (lse if keep else None,)


def attention_forward_spec(
    args: DotProductAttnFwdArgs,
) -> tuple[tuple[TensorSpec], tuple[Optional[TensorSpec]]]:
    plan = _plan(args)
    _check_backend(args, "DotProductAttnFwdArgs", _bias_grad(args))
    out = TensorSpec(_out_shape(plan, args.qkv_format), args.q.dtype, device=args.q.device)
    if not _needs_backward(args) or args.checkpoint:
        return (out,), (None,)
    if args.backend != "unfused":
        return (out,), (_fused_stats_spec(args, plan),)
    stats = TensorSpec(
        (plan.batch, plan.heads, plan.seq_q), math_dtype(args.q.dtype), device=args.q.device
    )
    return (out,), (stats,)


def attention_setup_context(
    args: DotProductAttnFwdArgs, outputs: tuple[Any, ...], saved: tuple[Any, ...]
) -> dict[str, Any]:
    (stats,) = saved
    grad = args.is_grad_enabled
    checkpoint = args.checkpoint and _needs_backward(args)
    return dict(
        out=outputs[0] if stats is not None and args.backend != "unfused" else None,
        softmax_stats=stats,
        rng_state=args.rng_state if _uses_dropout(args) else None,
        requires_dq=grad and args.q_requires_grad,
        requires_dk=grad and args.k_requires_grad,
        requires_dv=grad and args.v_requires_grad,
        requires_dbias=_bias_grad(args),
        dropout_p=args.dropout_p if _uses_dropout(args) else 0.0,
        checkpoint=checkpoint,
    )


def attention_backward(args: DotProductAttnBwdArgs) -> tuple[Optional[torch.Tensor], ...]:
    """Gradients of ``(q, k, v, attn_bias)``; None for those not required."""
    if not (args.requires_dq or args.requires_dk or args.requires_dv or args.requires_dbias):
        return None, None, None, None
    plan = _plan(args)
    if args.backend == "unfused":
        return _unfused_backward(args, plan)
    _check_backend(args, "DotProductAttnBwdArgs", args.requires_dbias)
    return _fused_backward(args, plan)


def attention_backward_spec(args: DotProductAttnBwdArgs) -> tuple[Optional[TensorSpec], ...]:
    def like(t: Any, need: bool) -> Optional[TensorSpec]:
        return TensorSpec(tuple(t.shape), t.dtype, device=args.q.device) if need else None

    return (
        like(args.q, args.requires_dq),
        like(args.k, args.requires_dk),
        like(args.v, args.requires_dv),
        like(args.attn_bias, args.requires_dbias),
    )


DOT_PRODUCT_ATTENTION = OpDeclaration(
    name="dot_product_attention",
    forward=DotProductAttnFwdArgs,
    backward=DotProductAttnBwdArgs,
    grad_fields=("q", "k", "v", "attn_bias"),
    forward_impl=attention_forward,
    backward_impl=attention_backward,
    forward_spec=attention_forward_spec,
    backward_spec=attention_backward_spec,
    setup_context=attention_setup_context,
    # Backward fields setup_context computes although a forward field has their name.
    derived=("rng_state", "dropout_p", "checkpoint"),
)
