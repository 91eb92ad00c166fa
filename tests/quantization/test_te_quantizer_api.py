"""TE's quantizer API: its constructors (positional order, ``te.DType``, ``device``,
``rowwise``/``columnwise``, ``fp4_dtype``, ``scale``/``amax``), its methods
(``make_empty``, ``quantize(out=)``, ``update_quantized``, ``copy``, ``calibrate``,
the allocation primitives) and its value rules (a process group is no value)."""

from __future__ import annotations

import warnings

import pytest
import torch
from quant_cases import random_input
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

import transformer_engine_ops as te
from transformer_engine_ops.quantization.hadamard import rht_matrix
from transformer_engine_ops.quantization.recipes import compatible_recipe
from transformer_engine_ops.runtime import codec

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def te_quantizers() -> dict[str, te.Quantizer]:
    """One quantizer per format, each made as TE's tests make it."""
    return {
        "fp8_current": te.Float8CurrentScalingQuantizer(
            fp8_dtype=te.DType.kFloat8E4M3, device=torch.device("cpu")
        ),
        "mxfp8": te.MXFP8Quantizer(fp8_dtype=te.DType.kFloat8E4M3),
        "fp8_block": te.Float8BlockQuantizer(
            fp8_dtype=te.DType.kFloat8E4M3, rowwise=True, columnwise=True
        ),
        "nvfp4": te.NVFP4Quantizer(
            fp4_dtype=te.DType.kFloat4E2M1,
            rowwise=True,
            columnwise=True,
            with_rht=True,
            with_post_rht_amax=True,
        ),
    }


SHAPE = (64, 128)


# ----- constructors -----


def test_current_scaling_takes_te_s_positional_dtype_and_device():
    q = te.Float8CurrentScalingQuantizer(te.DType.kFloat8E5M2, "cuda")
    assert q.fp8_dtype == E5M2 and q.dtype == te.DType.kFloat8E5M2
    assert q == te.Float8CurrentScalingQuantizer(fp8_dtype=E5M2)
    q = te.Float8CurrentScalingQuantizer(
        te.DType.kFloat8E4M3, device="cpu", rowwise=True, columnwise=False, amax_epsilon=1e-3
    )
    assert (q.rowwise_usage, q.columnwise_usage, q.amax_epsilon) == (True, False, 1e-3)


