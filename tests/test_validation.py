"""Bad input raises before anything runs, with messages that name the argument, the expectation and
what was received. Runs on NumPy inputs (the checks are shared with the CuPy path)."""

import ml_dtypes
import numpy as np
import pytest
from helpers import gpu_available

import cupyflash


def _qkv(dtype=np.float32, b=2, sq=5, sk=7, h=4, hk=2, d=8, dv=6):
    rng = np.random.default_rng(0)
    return (
        rng.standard_normal((b, sq, h, d)).astype(dtype),
        rng.standard_normal((b, sk, hk, d)).astype(dtype),
        rng.standard_normal((b, sk, hk, dv)).astype(dtype),
    )


def test_non_array_is_type_error():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match=r"q must be a cupy.ndarray or numpy.ndarray, got builtins.list"):
        cupyflash.flash_attention(q.tolist(), k, v)


@pytest.mark.parametrize("dtype", [np.int32, np.bool_, np.complex64, np.uint8])
def test_unsupported_dtype_is_type_error(dtype):
    q, k, v = (x.astype(dtype) for x in _qkv())
    with pytest.raises(TypeError, match=rf"q has dtype {np.dtype(dtype)}; expected float16, bfloat16, float32 or float64"):
        cupyflash.flash_attention(q, k, v)


def test_mismatched_dtype_is_type_error():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match=r"v has dtype bfloat16, but q has dtype float32"):
        cupyflash.flash_attention(q, k, v.astype(ml_dtypes.bfloat16))


def test_wrong_rank_is_value_error():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"q: 3-dimensional array given. Array must be 4-dimensional "
                                         r"\(batch, seqlen, heads, headdim\)"):
        cupyflash.flash_attention(q[0], k, v)


def test_batch_mismatch():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"batch sizes differ: q has 2, k has 1, v has 2"):
        cupyflash.flash_attention(q, k[:1], v)


def test_seqlen_mismatch_between_k_and_v():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"k and v must have the same seqlen; got k 7, v 6"):
        cupyflash.flash_attention(q, k, v[:, :6])


def test_heads_mismatch_between_k_and_v():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"k and v must have the same number of heads; got k 2, v 1"):
        cupyflash.flash_attention(q, k, v[:, :, :1])


def test_headdim_mismatch_between_q_and_k():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"q and k must have the same headdim; got q 8, k 7"):
        cupyflash.flash_attention(q, k[..., :7], v)


def test_zero_headdim():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"headdim must be at least 1; got q/k headdim 8, v headdim 0"):
        cupyflash.flash_attention(q, k, v[..., :0])


def test_heads_not_divisible_by_kv_heads():
    q, k, v = _qkv(h=5, hk=2)
    with pytest.raises(ValueError, match=r"multiple of the number of kv heads; got q 5 heads, k/v 2 heads"):
        cupyflash.flash_attention(q, k, v)


@pytest.mark.parametrize("scale, error, message", [
    ("0.5", TypeError, r"softmax_scale must be a real number or None, got str"),
    (True, TypeError, r"softmax_scale must be a real number or None, got bool"),
    (float("nan"), ValueError, r"softmax_scale must be finite, got nan"),
    (float("inf"), ValueError, r"softmax_scale must be finite, got inf"),
])
def test_bad_softmax_scale(scale, error, message):
    q, k, v = _qkv()
    with pytest.raises(error, match=message):
        cupyflash.flash_attention(q, k, v, softmax_scale=scale)


def test_causal_must_be_bool():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match=r"causal must be a bool, got str 'yes'"):
        cupyflash.flash_attention(q, k, v, causal="yes")


def test_return_lse_must_be_bool():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match=r"return_lse must be a bool, got int 1"):
        cupyflash.flash_attention(q, k, v, return_lse=1)


def test_deterministic_must_be_bool():
    q, k, v = _qkv()
    out, lse = cupyflash.flash_attention(q, k, v, return_lse=True)
    with pytest.raises(TypeError, match=r"deterministic must be a bool, got str 'yes'"):
        cupyflash.flash_attention_backward(out, q, k, v, out, lse, deterministic="yes")
    with pytest.raises(TypeError, match=r"deterministic must be a bool, got int 0"):
        cupyflash.flash_attention_vjp(q, k, v, deterministic=0)


def _backward_inputs():
    q, k, v = _qkv()
    out, lse = cupyflash.flash_attention(q, k, v, return_lse=True)
    return out.copy(), q, k, v, out, lse


def test_backward_dout_shape():
    dout, q, k, v, out, lse = _backward_inputs()
    with pytest.raises(ValueError, match=r"dout must have shape \(2, 5, 4, 6\) "
                                         r"\(batch, seqlen_q, heads, headdim_v\), got \(2, 5, 4, 5\)"):
        cupyflash.flash_attention_backward(dout[..., :5], q, k, v, out, lse)


