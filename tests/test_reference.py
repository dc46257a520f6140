"""CPU tests of the reference oracle's attention features.

:mod:`cupyflash.reference` is the yardstick of every other implementation, so
its window, causal, block-mask, ALiBi, softcap and variable-length features
are checked here against independent computations: a per-element Python
loop written straight from FlashAttention-2's definitions, central finite
differences of its float64 gradients, and NaN propagation row by row.
"""

import math

import ml_dtypes
import numpy as np
import pytest
from helpers import central_differences, random_normal, random_qkv, seed_from

from cupyflash import reference
from cupyflash._block_mask import BlockMask

# Any NumPy floating-point warning fails a test (as in test_numpy_path.py).
pytestmark = pytest.mark.filterwarnings("error")

#: Sizes of the loop comparisons: GQA with two query heads per key head.
BATCH, HEADS, HEADS_K, HEADDIM, HEADDIM_V = 2, 4, 2, 5, 3

#: (seqlen_q, seqlen_k) pairs with the diagonal offset seqlen_k - seqlen_q of both signs.
PAIRS = [(7, 11), (11, 7)]

WINDOWS = [(-1, -1), (3, 0), (0, 2), (5, 5), (2, -1)]

#: Finite-difference step and relative tolerance for float64 gradients.
FD_STEP = 1e-6
FD_RTOL = 1e-6


def pair_id(pair):
    """Test id of a (seqlen_q, seqlen_k) pair."""
    return f"q{pair[0]}-k{pair[1]}"


def causal_id(causal):
    """Test id of the causal flag."""
    return "causal" if causal else "full"


