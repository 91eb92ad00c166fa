"""Every keyword argument of TE 2.20.2's module constructors and ``forward`` methods
(``te_2_20_keywords.py``, read from TE's wheel) is accepted here: at TE's default
always; at another value it works with TE's meaning or raises ``NotImplementedError``
naming it, never a ``TypeError``. docs/te_api.md lists each with that status, and
this test holds the table to the code."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from te_2_20_keywords import TE_SIGNATURES

import transformer_engine_ops as te

DOC = Path(__file__).resolve().parents[2] / "docs" / "te_api.md"

# The positional arguments each class needs, and the input of a forward call.
REQUIRED: dict[str, dict[str, Any]] = {
    "Linear": {"in_features": 32, "out_features": 32},
    "LayerNormLinear": {"in_features": 32, "out_features": 32},
    "LayerNormMLP": {"hidden_size": 32, "ffn_hidden_size": 64},
    "GroupedLinear": {"num_gemms": 2, "in_features": 32, "out_features": 32},
    "LayerNorm": {"normalized_shape": 32},
    "RMSNorm": {"normalized_shape": 32},
    "MultiheadAttention": {"hidden_size": 32, "num_attention_heads": 4},
    "TransformerLayer": {"hidden_size": 32, "ffn_hidden_size": 64, "num_attention_heads": 4},
}
# Modules whose forward takes a sequence: [s, b, hidden] (TE's default sbhd).
SEQUENCE_INPUT = ("MultiheadAttention", "TransformerLayer")
FORWARD_REQUIRED: dict[str, Any] = {"inp": None, "m_splits": [2, 2], "hidden_states": None}

# A value other than TE's default for each keyword, of the type TE documents.
OTHER_VALUE: dict[str, Any] = {
    "eps": 1e-3,
    "tp_size": 2,
    "get_rng_state_tracker": lambda: None,
    "rng_tracker_name": "model-parallel-rng",
    "init_method": torch.nn.init.zeros_,
    "output_layer_init_method": torch.nn.init.zeros_,
    "bias": False,
    "normalization": "RMSNorm",
    "activation": "relu",
    "activation_params": {"limit": 7.0},
    "params_dtype": torch.bfloat16,
    "parallel_mode": "column",
    "parameters_split": ("query", "key"),
    "seq_length": 4,
    "micro_batch_size": 1,
    "ub_name": "qkv",
    "symmetric_ar_type": "multimem_all_reduce",
    "name": "layer0",
    "use_grouped_tensor": True,
    "normalized_shape": 32,
    "hidden_size": 32,
    "sequence_parallel": True,
    "is_first_microbatch": True,
    "out": "a tensor",
    "dgrad_out": "a tensor",
    # MultiheadAttention, TransformerLayer
    "kv_channels": 16,
    "attention_dropout": 0.2,
    "hidden_dropout": 0.2,
    "layernorm_epsilon": 1e-3,
    "layer_number": 2,
    "attn_mask_type": "no_mask",
    "self_attn_mask_type": "no_mask",
    "enc_dec_attn_mask_type": "padding",
    "window_size": (2, 0),
    "enc_dec_window_size": (-1, -1),
    "softcap": 5.0,
    "num_gqa_groups": 2,
    "attention_type": "cross",
    "qkv_format": "bshd",
    "attn_input_format": "bshd",
    "qk_norm_type": "RMSNorm",
    "qk_norm_eps": 1e-3,
    "softmax_type": "off-by-one",
    "layer_type": "decoder",
    "drop_path_rate": 0.1,
    "attention_mask": "a padding mask",
    "enc_dec_attn_mask": "a padding mask",
    "bottom_right_diagonal": True,
    "enc_dec_bottom_right_diagonal": True,
    "pad_between_seqs": True,
    "encoder_output": "a tensor",
    "rotary_pos_emb": "rotary",
    "core_attention_bias_type": "alibi",
    "core_attention_bias": "a tensor",
    "alibi_slopes": "a tensor",
    "cu_seqlens_q": "a tensor",
    "cu_seqlens_kv": "a tensor",
    "cu_seqlens_q_padded": "a tensor",
    "cu_seqlens_kv_padded": "a tensor",
    "max_seqlen_q": 4,
    "max_seqlen_kv": 4,
    "thd_attention_policies": [{}],
    "thd_attention_policy_dispatch": "per_sequence",
}
# Keywords whose other value needs a resource this CPU test has not: the status is
# written in the table by hand (and tested elsewhere).
NOT_PROBED = {
    "device": "implemented (default None: torch's default device; TE's is 'cuda')",
    "tp_group": "implemented (a registered ProcessGroup; tests/distributed)",
    "inference_params": "implemented (te.InferenceParams; tests/modules/test_inference.py)",
}

STATUS_OK = "implemented"
STATUS_NOT = "NotImplementedError"


def _keywords(cls: str, method: str) -> list[tuple[str, str | None]]:
    return TE_SIGNATURES[cls].get(method, [])


def _forward_args(cls: str) -> list[Any]:
    if cls in SEQUENCE_INPUT:
        return [torch.randn(4, 2, 32)]
    x = torch.randn(4, 32)
    return [x, [2, 2]] if cls == "GroupedLinear" else [x]


def _other(name: str, default: str | None) -> Any:
    if name in OTHER_VALUE:
        value = OTHER_VALUE[name]
        if value == "rotary":  # TE's table for the probe's 8-feature heads
            return te.RotaryPositionEmbedding(8)(4)
        if value == "a padding mask":  # [b, 1, 1, s] of the probe's input, True: padding
            return torch.zeros(2, 1, 1, 4, dtype=torch.bool)
        return torch.empty(4, 32) if value == "a tensor" else value
    if default in ("False", "True"):
        return default == "False"
    raise AssertionError(f"no other value for {name} (default {default})")


def probe(cls: str, method: str, name: str, default: str | None) -> str:
    """The status of ``name`` at a value other than TE's default: 'implemented' (it
    runs) or 'NotImplementedError' (raised naming it). Anything else fails."""
    module_cls = getattr(te, cls)
    kwargs = dict(REQUIRED[cls])
    value = _other(name, default)
    try:
        if method == "__init__":
            kwargs[name] = value
            if name == "hidden_size":  # the norms' deprecated name of normalized_shape
                kwargs.pop("normalized_shape")
            module_cls(**kwargs)
        else:
            module = module_cls(**kwargs)
            module(*_forward_args(cls), **{name: value})
    except NotImplementedError as error:
        assert name in str(error), f"{cls}.{method}({name}=...): {error}"
        return STATUS_NOT
    except (ValueError, RuntimeError) as error:
        # A value this module checks (e.g. tp_size without a group): accepted as an
        # argument with TE's meaning, refused as a configuration, naming it.
        assert name in str(error) or "tp_group" in str(error), f"{cls}.{method}({name}): {error}"
        return STATUS_OK
    return STATUS_OK


CASES = [
    (cls, method, name, default)
    for cls in TE_SIGNATURES
    for method in ("__init__", "forward")
    for name, default in _keywords(cls, method)
    if not (name in REQUIRED[cls] and default is None)
    and not (method == "forward" and name in FORWARD_REQUIRED)
]


@pytest.mark.parametrize("cls", sorted(TE_SIGNATURES))
def test_every_te_keyword_is_a_parameter(cls: str) -> None:
    """No TypeError for a TE argument: every name is ours too (by name)."""
    ours = getattr(te, cls)
    for method in ("__init__", "forward"):
        parameters = inspect.signature(getattr(ours, method)).parameters
        var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
        for name, _ in _keywords(cls, method):
            assert name in parameters or var_kw, f"{cls}.{method} lacks {name}"


@pytest.mark.parametrize("cls", sorted(TE_SIGNATURES))
def test_every_te_default_at_once(cls: str) -> None:
    """All of TE's defaults together (``device`` aside: TE's 'cuda' needs a GPU)."""
    kwargs = dict(REQUIRED[cls])
    for name, default in _keywords(cls, "__init__"):
        if default is not None and name not in kwargs and name != "device":
            kwargs[name] = eval(default)  # noqa: S307  (TE's literal defaults)
    module = getattr(te, cls)(**kwargs)
    args = _forward_args(cls)
    forward_defaults = {
        name: eval(default)  # noqa: S307
        for name, default in _keywords(cls, "forward")
        if default is not None and name not in FORWARD_REQUIRED
    }
    out = module(*args, **forward_defaults)
    assert isinstance(out, torch.Tensor)


def _doc_table() -> dict[tuple[str, str], str]:
    rows = {}
    for line in DOC.read_text().splitlines():
        m = re.match(r"\| `(\w+)(\.forward)?` \| `(\w+)` \| `[^`]*` \| (.+?) \|$", line)
        if m:
            rows[(m[1] + (m[2] or ""), m[3])] = m[4]
    return rows


@pytest.mark.parametrize(("cls", "method", "name", "default"), CASES)
def test_keyword_status_matches_the_doc(cls: str, method: str, name: str, default: str) -> None:
    where = cls if method == "__init__" else f"{cls}.forward"
    documented = _doc_table().get((where, name))
    assert documented is not None, f"docs/te_api.md has no row for {where} {name}"
    if name in NOT_PROBED:
        assert documented == NOT_PROBED[name]
        return
    status = probe(cls, method, name, default)
    assert documented.startswith(status), (where, name, status, documented)
