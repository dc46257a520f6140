"""CPU tests of the tiled NumPy implementation and of the reference oracle.

``cupyflash._numpy_impl`` is judged against the oracle with the tolerance
rule of :func:`helpers.assert_within_rule`, the plain baseline being
``cupyflash.reference`` with ``compute_dtype`` set to the input dtype.  The
oracle itself is checked independently against a direct SciPy softmax and,
with the NumPy path, against central finite differences.
"""

import math

import numpy as np
import pytest
import scipy.special
from helpers import (
    DTYPES,
    GRAD_FACTOR,
    OUTPUT_FACTOR,
    assert_within_rule,
    central_differences,
    oracle,
    plain,
    random_normal,
    random_qkv,
    seed_from,
)

import cupyflash
from cupyflash import _numpy_impl, reference
from cupyflash import _problem as problems

# Any NumPy floating-point warning (0/0, -inf - -inf, log(0)) fails a test:
# the implementations must guard their numerics, not merely mask NaNs away.
pytestmark = pytest.mark.filterwarnings("error")

BATCH = 2

#: (seqlen_q, seqlen_k) pairs: equal, q < k and q > k, single rows, one and
#: two 64-wide tiles with a ragged edge.
SEQLEN_PAIRS = [(1, 1), (1, 65), (3, 13), (13, 3), (29, 29), (29, 64), (64, 1), (64, 64), (65, 29), (65, 65)]

#: Head layouts as (heads, heads_k, headdim, headdim_v).
HEAD_CONFIGS = {
    "mha": (2, 2, 32, 32),
    "gqa": (6, 2, 24, 40),
    "mqa": (3, 1, 40, 24),
    "dv1": (4, 2, 16, 1),
}

#: (block_m, block_n) tilings smaller than the default, so that short
#: sequences still span several, unequal tiles.
SMALL_BLOCKS = [(16, 16), (16, 32), (32, 8)]

#: Finite-difference step and relative tolerance for float64 gradients:
#: truncation error ~ step**2, round-off ~ eps * |L| / step ~ 1e-9.
FD_STEP = 1e-6
FD_RTOL = 1e-6


def make_problem(batch, seqlen_q, seqlen_k, heads, heads_k, headdim, headdim_v, dtype, seed):
    """Return NumPy ``(q, k, v, dout)`` of ``dtype`` with fresh normal entries."""
    q, k, v = random_qkv(np, batch, seqlen_q, seqlen_k, heads, heads_k, headdim, headdim_v, dtype, seed)
    rng = np.random.default_rng(seed + 1)
    dout = random_normal(np, (batch, seqlen_q, heads, headdim_v), dtype, rng)
    return q, k, v, dout


def _problem(q, k, v, causal, softmax_scale):
    """The validated problem the public functions would pass to the NumPy path."""
    return problems.forward_problem(q, k, v, causal=causal, softmax_scale=softmax_scale)


def run_numpy_path(q, k, v, dout, causal, softmax_scale, block_m=64, block_n=64):
    """Run the tiled forward and backward; return a dict of all results."""
    p = _problem(q, k, v, causal, softmax_scale)
    out, lse = _numpy_impl.forward(q, k, v, p, block_m, block_n)
    dq, dk, dv = _numpy_impl.backward(dout, q, k, v, out, lse, p, block_m, block_n)
    return {"out": out, "lse": lse, "dq": dq, "dk": dk, "dv": dv}


def check_numpy_path(sizes, dtype_name, causal, block_m=64, block_n=64, softmax_scale=None):
    """Check the NumPy path on one problem against the oracle with the rule."""
    dtype = DTYPES[dtype_name]
    q, k, v, dout = make_problem(*sizes, dtype, seed_from(sizes, dtype_name, causal, block_m, block_n))
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(q.shape[-1])
    got = run_numpy_path(q, k, v, dout, causal, softmax_scale, block_m, block_n)
    expected = oracle(q, k, v, causal, softmax_scale, dout)
    baseline = plain(q, k, v, causal, softmax_scale, dout)
    # float64 lse for float32/float64 inputs (cupyflash._problem.lse_dtype).
    lse_dtype = np.float64 if np.dtype(dtype).itemsize >= 4 else np.float32
    assert got["lse"].dtype == lse_dtype
    for name, like in (("out", dout), ("dq", q), ("dk", k), ("dv", v)):
        assert got[name].shape == like.shape
        assert got[name].dtype == dtype
    for name in ("out", "lse", "dq", "dk", "dv"):
        factor = OUTPUT_FACTOR if name in ("out", "lse") else GRAD_FACTOR
        assert_within_rule(name, got[name], expected[name], baseline[name], factor)
    return got


