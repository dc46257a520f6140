"""Bad input raises before anything runs, with messages that name the argument, the expectation and
what was received. Runs on NumPy inputs (the checks are shared with the CuPy path)."""

import ml_dtypes
import numpy as np
import pytest

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
    with pytest.raises(ValueError, match=r"q: 3-dimensional array given. Array must be 4-dimensional \(batch, seqlen, heads, headdim\)"):
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
    with pytest.raises(ValueError, match=r"dout must have shape \(2, 5, 4, 6\) \(batch, seqlen_q, heads, headdim_v\), got \(2, 5, 4, 5\)"):
        cupyflash.flash_attention_backward(dout[..., :5], q, k, v, out, lse)


def test_backward_out_shape():
    dout, q, k, v, out, lse = _backward_inputs()
    with pytest.raises(ValueError, match=r"out must have shape \(2, 5, 4, 6\)"):
        cupyflash.flash_attention_backward(dout, q, k, v, out[:, :4], lse)


def test_backward_lse_shape_and_dtype():
    dout, q, k, v, out, lse = _backward_inputs()
    with pytest.raises(ValueError, match=r"lse must have shape \(2, 4, 5\) \(batch, heads, seqlen_q\), got \(2, 5, 4\)"):
        cupyflash.flash_attention_backward(dout, q, k, v, out, lse.transpose(0, 2, 1))
    with pytest.raises(TypeError, match=r"lse has dtype float16; expected float32 or float64 \(flash_attention returns float64 for float32 inputs\)"):
        cupyflash.flash_attention_backward(dout, q, k, v, out, lse.astype(np.float16))
    with pytest.raises(ValueError, match=r"lse: 2-dimensional array given. Array must be 3-dimensional"):
        cupyflash.flash_attention_backward(dout, q, k, v, out, lse[0])


def test_backward_dout_dtype():
    dout, q, k, v, out, lse = _backward_inputs()
    with pytest.raises(TypeError, match=r"dout has dtype float16, but q has dtype float32"):
        cupyflash.flash_attention_backward(dout.astype(np.float16), q, k, v, out, lse)


def test_backward_non_array():
    dout, q, k, v, out, lse = _backward_inputs()
    with pytest.raises(TypeError, match=r"lse must be a cupy.ndarray or numpy.ndarray, got builtins.NoneType"):
        cupyflash.flash_attention_backward(dout, q, k, v, out, None)


def test_mixed_numpy_and_cupy_is_type_error():
    cupy = pytest.importorskip("cupy")
    try:
        kk = cupy.zeros((2, 7, 2, 8), cupy.float32)
    except Exception:
        pytest.skip("no CUDA GPU available")
    q, k, v = _qkv()
    with pytest.raises(TypeError, match=r"inputs must all be cupy arrays or all numpy arrays; got q is numpy, k is cupy, v is numpy"):
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


def test_delta_grid_limit():
    """Regression: batch * heads * seqlen_q / 4 rows of the backward preprocess must fit one grid axis."""
    q = np.lib.stride_tricks.as_strided(np.zeros(8, np.float16), (2**20, 2**12, 4, 8), (0, 0, 0, 2))
    k = v = np.lib.stride_tricks.as_strided(np.zeros(8, np.float16), (2**20, 4, 4, 8), (0, 0, 0, 2))
    with pytest.raises(ValueError, match=r"problem too large for one launch"):
        cupyflash.flash_attention(q, k, v)