def test_backward_out_shape():
    dout, q, k, v, out, lse = _backward_inputs()
    with pytest.raises(ValueError, match=r"out must have shape \(2, 5, 4, 6\)"):
        cupyflash.flash_attention_backward(dout, q, k, v, out[:, :4], lse)


def test_backward_lse_shape_and_dtype():
    dout, q, k, v, out, lse = _backward_inputs()
    with pytest.raises(ValueError, match=r"lse must have shape \(2, 4, 5\) \(batch, heads, seqlen_q\), got \(2, 5, 4\)"):
        cupyflash.flash_attention_backward(dout, q, k, v, out, lse.transpose(0, 2, 1))
    with pytest.raises(TypeError, match=r"lse has dtype float16; expected float32 or float64 "
                                        r"\(flash_attention returns float64 for float32 inputs\)"):
        cupyflash.flash_attention_backward(dout, q, k, v, out, lse.astype(np.float16))
    with pytest.raises(ValueError, match=r"lse: 2-dimensional array given. Array must be 3-dimensional"):
        cupyflash.flash_attention_backward(dout, q, k, v, out, lse[0])


def test_backward_dout_dtype():
    dout, q, k, v, out, lse = _backward_inputs()
    with pytest.raises(TypeError, match=r"dout has dtype float16, but q has dtype float32"):
        cupyflash.flash_attention_backward(dout.astype(np.float16), q, k, v, out, lse)


def test_backward_non_array():
    dout, q, k, v, out, _ = _backward_inputs()
    with pytest.raises(TypeError, match=r"lse must be a cupy.ndarray or numpy.ndarray, got builtins.NoneType"):
        cupyflash.flash_attention_backward(dout, q, k, v, out, None)


def test_mixed_numpy_and_cupy_is_type_error():
    cupy = pytest.importorskip("cupy")
    if not gpu_available():
        pytest.skip("no CUDA GPU available")
    kk = cupy.zeros((2, 7, 2, 8), cupy.float32)
    q, _, v = _qkv()
    with pytest.raises(TypeError, match=r"inputs must all be cupy arrays or all numpy arrays; "
                                        r"got q is numpy, k is cupy, v is numpy"):
        cupyflash.flash_attention(q, kk, v)


def test_softmax_scale_overflowing_float32():
    """Regression: a scale finite in float64 but not in float32 (the kernels' type below float64)
    silently gave an all-zero output."""
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"softmax_scale 1e\+39 overflows float32"):
        cupyflash.flash_attention(q, k, v, softmax_scale=1e39)
    q, k, v = _qkv(np.float64)
    assert np.isfinite(cupyflash.flash_attention(q, k, v, softmax_scale=1e-300)).all()


def test_sizes_beyond_32_bit_kernel_indices():
    """Regression: seqlen 2^31 passed validation; the kernels index rows in 32 bits."""
    q = np.lib.stride_tricks.as_strided(np.zeros(8, np.float16), (1, 2**31, 1, 8), (0, 0, 0, 2))
    k = v = np.zeros((1, 4, 1, 8), np.float16)
    with pytest.raises(ValueError, match=r"seqlen_q must be at most 2147482624 \(32-bit kernel indices\), got 2147483648"):
        cupyflash.flash_attention(q, k, v)


def test_grid_limit():
    """Query tiles * batch * heads must fit one grid axis of 2^31 - 1 CTAs: 2^24 entries of 4096 rows
    (128 tiles of 32) and 4 heads are 2^33."""
    q = np.lib.stride_tricks.as_strided(np.zeros(8, np.float16), (2**24, 2**12, 4, 8), (0, 0, 0, 2))
    with pytest.raises(ValueError, match=r"problem too large for one launch: 8589934592 blocks"):
        cupyflash.flash_attention(q, q, q)


# ------------------------------------------------------------------------- masks and score modifications


@pytest.mark.parametrize("window, error, message", [
    ((1, 2, 3), TypeError, r"window_size must be a pair \(left, right\) of ints, got \(1, 2, 3\)"),
    (5, TypeError, r"window_size must be a pair \(left, right\) of ints, got 5"),
    ((1.5, 0), TypeError, r"window_size left must be an int, got float 1.5"),
    ((0, True), TypeError, r"window_size right must be an int, got bool True"),
    ((-2, 0), ValueError, r"window_size left must be -1 \(unbounded\) or at least 0, got -2"),
    ((0, -5), ValueError, r"window_size right must be -1 \(unbounded\) or at least 0, got -5"),
])
def test_bad_window_size(window, error, message):
    q, k, v = _qkv()
    with pytest.raises(error, match=message):
        cupyflash.flash_attention(q, k, v, window_size=window)