def pair_id(pair):
    """Test id of a (seqlen_q, seqlen_k) pair."""
    return f"q{pair[0]}-k{pair[1]}"


def causal_id(causal):
    """Test id of the causal flag."""
    return "causal" if causal else "full"


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("causal", [False, True], ids=causal_id)
@pytest.mark.parametrize("pair_index", range(len(SEQLEN_PAIRS)), ids=[pair_id(p) for p in SEQLEN_PAIRS])
def test_seqlens(pair_index, causal, dtype_name):
    """Every seqlen pair, with the head layouts taken in rotation."""
    seqlen_q, seqlen_k = SEQLEN_PAIRS[pair_index]
    layouts = list(HEAD_CONFIGS.values())
    heads, heads_k, headdim, headdim_v = layouts[pair_index % len(layouts)]
    check_numpy_path((BATCH, seqlen_q, seqlen_k, heads, heads_k, headdim, headdim_v), dtype_name, causal)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("causal", [False, True], ids=causal_id)
@pytest.mark.parametrize("pair", [(29, 65), (65, 29)], ids=pair_id)
@pytest.mark.parametrize("layout", list(HEAD_CONFIGS))
def test_head_layouts(layout, pair, causal, dtype_name):
    """MHA, GQA, MQA and headdim_v != headdim, every dtype, across two tiles."""
    heads, heads_k, headdim, headdim_v = HEAD_CONFIGS[layout]
    check_numpy_path((BATCH, *pair, heads, heads_k, headdim, headdim_v), dtype_name, causal)


@pytest.mark.parametrize("dtype_name", ["bfloat16", "float64"])
@pytest.mark.parametrize("causal", [False, True], ids=causal_id)
@pytest.mark.parametrize("pair", [(13, 13), (29, 64), (64, 29)], ids=pair_id)
@pytest.mark.parametrize("blocks", SMALL_BLOCKS, ids=lambda b: f"bm{b[0]}-bn{b[1]}")
def test_small_blocks(blocks, pair, causal, dtype_name):
    """Many tiles: the causal loop bounds and the online rescaling."""
    check_numpy_path((BATCH, *pair, 6, 2, 24, 40), dtype_name, causal, *blocks)


@pytest.mark.parametrize("blocks", [(2, 3), (3, 2), (4, 4)], ids=lambda b: f"bm{b[0]}-bn{b[1]}")
def test_causal_tile_edges(blocks):
    """Every small (seqlen_q, seqlen_k) under tiny tiles: all diagonal positions.

    Sweeping both lengths moves the causal diagonal across every offset
    relative to the tile edges, which exercises the key-loop end, the
    query-loop start and the skipping of the mask on tiles below the
    diagonal.  This is a structural check, so a fixed float64 tolerance is
    used: on problems this small ``max|plain - oracle|`` can fall below an
    ulp by chance and the tolerance rule would judge rounding, not loop
    bounds (a wrong bound errs by O(1)).
    """
    for seqlen_q in range(1, 10):
        for seqlen_k in range(1, 10):
            q, k, v, dout = make_problem(1, seqlen_q, seqlen_k, 2, 1, 4, 3, np.float64, seed_from(seqlen_q, seqlen_k))
            got = run_numpy_path(q, k, v, dout, True, 0.5, *blocks)
            expected = oracle(q, k, v, True, 0.5, dout)
            for name, x in got.items():
                np.testing.assert_allclose(
                    x, expected[name].astype(np.float64), rtol=1e-12, atol=1e-12,
                    err_msg=f"{name}, seqlen_q={seqlen_q}, seqlen_k={seqlen_k}",
                )


def test_custom_softmax_scale():
    """A softmax_scale other than the 1/sqrt(headdim) default."""
    check_numpy_path((BATCH, 29, 29, 2, 1, 16, 16), "float32", True, softmax_scale=0.7)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("blocks", [(64, 64), (16, 8)], ids=lambda b: f"bm{b[0]}-bn{b[1]}")
