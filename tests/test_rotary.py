"""cupyflash.apply_rotary (FlashAttention's apply_rotary_emb) on NumPy arrays: against
cupyflash.reference.apply_rotary at every row's position (dense, packed, offsets as an int and per
sequence, both pair layouts, a rotary_dim below headdim, every dtype), the conjugate as inverse and
adjoint (the gradient), in place, and the argument checks."""

import numpy as np
import pytest
from helpers import DTYPES, packed_offsets

import cupyflash
from cupyflash import reference

pytestmark = pytest.mark.filterwarnings("error")


def _tables(rows, half, seed=0, dtype=np.float32):
    angles = np.random.default_rng(seed).uniform(-10, 10, (rows, half))
    return np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)


def _within_one_rounding(got, want, dtype):
    """Rounded once from a float32 (float64) computation: within one ulp of the dtype at each value,
    plus float32's own error."""
    want = np.asarray(want, np.float64)
    spacing = np.spacing(np.abs(want).astype(dtype)).astype(np.float64)
    acc_eps = 2.0**-52 if np.dtype(dtype) == np.float64 else 2.0**-22
    bound = spacing + acc_eps * (np.abs(want) + 1)
    err = np.abs(got.astype(np.float64) - want)
    assert (err <= bound).all(), f"max excess {np.max(err - bound):.3e}"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("offsets", ["int", "array"])
def test_dense_against_reference(offsets, interleaved, dtype):
    dt = DTYPES[dtype]
    batch, seqlen, heads, headdim, half = 3, 29, 2, 40, 12  # rotary_dim 24 < headdim: 16 columns pass through
    x = np.random.default_rng(1).standard_normal((batch, seqlen, heads, headdim)).astype(dt)
    cos, sin = _tables(64, half)
    shift = 5 if offsets == "int" else np.array([0, 7, 35], np.int32)
    y = cupyflash.apply_rotary(x, cos, sin, interleaved=interleaved, seqlen_offsets=shift)
    assert y.dtype == dt and y.shape == x.shape and y.flags.c_contiguous
    positions = np.broadcast_to(np.reshape(shift, (-1, 1)) + np.arange(seqlen), (batch, seqlen))
    want = reference.apply_rotary(x, cos, sin, positions, interleaved=interleaved)
    _within_one_rounding(y, want, dt)
    np.testing.assert_array_equal(y[..., 2 * half:], x[..., 2 * half:])


@pytest.mark.parametrize("interleaved", [False, True])
def test_packed_counts_positions_per_sequence(interleaved):
    lengths = [13, 0, 30, 1]
    cu = packed_offsets(lengths)
    x = np.random.default_rng(2).standard_normal((int(cu[-1]), 4, 16)).astype(np.float32)
    cos, sin = _tables(50, 8, seed=3)
    shift = np.array([2, 9, 0, 40], np.int32)
    y = cupyflash.apply_rotary(x, cos, sin, interleaved=interleaved, seqlen_offsets=shift, cu_seqlens=cu)
    for b in range(len(lengths)):
        rows = slice(cu[b], cu[b + 1])
        want = cupyflash.apply_rotary(x[None, rows], cos, sin, interleaved=interleaved, seqlen_offsets=int(shift[b]))
        np.testing.assert_array_equal(y[rows], want[0])
    same = cupyflash.apply_rotary(x, cos, sin, interleaved=interleaved, seqlen_offsets=shift, cu_seqlens=cu,
                                  max_seqlen=30)
    np.testing.assert_array_equal(same, y)


def test_conjugate_is_the_inverse_and_the_gradient():
    """float64: conjugate undoes the rotation, and <R x, y> = <x, R^T y> (so conjugate is the vjp)."""
    rng = np.random.default_rng(4)
    x, dy = rng.standard_normal((2, 2, 11, 3, 20))
    cos, sin = _tables(16, 10, seed=5, dtype=np.float64)
    for interleaved in (False, True):
        options = {"interleaved": interleaved, "seqlen_offsets": 4}
        y = cupyflash.apply_rotary(x, cos, sin, **options)
        np.testing.assert_allclose(cupyflash.apply_rotary(y, cos, sin, conjugate=True, **options), x, atol=1e-13)
        dx = cupyflash.apply_rotary(dy, cos, sin, conjugate=True, **options)
        assert abs(np.vdot(y, dy) - np.vdot(x, dx)) < 1e-11