def test_current_scaling_ignores_scale_amax_and_use_existing_amax_with_te_s_warning():
    with pytest.warns(DeprecationWarning, match="ignores `use_existing_amax`, `scale`, and `amax`"):
        q = te.Float8CurrentScalingQuantizer(
            te.DType.kFloat8E4M3, "cpu", scale=torch.ones(1), amax=torch.zeros(1)
        )
    assert q == te.Float8CurrentScalingQuantizer()
    with pytest.warns(DeprecationWarning):
        te.Float8CurrentScalingQuantizer(te.DType.kFloat8E4M3, "cpu", use_existing_amax=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        te.Float8CurrentScalingQuantizer(te.DType.kFloat8E4M3, "cpu")


@pytest.mark.parametrize(
    "make",
    [
        lambda d: te.Float8CurrentScalingQuantizer(d, "cpu"),
        lambda d: te.MXFP8Quantizer(d),
        lambda d: te.Float8BlockQuantizer(d, rowwise=True, columnwise=True),
        lambda d: te.Float8Quantizer(torch.ones(1), torch.zeros(1), d),
    ],
    ids=["fp8_current", "mxfp8", "fp8_block", "fp8_delayed"],
)
def test_fp8_quantizers_take_te_dtype_or_torch_dtype_and_refuse_others(make):
    assert make(te.DType.kFloat8E4M3).fp8_dtype == E4M3
    assert make(te.DType.kFloat8E5M2).fp8_dtype == E5M2
    assert make(E5M2).dtype == te.DType.kFloat8E5M2
    with pytest.raises(TypeError, match="fp8_dtype must be te.DType.kFloat8E4M3"):
        make(te.DType.kBFloat16)
    with pytest.raises(TypeError, match="fp8_dtype must be torch.float8_e4m3fn"):
        make(torch.bfloat16)


def test_block_quantizer_defaults_to_te_s_2d_blocks():
    q = te.Float8BlockQuantizer(te.DType.kFloat8E4M3, rowwise=True, columnwise=False)
    assert (q.block_scaling_dim, q.block_len, q.force_pow_2_scales) == (2, 128, True)
    assert not q.columnwise_usage


def test_nvfp4_takes_te_s_positional_arguments():
    q = te.NVFP4Quantizer(te.DType.kFloat4E2M1, True, False, False, None, True, True)
    assert (q.rowwise_usage, q.columnwise_usage, q.with_rht, q.with_post_rht_amax) == (
        True,
        False,
        True,
        True,
    )
    assert q.dtype == te.DType.kFloat4E2M1
    with pytest.raises(TypeError, match="fp4_dtype must be te.DType.kFloat4E2M1"):
        te.NVFP4Quantizer(te.DType.kFloat8E4M3)


def test_usage_given_twice_is_refused():
    with pytest.raises(TypeError, match="rowwise and rowwise_usage both given"):
        te.MXFP8Quantizer(rowwise=True, rowwise_usage=True)


def test_nvfp4_without_the_random_sign_mask_transforms_with_the_plain_hadamard_matrix():
    """TE's ``with_random_sign_mask=False``: the transform's signs are all +1; the
    columnwise data differs from the signed transform's and dequantizes as closely."""
    h = rht_matrix(torch.float64, random_signs=False) * 4
    assert torch.equal(h.abs(), torch.ones_like(h)) and torch.equal(h[0], torch.ones(16).double())
    assert torch.equal(h @ h.T, 16 * torch.eye(16, dtype=torch.float64))
    x = random_input((64, 32))
    signed = te.NVFP4Quantizer(with_rht=True, with_post_rht_amax=True, rowwise=False)
    plain = te.NVFP4Quantizer(
        with_rht=True, with_post_rht_amax=True, rowwise=False, with_random_sign_mask=False
    )
    assert signed != plain and codec.code_of(signed) != codec.code_of(plain)
    a, b = signed.quantize(x), plain.quantize(x)
    assert not torch.equal(a._columnwise_data, b._columnwise_data)
    bound = 0.6 * float(x.abs().max())
    assert float((b.dequantize() - x).abs().max()) <= bound
    assert codec.decode(codec.code_of(b.quantizer)) == b.quantizer


# ----- delayed scaling with TE's scale and amax tensors -----


def test_delayed_quantizer_reads_te_s_scale_and_records_the_amax_by_reference():
    scale = torch.full((1,), 4.0)
    amax = torch.zeros(1)
    q = te.Float8Quantizer(scale=scale, amax=amax, fp8_dtype=te.DType.kFloat8E4M3)
    assert q.scale is scale and q.amax is amax and not q.owns_state
    x = random_input((16, 32))
    value = q(x)
    assert torch.equal(value._scale_inv, torch.tensor([0.25]))
    assert float(amax) == float(x.abs().max())
    q(x / 8)  # the maximum over the quantizes
    assert float(amax) == float(x.abs().max())
    assert float(scale) == 4.0  # the owner updates the scale, not the quantizer
    scale.fill_(2.0)  # read by reference
    assert torch.equal(q(x)._scale_inv, torch.tensor([0.5]))
    with pytest.raises(RuntimeError, match="their owner updates the scale"):
        q.update_scale()


def test_delayed_quantizer_copies_share_te_s_tensors_and_factories_get_their_own():
    def factory() -> te.Float8Quantizer:
        return te.Float8Quantizer(torch.ones(1), torch.zeros(1), te.DType.kFloat8E4M3)

    q1, q2 = factory(), factory()
    assert q1.scale.data_ptr() != q2.scale.data_ptr()
    q1.scale.fill_(123.0)
    assert not torch.equal(q1.scale, q2.scale)
    assert q1.copy().scale is q1.scale and q1.copy().amax is q1.amax


def test_calibrate_records_the_amax_without_quantizing_and_only_delayed_scaling_keeps_it():
    amax = torch.full((1,), 100.0)
    q = te.Float8Quantizer(torch.ones(1).squeeze(), amax, te.DType.kFloat8E4M3)
    x = random_input((8, 16))
    q.calibrate(x)
    assert float(amax) == float(x.abs().max())  # replaced, as TE's calibrate does
    owned = te.Float8Quantizer()
    owned.calibrate(x)
    assert float(owned.amax_history[0]) == float(x.abs().max())
    assert float(owned.scale) == 1.0
    for q in te_quantizers().values():
        assert q.calibrate(x) is None


@pytest.mark.parametrize("shape", [(), (2,), (1, 2)])
def test_delayed_quantizer_refuses_a_scale_that_is_not_one_element(shape):
    with pytest.raises(ValueError, match="scale must be a one-element tensor"):
        te.Float8Quantizer(torch.ones(shape) if shape != () else torch.ones(0), torch.zeros(1))
    if shape == (1, 2):
        with pytest.raises(TypeError, match="amax must be float32"):
            te.Float8Quantizer(torch.ones(1), torch.zeros(1, dtype=torch.float64))


# ----- methods -----


@pytest.mark.parametrize("name", list(te_quantizers()))
def test_make_empty_takes_te_s_defaults(name):
    q = te_quantizers()[name]
    empty = q.make_empty(SHAPE, device="cpu")
    assert isinstance(empty, q.wrapper_cls) and empty.dtype == torch.float32
    assert tuple(empty.shape) == SHAPE and not empty.requires_grad
    q.internal = True
    storage = q.make_empty(SHAPE, dtype=torch.bfloat16, device="cpu")
    assert isinstance(storage, q.storage_cls) and storage.dtype == torch.bfloat16


@pytest.mark.parametrize("name", list(te_quantizers()))
def test_quantize_into_out_and_update_quantized_write_in_place(name):
    q = te_quantizers()[name]
    x = random_input(SHAPE, dtype=torch.bfloat16)
    dst = q.make_empty(SHAPE, dtype=torch.bfloat16, device="cpu")
    buffers = [t.data_ptr() for t in dst.inner_tensors()]
    assert q.quantize(x, out=dst) is dst
    assert [t.data_ptr() for t in dst.inner_tensors()] == buffers
    assert torch.equal(dst.dequantize(), q(x).dequantize())
    y = random_input(SHAPE, seed=1, dtype=torch.bfloat16)
    assert q.update_quantized(y, dst) is dst
    assert torch.equal(dst.dequantize(), q(y).dequantize())


@pytest.mark.parametrize("name", list(te_quantizers()))
def test_update_quantized_with_the_noop_flag_set_writes_nothing(name):
    q = te_quantizers()[name]
    x, y = random_input(SHAPE), random_input(SHAPE, seed=1)
    dst = q(x)
    before = [t.clone() for t in dst.inner_tensors()]
    q.update_quantized(y, dst, noop_flag=torch.ones(1))
    assert all(torch.equal(a, b) for a, b in zip(before, dst.inner_tensors(), strict=True))
    q.update_quantized(y, dst, noop_flag=torch.zeros(1))
    assert torch.equal(dst.dequantize(), q(y).dequantize())


def test_update_quantized_with_the_noop_flag_leaves_delayed_scaling_state_alone():
    amax = torch.zeros(1)
    q = te.Float8Quantizer(torch.ones(1), amax)
    dst = q(random_input((8, 16)))
    recorded = amax.clone()
    q.update_quantized(random_input((8, 16)) * 100, dst, noop_flag=torch.ones(1))
    assert torch.equal(amax, recorded)


def test_update_quantized_refuses_another_format_and_another_shape():
    fp8, mx = te_quantizers()["fp8_current"], te_quantizers()["mxfp8"]
    dst = fp8(random_input(SHAPE))
    with pytest.raises(ValueError, match="MXFP8Quantizer can only update MXFP8Tensor"):
        mx.update_quantized(random_input(SHAPE), dst)
    with pytest.raises(ValueError, match=r"src of shape \(64, 64\)"):
        fp8.update_quantized(random_input((64, 64)), dst)


def test_quantizing_a_tensor_that_requires_grad_passes_the_gradient_straight_through():
    q = te_quantizers()["fp8_current"]
    x = random_input((8, 16)).requires_grad_()
    value = q(x)
    assert value.requires_grad
    value.dequantize().mul(3).sum().backward()
    assert torch.equal(x.grad, torch.full_like(x, 3.0))
    q.internal = True  # storages never carry autograd history, as TE's
    assert not q(x).requires_grad
    with torch.no_grad():
        assert not te_quantizers()["fp8_current"](x).requires_grad


def test_quantize_presents_the_dtype_asked_for():
    q = te_quantizers()["mxfp8"]
    x = random_input(SHAPE)
    value = q.quantize(x, dtype=torch.bfloat16)
    assert value.dtype == torch.bfloat16 and value.dequantize().dtype == torch.bfloat16
    assert torch.equal(value.dequantize(), q(x).dequantize().bfloat16())
    with pytest.raises(TypeError, match="dtype=torch.int32"):
        q.quantize(x, dtype=torch.int32)


def test_te_s_small_queries():
    qs = te_quantizers()
    x = random_input((128, 128))
    assert [q.is_quantizable(x) for q in qs.values()] == [True, True, True, True]
    assert not qs["mxfp8"].is_quantizable(random_input((48, 64)))
    assert not qs["fp8_block"].is_quantizable(random_input((128,)))
    assert not te.NVFP4Quantizer(row_scaled_nvfp4=True).is_quantizable(x)
    assert qs["fp8_current"].supports_only_rowwise_all_gather()
    assert not qs["mxfp8"].supports_only_rowwise_all_gather()
    assert all(q.is_requantization_safe() for q in qs.values())
    assert not te.NVFP4Quantizer(stochastic_rounding=True).is_requantization_safe()
    assert not te.Float8Quantizer().is_requantization_safe()
    assert compatible_recipe(qs["nvfp4"]) is te.recipe.NVFP4BlockScaling
    assert compatible_recipe(te.Float8Quantizer()) is te.recipe.DelayedScaling
    assert compatible_recipe(te.IdentityQuantizer()) is None
    values = qs["fp8_current"].multi_quantize([x, 2 * x])
    assert [type(v) for v in values] == [te.Float8Tensor, te.Float8Tensor]


# ----- TE's data-free allocation primitives -----


@pytest.mark.parametrize("name", list(te_quantizers()))
def test_allocation_primitives_describe_and_build_the_value_make_empty_builds(name):
    q = te_quantizers()[name]
    specs = q.inner_tensor_specs(SHAPE)
    with FakeTensorMode():
        fake = q.alloc_tensors(SHAPE, device="cpu")
    assert list(fake) == list(specs)
    for buffer, (shape, dtype) in zip(fake.values(), specs.values(), strict=True):
        assert isinstance(buffer, FakeTensor)
        assert (tuple(buffer.shape), buffer.dtype) == (shape, dtype)
    ctx = q.create_metadata(SHAPE, dtype=torch.bfloat16, requires_grad=True)
    assert ctx["cls"] is q.wrapper_cls and ctx["is_tensor"] and ctx["requires_grad"]
    inner = q.alloc_tensors(SHAPE, device="cpu")
    built = ctx["cls"].__tensor_unflatten__(inner, ctx, SHAPE, None)
    empty = q.make_empty(SHAPE, dtype=torch.bfloat16, device="cpu")
    assert type(built) is type(empty) and built.requires_grad
    assert built.inner_names() == empty.inner_names() and built.dtype == torch.bfloat16
    q.internal = True
    ctx = q.create_metadata(SHAPE, dtype=torch.float32)
    storage = ctx["cls"].__tensor_unflatten__(q.alloc_tensors(SHAPE, device="cpu"), ctx, None, None)
    assert isinstance(storage, q.storage_cls) and tuple(storage.size()) == SHAPE


# ----- a process group is no value -----


def test_a_quantizer_holding_a_process_group_is_not_a_value():
    """TE's rule: a quantizer that holds an ``amax_reduction_group`` is never hashed,
    compared, encoded or baked into a graph; without it, it is a value again."""
    q = te.MXFP8Quantizer(fp8_dtype=te.DType.kFloat8E4M3)
    group = object()  # any live group object
    q.amax_reduction_group = group
    for use in (hash, q.__fx_repr__, codec.encode, lambda: q == te.MXFP8Quantizer()):
        with pytest.raises(TypeError, match="holds a process group"):
            use(q) if use in (hash, codec.encode) else use()
    assert q.copy().amax_reduction_group is group
    q.amax_reduction_group = None
    assert q == te.MXFP8Quantizer() and hash(q) == hash(te.MXFP8Quantizer())


def test_with_amax_reduction_needs_torch_distributed():
    q = te.Float8CurrentScalingQuantizer(with_amax_reduction=True)
    with pytest.raises(RuntimeError, match="torch.distributed is not initialized"):
        q(random_input((8, 16)))