@pytest.mark.parametrize("pair", [(13, 3), (65, 29), (64, 1)], ids=pair_id)
def test_rows_without_keys(pair, blocks, dtype_name):
    """Causal with seqlen_q > seqlen_k: unseeing rows give 0, -inf, zero dq, no NaN."""
    seqlen_q, seqlen_k = pair
    blind = seqlen_q - seqlen_k  # rows i < seqlen_q - seqlen_k see no key
    got = check_numpy_path((BATCH, seqlen_q, seqlen_k, 6, 2, 24, 40), dtype_name, True, *blocks)
    assert not any(np.isnan(x.astype(np.float64)).any() for x in got.values())
    assert (got["out"][:, :blind].astype(np.float64) == 0).all()
    assert (got["lse"][:, :, :blind] == -np.inf).all()
    assert np.isfinite(got["lse"][:, :, blind:]).all()
    assert (got["dq"][:, :blind].astype(np.float64) == 0).all()


EMPTY_SIZES = {
    "batch0": (0, 13, 29, 6, 2, 24, 40),
    "seqlen_q0": (BATCH, 0, 29, 6, 2, 24, 40),
    "seqlen_k0": (BATCH, 13, 0, 6, 2, 24, 40),
    "heads0": (BATCH, 13, 29, 0, 0, 24, 40),
}


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("causal", [False, True], ids=causal_id)
@pytest.mark.parametrize("case", list(EMPTY_SIZES))
def test_empty(case, causal, dtype_name):
    """Empty sizes give correctly shaped results; seqlen_k = 0 gives 0 / -inf / 0."""
    got = check_numpy_path(EMPTY_SIZES[case], dtype_name, causal)
    batch, seqlen_q, seqlen_k, heads, heads_k, headdim, headdim_v = EMPTY_SIZES[case]
    assert got["out"].shape == (batch, seqlen_q, heads, headdim_v)
    assert got["lse"].shape == (batch, heads, seqlen_q)
    if case == "seqlen_k0":
        assert (got["out"].astype(np.float64) == 0).all()
        assert (got["lse"] == -np.inf).all()
        assert (got["dq"].astype(np.float64) == 0).all()


def test_non_contiguous_views():
    """Strided views give the same bits as their contiguous copies."""
    rng = np.random.default_rng(seed_from("views"))
    # Head-major storage transposed to (batch, seqlen, heads, dim), then a
    # strided slice of the head dimension.
    q = rng.standard_normal((BATCH, 4, 29, 32)).astype(np.float32).transpose(0, 2, 1, 3)[..., ::2]
    k = rng.standard_normal((BATCH, 2, 40, 16)).astype(np.float32).transpose(0, 2, 1, 3)
    v = rng.standard_normal((BATCH, 40, 2, 48)).astype(np.float32)[..., 8:32]
    dout = rng.standard_normal((BATCH, 29, 4, 24)).astype(np.float32)[:, ::-1]
    assert not any(x.flags.c_contiguous for x in (q, k, v, dout))
    got = run_numpy_path(q, k, v, dout, True, 0.25, 16, 16)
    want = run_numpy_path(*(np.ascontiguousarray(x) for x in (q, k, v, dout)), True, 0.25, 16, 16)
    for name in got:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def numpy_path_forward(q, k, v, causal, softmax_scale):
    """NumPy-path forward with 4x4 tiles (several tiles even on tiny problems)."""
    return _numpy_impl.forward(q, k, v, _problem(q, k, v, causal, softmax_scale), 4, 4)


def numpy_path_backward(dout, q, k, v, causal, softmax_scale):
    """NumPy-path backward with 4x4 tiles, from its own forward results."""
    p = _problem(q, k, v, causal, softmax_scale)
    out, lse = _numpy_impl.forward(q, k, v, p, 4, 4)
    return _numpy_impl.backward(dout, q, k, v, out, lse, p, 4, 4)


def reference_backward(dout, q, k, v, causal, softmax_scale):
    """Oracle backward with the positional signature of the FD test."""
    return reference.attention_backward(dout, q, k, v, causal, softmax_scale)