def test_huge_window_is_unbounded():
    q, k, v = _qkv()
    np.testing.assert_array_equal(cupyflash.flash_attention(q, k, v, window_size=(10**12, 10**12)),
                                  cupyflash.flash_attention(q, k, v))


@pytest.mark.parametrize("softcap, error, message", [
    ("1", TypeError, r"softcap must be a real number, got str '1'"),
    (True, TypeError, r"softcap must be a real number, got bool True"),
    (-1.0, ValueError, r"softcap must be 0 \(none\) or a positive finite number, got -1.0"),
    (float("inf"), ValueError, r"softcap must be 0 \(none\) or a positive finite number, got inf"),
    (1e-45, ValueError, r"softcap 1e-45 is outside the float32 range the kernels use for float32 inputs"),
])
def test_bad_softcap(softcap, error, message):
    q, k, v = _qkv()
    with pytest.raises(error, match=message):
        cupyflash.flash_attention(q, k, v, softcap=softcap)


def test_bad_alibi_slopes():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match=r"alibi_slopes has dtype float64; expected float32"):
        cupyflash.flash_attention(q, k, v, alibi_slopes=np.ones(4))
    with pytest.raises(ValueError, match=r"alibi_slopes must have shape \(4,\) or \(2, 4\) \(batch, heads\), got \(2,\)"):
        cupyflash.flash_attention(q, k, v, alibi_slopes=np.ones(2, np.float32))
    with pytest.raises(TypeError, match=r"alibi_slopes must be a cupy.ndarray or numpy.ndarray, got builtins.list"):
        cupyflash.flash_attention(q, k, v, alibi_slopes=[1.0] * 4)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_alibi_slopes_are_refused(bad):
    """Regression: a NaN slope was taken silently (a NaN softcap is refused)."""
    q, k, v = _qkv()  # batch 2, heads 4
    slopes = np.array([0.5, 0.25, bad, 0.125], np.float32)
    message = rf"alibi_slopes must be finite; got {bad} at index \(2,\) \(1 non-finite of 4\)"
    with pytest.raises(ValueError, match=message):
        cupyflash.flash_attention(q, k, v, alibi_slopes=slopes)
    out, lse = cupyflash.flash_attention(q, k, v, return_lse=True)
    with pytest.raises(ValueError, match=message):
        cupyflash.flash_attention_backward(out, q, k, v, out, lse, alibi_slopes=slopes)
    cu = np.array([0, 5], np.int32)
    with pytest.raises(ValueError, match=r"alibi_slopes must be finite; got .* at index \(0, 2\)"):
        cupyflash.flash_attention_varlen(q[0], k[0, :5], v[0, :5], cu, cu, alibi_slopes=slopes[None])


def test_bad_block_mask():
    q, k, v = _qkv()  # batch 2, seqlen_q 5, seqlen_k 7, heads 4
    with pytest.raises(TypeError, match=r"block_mask must be a cupyflash.BlockMask "
                                        r"\(see BlockMask.from_dense\), got numpy.ndarray"):
        cupyflash.flash_attention(q, k, v, block_mask=np.ones((1, 1, 1, 1), bool))
    mask = cupyflash.BlockMask.from_dense(np.ones((1, 1, 2, 2), bool), (4, 4))
    with pytest.raises(ValueError, match=r"block_mask has layout shape \(1, 3, 2, 2\) for blocks \(4, 4\); "
                                         r"expected \(1 or 2, 1 or 4, 2, 2\)"):
        cupyflash.flash_attention(q, k, v, block_mask=cupyflash.BlockMask.from_dense(np.ones((1, 3, 2, 2), bool), (4, 4)))
    with pytest.raises(ValueError, match=r"expected \(1 or 2, 1 or 4, 1, 2\) for seqlen_q 5, seqlen_k 7"):
        cupyflash.flash_attention(q, k, v, block_mask=cupyflash.BlockMask.from_dense(np.ones((1, 1, 2, 2), bool), (8, 4)))
    cupyflash.flash_attention(q, k, v, block_mask=mask)


@pytest.mark.parametrize("layout, block, error, message", [
    (np.ones((1, 1, 2, 2), np.int8), (4, 4), TypeError, r"layout has dtype int8; expected bool"),
    (np.ones((2, 2), bool), (4, 4), ValueError, r"layout: 2-dimensional array given. Array must be 4-dimensional"),
    (np.ones((1, 1, 0, 2), bool), (4, 4), ValueError, r"layout must not be empty"),
    (np.ones((1, 1, 2, 2), bool), (4, 0), ValueError, r"block_size must be positive and at most 1073741824, got \(4, 0\)"),
    (np.ones((1, 1, 2, 2), bool), 4, TypeError, r"block_size must be a pair of ints \(block_q, block_k\), got 4"),
])
def test_bad_block_mask_layout(layout, block, error, message):
    with pytest.raises(error, match=message):
        cupyflash.BlockMask.from_dense(layout, block)


