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
    "DotProductAttention": {"num_attention_heads": 4, "kv_channels": 8},
    "MultiheadAttention": {"hidden_size": 32, "num_attention_heads": 4},
    "TransformerLayer": {"hidden_size": 32, "ffn_hidden_size": 64, "num_attention_heads": 4},
}
# Modules whose forward takes hidden states [s, b, hidden] (TE's default sbhd; s=6, b=2
# as DotProductAttention's probe input, so the attention keywords' values fit both).
SEQUENCE_INPUT = ("MultiheadAttention", "TransformerLayer")
FORWARD_REQUIRED: dict[str, Any] = {
    "inp": None,
    "m_splits": [2, 2],
    "query_layer": None,
    "key_layer": None,
    "value_layer": None,
    "hidden_states": None,
}

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
    # DotProductAttention's
    "num_gqa_groups": 2,
    "attention_dropout": 0.2,
    "qkv_format": "bshd",
    "attn_mask_type": "no_mask",
    "window_size": (2, 0),
    "bottom_right_diagonal": True,
    "softcap": 5.0,
    "layer_number": 2,
    "attention_type": "cross",
    "cp_group": object(),
    "cp_global_ranks": [0, 1],
    "cp_stream": object(),
    "cp_comm_type": "a2a",
    "softmax_scale": 0.5,
    "softmax_type": "off-by-one",
    "attention_mask": torch.zeros(2, 1, 1, 6, dtype=torch.bool),
    "cu_seqlens_q": torch.tensor([0, 6, 12], dtype=torch.int32),
    "cu_seqlens_kv": torch.tensor([0, 6, 12], dtype=torch.int32),
    "cu_seqlens_q_padded": torch.tensor([0, 6, 12], dtype=torch.int32),
    "cu_seqlens_kv_padded": torch.tensor([0, 6, 12], dtype=torch.int32),
    "max_seqlen_q": 6,
    "max_seqlen_kv": 6,
    "core_attention_bias_type": "alibi",
    "core_attention_bias": torch.zeros(1, 4, 6, 6),
    "alibi_slopes": torch.ones(4),
    "fast_zero_fill": False,
    "inference_params": object(),
    "pad_between_seqs": True,
    "num_splits": 2,
    "score_mod": lambda graph, score, tensors: score,
    "score_mod_bprop": lambda graph, dp, tensors: dp,
    "score_mod_tensors": {"t": torch.zeros(1)},
    "score_mod_bprop_tensors": {"t": torch.zeros(1)},
    "qkv_layer": torch.zeros(6, 2, 3, 4, 8),
    "kv_layer": torch.zeros(6, 2, 2, 4, 8),
    "qkv_interleave_dim": -2,
    "thd_attention_policies": [{}],
    "thd_attention_policy_dispatch": "manual",
    # MultiheadAttention's and TransformerLayer's
    "kv_channels": 16,
    "hidden_dropout": 0.2,
    "layernorm_epsilon": 1e-3,
    "self_attn_mask_type": "no_mask",
    "enc_dec_attn_mask_type": "padding",
    "enc_dec_window_size": (-1, -1),
    "enc_dec_bottom_right_diagonal": True,
    "enc_dec_attn_mask": torch.zeros(2, 1, 1, 6, dtype=torch.bool),
    "attn_input_format": "bshd",
    "qk_norm_type": "RMSNorm",
    "qk_norm_eps": 1e-3,
    "layer_type": "decoder",
    "drop_path_rate": 0.1,
    "encoder_output": "a tensor",
    "rotary_pos_emb": "rotary",
}
# Keywords whose other value needs a resource this CPU test has not: the status is
# written in the table by hand (and tested elsewhere).
NOT_PROBED = {
    "device": (
        "implemented (default None: the current CUDA device where available, TE's 'cuda'; "
        "else the CPU)"
    ),
    "tp_group": "implemented (a registered ProcessGroup; tests/distributed)",
}

# ... and where one class means something else by it.
NOT_PROBED_IN = {
    **{
        (cls, "inference_params"): (
            "implemented (te.InferenceParams; tests/modules/test_inference.py)"
        )
        for cls in ("MultiheadAttention", "TransformerLayer", "DotProductAttention")
    },
    ("DotProductAttention", "tp_group"): (
        "implemented (its size sets tp_size, so this rank holds num_attention_heads / "
        "tp_size heads; attention itself communicates nothing)"
    ),
}

STATUS_OK = "implemented"
STATUS_NOT = "NotImplementedError"


def _keywords(cls: str, method: str) -> list[tuple[str, str | None]]:
    return TE_SIGNATURES[cls].get(method, [])


def _forward_args(cls: str) -> list[Any]:
    if cls == "DotProductAttention":
        return [torch.randn(6, 2, 4, 8) for _ in range(3)]  # q, k, v (sbhd)
    if cls in SEQUENCE_INPUT:
        return [torch.randn(6, 2, 32)]
    x = torch.randn(4, 32)
    return [x, [2, 2]] if cls == "GroupedLinear" else [x]


def _other(name: str, default: str | None) -> Any:
    if name in OTHER_VALUE:
        value = OTHER_VALUE[name]
        if isinstance(value, str) and value == "rotary":  # TE's table, 8-feature heads
            return te.RotaryPositionEmbedding(8)(6)
        return torch.empty(4, 32) if isinstance(value, str) and value == "a tensor" else value
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
    expected = NOT_PROBED_IN.get((cls, name), NOT_PROBED.get(name))
    if expected is not None:
        assert documented == expected
        return
    status = probe(cls, method, name, default)
    assert documented.startswith(status), (where, name, status, documented)