def loop_attention(q, k, v, causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0,
                   alibi_slopes=None, layout=None, block_size=None):
    """Attention by explicit loops over batch, head, query i and key j, in float64.

    Written from the definitions, sharing no code with the reference: query i
    sees key j iff ``i + off - left <= j <= i + off + right`` (``off =
    seqlen_k - seqlen_q``, -1 unbounded, causal forcing ``right = 0``) and the
    block layout allows it; the score is ``scale * q . k``, soft-capped, minus
    ``slope * |i + off - j|``.
    """
    batch, seqlen_q, heads, headdim = q.shape
    seqlen_k, heads_k = k.shape[1:3]
    group = heads // heads_k
    scale = 1 / math.sqrt(headdim) if softmax_scale is None else softmax_scale
    left, right = window_size
    if causal:
        right = 0
    slopes = None
    if alibi_slopes is not None:
        slopes = np.broadcast_to(np.asarray(alibi_slopes, np.float64), (batch, heads))
    out = np.zeros((batch, seqlen_q, heads, v.shape[-1]))
    lse = np.full((batch, heads, seqlen_q), -np.inf)
    off = seqlen_k - seqlen_q
    for b in range(batch):
        for h in range(heads):
            kv = h // group
            for i in range(seqlen_q):
                keys, scores = [], []
                for j in range(seqlen_k):
                    if left != -1 and j < i + off - left:
                        continue
                    if right != -1 and j > i + off + right:
                        continue
                    if layout is not None:
                        cell = layout[b if layout.shape[0] > 1 else 0, h if layout.shape[1] > 1 else 0,
                                      i // block_size[0], j // block_size[1]]
                        if not cell:
                            continue
                    s = scale * sum(float(q[b, i, h, d]) * float(k[b, j, kv, d]) for d in range(headdim))
                    if softcap:
                        s = softcap * math.tanh(s / softcap)
                    if slopes is not None:
                        s -= slopes[b, h] * abs(i + off - j)
                    keys.append(j)
                    scores.append(s)
                if not keys:
                    continue
                top = max(scores)
                weights = [math.exp(s - top) for s in scores]
                total = sum(weights)
                out[b, i, h] = sum(w * v[b, j, kv] for w, j in zip(weights, keys)) / total
                lse[b, h, i] = top + math.log(total)
    return out, lse


def assert_matches_loop(got, want):
    """Compare (out, lse) pairs: -inf exactly where expected, else to ~1e-13."""
    out, lse = got
    want_out, want_lse = want
    assert out.dtype == lse.dtype == np.float64
    np.testing.assert_allclose(out, want_out, rtol=1e-12, atol=1e-13)
    np.testing.assert_array_equal(lse == -np.inf, want_lse == -np.inf)
    finite = np.isfinite(want_lse)
    np.testing.assert_allclose(lse[finite], want_lse[finite], rtol=1e-12, atol=1e-13)


def make_inputs(seqlen_q, seqlen_k, seed, batch=BATCH, heads=HEADS, heads_k=HEADS_K):
    """Float64 ``(q, k, v)`` of the loop-comparison sizes."""
    return random_qkv(np, batch, seqlen_q, seqlen_k, heads, heads_k, HEADDIM, HEADDIM_V, np.float64, seed)


def random_slopes(shape, seed):
    """Positive float32 ALiBi slopes."""
    return np.random.default_rng(seed).uniform(0.05, 1.0, shape).astype(np.float32)


def random_layout(shape, seed):
    """A random boolean block layout, about two thirds set."""
    return np.random.default_rng(seed).random(shape) < 0.65


# ------------------------------------------------------------------------------ against the loop


@pytest.mark.parametrize("causal", [False, True], ids=causal_id)
@pytest.mark.parametrize("window", WINDOWS, ids=lambda w: f"w{w[0]}_{w[1]}")
@pytest.mark.parametrize("pair", PAIRS, ids=pair_id)
def test_window_matches_loop(pair, window, causal):
    """Every window, with and without causal, on both sides of the diagonal."""
    q, k, v = make_inputs(*pair, seed_from("window", pair, window, causal))
    got = reference.attention(q, k, v, causal, window_size=window)
    assert_matches_loop(got, loop_attention(q, k, v, causal, window_size=window))


def test_causal_is_window_minus1_0():
    """causal equals the window (-1, 0), and caps any right extent at 0."""
    q, k, v = make_inputs(7, 11, seed_from("causal-window"))
    causal = reference.attention(q, k, v, True)
    for a, b in zip(causal, reference.attention(q, k, v, window_size=(-1, 0))):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(reference.attention(q, k, v, True, window_size=(2, 4)),
                    reference.attention(q, k, v, window_size=(2, 0))):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("causal", [False, True], ids=causal_id)
@pytest.mark.parametrize("layout_shape", [(1, 1), (BATCH, 1), (1, HEADS), (BATCH, HEADS)], ids=str)
@pytest.mark.parametrize("pair", PAIRS, ids=pair_id)
def test_block_mask_matches_loop(pair, layout_shape, causal):
    """Block layouts broadcast over batch and/or heads, with ragged last blocks, ANDed with a window."""
    block_size = (3, 4)
    grid = (-(-pair[0] // block_size[0]), -(-pair[1] // block_size[1]))
    layout = random_layout(layout_shape + grid, seed_from("layout", pair, layout_shape))
    mask = BlockMask.from_dense(layout, block_size)
    q, k, v = make_inputs(*pair, seed_from("block", pair, layout_shape, causal))
    window = (4, 3)
    got = reference.attention(q, k, v, causal, window_size=window, block_mask=mask)
    want = loop_attention(q, k, v, causal, window_size=window, layout=layout, block_size=block_size)
    assert_matches_loop(got, want)
    assert_matches_loop(reference.attention(q, k, v, causal, block_mask=mask),
                        loop_attention(q, k, v, causal, layout=layout, block_size=block_size))


@pytest.mark.parametrize("slopes_shape", [(HEADS,), (BATCH, HEADS)], ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=causal_id)
@pytest.mark.parametrize("pair", PAIRS, ids=pair_id)
def test_alibi_matches_loop(pair, causal, slopes_shape):
    """ALiBi with one slope per query head (not per key head), shared or per batch entry."""
    q, k, v = make_inputs(*pair, seed_from("alibi", pair, causal))
    slopes = random_slopes(slopes_shape, seed_from("slopes", slopes_shape))
    got = reference.attention(q, k, v, causal, alibi_slopes=slopes)
    assert_matches_loop(got, loop_attention(q, k, v, causal, alibi_slopes=slopes))


@pytest.mark.parametrize("softcap", [0.5, 3.0])
@pytest.mark.parametrize("causal", [False, True], ids=causal_id)
@pytest.mark.parametrize("pair", PAIRS, ids=pair_id)
def test_softcap_matches_loop(pair, causal, softcap):
    """Gemma 2's softcap, with scores large enough (q, k scaled by 3) for tanh to bend."""
    q, k, v = (x * 3 for x in make_inputs(*pair, seed_from("softcap", pair, causal)))
    got = reference.attention(q, k, v, causal, 0.7, softcap=softcap)
    assert_matches_loop(got, loop_attention(q, k, v, causal, 0.7, softcap=softcap))


@pytest.mark.parametrize("pair", PAIRS, ids=pair_id)
def test_all_features_match_loop(pair):
    """Window, causal, block mask, softcap and ALiBi together."""
    block_size = (2, 3)
    grid = (-(-pair[0] // block_size[0]), -(-pair[1] // block_size[1]))
    layout = random_layout((BATCH, HEADS) + grid, seed_from("all-layout", pair))
    slopes = random_slopes((BATCH, HEADS), seed_from("all-slopes", pair))
    q, k, v = make_inputs(*pair, seed_from("all", pair))
    kwargs = dict(window_size=(5, 1), softcap=1.5, alibi_slopes=slopes)
    got = reference.attention(q, k, v, True, 0.8, block_mask=BlockMask.from_dense(layout, block_size), **kwargs)
    want = loop_attention(q, k, v, True, 0.8, layout=layout, block_size=block_size, **kwargs)
    assert_matches_loop(got, want)


def test_shared_slopes_equal_tiled_slopes():
    """(heads,) slopes act like the same row repeated for every batch entry."""
    q, k, v = make_inputs(7, 11, seed_from("tiled"))
    slopes = random_slopes((HEADS,), seed_from("tiled-slopes"))
    shared = reference.attention(q, k, v, alibi_slopes=slopes)
    tiled = reference.attention(q, k, v, alibi_slopes=np.tile(slopes, (BATCH, 1)))
    for a, b in zip(shared, tiled):
        np.testing.assert_array_equal(a, b)


# --------------------------------------------------------------------------------- rows without keys


def assert_blind_rows(q, k, v, blind, **kwargs):
    """Rows ``blind`` (a boolean (batch, heads, seqlen_q) array) give 0 / -inf / zero dq; others are finite."""
    out, lse = reference.attention(q, k, v, **kwargs)
    dout = random_normal(np, out.shape, np.float64, np.random.default_rng(seed_from("blind-dout")))
    dq, dk, dv = reference.attention_backward(dout, q, k, v, **kwargs)
    assert blind.any() and not blind.all()
    rows = blind.transpose(0, 2, 1)  # (batch, seqlen_q, heads), like out and dq
    assert (out[rows] == 0).all()
    assert (dq[rows] == 0).all()
    assert (lse[blind] == -np.inf).all()
    assert np.isfinite(lse[~blind]).all()
    assert (np.abs(out[~rows]).sum(axis=-1) > 0).all()
    assert all(np.isfinite(x).all() for x in (out, dq, dk, dv))


def test_window_0_0_rows_without_keys():
    """Window (0, 0) with seqlen_q > seqlen_k: only rows i >= seqlen_q - seqlen_k have a diagonal key."""
    q, k, v = make_inputs(11, 7, seed_from("blind-window"))
    blind = np.zeros((BATCH, HEADS, 11), bool)
    blind[:, :, :4] = True
    assert_blind_rows(q, k, v, blind, window_size=(0, 0))


def test_block_mask_rows_without_keys():
    """A layout row that is all False blinds its block of queries, for its batch entry and head only."""
    block_size = (3, 4)
    layout = np.ones((BATCH, HEADS, 3, 3), bool)
    layout[1, 2, 1] = False  # queries 3..5 of batch 1, head 2
    layout[0, :, 2] = False  # queries 6..7 of batch 0, every head
    layout[0, 1, 0, 1:] = False  # a partial row: queries 0..2 keep keys 0..3
    q, k, v = make_inputs(8, 9, seed_from("blind-block"))
    blind = np.zeros((BATCH, HEADS, 8), bool)
    blind[1, 2, 3:6] = True
    blind[0, :, 6:] = True
    assert_blind_rows(q, k, v, blind, block_mask=BlockMask.from_dense(layout, block_size))


def test_block_mask_shape_mismatch():
    """A layout whose block grid does not fit the sequence lengths is refused."""
    q, k, v = make_inputs(7, 11, seed_from("mismatch"))
    mask = BlockMask.from_dense(np.ones((1, 1, 3, 3), bool), (3, 4))  # 11 keys need ceil(11/4) = 3 ...
    reference.attention(q, k, v, block_mask=mask)  # ... and 7 queries ceil(7/3) = 3: fits
    for layout, block_size in [((1, 1, 2, 3), (3, 4)), ((1, 1, 3, 4), (3, 4)), ((1, 1, 3, 3), (4, 4))]:
        with pytest.raises(ValueError, match="block_mask"):
            reference.attention(q, k, v, block_mask=BlockMask.from_dense(np.ones(layout, bool), block_size))
    with pytest.raises(ValueError, match="block_mask"):
        reference.attention(q, k, v, block_mask=BlockMask.from_dense(np.ones((1, 3, 3, 3), bool), (3, 4)))


def test_bad_arguments():
    """Malformed ALiBi slopes, softcaps and windows are refused."""
    q, k, v = make_inputs(7, 11, seed_from("bad"))
    for shape in [(HEADS_K,), (BATCH + 1, HEADS), (1, HEADS, 1)]:
        with pytest.raises(ValueError, match="alibi_slopes"):
            reference.attention(q, k, v, alibi_slopes=np.ones(shape, np.float32))
    with pytest.raises(ValueError, match="softcap"):
        reference.attention(q, k, v, softcap=-1.0)
    for window in [(-2, 0), (1, 2, 3)]:
        with pytest.raises(ValueError, match="window_size"):
            reference.attention(q, k, v, window_size=window)


# ------------------------------------------------------------------------------ finite differences


def check_finite_differences(seqlen_q, seqlen_k, batch=1, heads=2, heads_k=1, **kwargs):
    """float64 gradients of L = sum(out * W) match central differences."""
    q, k, v = random_qkv(np, batch, seqlen_q, seqlen_k, heads, heads_k, 3, 4, np.float64,
                         seed_from("fd", seqlen_q, seqlen_k, sorted(kwargs)))
    weight = random_normal(np, (batch, seqlen_q, heads, 4), np.float64, np.random.default_rng(seed_from("fd-w")))
    inputs = {"q": q, "k": k, "v": v}

    def loss():
        out, _ = reference.attention(inputs["q"], inputs["k"], inputs["v"], softmax_scale=0.9, **kwargs)
        return float(np.sum(out * weight))

    grads = dict(zip("qkv", reference.attention_backward(weight, q, k, v, softmax_scale=0.9, **kwargs)))
    for name, x in inputs.items():
        numeric = central_differences(loss, x, FD_STEP)
        assert np.max(np.abs(numeric)) > 1e-3, f"d{name} is (nearly) zero: the check would be vacuous"
        error = np.max(np.abs(grads[name] - numeric))
        assert error <= FD_RTOL * np.max(np.abs(numeric)), f"d{name}: max error {error:.3e}"


@pytest.mark.parametrize("pair", [(5, 7), (7, 5)], ids=pair_id)
def test_fd_softcap(pair):
    """The softcap's 1 - tanh^2 factor (softcap small enough for tanh to bend)."""
    check_finite_differences(*pair, softcap=0.8)


@pytest.mark.parametrize("pair", [(5, 7), (7, 5)], ids=pair_id)
def test_fd_alibi(pair):
    """ALiBi enters the gradient only through P."""
    check_finite_differences(*pair, alibi_slopes=np.array([0.3, 0.9], np.float32))


@pytest.mark.parametrize("pair", [(5, 7), (7, 5)], ids=pair_id)
def test_fd_window(pair):
    """A two-sided window, including rows without keys when seqlen_q > seqlen_k."""
    check_finite_differences(*pair, window_size=(1, 1))


def test_fd_block_mask():
    """A per-batch, per-head block layout."""
    layout = np.array([[[[1, 0, 1], [0, 1, 1], [1, 1, 0]], [[0, 1, 0], [1, 1, 1], [1, 0, 1]]],
                       [[[1, 1, 0], [1, 0, 0], [0, 1, 1]], [[1, 1, 1], [0, 0, 1], [1, 0, 0]]]], bool)
    check_finite_differences(6, 7, batch=2, block_mask=BlockMask.from_dense(layout, (2, 3)))


@pytest.mark.parametrize("pair", [(5, 7), (7, 5)], ids=pair_id)
def test_fd_combined(pair):
    """Causal, window, softcap and per-batch ALiBi together, with GQA."""
    check_finite_differences(*pair, batch=2, heads=4, heads_k=2, causal=True, window_size=(2, 3), softcap=1.2,
                             alibi_slopes=random_slopes((2, 4), seed_from("fd-slopes")))


# --------------------------------------------------------------------------------------------- NaN


def assert_nan_rows(out, lse, nan_rows):
    """Exactly ``nan_rows`` ((batch, heads, seqlen_q) bool) are NaN in lse and every entry of out."""
    rows = nan_rows.transpose(0, 2, 1)
    assert np.isnan(lse[nan_rows]).all()
    assert np.isnan(out[rows]).all()
    assert np.isfinite(lse[~nan_rows]).all()
    assert np.isfinite(out[~rows]).all()


@pytest.mark.parametrize("causal", [False, True], ids=causal_id)
def test_nan_in_q(causal):
    """A NaN in one query row makes exactly that row's out and lse NaN."""
    q, k, v = make_inputs(7, 11, seed_from("nan-q", causal))
    q[1, 4, 3, 2] = np.nan
    out, lse = reference.attention(q, k, v, causal, softcap=2.0, alibi_slopes=random_slopes((HEADS,), 1))
    nan_rows = np.zeros((BATCH, HEADS, 7), bool)
    nan_rows[1, 3, 4] = True
    assert_nan_rows(out, lse, nan_rows)


def test_nan_in_k():
    """A NaN in key j makes NaN exactly the rows of its query group that see j (causal hides it from some)."""
    seqlen_q, seqlen_k, j = 7, 11, 7
    q, k, v = make_inputs(seqlen_q, seqlen_k, seed_from("nan-k"))
    k[0, j, 1, 0] = np.nan
    out, lse = reference.attention(q, k, v, True)
    nan_rows = np.zeros((BATCH, HEADS, seqlen_q), bool)
    # Query heads 2 and 3 read key head 1; row i sees j iff j <= i + 4.
    nan_rows[0, 2:4, j - (seqlen_k - seqlen_q):] = True
    assert 0 < nan_rows.sum() < 2 * seqlen_q
    assert_nan_rows(out, lse, nan_rows)


def test_nan_in_masked_key_is_ignored():
    """A NaN key hidden from every row by the window leaves all results finite."""
    q, k, v = make_inputs(7, 11, seed_from("nan-hidden"))
    k[:, 0] = np.nan
    out, lse = reference.attention(q, k, v, window_size=(2, 2))
    assert np.isfinite(out).all() and np.isfinite(lse).all()


# ------------------------------------------------------------------------------------------ varlen

#: Per-sequence (seqlen_q, seqlen_k): q < k, an empty query sequence, an
#: empty key sequence, q > k, and q == k.
VARLEN_SEQLENS = [(3, 5), (0, 4), (4, 0), (6, 3), (2, 2)]


def make_varlen(seed):
    """Packed float64 inputs, cu_seqlens, per-sequence slopes and dout for :data:`VARLEN_SEQLENS`."""
    rng = np.random.default_rng(seed)
    seqlens_q, seqlens_k = zip(*VARLEN_SEQLENS)
    cu_q = np.concatenate([[0], np.cumsum(seqlens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(seqlens_k)]).astype(np.int32)
    q = random_normal(np, (cu_q[-1], HEADS, HEADDIM), np.float64, rng)
    k = random_normal(np, (cu_k[-1], HEADS_K, HEADDIM), np.float64, rng)
    v = random_normal(np, (cu_k[-1], HEADS_K, HEADDIM_V), np.float64, rng)
    dout = random_normal(np, (cu_q[-1], HEADS, HEADDIM_V), np.float64, rng)
    slopes = random_slopes((len(VARLEN_SEQLENS), HEADS), seed)
    return q, k, v, dout, cu_q, cu_k, slopes


VARLEN_OPTIONS = {
    "plain": dict(),
    "causal": dict(causal=True),
    "causal-alibi": dict(causal=True, alibi_slopes=True),
    "window-softcap-alibi": dict(window_size=(2, 1), softcap=1.5, alibi_slopes=True),
}


def _varlen_options(option, slopes):
    """(causal, keyword options) of a VARLEN_OPTIONS entry, with the ALiBi slopes filled in."""
    kwargs = dict(VARLEN_OPTIONS[option])
    causal = kwargs.pop("causal", False)
    if kwargs.get("alibi_slopes"):
        kwargs["alibi_slopes"] = slopes
    return causal, kwargs


@pytest.mark.parametrize("option", list(VARLEN_OPTIONS))
def test_varlen_forward_matches_loop(option):
    """Each packed sequence is its own problem, with its own diagonal offset and slope row."""
    q, k, v, _, cu_q, cu_k, slopes = make_varlen(seed_from("varlen", option))
    causal, kwargs = _varlen_options(option, slopes)
    out, lse = reference.attention_varlen(q, k, v, cu_q, cu_k, causal, 0.6, **kwargs)
    assert out.shape == (q.shape[0], HEADS, HEADDIM_V) and out.dtype == np.float64
    assert lse.shape == (HEADS, q.shape[0]) and lse.dtype == np.float64
    for b in range(len(VARLEN_SEQLENS)):
        seq_kwargs = dict(kwargs)
        if "alibi_slopes" in kwargs:
            seq_kwargs["alibi_slopes"] = slopes[b]
        qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        want = loop_attention(q[None, qs], k[None, ks], v[None, ks], causal, 0.6, **seq_kwargs)
        assert_matches_loop((out[None, qs], lse[None, :, qs]), want)
    # The empty key sequence: its queries see nothing.
    blind = slice(cu_q[2], cu_q[3])
    assert (out[blind] == 0).all() and (lse[:, blind] == -np.inf).all()


@pytest.mark.parametrize("option", list(VARLEN_OPTIONS))
def test_varlen_backward_matches_dense(option):
    """Varlen gradients equal the dense backward run on each sequence alone."""
    q, k, v, dout, cu_q, cu_k, slopes = make_varlen(seed_from("varlen-bwd", option))
    causal, kwargs = _varlen_options(option, slopes)
    dq, dk, dv = reference.attention_varlen_backward(dout, q, k, v, cu_q, cu_k, causal, **kwargs)
    for got, like in zip((dq, dk, dv), (q, k, v)):
        assert got.shape == like.shape and got.dtype == np.float64
    for b in range(len(VARLEN_SEQLENS)):
        seq_kwargs = dict(kwargs)
        if "alibi_slopes" in kwargs:
            seq_kwargs["alibi_slopes"] = slopes[None, b]
        qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        want = reference.attention_backward(dout[None, qs], q[None, qs], k[None, ks], v[None, ks], causal,
                                            **seq_kwargs)
        for name, got, expected in zip("qkv", (dq[qs], dk[ks], dv[ks]), want):
            np.testing.assert_array_equal(got, expected[0], err_msg=f"d{name}, sequence {b}")
    # Keys of the empty query sequence get no gradient; queries of the empty key sequence neither.
    assert (dk[cu_k[1]:cu_k[2]] == 0).all() and (dv[cu_k[1]:cu_k[2]] == 0).all()
    assert (dq[cu_q[2]:cu_q[3]] == 0).all()
    assert np.abs(dk).sum() > 0 and np.abs(dq).sum() > 0


def test_varlen_finite_differences():
    """Varlen float64 gradients match central differences (causal, window, softcap, per-sequence ALiBi)."""
    q, k, v, weight, cu_q, cu_k, slopes = make_varlen(seed_from("varlen-fd"))
    kwargs = dict(window_size=(3, 2), softcap=1.5, alibi_slopes=slopes)
    inputs = {"q": q, "k": k, "v": v}

    def loss():
        out, _ = reference.attention_varlen(inputs["q"], inputs["k"], inputs["v"], cu_q, cu_k, True, **kwargs)
        return float(np.sum(out * weight))

    grads = dict(zip("qkv", reference.attention_varlen_backward(weight, q, k, v, cu_q, cu_k, True, **kwargs)))
    for name, x in inputs.items():
        numeric = central_differences(loss, x, FD_STEP)
        error = np.max(np.abs(grads[name] - numeric))
        assert error <= FD_RTOL * np.max(np.abs(numeric)), f"d{name}: max error {error:.3e}"


def test_varlen_bad_cu_seqlens():
    """Decreasing, out-of-range, non-integer or mismatched offsets are refused."""
    q, k, v, _, cu_q, cu_k, _ = make_varlen(seed_from("varlen-bad"))
    for bad_q, bad_k in [(cu_q[::-1], cu_k), (cu_q, cu_k + 1), (cu_q.astype(np.float64), cu_k), (cu_q[:-1], cu_k)]:
        with pytest.raises(ValueError, match="cu_seqlens"):
            reference.attention_varlen(q, k, v, bad_q, bad_k)


# ------------------------------------------------------------------------------------- plain mode


def test_plain_bfloat16_with_features():
    """The bfloat16 plain baseline with every feature stays near the oracle (and does round)."""
    bf16 = np.dtype(ml_dtypes.bfloat16)
    block_size = (3, 4)
    layout = random_layout((1, HEADS, 4, 3), seed_from("plain-layout"))
    layout[..., -1] = True  # every row keeps its diagonal keys' block
    slopes = random_slopes((BATCH, HEADS), seed_from("plain-slopes"))
    q, k, v = (x.astype(bf16) for x in make_inputs(11, 9, seed_from("plain")))
    dout = random_normal(np, (BATCH, 11, HEADS, HEADDIM_V), bf16, np.random.default_rng(seed_from("plain-dout")))
    kwargs = dict(window_size=(6, 2), softcap=2.0, alibi_slopes=slopes,
                  block_mask=BlockMask.from_dense(layout, block_size))
    expected = (*reference.attention(q, k, v, True, **kwargs),
                *reference.attention_backward(dout, q, k, v, True, **kwargs))
    got = (*reference.attention(q, k, v, True, compute_dtype=bf16, **kwargs),
           *reference.attention_backward(dout, q, k, v, True, compute_dtype=bf16, **kwargs))
    for name, g, e in zip(("out", "lse", "dq", "dk", "dv"), got, expected):
        assert g.dtype == (np.float32 if name == "lse" else bf16), name
        g = g.astype(np.float64)
        np.testing.assert_array_equal(np.isinf(g), np.isinf(e), err_msg=name)
        finite = np.isfinite(e)
        error = np.max(np.abs(g[finite] - e[finite]))
        assert 0 < error <= 0.05 * max(1.0, np.max(np.abs(e[finite]))), f"{name}: error {error:.3e}"


def test_plain_wide_with_features():
    """The longdouble plain mode agrees with the float64 oracle to float64 rounding, and the float64 plain
    mode (the same-precision baseline of float64 inputs) is the oracle itself, bit for bit."""
    q, k, v = make_inputs(7, 11, seed_from("plain-wide"))
    dout = random_normal(np, (BATCH, 7, HEADS, HEADDIM_V), np.float64, np.random.default_rng(1))
    kwargs = dict(window_size=(3, 1), softcap=2.0, alibi_slopes=random_slopes((HEADS,), 2))
    expected = (*reference.attention(q, k, v, True, **kwargs),
                *reference.attention_backward(dout, q, k, v, True, **kwargs))
    for compute_dtype in (np.longdouble, np.float64):
        got = (*reference.attention(q, k, v, True, compute_dtype=compute_dtype, **kwargs),
               *reference.attention_backward(dout, q, k, v, True, compute_dtype=compute_dtype, **kwargs))
        for g, e in zip(got, expected):
            assert g.dtype == np.dtype(compute_dtype)
            if compute_dtype is np.float64:
                np.testing.assert_array_equal(g, e)
            else:
                np.testing.assert_allclose(g.astype(np.float64), e, rtol=1e-12, atol=1e-13)
    # The oracle itself with these features, against the per-element loop.
    assert_matches_loop(expected[:2], loop_attention(q, k, v, True, window_size=(3, 1), softcap=2.0,
                                                     alibi_slopes=kwargs["alibi_slopes"]))


def test_plain_varlen_dtypes():
    """Varlen results take the dense dtypes: compute_dtype, float32 lse for 16-bit."""
    q, k, v, dout, cu_q, cu_k, slopes = make_varlen(seed_from("varlen-dtypes"))
    q, k, v, dout = (x.astype(np.float16) for x in (q, k, v, dout))
    out, lse = reference.attention_varlen(q, k, v, cu_q, cu_k, True, alibi_slopes=slopes, compute_dtype=np.float16)
    grads = reference.attention_varlen_backward(dout, q, k, v, cu_q, cu_k, True, alibi_slopes=slopes,
                                                compute_dtype=np.float16)
    assert out.dtype == np.float16 and lse.dtype == np.float32
    assert all(g.dtype == np.float16 for g in grads)
    want_out, want_lse = reference.attention_varlen(q, k, v, cu_q, cu_k, True, alibi_slopes=slopes)
    np.testing.assert_allclose(out.astype(np.float64), want_out, atol=1e-2)
    np.testing.assert_array_equal(np.isinf(lse), np.isinf(want_lse))


def test_test_seeds_do_not_depend_on_addresses():
    """seed_from (the tests' input seeds): two functions with one name (a score_mod made twice, at two
    addresses) give one seed, so a test's inputs are the same in every process; different names differ."""
    def make():
        return lambda s, b, h, q_idx, kv_idx: s

    def other(s, b, h, q_idx, kv_idx):
        return s

    first, second = make(), make()
    assert first is not second and repr(first) != repr(second)
    assert seed_from("float32", {"score_mod": first}) == seed_from("float32", {"score_mod": second})
    assert seed_from("float32", {"score_mod": first}) != seed_from("float32", {"score_mod": other})