# ----------------------------------------------------------------------------------- packed batches


def _packed(dtype=np.float32):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((9, 4, 8)).astype(dtype)
    k = rng.standard_normal((11, 2, 8)).astype(dtype)
    v = rng.standard_normal((11, 2, 6)).astype(dtype)
    return q, k, v, np.array([0, 4, 9], np.int32), np.array([0, 5, 11], np.int32)


@pytest.mark.parametrize("cu_q, message", [
    (np.array([1, 4, 9], np.int32), r"cu_seqlens_q must be non-decreasing from 0 to 9 \(the rows of the packed tensor\), "
                                       r"got \[1 4 9\]"),
    (np.array([0, 6, 4], np.int32), r"cu_seqlens_q must be non-decreasing from 0 to 9"),
    (np.array([0, 4, 8], np.int32), r"cu_seqlens_q must be non-decreasing from 0 to 9"),
])
def test_bad_cu_seqlens_values(cu_q, message):
    q, k, v, _, cu_k = _packed()
    with pytest.raises(ValueError, match=message):
        cupyflash.flash_attention_varlen(q, k, v, cu_q, cu_k)


def test_bad_cu_seqlens_kinds_and_sizes():
    q, k, v, cu_q, cu_k = _packed()
    with pytest.raises(TypeError, match=r"cu_seqlens_q has dtype int64; expected int32"):
        cupyflash.flash_attention_varlen(q, k, v, cu_q.astype(np.int64), cu_k)
    with pytest.raises(ValueError, match=r"cu_seqlens_q and cu_seqlens_k must have the same length; got 3 and 2"):
        cupyflash.flash_attention_varlen(q, k, v, cu_q, cu_k[:2])
    with pytest.raises(ValueError, match=r"cu_seqlens_q must be 1-dimensional of length batch \+ 1 >= 1, got shape \(0,\)"):
        cupyflash.flash_attention_varlen(q, k, v, cu_q[:0], cu_k)
    with pytest.raises(ValueError, match=r"max_seqlen_q is 3, but cu_seqlens_q holds a sequence of 5"):
        cupyflash.flash_attention_varlen(q, k, v, cu_q, cu_k, max_seqlen_q=3)
    with pytest.raises(ValueError, match=r"max_seqlen_k must be non-negative, got -1"):
        cupyflash.flash_attention_varlen(q, k, v, cu_q, cu_k, max_seqlen_k=-1)
    with pytest.raises(TypeError, match=r"max_seqlen_q must be an int or None, got float 3.0"):
        cupyflash.flash_attention_varlen(q, k, v, cu_q, cu_k, max_seqlen_q=3.0)
    with pytest.raises(ValueError, match=r"q: 4-dimensional array given. Array must be 3-dimensional \(total, heads, headdim\)"):
        cupyflash.flash_attention_varlen(q[None], k, v, cu_q, cu_k)
    with pytest.raises(ValueError, match=r"k and v must have the same number of rows; got k 11, v 10"):
        cupyflash.flash_attention_varlen(q, k, v[:10], cu_q, cu_k)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'block_mask'"):
        cupyflash.flash_attention_varlen(q, k, v, cu_q, cu_k, block_mask=None)


def test_varlen_backward_shapes():
    q, k, v, cu_q, cu_k = _packed()
    out, lse = cupyflash.flash_attention_varlen(q, k, v, cu_q, cu_k, return_lse=True)
    assert out.shape == (9, 4, 6) and lse.shape == (4, 9)
    with pytest.raises(ValueError, match=r"lse must have shape \(4, 9\) \(heads, total_q\), got \(9, 4\)"):
        cupyflash.flash_attention_varlen_backward(out, q, k, v, out, lse.T, cu_q, cu_k)
    with pytest.raises(ValueError, match=r"dout must have shape \(9, 4, 6\) \(total_q, heads, headdim_v\), got \(9, 4, 5\)"):
        cupyflash.flash_attention_varlen_backward(out[..., :5], q, k, v, out, lse, cu_q, cu_k)
    out2, vjp = cupyflash.flash_attention_varlen_vjp(q, k, v, cu_q, cu_k, causal=True)
    dq, dk, dv = vjp(np.ones_like(out2))
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape


def test_varlen_empty_batch_and_sequences():
    q, k, v = np.zeros((0, 2, 8), np.float32), np.zeros((0, 1, 8), np.float32), np.zeros((0, 1, 4), np.float32)
    out, lse = cupyflash.flash_attention_varlen(q, k, v, np.zeros(1, np.int32), np.zeros(1, np.int32), return_lse=True)
    assert out.shape == (0, 2, 4) and lse.shape == (2, 0)
    q = np.ones((3, 2, 8), np.float32)
    out, lse = cupyflash.flash_attention_varlen(q, k, v, np.array([0, 3], np.int32), np.array([0, 0], np.int32),
                                                return_lse=True)
    assert (out == 0).all() and np.isneginf(lse).all()


def test_softcap_ratio_overflowing_float32():
    """softmax_scale / softcap is held in float32 below float64 inputs."""
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"softmax_scale / softcap = .* overflows float32 for float32 inputs"):
        cupyflash.flash_attention(q, k, v, softmax_scale=100.0, softcap=2e-38)


def test_big_endian_alibi_slopes_are_converted():
    q, k, v = _qkv()
    slopes = np.linspace(0.1, 1.0, 4).astype(np.float32)
    np.testing.assert_array_equal(cupyflash.flash_attention(q, k, v, alibi_slopes=slopes.astype(">f4")),
                                  cupyflash.flash_attention(q, k, v, alibi_slopes=slopes))


def test_block_mask_keeps_its_own_layout():
    """Regression (review): the mask shared the caller's array while caching lists built from it."""
    layout = np.ones((1, 1, 2, 2), bool)
    mask = cupyflash.BlockMask.from_dense(layout, (4, 4))
    layout[0, 0, 0, 1] = False
    assert mask.layout is not layout and mask.layout.all()
    assert mask.kv_num_blocks.tolist() == [[[2, 2]]]
    with pytest.raises(ValueError):
        mask.layout[0, 0, 0, 0] = False


def test_block_mask_builders_check_their_arguments():
    with pytest.raises(TypeError, match=r"window_blocks must be an int, got float 1.5"):
        cupyflash.BlockMask.longformer(100, window_blocks=1.5)
    with pytest.raises(ValueError, match=r"seqlen_q must be at least 1, got 0"):
        cupyflash.BlockMask.longformer(0)
    with pytest.raises(ValueError, match=r"random_blocks must be non-negative, got -1"):
        cupyflash.BlockMask.bigbird(100, random_blocks=-1)


@pytest.mark.parametrize("seed, error, match", [
    ("a", TypeError, r"seed must be an int, got str 'a'"),
    (1.5, TypeError, r"seed must be an int, got float 1.5"),
    (None, TypeError, r"seed must be an int, got NoneType None"),
    (True, TypeError, r"seed must be an int, got bool True"),
    (-1, ValueError, r"seed must be non-negative, got -1"),
])
def test_bigbird_seed_must_be_an_int(seed, error, match):
    """Regression: a str seed failed inside NumPy ("SeedSequence expects int or sequence of ints for entropy")."""
    with pytest.raises(error, match=match):
        cupyflash.BlockMask.bigbird(256, block_size=(64, 64), seed=seed)


def test_bigbird_seed_draws_from_default_rng():
    """The documented draw: numpy.random.default_rng(seed).choice per head and query block, after Longformer's."""
    mask = cupyflash.BlockMask.bigbird(512, block_size=(64, 64), window_blocks=0, global_blocks=0, random_blocks=2,
                                       heads=2, seed=np.int64(7))
    rng = np.random.default_rng(7)
    want = np.repeat(np.eye(8, dtype=bool)[None, None], 2, axis=1)
    for h in range(2):
        for r in range(8):
            want[0, h, r, rng.choice(8, 2, replace=False)] = True
    np.testing.assert_array_equal(mask.layout, want)


@pytest.mark.parametrize("precision, error, message", [
    ("fast", ValueError, r"precision must be one of \('highest', 'tf32'\), got 'fast'"),
    ("TF32", ValueError, r"got 'TF32'"),
    (None, TypeError, r"precision must be one of .*, got NoneType None"),
])
def test_bad_precision(precision, error, message):
    q, k, v = _qkv()
    with pytest.raises(error, match=message):
        cupyflash.flash_attention(q, k, v, precision=precision)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float64])
def test_tf32_precision_is_for_float32_only(dtype):
    q, k, v = _qkv(dtype)
    with pytest.raises(ValueError, match=r"precision='tf32' applies to float32 inputs; .* take only 'highest'"):
        cupyflash.flash_attention(q, k, v, precision="tf32")
    assert cupyflash.flash_attention(q, k, v, precision="highest").dtype == q.dtype


