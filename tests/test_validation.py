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