@pytest.mark.parametrize(
    "forward, backward",
    [(numpy_path_forward, numpy_path_backward), (reference.attention, reference_backward)],
    ids=["numpy_path", "reference"],
)
@pytest.mark.parametrize("causal", [False, True], ids=causal_id)
@pytest.mark.parametrize("pair", [(5, 7), (7, 5)], ids=pair_id)
def test_finite_differences(pair, causal, forward, backward):
    """float64 gradients of L = sum(out * W) match central differences."""
    seqlen_q, seqlen_k = pair
    softmax_scale = 0.6
    q, k, v, weight = make_problem(1, seqlen_q, seqlen_k, 2, 1, 3, 4, np.float64, seed_from("fd", pair, causal))
    inputs = {"q": q, "k": k, "v": v}

    def loss():
        out, _ = forward(inputs["q"], inputs["k"], inputs["v"], causal, softmax_scale)
        return float(np.sum(out * weight))

    grads = dict(zip(("q", "k", "v"), backward(weight, q, k, v, causal, softmax_scale)))
    for name, x in inputs.items():
        numeric = central_differences(loss, x, FD_STEP)
        error = np.max(np.abs(grads[name] - numeric))
        assert error <= FD_RTOL * np.max(np.abs(numeric)), f"d{name}: max error {error:.3e}"


def direct_attention(q, k, v, causal, softmax_scale):
    """Per-(batch, head) softmax attention with SciPy, for checking the oracle."""
    batch, seqlen_q, heads, _ = q.shape
    seqlen_k, heads_k = k.shape[1:3]
    group = heads // heads_k
    out = np.zeros((batch, seqlen_q, heads, v.shape[-1]))
    lse = np.full((batch, heads, seqlen_q), -np.inf)
    for b in range(batch):
        for h in range(heads):
            kv = h // group
            scores = softmax_scale * q[b, :, h] @ k[b, :, kv].T
            for i in range(seqlen_q):
                visible = i + seqlen_k - seqlen_q + 1 if causal else seqlen_k
                if visible <= 0:
                    continue
                row = scores[i, :visible]
                out[b, i, h] = scipy.special.softmax(row) @ v[b, :visible, kv]
                lse[b, h, i] = scipy.special.logsumexp(row)
    return out, lse


@pytest.mark.parametrize("causal", [False, True], ids=causal_id)
@pytest.mark.parametrize("pair", [(6, 9), (9, 6)], ids=pair_id)
def test_reference_matches_direct_softmax(pair, causal):
    """The oracle agrees with an independent SciPy computation (GQA layout)."""
    q, k, v = random_qkv(np, 2, *pair, 4, 2, 5, 3, np.float64, seed_from("direct", pair, causal))
    out, lse = reference.attention(q, k, v, causal)
    want_out, want_lse = direct_attention(q, k, v, causal, 1 / math.sqrt(5))
    np.testing.assert_allclose(out, want_out, rtol=1e-13, atol=1e-14)
    np.testing.assert_array_equal(np.isinf(lse), np.isinf(want_lse))
    finite = np.isfinite(want_lse)
    np.testing.assert_allclose(lse[finite], want_lse[finite], rtol=1e-13)


@pytest.mark.parametrize(
    "compute_dtype",
    [None, np.longdouble, *DTYPES.values()],
    ids=lambda d: "oracle" if d is None else np.dtype(d).name,
)
def test_reference_result_dtypes(compute_dtype):
    """Oracle results are float64, plain results in compute_dtype (lse float32 or wider)."""
    q, k, v, dout = make_problem(1, 3, 4, 2, 1, 8, 8, np.float32, seed_from("dtypes"))
    out, lse = reference.attention(q, k, v, True, compute_dtype=compute_dtype)
    grads = reference.attention_backward(dout, q, k, v, True, compute_dtype=compute_dtype)
    store = np.dtype(np.float64 if compute_dtype is None else compute_dtype)
    assert out.dtype == store
    assert all(g.dtype == store for g in grads)
    assert lse.dtype == (np.float32 if store.itemsize <= 4 else store)


@pytest.mark.parametrize("options", [{"causal": True}, {"window_size": (9, 2), "softcap": 7.0}])
def test_varlen_seqused_k(options):
    """flash_attention_varlen's seqused_k: each sequence attends to its first seqused_k[b] keys (masks aligned
    to that count, a sequence using none gets out 0 and lse -inf); the NumPy twin against the oracle."""
    from helpers import check_varlen

    check_varlen(np, [7, 20, 0, 13], [30, 11, 4, 25], 4, 2, 16, 8, np.float32, backward=False,
                 seqused_k=np.array([12, 0, 4, 25], np.int32), **options)