def test_every_float32_function_takes_precision():
    """precision= reaches every public function that takes float32 arrays (the NumPy path computes every
    precision at float32 accuracy: the same results)."""
    q, k, v = _qkv()
    dout = np.ones((2, 5, 4, 6), np.float32)
    out, lse = cupyflash.flash_attention(q, k, v, return_lse=True, precision="tf32")
    want, want_lse = cupyflash.flash_attention(q, k, v, return_lse=True)
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(lse, want_lse)
    grads = cupyflash.flash_attention_backward(dout, q, k, v, out, lse, precision="tf32")
    for got, expected in zip(grads, cupyflash.flash_attention_backward(dout, q, k, v, out, lse)):
        np.testing.assert_array_equal(got, expected)
    out_vjp, vjp = cupyflash.flash_attention_vjp(q, k, v, precision="tf32")
    np.testing.assert_array_equal(out_vjp, want)
    np.testing.assert_array_equal(vjp(dout)[0], grads[0])
    cu = np.array([0, 5, 10], np.int32)
    cu_k = np.array([0, 7, 14], np.int32)
    packed = (q.reshape(10, 4, 8), k.reshape(14, 2, 8), v.reshape(14, 2, 6))
    out_packed = cupyflash.flash_attention_varlen(*packed, cu, cu_k, precision="tf32")
    np.testing.assert_array_equal(out_packed, want.reshape(10, 4, 6))
    out_packed, vjp = cupyflash.flash_attention_varlen_vjp(*packed, cu, cu_k, precision="tf32")
    grads_packed = vjp(dout.reshape(10, 4, 6))
    np.testing.assert_array_equal(grads_packed[0], grads[0].reshape(10, 4, 8))
    cache_out = cupyflash.flash_attention_with_kvcache(q, k, v, cache_seqlens=7, precision="tf32")
    np.testing.assert_array_equal(cache_out, want)
    with pytest.raises(ValueError, match="precision='tf32' applies to float32 inputs"):
        cupyflash.flash_attention_with_kvcache(q.astype(np.float16), k.astype(np.float16), v.astype(np.float16),
                                               cache_seqlens=7, precision="tf32")
    with pytest.raises(ValueError, match="precision must be one of"):
        cupyflash.flash_attention_varlen_backward(dout.reshape(10, 4, 6), *packed, out_packed, lse.transpose(1, 0, 2)
                                                  .reshape(4, 10), cu, cu_k, precision="low")


# ---------------------------------------------------------------------------------------------------------
# Session 64's audit: arrays written in place, empty caches, broadcast block masks, numbers past float64,
# FP8 scales float32 cannot hold, non-native index arrays, and the messages of a few checks.

def _cache(dtype="<f8", b=1, n=6):
    rng = np.random.default_rng(1)
    return (rng.standard_normal((b, n, 1, 4)).astype(dtype) for _ in range(2))


def test_big_endian_cache_written_in_place_is_refused():
    """Regression: the new keys went into a native copy and the caller's big-endian cache kept its old rows."""
    q, new = np.ones((1, 1, 1, 4)), np.ones((1, 1, 1, 4))
    k_cache, v_cache = _cache(">f8")
    before = k_cache.copy()
    with pytest.raises(ValueError, match=r"k_cache has dtype >f8 \(non-native byte order\), but it is written in "
                       r"place.*k_cache = k_cache.astype\(k_cache.dtype.newbyteorder\('='\)\)"):
        cupyflash.flash_attention_with_kvcache(q, k_cache, v_cache, k=new, v=new, cache_seqlens=2)
    assert (k_cache == before).all()
    # Read only (no new tokens): converted once and attended, as every big-endian input is.
    native = [x.astype("<f8") for x in (k_cache, v_cache)]
    np.testing.assert_array_equal(cupyflash.flash_attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=3),
                                  cupyflash.flash_attention_with_kvcache(q, *native, cache_seqlens=3))


def test_big_endian_rotary_in_place_is_refused():
    x = np.random.default_rng(2).standard_normal((1, 4, 2, 4)).astype(">f8")
    cos, sin = np.full((4, 1), 0.6), np.full((4, 1), 0.8)
    with pytest.raises(ValueError, match=r"x has dtype >f8 \(non-native byte order\), but it is written in place"):
        cupyflash.apply_rotary(x, cos, sin, inplace=True)
    np.testing.assert_array_equal(cupyflash.apply_rotary(x, cos, sin), cupyflash.apply_rotary(x.astype("<f8"), cos, sin))