def test_inplace_and_strided_views():
    rng = np.random.default_rng(6)
    base = rng.standard_normal((2, 3, 17, 32)).astype(np.float32)  # (batch, heads, seqlen, headdim)
    view = base.transpose(0, 2, 1, 3)
    cos, sin = _tables(17, 16, seed=7)
    want = cupyflash.apply_rotary(np.ascontiguousarray(view), cos, sin)
    np.testing.assert_array_equal(cupyflash.apply_rotary(view, cos, sin), want)
    assert cupyflash.apply_rotary(view, cos, sin, inplace=True) is view
    np.testing.assert_array_equal(base.transpose(0, 2, 1, 3), want)


@pytest.mark.parametrize("call, error, match", [
    (lambda x, c, s: cupyflash.apply_rotary(x, c, s[:, :3]), ValueError, "cos and sin must have one shape"),
    (lambda x, c, s: cupyflash.apply_rotary(x, c.astype(np.float64), s), TypeError, "cos has dtype float64"),
    (lambda x, c, s: cupyflash.apply_rotary(x.astype(np.float16), c, s.astype(np.float16)), TypeError,
     "cos and sin must have one dtype"),
    (lambda x, c, s: cupyflash.apply_rotary(x[0], c, s), ValueError, "x: 3-dimensional array given"),
    (lambda x, c, s: cupyflash.apply_rotary(x[..., :6], c, s), ValueError, r"rotary_dim = 2 \* that must be in"),
    (lambda x, c, s: cupyflash.apply_rotary(x, c, s, seqlen_offsets=3), ValueError, "positions run to 10"),
    (lambda x, c, s: cupyflash.apply_rotary(x, c, s, seqlen_offsets=np.array([0, 4], np.int32)), ValueError,
     "positions run to 11"),
    (lambda x, c, s: cupyflash.apply_rotary(x, c, s, seqlen_offsets=np.array([0], np.int32)), TypeError,
     r"int32 array of shape \(2,\)"),
    (lambda x, c, s: cupyflash.apply_rotary(x, c, s, seqlen_offsets=-1), ValueError, "non-negative"),
    (lambda x, c, s: cupyflash.apply_rotary(x, c, s, interleaved=1), TypeError, "interleaved must be a bool"),
    (lambda x, c, s: cupyflash.apply_rotary(x, c, s, max_seqlen=8), ValueError, "max_seqlen goes with cu_seqlens"),
    (lambda x, c, s: cupyflash.apply_rotary(x.reshape(16, 2, 8), c, s, cu_seqlens=np.array([0, 9, 16], np.int32)),
     ValueError, "max_seqlen_s is 8|holds a sequence of 9|positions run to"),
    (lambda x, c, s: cupyflash.apply_rotary(x.astype(np.int32), c, s), TypeError, "x has dtype int32"),
])
def test_argument_checks(call, error, match):
    x = np.ones((2, 8, 2, 8), np.float32)
    cos, sin = _tables(8, 4)
    with pytest.raises(error, match=match):
        call(x, cos, sin)


def test_empty_sequences_use_no_position():
    """A sequence without rows may have any offset; x of no rows comes back as it is."""
    cos, sin = _tables(8, 4)
    x = np.ones((5, 2, 8), np.float32)
    cu = np.array([0, 5, 5], np.int32)
    y = cupyflash.apply_rotary(x, cos, sin, seqlen_offsets=np.array([3, 1000], np.int32), cu_seqlens=cu)
    np.testing.assert_array_equal(y, cupyflash.apply_rotary(x[None], cos, sin, seqlen_offsets=3)[0])
    assert cupyflash.apply_rotary(np.ones((2, 0, 2, 8), np.float32), cos, sin, seqlen_offsets=100).shape == (2, 0, 2, 8)