def test_varlen_seqused_k_is_the_shorter_sequences():
    """The oracle's seqused_k against packing only the used keys (independent of the twin)."""
    rng = np.random.default_rng(3)
    cu_q, cu_k = np.array([0, 5, 9], np.int32), np.array([0, 12, 20], np.int32)
    q, k, v = rng.standard_normal((9, 2, 8)), rng.standard_normal((20, 2, 8)), rng.standard_normal((20, 2, 8))
    used = np.array([7, 3], np.int32)
    got = cupyflash.reference.attention_varlen(q, k, v, cu_q, cu_k, True, seqused_k=used)
    keep = np.r_[0:7, 12:15]
    want = cupyflash.reference.attention_varlen(q, k[keep], v[keep], cu_q, np.array([0, 7, 10], np.int32), True)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("seqused_k, error, match", [
    (np.array([12, 9], np.int32), ValueError, r"seqused_k\[1\] must lie in \[0, 8\]"),
    (np.array([1, 2, 3], np.int32), ValueError, r"seqused_k must have shape \(2,\)"),
    (np.array([1, 2], np.int64), TypeError, "seqused_k has dtype int64; expected int32"),
])
def test_varlen_seqused_k_is_checked(seqused_k, error, match):
    q, k = np.ones((9, 2, 8), np.float32), np.ones((20, 2, 8), np.float32)
    with pytest.raises(error, match=match):
        cupyflash.flash_attention_varlen(q, k, k, np.array([0, 5, 9], np.int32), np.array([0, 12, 20], np.int32),
                                         seqused_k=seqused_k)