@pytest.mark.parametrize("batch, cache_len", [(0, 5), (2, 0)])
def test_empty_kv_cache(batch, cache_len):
    """Regression: an empty cache (NumPy gives its axes stride 0) failed the contiguous-last-axis check."""
    k_cache = np.zeros((batch, cache_len, 2, 4), np.float32)
    q = np.random.default_rng(3).standard_normal((batch, 1, 2, 4)).astype(np.float32)
    out, lse = cupyflash.flash_attention_with_kvcache(q, k_cache, k_cache.copy(), cache_seqlens=0, return_lse=True)
    assert out.shape == (batch, 1, 2, 4) and lse.shape == (batch, 2, 1)
    assert (out == 0).all() and (lse == -np.inf).all()


def test_broadcast_mask_mod_reading_the_head_is_refused_where_its_partial_blocks_evaluate_it():
    """Regression: a heads=1 mask of a function of h classified its blocks at h = 0 while its partial
    blocks evaluated the function at each head, so heads > 0 got a mix of the two masks."""
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((2, 8, 2, 4)) for _ in range(3))
    reads_h = lambda b, h, i, j: (h == 1) | (j <= i)  # noqa: E731
    mask = cupyflash.BlockMask.from_mask_mod(reads_h, 1, 1, 8, 8, block_size=(4, 4))
    with pytest.raises(ValueError, match=r"built by from_mask_mod with heads=1, but its mask_mod reads h and its "
                       r"partial blocks evaluate it at each h.*got heads 2 \(build it with heads=2\)"):
        cupyflash.flash_attention(q, k, v, block_mask=mask)
    whole = cupyflash.BlockMask.from_mask_mod(reads_h, 1, 2, 8, 8, block_size=(4, 4))
    want = cupyflash.reference.attention(q, k, v, block_mask=whole)[0]
    np.testing.assert_allclose(cupyflash.flash_attention(q, k, v, block_mask=whole), want, atol=1e-12)
    # Broadcasting stays for functions that do not read h, and for masks without partial blocks.
    for fn in (lambda b, h, i, j: j <= i, lambda b, h, i, j: (h == 1) | (j // 4 <= i // 4)):
        cupyflash.flash_attention(q, k, v, block_mask=cupyflash.BlockMask.from_mask_mod(fn, 1, 1, 8, 8, block_size=(4, 4)))


@pytest.mark.parametrize("name", ["softmax_scale", "softcap", "dropout_p"])
def test_int_past_float64_is_value_error(name):
    q, k, v = _qkv()
    extra = {"dropout_seed": 1} if name == "dropout_p" else {}
    with pytest.raises(ValueError, match=rf"{name} must be finite, got an int of 1101 bits, past float64's range"):
        cupyflash.flash_attention(q, k, v, **{name: 2 ** 1100}, **extra)


@pytest.mark.parametrize("value, match", [
    (1e300, r"x holds a value of magnitude 1e\+300, past float32's range"),
    (1e-300, r"a head's largest magnitude is 1e-300: its descale .* below float32's smallest normal number"),
])
def test_quantize_fp8_refuses_scales_float32_cannot_hold(value, match):
    """Regression: 1e300 was called non-finite, and 1e-300 came back as zeros with descale 1."""
    x = np.full((1, 2, 2, 4), value)
    x[0, 0, 0, 0] = value / 2
    with pytest.raises(ValueError, match=match):
        cupyflash.quantize_fp8(x)


def test_big_endian_index_arrays_are_taken():
    """Regression: '>i4' arrays (int32 in the other byte order) were refused as not int32."""
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((9, 2, 4)) for _ in range(3))
    cu = np.array([0, 4, 9], np.int32)
    np.testing.assert_array_equal(cupyflash.flash_attention_varlen(q, k, v, cu.astype(">i4"), cu, max_seqlen_q=5),
                                  cupyflash.flash_attention_varlen(q, k, v, cu, cu, max_seqlen_q=5))
    q1 = rng.standard_normal((2, 1, 1, 4))
    k_cache, v_cache = _cache(b=2)
    lengths = np.array([2, 5], np.int32)
    np.testing.assert_array_equal(
        cupyflash.flash_attention_with_kvcache(q1, k_cache, v_cache, cache_seqlens=lengths.astype(">i4")),
        cupyflash.flash_attention_with_kvcache(q1, k_cache, v_cache, cache_seqlens=lengths))
    cos, sin = np.full((9, 1), 0.6), np.full((9, 1), 0.8)
    np.testing.assert_array_equal(cupyflash.apply_rotary(q, cos, sin, cu_seqlens=cu.astype(">i4"), max_seqlen=5),
                                  cupyflash.apply_rotary(q, cos, sin, cu_seqlens=cu, max_seqlen=5))


def test_rotary_max_seqlen_message_names_the_argument():
    x = np.zeros((10, 2, 8))
    with pytest.raises(ValueError, match=r"^max_seqlen is 3, but cu_seqlens holds a sequence of 6$"):
        cupyflash.apply_rotary(x, np.ones((10, 2)), np.ones((10, 2)), cu_seqlens=np.array([0, 4, 10], np.int32),
                               max_seqlen=3)


@pytest.mark.parametrize("cu, match", [
    ([0, 5, 3], r"cu_seqlens_k must be non-decreasing from 0, got \[0 5 3\]"),
    ([2, 5, 11], r"cu_seqlens_k must be non-decreasing from 0, got \[ 2  5 11\]"),
    ([0, 5, 13], r"cu_seqlens_k gives sequences of \[5, 8\] keys; block_table holds 6 per sequence"),
])
def test_paged_varlen_checks_cu_seqlens_k_first(cu, match):
    """Regression: decreasing or offset cu_seqlens_k were reported as a capacity or a packed size."""
    rng = np.random.default_rng(6)
    q = rng.standard_normal((6, 2, 4))
    pages = [rng.standard_normal((4, 3, 2, 4)) for _ in range(2)]
    table = np.array([[0, 1], [2, 3]], np.int32)
    with pytest.raises(ValueError, match=match):
        cupyflash.flash_attention_varlen(q, *pages, np.array([0, 3, 6], np.int32), np.array(cu, np.int32),
                                         block_table=table)


def test_zigzag_shard_world_and_rank_must_be_ints():
    with pytest.raises(TypeError, match=r"world must be an int, got float 2.0"):
        cupyflash.zigzag_shard(np.zeros((1, 8, 1)), 2.0, 0)


@pytest.mark.parametrize("value", [5.0, True])
def test_cache_seqlens_of_another_type(value):
    k_cache, v_cache = _cache()
    with pytest.raises(TypeError, match=rf"cache_seqlens must be an int, an int32 array \(batch,\) of q's kind or "
                       rf"None, got {type(value).__name__} {value!r}"):
        cupyflash.flash_attention_with_kvcache(np.ones((1, 1, 1, 4)), k_cache, v_cache, cache_seqlens=value)


def test_seqlen_offsets_of_another_type():
    with pytest.raises(TypeError, match=r"seqlen_offsets must be an int or an int32 array \(batch,\) of x's kind, "
                       r"got float 1.0"):
        cupyflash.apply_rotary(np.zeros((1, 4, 2, 4)), np.ones((8, 1)), np.ones((8, 1)), seqlen_offsets=1.0)


@pytest.mark.parametrize("layout", ["batch_idx", "pages", "page_read"])
def test_cache_rows_new_tokens_go_to_must_not_be_shared(layout):
    """Regression: a repeated cache_batch_idx made entry 0 attend to entry 1's new token."""
    rng = np.random.default_rng(7)
    q, k_new, v_new = (rng.standard_normal((2, 1, 1, 4)) for _ in range(3))
    if layout == "batch_idx":
        k_cache, v_cache = _cache(b=2)
        options = {"cache_seqlens": 0, "cache_batch_idx": np.array([0, 0], np.int32)}
        where = "row 0 of cache entry 0"
    else:
        k_cache, v_cache = (rng.standard_normal((4, 2, 1, 4)) for _ in range(2))
        # pages: both entries append to page 1; page_read: entry 1 reads (row 0 of page 1) what entry 0 writes
        table, lengths = ([[0, 1], [0, 1]], [2, 2]) if layout == "pages" else ([[0, 1], [1, 2]], [2, 1])
        options = {"cache_seqlens": np.array(lengths, np.int32), "block_table": np.array(table, np.int32)}
        where = "row 0 of page 1"
    before = k_cache.copy()
    with pytest.raises(ValueError, match=rf"batch entries 0 and 1 share {where}, which entry 0's new keys are written to"):
        cupyflash.flash_attention_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new, **options)
    assert (k_cache == before).all()


def test_cache_rows_shared_by_cached_keys_only_are_fine():
    """A common prefix (page 0 in both rows) with each entry's new tokens on pages of its own."""
    rng = np.random.default_rng(8)
    q, k_new, v_new = (rng.standard_normal((2, 1, 1, 4)) for _ in range(3))
    k_cache, v_cache = (rng.standard_normal((4, 2, 1, 4)) for _ in range(2))
    table, lengths = np.array([[0, 1], [0, 2]], np.int32), np.array([2, 2], np.int32)
    want = cupyflash.reference.attention_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new, cache_seqlens=lengths,
                                                      block_table=table)[0]
    out = cupyflash.flash_attention_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new, cache_seqlens=lengths,
                                                 block_table=table)
    np.testing.assert_allclose(out, want, atol=1e-12)