@pytest.mark.parametrize("page_size", [1, 16])
def test_varlen_paged_keys(page_size):
    """flash_attention_varlen's block_table (FlashAttention-2's varlen paged KV): pages in shuffled order,
    sequences of 0 to 40 keys, the twin against the oracle (whose own gather is a loop over keys)."""
    from helpers import assert_within_rule

    rng = np.random.default_rng(page_size)
    lengths_q, lengths_k = [5, 0, 9, 3], [40, 7, 0, 23]
    cu_q, cu_k = (np.concatenate([[0], np.cumsum(n)]).astype(np.int32) for n in (lengths_q, lengths_k))
    max_pages = -(-max(lengths_k) // page_size)
    num_pages = 4 * max_pages + 2
    table = rng.permutation(num_pages)[:4 * max_pages].reshape(4, max_pages).astype(np.int32)
    q = rng.standard_normal((int(cu_q[-1]), 4, 16)).astype(np.float32)
    k, v = (rng.standard_normal((num_pages, page_size, 2, 16)).astype(np.float32) for _ in range(2))
    out, lse = cupyflash.flash_attention_varlen(q, k, v, cu_q, cu_k, causal=True, block_table=table, return_lse=True)
    want = reference.attention_varlen(q, k, v, cu_q, cu_k, True, block_table=table, compute_dtype=None)
    base = reference.attention_varlen(q, k, v, cu_q, cu_k, True, block_table=table, compute_dtype=np.float32)
    assert_within_rule("out", out, want[0], base[0], 2)
    assert_within_rule("lse", lse, want[1], base[1], 2)


def test_the_oracle_checks_seqused_k_and_pages():
    q, k = np.ones((4, 2, 8)), np.ones((9, 2, 8))
    cu_q, cu_k = np.array([0, 2, 4], np.int32), np.array([0, 3, 9], np.int32)
    with pytest.raises(ValueError, match=r"seqused_k\[0\] = 6 must lie in \[0, 3\]"):
        reference.attention_varlen(q, k, k, cu_q, cu_k, seqused_k=np.array([6, 1], np.int32))
    pages = np.ones((3, 4, 2, 8))
    with pytest.raises(ValueError, match="block_table row 1 names pages outside"):
        reference.attention_varlen(q, pages, pages, cu_q, cu_k, block_table=np.array([[0, 1], [-1, 2]], np.int32))


def test_varlen_paged_keys_are_checked():
    q, k = np.ones((4, 2, 8), np.float32), np.ones((3, 4, 2, 8), np.float32)
    cu_q, cu_k = np.array([0, 2, 4], np.int32), np.array([0, 5, 9], np.int32)
    with pytest.raises(ValueError, match="block_table holds 4 per sequence"):
        cupyflash.flash_attention_varlen(q, k, k, cu_q, cu_k, block_table=np.array([[0], [1]], np.int32))
    with pytest.raises(ValueError, match="block_table row 1 names pages outside the 3"):
        cupyflash.flash_attention_varlen(q, k, k, cu_q, cu_k, block_table=np.array([[0, 1], [5, 2]], np.int32))
    with pytest.raises(TypeError, match="block_table must be an int32 array"):
        cupyflash.flash_attention_varlen(q, k, k, cu_q, cu_k, block_table=np.array([[0, 1], [2, 0]], np.int64))


def test_varlen_pages_gathered_on_the_device_match_the_host_gather(monkeypatch):
    """paged_counts_on_device and gather_pages_on_device (the CuPy path of flash_attention_varlen's
    block_table), run with NumPy in CuPy's place: each sequence's capacity holds its keys first (the host
    gather's, in order), the placeholders have that packed shape, seqused_k is the smaller of its count
    and the caller's, out-of-range counts or used pages flag the sequence (pages past its count are not
    checked), and nan_bad_sequences makes exactly the flagged sequences' out rows, lse columns and
    max_score rows NaN, bfloat16 included."""
    import sys

    import ml_dtypes

    from cupyflash import _problem

    monkeypatch.setitem(sys.modules, "cupy", np)
    rng = np.random.default_rng(5)
    page_size, lengths = 4, [9, 0, 12, 5]
    cu_k = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    table = rng.permutation(14)[:12].reshape(4, 3).astype(np.int32)
    k, v = (rng.standard_normal((14, page_size, 2, 8)).astype(np.float32) for _ in range(2))
    table[1, 0] = 99  # sequence 1 uses no key: not checked
    views_k, views_v, cu, used, bad, capacity = _problem.paged_counts_on_device(k, v, cu_k, np.array([9, 0, 7, 9], np.int32),
                                                                              table)
    assert views_k.shape == views_v.shape == (48, 2, 8) and views_k.strides[0] == 0
    gk, gv = _problem.gather_pages_on_device(k, v, table)
    host_k, host_v = _problem.gather_paged(k, v, cu_k, np.where(table == 99, 0, table))
    assert cu.tolist() == [0, 12, 24, 36, 48] and used.tolist() == [9, 0, 7, 5] and not bad.any() and capacity == 12
    for b, n in enumerate(lengths):
        np.testing.assert_array_equal(gk[12 * b:12 * b + n], host_k[cu_k[b]:cu_k[b + 1]])
        np.testing.assert_array_equal(gv[12 * b:12 * b + n], host_v[cu_k[b]:cu_k[b + 1]])
    table[3, 1] = -1  # used by sequence 3 (5 keys: pages 0 and 1)
    table[0, 2] = 14
    *_, used, bad, _ = _problem.paged_counts_on_device(k, v, np.array([0, 9, 9, 21, 34], np.int32), None, table)
    assert bad.tolist() == [True, False, False, True] and used.tolist() == [0, 0, 12, 0]
    with pytest.raises(TypeError, match="seqused_k must be an int32"):
        _problem.paged_counts_on_device(k, v, cu_k, np.zeros(4, np.int64), table)
    empty = _problem.paged_counts_on_device(k, v, np.zeros(1, np.int32), None, table[:0])
    assert empty[0].shape == (0, 2, 8) and empty[4].shape == (0,)
    cu_q = np.array([0, 2, 2, 5, 6], np.int32)
    out = np.ones((6, 3, 8), ml_dtypes.bfloat16)
    lse, top = np.zeros((3, 6), np.float32), np.zeros((4, 3), np.float32)
    out, lse, top = _problem.nan_bad_sequences((out, lse, top), bad, cu_q, True, True)
    nan_rows = np.isnan(out.astype(np.float32)).all(axis=(1, 2))
    assert nan_rows.tolist() == [True, True, False, False, False, True]
    assert np.isnan(lse).all(axis=0).tolist() == nan_rows.tolist() and np.isnan(top).all(axis=1).tolist() == bad.tolist()
