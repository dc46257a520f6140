"""flash_attention_with_kvcache against the float64 oracle (cupyflash.reference.attention_with_kvcache)
with the tolerance rule: dense and paged caches (pages of 1 to 64 rows), appended tokens with rotary
embedding, GQA, masks and score modifications, split-KV decoding and its merge, the decode kernel and
the general path; the caches written in place; out-of-range values; CUDA graph capture; validation.
NumPy always, CuPy on a GPU."""

import dataclasses
import sys

import ml_dtypes
import numpy as np
import pytest
from helpers import (
    DTYPES,
    OUTPUT_FACTOR,
    assert_within_rule,
    gpu_available,
    seed_from,
    to_host,
)

import cupyflash
from cupyflash import reference

if gpu_available():
    import cupy
else:
    cupy = None




def _xp(name):
    return np if name == "numpy" else cupy


def _pages(batch, capacity, page_size, rng, spare=3):
    """A block table of shuffled pages (with spare pages no entry uses) and the number of pages."""
    per_entry = -(-capacity // page_size)
    count = batch * per_entry + spare
    table = rng.permutation(count)[: batch * per_entry].reshape(batch, per_entry).astype(np.int32)
    return table, count


def _inputs(xp, dtype, *, batch, seqlen_q, heads, heads_k, headdim, headdim_v, capacity, lengths, new=0, page_size=0,
            rotary_dim=0, batch_idx=False, seed=0):
    """Random inputs of one call: a dict of keyword arguments and the positional q, k_cache, v_cache."""
    rng = np.random.default_rng(seed)
    dt = DTYPES[dtype]

    def normal(*shape):
        return rng.standard_normal(shape).astype(dt)

    q = normal(batch, seqlen_q, heads, headdim)
    kwargs = {"cache_seqlens": np.asarray(lengths, np.int32)}
    if page_size:
        table, count = _pages(batch, capacity, page_size, rng)
        k_cache, v_cache = normal(count, page_size, heads_k, headdim), normal(count, page_size, heads_k, headdim_v)
        kwargs["block_table"] = table
    else:
        entries = batch + 2 if batch_idx else batch
        k_cache, v_cache = normal(entries, capacity, heads_k, headdim), normal(entries, capacity, heads_k, headdim_v)
        if batch_idx:
            kwargs["cache_batch_idx"] = rng.permutation(entries)[:batch].astype(np.int32)
    if new:
        kwargs["k"], kwargs["v"] = normal(batch, new, heads_k, headdim), normal(batch, new, heads_k, headdim_v)
    if rotary_dim:
        if page_size:  # a paged cache holds whole pages
            capacity = -(-capacity // page_size) * page_size
        angles = np.arange(capacity)[:, None] * (1e-2 ** (np.arange(rotary_dim // 2) / (rotary_dim // 2)))[None, :]
        kwargs["rotary_cos"], kwargs["rotary_sin"] = np.cos(angles).astype(dt), np.sin(angles).astype(dt)
    to = (lambda x: xp.asarray(x)) if xp is not np else (lambda x: x)
    return (to(q), to(k_cache), to(v_cache)), {n: to(x) for n, x in kwargs.items()}


def _check(xp, dtype, options=None, max_score=None, **sizes):
    """One call against the oracle (out, lse with the tolerance rule; the caches as the reference
    writes them, rounded; the maximum score unless ``max_score`` is False); returns the call's results."""
    options = options or {}
    (q, k_cache, v_cache), arrays = _inputs(xp, dtype, **sizes, seed=seed_from(dtype, sorted(sizes.items()),
                                                                               sorted(options.items())))
    host = {n: to_host(x) for n, x in arrays.items()}
    host_q, host_k, host_v = (to_host(x) for x in (q, k_cache, v_cache))
    slopes, sinks, leftpad = options.get("alibi_slopes"), options.get("sinks"), options.get("cache_leftpad")
    ref_options = dict(options, alibi_slopes=to_host(slopes) if slopes is not None else None,
                       sinks=to_host(sinks) if sinks is not None else None)
    if leftpad is not None:
        ref_options["cache_leftpad"] = to_host(leftpad)
    ref_options.pop("num_splits", None)
    # A float64 oracle cannot judge float64 results (helpers.oracle).
    wide = np.longdouble if dtype == "float64" else None
    want = reference.attention_with_kvcache(host_q, host_k, host_v, **host, **ref_options, compute_dtype=wide,
                                            return_max_score=True)
    base = reference.attention_with_kvcache(host_q, host_k, host_v, **host, **ref_options, compute_dtype=DTYPES[dtype],
                                            return_max_score=True)
    if max_score is not False:
        out, lse, top = cupyflash.flash_attention_with_kvcache(q, k_cache, v_cache, **arrays, **options, return_lse=True,
                                                               return_max_score=True)
        assert top.dtype == np.float32 and top.shape == (sizes["batch"], sizes["heads"])
        assert_within_rule("max_score", top, want[2], base[2], OUTPUT_FACTOR)
    else:
        out, lse = cupyflash.flash_attention_with_kvcache(q, k_cache, v_cache, **arrays, **options, return_lse=True)
    if xp is not np:
        # A second call of the layout runs the cached plan: it appends the same tokens at the same
        # positions, so it must reproduce the first call bit for bit.
        again = cupyflash.flash_attention_with_kvcache(q, k_cache, v_cache, **arrays, **options, return_lse=True)
        assert all(bool((x.view(np.uint8) == y.view(np.uint8)).all()) for x, y in zip((out, lse), again))
    assert out.dtype == DTYPES[dtype] and out.shape == want[0].shape
    assert_within_rule("out", out, want[0], base[0], OUTPUT_FACTOR)
    assert_within_rule("lse", lse, want[1], base[1], OUTPUT_FACTOR)
    for name, got, expected in (("k_cache", k_cache, want[3]), ("v_cache", v_cache, want[4])):
        got = to_host(got).astype(np.float64)
        # Rotated keys are rounded once from float32 (the kernel) or float64 (the reference).
        tolerance = np.spacing(np.abs(expected).astype(DTYPES[dtype])).astype(np.float64)
        assert (np.abs(got - expected.astype(np.float64)) <= tolerance).all(), name
    return out, lse


# Cases: (dtype, sizes, options). Decode rows (seqlen_q 1, GQA) take the decode kernel on the GPU for
# 16-bit dtypes; longer chunks of a dense cache and float32/float64 the forward families (the sm80
# family's float32/float64 forward up to head dim 128, the general kernels above).
DECODE = {"batch": 3, "seqlen_q": 1, "heads": 8, "heads_k": 2, "headdim": 128, "headdim_v": 128, "capacity": 700,
          "lengths": [699, 37, 0], "new": 1}
CASES = [
    ("bfloat16", DECODE, {}),
    ("float16", dict(DECODE, new=0, lengths=[700, 1, 333]), {"num_splits": 5}),
    ("bfloat16", dict(DECODE, page_size=16, rotary_dim=64), {"rotary_interleaved": False}),
    ("bfloat16", dict(DECODE, page_size=1, lengths=[90, 3, 1], capacity=100, headdim=64, headdim_v=64), {}),
    ("float16", dict(DECODE, page_size=64, seqlen_q=4, new=4, lengths=[0, 50, 500], rotary_dim=32),
     {"causal": True}),
    ("bfloat16", dict(DECODE, seqlen_q=5, new=2, lengths=[698, 37, 0], headdim=96, headdim_v=72, batch_idx=True),
     {"window_size": (40, 3), "softcap": 15.0}),
    ("float16", dict(DECODE, headdim=256, headdim_v=200, heads=4, heads_k=4, capacity=300, lengths=[299, 64, 65]),
     {"causal": True, "alibi": True}),
    ("bfloat16", dict(DECODE, seqlen_q=40, new=40, capacity=500, lengths=[0, 300, 460], rotary_dim=128),
     {"causal": True}),
    ("bfloat16", dict(DECODE, seqlen_q=33, new=0, heads=4, heads_k=1, capacity=260, lengths=[260, 31, 100],
                      batch_idx=True), {"causal": True}),
    ("float32", dict(DECODE, page_size=8, new=3, seqlen_q=3, rotary_dim=16, capacity=96, lengths=[93, 3, 40]),
     {"causal": True}),
    ("float64", dict(DECODE, headdim=40, headdim_v=24, capacity=50, lengths=[49, 0, 10], batch_idx=True),
     {"softcap": 5.0, "alibi": True}),
    ("bfloat16", dict(DECODE, page_size=16, lengths=[699, 0, 5]), {"sinks": True, "causal": True}),
    ("float32", dict(DECODE, capacity=40, lengths=[38, 0, 10], headdim=32, headdim_v=32, seqlen_q=3, new=2),
     {"sinks": True, "causal": True}),
]
CASE_IDS = [
    "bf16-decode-append", "fp16-decode-splits5", "bf16-paged16-rotary-halves", "bf16-paged1-d64",
    "fp16-paged64-chunk-causal-rotary", "bf16-d96-v72-batch-idx-window-softcap", "fp16-d256-alibi-causal",
    "bf16-prefill-dense-rotary", "bf16-prefill-batch-idx-mqa", "fp32-paged8-rotary", "fp64-batch-idx-softcap-alibi",
    "bf16-decode-paged-sinks", "fp32-chunk-causal-sinks",
]
# The NumPy twin runs the small cases (the CPU is slow on 700-key caches of 128 columns).
NUMPY_CASES = [3, 9, 10, 12]


def _options(xp, case):
    dtype, sizes, options = case
    options = dict(options)
    if options.pop("alibi", False):
        slopes = 2.0 ** (-8.0 * (np.arange(sizes["heads"]) + 1) / sizes["heads"])
        options["alibi_slopes"] = xp.asarray(slopes.astype(np.float32))
    if options.pop("sinks", False):
        sinks = np.random.default_rng(sizes["heads"]).standard_normal(sizes["heads"]) * 2
        options["sinks"] = xp.asarray(sinks.astype(np.float32))
    return dtype, sizes, options


@pytest.mark.parametrize("case", [CASES[i] for i in NUMPY_CASES], ids=[CASE_IDS[i] for i in NUMPY_CASES])
def test_numpy(case):
    dtype, sizes, options = _options(np, case)
    _check(np, dtype, options, **sizes)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
@pytest.mark.gpu
def test_cupy(case):
    dtype, sizes, options = _options(cupy, case)
    _check(cupy, dtype, options, **sizes)


@pytest.mark.parametrize("xp_name", ["numpy", pytest.param("cupy", marks=pytest.mark.gpu)])
def test_empty_cache_and_no_queries(xp_name):
    xp = _xp(xp_name)
    (q, k_cache, v_cache), arrays = _inputs(xp, "float32", batch=2, seqlen_q=2, heads=2, heads_k=1, headdim=8,
                                            headdim_v=8, capacity=4, lengths=[0, 0])
    out, lse = cupyflash.flash_attention_with_kvcache(q, k_cache, v_cache, **arrays, return_lse=True)
    assert not to_host(out).any() and np.isneginf(to_host(lse)).all()
    out = cupyflash.flash_attention_with_kvcache(q[:, :0], k_cache, v_cache, **arrays)
    assert out.shape == (2, 0, 2, 8)


def _misaligned_copy(x):
    """A copy of CuPy array ``x`` (last axis contiguous) whose address is 2 bytes past a multiple of 16."""
    buffer = cupy.empty(x.size * x.itemsize + 16, np.uint8)
    copy = buffer[2:2 + x.size * x.itemsize].view(x.dtype).reshape(x.shape)
    copy[...] = x
    return copy


@pytest.mark.parametrize("paged", [False, True], ids=["dense", "paged"])
@pytest.mark.parametrize("aligned", [True, False], ids=["decode-kernel-appends", "kvc-append"])
@pytest.mark.gpu
def test_new_keys_are_appended_by_the_decode_kernel_where_their_rows_allow(aligned, paged):
    """Unrotated new keys and values with 16-byte aligned rows are appended by the decode kernel (its tiles
    read them from k and v, its CTAs write them into the cache); others by kvc_append before it. Both
    against the oracle, with several splits (merged by the decode kernel) and two row tiles."""
    from cupyflash import _kvcache

    sizes = {"batch": 2, "seqlen_q": 5, "heads": 8, "heads_k": 2, "headdim": 64, "headdim_v": 64, "capacity": 320,
             "lengths": [250, 63], "new": 5, "page_size": 16 if paged else 0}
    (q, k_cache, v_cache), arrays = _inputs(cupy, "bfloat16", **sizes, seed=13)
    if not aligned:
        arrays["k"], arrays["v"] = _misaligned_copy(arrays["k"]), _misaligned_copy(arrays["v"])
    host = {n: to_host(x) for n, x in arrays.items()}
    args = (to_host(q), to_host(k_cache), to_host(v_cache))
    want = reference.attention_with_kvcache(*args, **host, causal=True)
    base = reference.attention_with_kvcache(*args, **host, causal=True, compute_dtype=ml_dtypes.bfloat16)
    _kvcache.PLANS.clear()
    out, lse = cupyflash.flash_attention_with_kvcache(q, k_cache, v_cache, **arrays, causal=True, return_lse=True)
    (plan,) = _kvcache.PLANS._plans.values()
    assert plan.fused_append is aligned and plan.splits > 1
    assert_within_rule("out", out, want[0], base[0], OUTPUT_FACTOR)
    assert_within_rule("lse", lse, want[1], base[1], OUTPUT_FACTOR)
    np.testing.assert_array_equal(to_host(k_cache), want[2].astype(ml_dtypes.bfloat16))
    np.testing.assert_array_equal(to_host(v_cache), want[3].astype(ml_dtypes.bfloat16))


@pytest.mark.gpu
def test_new_keys_without_queries_are_appended():
    """Regression guard: a call with new tokens and no queries (seqlen_q 0) launches no decode CTA, so the
    general path appends them."""
    sizes = {"batch": 2, "seqlen_q": 0, "heads": 4, "heads_k": 2, "headdim": 64, "headdim_v": 64, "capacity": 100,
             "lengths": [10, 90], "new": 3}
    (q, k_cache, v_cache), arrays = _inputs(cupy, "bfloat16", **sizes, seed=17)
    host = {n: to_host(x) for n, x in arrays.items()}
    want = reference.attention_with_kvcache(to_host(q), to_host(k_cache), to_host(v_cache), **host)
    out = cupyflash.flash_attention_with_kvcache(q, k_cache, v_cache, **arrays)
    assert out.shape == (2, 0, 4, 64)
    np.testing.assert_array_equal(to_host(k_cache), want[2].astype(ml_dtypes.bfloat16))
    np.testing.assert_array_equal(to_host(v_cache), want[3].astype(ml_dtypes.bfloat16))


@pytest.mark.parametrize("paged", [False, True], ids=["dense", "paged"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.gpu
def test_out_of_range_values_poison_only_their_entry(dtype, paged):
    """A CuPy call checks cache_seqlens and the block table on the device: the entries with
    out-of-range values come out NaN (and, for a bad length, their caches unchanged); the others are exact."""
    sizes = {"batch": 4, "seqlen_q": 1, "heads": 4, "heads_k": 2, "headdim": 64, "headdim_v": 64, "capacity": 64,
             "lengths": [10, 63, 20, 5], "new": 1, "page_size": 16 if paged else 0}
    (q, k_cache, v_cache), arrays = _inputs(cupy, dtype, **sizes, seed=5)
    lengths = arrays["cache_seqlens"]
    lengths[1] = 64  # no room for the new token
    lengths[3] = -2
    if paged:
        arrays["block_table"][2, 1] = 10**6  # the page of positions 16..31, which entry 2 uses
    good = [0] + ([] if paged else [2])
    k_before = k_cache.copy()
    out, lse = cupyflash.flash_attention_with_kvcache(q, k_cache, v_cache, **arrays, return_lse=True)
    out, lse = to_host(out).astype(np.float64), to_host(lse)
    bad = [b for b in range(4) if b not in good]
    assert np.isnan(out[bad]).all() and np.isnan(lse[bad]).all()
    assert np.isfinite(out[good]).all() and np.isfinite(lse[good]).all()
    if not paged:
        assert (k_cache[1:2] == k_before[1:2]).all() and (k_cache[3:] == k_before[3:]).all()
    # The good entries against a call holding only them.
    host = {n: to_host(x)[good] for n, x in arrays.items()}
    want = reference.attention_with_kvcache(to_host(q)[good], to_host(k_before) if paged else to_host(k_before)[good],
                                            to_host(v_cache) if paged else to_host(v_cache)[good], **host)
    np.testing.assert_allclose(out[good], want[0], atol=2e-2 if dtype == "bfloat16" else 1e-5)


@pytest.mark.parametrize("xp_name", ["numpy", pytest.param("cupy", marks=pytest.mark.gpu)])
def test_numpy_and_int_values_are_checked_on_the_host(xp_name):
    xp = _xp(xp_name)
    (q, k_cache, v_cache), arrays = _inputs(xp, "float32", batch=2, seqlen_q=1, heads=2, heads_k=1, headdim=8,
                                            headdim_v=8, capacity=16, lengths=[3, 4], new=1, page_size=4)
    with pytest.raises(ValueError, match="cache_seqlens must be in"):
        cupyflash.flash_attention_with_kvcache(q, k_cache, v_cache, **dict(arrays, cache_seqlens=16))
    if xp is np:
        bad = dict(arrays, cache_seqlens=np.array([3, 16], np.int32))
        with pytest.raises(ValueError, match="cache_seqlens must lie in"):
            cupyflash.flash_attention_with_kvcache(q, k_cache, v_cache, **bad)
        table = arrays["block_table"].copy()
        table[1, 1] = -1
        with pytest.raises(ValueError, match="block_table row 1"):
            cupyflash.flash_attention_with_kvcache(q, k_cache, v_cache, **dict(arrays, block_table=table))


@pytest.mark.parametrize("paged", [False, True], ids=["dense", "paged"])
@pytest.mark.gpu
def test_cuda_graph_capture_and_replay(paged):
    """A decode step (append one token, attend, split-KV merge) captured in a CUDA graph, replayed
    with new queries, new tokens and longer caches written into the captured arrays."""
    sizes = {"batch": 2, "seqlen_q": 1, "heads": 8, "heads_k": 2, "headdim": 128, "headdim_v": 128, "capacity": 2048,
             "lengths": [1000, 2047 - 8], "new": 1, "page_size": 16 if paged else 0}
    (q, k_cache, v_cache), arrays = _inputs(cupy, "bfloat16", **sizes, seed=7)
    lengths = arrays["cache_seqlens"]
    call = dict(arrays, num_splits=4, return_lse=True)
    cupyflash.flash_attention_with_kvcache(q, k_cache, v_cache, **call)  # compiles, fills the memory pool
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        out, lse = cupyflash.flash_attention_with_kvcache(q, k_cache, v_cache, **call)
        graph = stream.end_capture()
    rng = np.random.default_rng(3)
    for step in range(3):
        k_host, v_host = to_host(k_cache), to_host(v_cache)
        q[...] = cupy.asarray(rng.standard_normal(q.shape).astype(ml_dtypes.bfloat16))
        arrays["k"][...] = cupy.asarray(rng.standard_normal(arrays["k"].shape).astype(ml_dtypes.bfloat16))
        lengths += 1
        host = {n: to_host(x) for n, x in arrays.items()}
        want = reference.attention_with_kvcache(to_host(q), k_host, v_host, **host)
        graph.launch(stream)
        stream.synchronize()
        np.testing.assert_allclose(to_host(out).astype(np.float64), want[0], atol=2e-2)
        np.testing.assert_allclose(to_host(lse), want[1], atol=1e-3)
        np.testing.assert_array_equal(to_host(k_cache), want[2].astype(ml_dtypes.bfloat16))


@pytest.mark.parametrize(
    "change, error, match",
    [
        ({"k": None}, ValueError, "k and v must be given together"),
        ({"rotary_sin": None}, ValueError, "rotary_cos and rotary_sin"),
        ({"cache_seqlens": np.zeros(3, np.int32)}, ValueError, r"cache_seqlens must be an int or have shape \(2,\)"),
        ({"cache_seqlens": np.zeros(2, np.int64)}, TypeError, "cache_seqlens has dtype int64; expected int32"),
        ({"block_table": np.zeros((2, 4), np.int64)}, TypeError, "block_table has dtype int64"),
        ({"block_table": np.zeros((3, 4), np.int32)}, ValueError, r"block_table must have shape \(2, max_pages\)"),
        ({"cache_batch_idx": np.zeros(2, np.int32)}, ValueError, "cache_batch_idx is for dense caches"),
        ({"num_splits": -1}, ValueError, r"num_splits must be in \[0, 256\]"),
        ({"num_splits": 2.0}, TypeError, "num_splits must be an int"),
        ({"rotary_cos": np.zeros((4, 2), np.float32), "rotary_sin": np.zeros((4, 2), np.float32)}, ValueError,
         "rotary_cos has 4 positions"),
        ({"rotary_cos": np.zeros((16, 5), np.float32), "rotary_sin": np.zeros((16, 5), np.float32)}, ValueError,
         "rotary_dim = 2 \\* that must be in"),
        ({"rotary_cos": np.zeros((16, 2), np.float64), "rotary_sin": np.zeros((16, 2), np.float64)}, TypeError,
         "rotary_cos has dtype float64"),
        ({"k": np.zeros((2, 1, 2, 8), np.float32)}, ValueError, "k and v must have shapes"),
        ({"return_lse": 1}, TypeError, "return_lse must be a bool"),
    ],
    ids=["k-alone", "cos-alone", "seqlens-shape", "seqlens-dtype", "table-dtype", "table-shape", "batch-idx-paged",
         "splits-negative", "splits-float", "rotary-short", "rotary-wide", "rotary-dtype", "k-shape", "lse-flag"],
)
def test_validation(change, error, match):
    (q, k_cache, v_cache), arrays = _inputs(np, "float32", batch=2, seqlen_q=1, heads=2, heads_k=1, headdim=8,
                                            headdim_v=8, capacity=16, lengths=[3, 4], new=1, page_size=4,
                                            rotary_dim=4)
    call = dict(arrays, **change)
    with pytest.raises(error, match=match):
        cupyflash.flash_attention_with_kvcache(q, k_cache, v_cache, **{n: x for n, x in call.items()
                                                                         if x is not None})


def test_rotary_table_must_reach_the_last_query():
    """Regression: with causal, query i rotates at cache_seqlens + i, which passes the cache capacity
    when there are more queries than new keys; the table was checked against the capacity only, so
    the NumPy path failed with an IndexError and the kernels silently clamped the position."""
    (q, k_cache, v_cache), arrays = _inputs(np, "float32", batch=1, seqlen_q=2, heads=1, heads_k=1, headdim=4,
                                            headdim_v=4, capacity=4, lengths=[3], new=1, rotary_dim=4)
    cos, sin = (np.ones((4, 2), np.float32) for _ in range(2))
    call = dict(arrays, cache_seqlens=3, rotary_cos=cos, rotary_sin=sin)
    with pytest.raises(ValueError, match=r"rotary_cos has 4 positions; 5 are needed .* for 2 queries"):
        cupyflash.flash_attention_with_kvcache(q, k_cache, v_cache, causal=True, **call)
    # Without causal or a window every query rotates at cache_seqlens: 4 positions are enough.
    cupyflash.flash_attention_with_kvcache(q, k_cache, v_cache, **call)


@pytest.mark.parametrize("read_only", ["k_cache", "v_cache"])
def test_read_only_cache_is_refused_before_anything_is_written(read_only):
    """Regression: a read-only NumPy v_cache let the call write k_cache, then fail with numpy's
    "assignment destination is read-only"."""
    (q, k_cache, v_cache), arrays = _inputs(np, "float32", batch=2, seqlen_q=1, heads=2, heads_k=1, headdim=8,
                                            headdim_v=8, capacity=16, lengths=[3, 4], new=1)
    caches = {"k_cache": k_cache, "v_cache": v_cache}
    caches[read_only].flags.writeable = False
    before = {n: x.copy() for n, x in caches.items()}
    with pytest.raises(ValueError, match=rf"{read_only} is read-only; the new keys and values \(k, v\) are written into "
                       r"k_cache and v_cache in place, so both must be writable"):
        cupyflash.flash_attention_with_kvcache(q, k_cache, v_cache, **arrays)
    for name, x in caches.items():
        np.testing.assert_array_equal(x, before[name], err_msg=f"{name} was written")


def test_read_only_cache_without_new_keys_is_read():
    (q, k_cache, v_cache), arrays = _inputs(np, "float32", batch=2, seqlen_q=1, heads=2, heads_k=1, headdim=8,
                                            headdim_v=8, capacity=16, lengths=[3, 4])
    for x in (k_cache, v_cache):
        x.flags.writeable = False
    out = cupyflash.flash_attention_with_kvcache(q, k_cache, v_cache, **arrays)
    want = reference.attention_with_kvcache(q, k_cache, v_cache, **arrays)[0]
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_alibi_slopes_are_refused(bad):
    """Regression: a NaN slope was taken silently (a NaN softcap is refused)."""
    (q, k_cache, v_cache), arrays = _inputs(np, "float32", batch=2, seqlen_q=1, heads=2, heads_k=1, headdim=8,
                                            headdim_v=8, capacity=16, lengths=[3, 4])
    slopes = np.array([[0.5, 0.25], [0.5, bad]], np.float32)
    with pytest.raises(ValueError, match=rf"alibi_slopes must be finite; got {bad} at index \(1, 1\) \(1 non-finite of 4\)"):
        cupyflash.flash_attention_with_kvcache(q, k_cache, v_cache, alibi_slopes=slopes, **arrays)


def test_rotary_needs_new_keys():
    (q, k_cache, v_cache), arrays = _inputs(np, "float32", batch=1, seqlen_q=1, heads=1, heads_k=1, headdim=8,
                                            headdim_v=8, capacity=8, lengths=[3], rotary_dim=4)
    with pytest.raises(ValueError, match="rotate the new keys"):
        cupyflash.flash_attention_with_kvcache(q, k_cache, v_cache, **arrays)


def test_cache_layouts_are_checked():
    (q, k_cache, v_cache), arrays = _inputs(np, "float32", batch=2, seqlen_q=1, heads=2, heads_k=1, headdim=8,
                                            headdim_v=8, capacity=16, lengths=[3, 4])
    strided = np.zeros(v_cache.shape[:3] + (16,), np.float32)[..., ::2]
    with pytest.raises(ValueError, match="v_cache must have a contiguous last axis"):
        cupyflash.flash_attention_with_kvcache(q, k_cache, strided, **arrays)
    with pytest.raises(ValueError, match="pass cache_batch_idx"):
        cupyflash.flash_attention_with_kvcache(q, k_cache[:1], v_cache[:1], **dict(arrays, cache_seqlens=3))
    with pytest.raises(ValueError, match="q and k_cache must have the same headdim"):
        cupyflash.flash_attention_with_kvcache(q[..., :4], k_cache, v_cache, **arrays)


def test_split_heuristic_fills_the_sms():
    """num_splits=0: enough splits that batch x kv heads x splits CTAs fill an H200's 132 SMs once
    (twice for a paged or an e4m3 cache), none shorter than MIN_TILES_PER_SPLIT tiles; none when the batch
    fills them already; a call's own count."""
    from cupyflash._families import common
    from cupyflash._kvcache import call as kvcache_call
    from cupyflash._kvcache import device as kvcache

    device = common.Device(90, 227 * 1024, 132)

    (q, k_cache, v_cache), _ = _inputs(np, "bfloat16", batch=1, seqlen_q=1, heads=32, heads_k=8, headdim=128,
                                       headdim_v=128, capacity=16, lengths=[0])
    small = kvcache_call.check(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, cache_batch_idx=None,
                                     block_table=None, rotary_cos=None, rotary_sin=None, rotary_interleaved=True,
                                     causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                                     softmax_scale=None, num_splits=0, max_splits=256, precision="highest")

    def splits(batch, context, num_splits=0):
        call = dataclasses.replace(small, batch=batch, capacity=context, num_splits=num_splits)
        return kvcache.num_splits(call, kvcache.DECODE.variant("bfloat16", (128,)), device, 1)

    assert splits(1, 131072) == 16      # 128 CTAs
    assert splits(8, 32768) == 2        # 128 CTAs
    assert splits(64, 4096) == 1        # 512 CTAs already
    assert splits(1, 256) == 2          # 4 tiles: at least 2 per split
    assert splits(1, 131072, num_splits=7) == 7
    paged = dataclasses.replace(small, block_table=np.zeros((1, 1), np.int32), page_size=16)
    assert kvcache.num_splits(dataclasses.replace(paged, capacity=131072), kvcache.DECODE.variant("bfloat16", (128,)),
                              device, 1) == 33  # 264 CTAs: two per SM
    e4m3 = kvcache.DECODE_FP8.variant("bfloat16", (128,))
    assert kvcache.num_splits(dataclasses.replace(small, batch=8, capacity=32768), e4m3, device, 1) == 4  # 256 CTAs
    wide = kvcache.DECODE_FP8.variant("bfloat16", (256,))  # (two CTAs an SM do not fit: one wave of 132)
    assert kvcache.num_splits(dataclasses.replace(small, batch=8, capacity=32768), wide, device, 1) == 2


@pytest.mark.parametrize("dtype, sizes, options, leftpad", [
    ("bfloat16", dict(DECODE, lengths=[699, 37, 5], capacity=700, headdim=64, headdim_v=64), {"causal": True},
     [650, 0, 5]),
    ("float32", dict(DECODE, seqlen_q=5, new=2, lengths=[60, 37, 9], capacity=80, headdim=40, headdim_v=24,
                     batch_idx=True), {"window_size": (20, 3), "alibi": True}, [13, 37, 1]),
    ("float16", dict(DECODE, seqlen_q=3, new=3, lengths=[40, 10, 0], capacity=64, headdim=32, headdim_v=32,
                     rotary_dim=16), {"causal": True}, [7, 10, 0]),
])
def test_left_padded_caches_numpy(dtype, sizes, options, leftpad):
    """cache_leftpad (FlashAttention-2's left-padded caches): entry b attends to positions cache_leftpad[b]
    .. cache_seqlens[b] + seqlen_new, its masks and ALiBi counted from cache_leftpad[b] (one entry's padding
    reaches its last cached key), GQA, rotary, windows; the NumPy twin against the oracle."""
    dtype, sizes, options = _options(np, (dtype, sizes, options))
    _check(np, dtype, dict(options, cache_leftpad=np.asarray(leftpad, np.int32)), **sizes)


def test_left_padding_is_the_cache_from_its_first_key():
    """The oracle's left padding against its own unpadded form (independent of the twin): each entry's
    cache from cache_leftpad[b] on, with cache_seqlens[b] - cache_leftpad[b] keys, gives the same out and lse."""
    sizes = dict(DECODE, seqlen_q=4, new=2, lengths=[50, 20, 7], capacity=60, headdim=32, headdim_v=16)
    (q, k_cache, v_cache), arrays = _inputs(np, "float32", **sizes, seed=11)
    leftpad = np.array([17, 0, 7], np.int32)
    out, lse, *_ = reference.attention_with_kvcache(q, k_cache, v_cache, **arrays, cache_leftpad=leftpad, causal=True)
    for b in range(3):
        start = int(leftpad[b])
        want, want_lse, *_ = reference.attention_with_kvcache(
            q[b:b + 1], k_cache[b:b + 1, start:], v_cache[b:b + 1, start:], k=arrays["k"][b:b + 1],
            v=arrays["v"][b:b + 1], cache_seqlens=np.array([sizes["lengths"][b] - start], np.int32), causal=True)
        np.testing.assert_array_equal(out[b], want[0])
        np.testing.assert_array_equal(lse[b], want_lse[0])


@pytest.mark.parametrize("change, error, match", [
    ({"cache_leftpad": np.array([1, 40, 0], np.int32)}, ValueError, r"cache_leftpad\[1\] must lie in \[0, cache_seqlens"),
    ({"cache_leftpad": np.array([1, 2], np.int32)}, ValueError, r"cache_leftpad must have shape \(3,\)"),
    ({"cache_leftpad": np.array([1, 2, 0], np.int64)}, TypeError, "cache_leftpad has dtype int64; expected int32"),
    ({"cache_leftpad": np.array([1, 2, 0], np.int32), "paged": True}, ValueError, "cache_leftpad is for dense caches"),
    ({"cache_leftpad": np.array([1, 2, 0], np.int32), "score_mod": lambda s, b, h, i, j: s}, NotImplementedError,
     "score_mod with cache_leftpad"),
])
def test_left_padding_is_checked(change, error, match):
    change = dict(change)
    sizes = dict(DECODE, lengths=[30, 37, 0], capacity=64, headdim=32, headdim_v=32,
                 page_size=16 if change.pop("paged", False) else 0)
    (q, k_cache, v_cache), arrays = _inputs(np, "float32", **sizes, seed=12)
    with pytest.raises(error, match=match):
        cupyflash.flash_attention_with_kvcache(q, k_cache, v_cache, **arrays, **change)


@pytest.mark.parametrize("paged", [False, True], ids=["dense", "paged"])
@pytest.mark.gpu
def test_checked_mode_raises_for_cupy_values(paged, monkeypatch):
    """CUPYFLASH_CHECK=1: a CuPy call's out-of-range cache_seqlens, cache_batch_idx or block_table raise
    ValueError naming the argument, as a NumPy call's do (by default their entry's rows are NaN); a valid
    call runs as usual."""
    monkeypatch.setenv("CUPYFLASH_CHECK", "1")
    sizes = {"batch": 3, "seqlen_q": 1, "heads": 4, "heads_k": 2, "headdim": 64, "headdim_v": 64, "capacity": 64,
             "lengths": [10, 63, 20], "new": 1, "page_size": 16 if paged else 0, "batch_idx": not paged}
    (q, k_cache, v_cache), arrays = _inputs(cupy, "bfloat16", **sizes, seed=14)
    cupyflash.flash_attention_with_kvcache(q, k_cache, v_cache, **arrays)
    bad = dict(arrays, cache_seqlens=cupy.asarray(np.array([10, 64, 20], np.int32)))
    with pytest.raises(ValueError, match="cache_seqlens must lie in"):
        cupyflash.flash_attention_with_kvcache(q, k_cache, v_cache, **bad)
    if paged:
        table = arrays["block_table"].copy()
        table[1, 0] = 10**6
        with pytest.raises(ValueError, match="block_table row 1 names pages outside"):
            cupyflash.flash_attention_with_kvcache(q, k_cache, v_cache, **dict(arrays, block_table=table))
    else:
        with pytest.raises(ValueError, match="cache_batch_idx must index"):
            cupyflash.flash_attention_with_kvcache(q, k_cache, v_cache,
                                                   **dict(arrays, cache_batch_idx=cupy.asarray(np.array([0, 9, 1],
                                                                                                      np.int32))))


def test_checked_mode_reads_its_variable(monkeypatch):
    from cupyflash import _kvcache

    for value, on in (("", False), ("0", False), ("1", True), ("yes", True)):
        monkeypatch.setenv("CUPYFLASH_CHECK", value)
        assert _kvcache.checked_mode() is on
    monkeypatch.delenv("CUPYFLASH_CHECK")
    assert _kvcache.checked_mode() is False


@pytest.mark.parametrize("xp_name", ["numpy", pytest.param("cupy", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("heads, seqlen_q", [(16, 1), (128, 2)])
def test_mla_shapes(heads, seqlen_q, xp_name):
    """Issue 26's MLA layout through flash_attention_with_kvcache: one latent kv head of 576 columns in
    pages of 64, v_cache the view k_cache[..., :512] (new tokens written through both, the same bytes), 16
    or 128 query heads, causal for seqlen_q > 1; against the oracle (on the GPU, the MLA decode kernel
    after kvc_append: test_mla_decode_kernel_cupy)."""
    xp = _xp(xp_name)
    rng = np.random.default_rng(heads)
    batch, page, pages_per, bf16 = 2, 64, 3, DTYPES["bfloat16"]
    num_pages = batch * pages_per + 1
    latent = rng.standard_normal((num_pages, page, 1, 576)).astype(bf16)
    k_cache, v_cache = latent, latent[..., :512]
    table = rng.permutation(num_pages)[:batch * pages_per].reshape(batch, pages_per).astype(np.int32)
    q = rng.standard_normal((batch, seqlen_q, heads, 576)).astype(bf16)
    k_new = rng.standard_normal((batch, seqlen_q, 1, 576)).astype(bf16)
    arrays = {"k": k_new, "v": k_new[..., :512], "cache_seqlens": np.array([150, 37], np.int32), "block_table": table,
              "causal": seqlen_q > 1, "softmax_scale": 576 ** -0.5}
    want = reference.attention_with_kvcache(q, k_cache, v_cache, **arrays)
    base = reference.attention_with_kvcache(q, k_cache, v_cache, **arrays, compute_dtype=bf16)
    if xp is not np:
        latent = xp.asarray(latent)
        k_cache, v_cache, q = latent, latent[..., :512], xp.asarray(q)
        arrays = {n: xp.asarray(x) if isinstance(x, np.ndarray) else x for n, x in arrays.items()}
        arrays["v"] = arrays["k"][..., :512]
    out, lse = cupyflash.flash_attention_with_kvcache(q, k_cache, v_cache, **arrays, return_lse=True)
    assert out.shape == (batch, seqlen_q, heads, 512)
    assert_within_rule("out", out, want[0], base[0], OUTPUT_FACTOR)
    assert_within_rule("lse", lse, want[1], base[1], OUTPUT_FACTOR)
    assert (to_host(latent) == want[2]).all() and (to_host(latent)[..., :512] == want[3]).all()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, heads, seqlen_q, page, lengths, options", [
    ("bfloat16", 16, 1, 1, [1, 200, 77], {}),
    ("float16", 32, 3, None, [150, 3, 64], {"causal": True, "num_splits": 4, "cache_leftpad": [7, 0, 60]}),
    ("bfloat16", 128, 1, 64, [65, 129, 0], {"num_splits": 2}),
    ("float16", 16, 4, 16, [300, 47, 4], {"causal": True}),
    ("bfloat16", 12, 3, 16, [70, 5, 130], {"causal": True, "num_splits": 3}),
    ("float16", 8, 5, None, [90, 2, 66], {"causal": True, "cache_leftpad": [0, 1, 30]}),
    ("bfloat16", 64, 1, 128, [300, 1, 129], {}),
    ("float16", 128, 2, 64, [257, 64, 3], {"causal": True, "num_splits": 3}),
    ("bfloat16", 40, 2, None, [190, 0, 75], {"causal": True, "cache_leftpad": [5, 0, 64]}),
])
def test_mla_decode_kernel_cupy(dtype, heads, seqlen_q, page, lengths, options, monkeypatch):
    """The MLA decode kernels (kernels_cu/kvcache/mla.cu; with MLA_SM90_MIN_ROWS (16) or more rows a batch entry on compute
    capability 9.0, mla_sm90.cu) against the float64 reference, never the general path: pages of 1, 16,
    64 and 128 and a dense cache with left padding, odd lengths and an empty entry, 8 to 128 heads, causal
    chunks of up to 5 queries, splits merged in the kernel; a view of the cache's first 512 columns as
    v_cache; 12 and 8 heads put several queries, with their own causal limits, and a partial last row
    tile in a CTA (40 heads x 2 queries too, on the 64-row tiles); walks of an odd and an even number of
    64-key tiles, and a last tile cut by the entry's length (its rows past it hold other values). A
    v_cache of another cache (the same layout) takes the general path and another plan."""
    from cupyflash import _kvcache
    from cupyflash._kvcache import device

    _kvcache.PLANS.clear()  # (no plan of an earlier test of these layouts)
    dt = DTYPES[dtype]
    rng = np.random.default_rng(sum(lengths) + heads)
    batch, capacity = len(lengths), 320
    if page is None:
        latent = rng.standard_normal((batch + 1, capacity, 1, 576)).astype(dt)
        arrays = {"cache_batch_idx": np.array([2, 0, 3][:batch], np.int32) % (batch + 1)}
    else:
        pages_per = -(-capacity // page)
        num_pages = batch * pages_per + 3
        latent = rng.standard_normal((num_pages, page, 1, 576)).astype(dt)
        table = rng.permutation(num_pages)[:batch * pages_per].reshape(batch, pages_per).astype(np.int32)
        arrays = {"block_table": table}
    q = rng.standard_normal((batch, seqlen_q, heads, 576)).astype(dt)
    arrays.update(cache_seqlens=np.array(lengths, np.int32), softmax_scale=576 ** -0.5, causal=options.get("causal", False))
    if "cache_leftpad" in options:
        arrays["cache_leftpad"] = np.array(options["cache_leftpad"], np.int32)
    want = reference.attention_with_kvcache(q, latent, latent[..., :512], **arrays)
    base = reference.attention_with_kvcache(q, latent, latent[..., :512], **arrays, compute_dtype=dt)
    gpu = {n: cupy.asarray(x) if isinstance(x, np.ndarray) else x for n, x in arrays.items()}
    # The rows no entry uses hold NaN on the GPU: the kernels must never let them into a result (rows past
    # an entry's length share its last tile, and 0 x NaN in P V is NaN).
    poisoned = latent.copy()
    for b, length in enumerate(lengths):
        if page is None:
            entry, first = arrays["cache_batch_idx"][b], options.get("cache_leftpad", [0] * batch)[b]
            poisoned[entry, :first] = poisoned[entry, first + length:] = np.nan
        else:
            for pos in range(length, capacity):
                poisoned[table[b, pos // page], pos % page] = np.nan
    latent_gpu = cupy.asarray(poisoned)
    monkeypatch.setattr(device, "_general", lambda *args, **kwargs: pytest.fail("took the general path"))
    chosen = []
    decode_variant = device.decode_variant
    monkeypatch.setattr(device, "decode_variant", lambda *args, **kwargs: chosen.append(decode_variant(*args, **kwargs))
                        or chosen[-1])
    out, lse = cupyflash.flash_attention_with_kvcache(cupy.asarray(q), latent_gpu, latent_gpu[..., :512], **gpu,
                                                      num_splits=options.get("num_splits", 0), return_lse=True)
    sm90 = cupy.cuda.Device().compute_capability == "90" and heads * seqlen_q >= device.MLA_SM90_MIN_ROWS
    assert [v.kernel for v in chosen] == [device.MLA_SM90 if sm90 and (page or 64) % 64 == 0 else device.MLA]
    assert out.shape == (batch, seqlen_q, heads, 512)
    assert_within_rule("out", out, want[0], base[0], OUTPUT_FACTOR)
    assert_within_rule("lse", lse, want[1], base[1], OUTPUT_FACTOR)
    # v_cache of the same layout in another latent cache: not a view of k_cache, so the general path,
    # and not the plan of the call above (whose key differs only there).
    monkeypatch.undo()
    chosen.clear()
    monkeypatch.setattr(device, "decode_variant", lambda *args, **kwargs: chosen.append(decode_variant(*args, **kwargs))
                        or chosen[-1])
    other = rng.standard_normal(latent.shape).astype(dt)
    want = reference.attention_with_kvcache(q, latent, other[..., :512], **arrays)
    base = reference.attention_with_kvcache(q, latent, other[..., :512], **arrays, compute_dtype=dt)
    out, _ = cupyflash.flash_attention_with_kvcache(cupy.asarray(q), cupy.asarray(latent), cupy.asarray(other)[..., :512],
                                                    **gpu, num_splits=options.get("num_splits", 0), return_lse=True)
    assert chosen == [None]
    assert_within_rule("out (v_cache of another cache)", out, want[0], base[0], OUTPUT_FACTOR)


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [16, 128])
def test_mla_bad_pages_give_nan_rows_cupy(heads):
    """An out-of-range block_table entry in a page an entry uses makes that entry's rows NaN on both MLA
    kernels (16 heads: mla.cu; 128 on compute capability 9.0: mla_sm90.cu), with and without splits; the
    other entries' rows match the float64 reference."""
    rng = np.random.default_rng(heads)
    batch, page, pages_per, bf16 = 3, 64, 4, DTYPES["bfloat16"]
    latent = rng.standard_normal((batch * pages_per, page, 1, 576)).astype(bf16)
    table = np.arange(batch * pages_per, dtype=np.int32).reshape(batch, pages_per)
    q = rng.standard_normal((batch, 1, heads, 576)).astype(bf16)
    arrays = {"cache_seqlens": np.array([200, 150, 256], np.int32), "block_table": table, "softmax_scale": 576 ** -0.5}
    want = reference.attention_with_kvcache(q, latent, latent[..., :512], **arrays)
    base = reference.attention_with_kvcache(q, latent, latent[..., :512], **arrays, compute_dtype=bf16)
    bad = table.copy()
    bad[1, 2] = 10**6  # entry 1 uses 150 keys: pages 0-2
    gpu = dict(arrays, cache_seqlens=cupy.asarray(arrays["cache_seqlens"]), block_table=cupy.asarray(bad))
    latent_gpu = cupy.asarray(latent)
    for splits in (1, 3):
        out = to_host(cupyflash.flash_attention_with_kvcache(cupy.asarray(q), latent_gpu, latent_gpu[..., :512], **gpu,
                                                             num_splits=splits)).astype(np.float32)
        assert np.isnan(out[1]).all() and np.isfinite(out[[0, 2]]).all()
        assert_within_rule("out", out[[0, 2]], want[0][[0, 2]], base[0][[0, 2]], OUTPUT_FACTOR)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, sizes, options, leftpad", [
    ("bfloat16", dict(DECODE, lengths=[699, 37, 5], capacity=700), {"causal": True}, [650, 0, 5]),
    ("float16", dict(DECODE, new=0, lengths=[700, 300, 333], capacity=700), {"num_splits": 5}, [1, 299, 100]),
    ("bfloat16", dict(DECODE, seqlen_q=5, new=5, lengths=[60, 37, 9], capacity=80, headdim=64, headdim_v=64,
                      batch_idx=True, rotary_dim=32), {"window_size": (20, 3), "alibi": True}, [13, 37, 1]),
    ("bfloat16", dict(DECODE, seqlen_q=3, new=3, lengths=[40, 17, 0], capacity=64, headdim=96, headdim_v=96),
     {"causal": True}, [39, 16, 0]),
    ("float32", dict(DECODE, lengths=[99, 37, 5], capacity=100, headdim=32, headdim_v=32), {}, [0, 36, 2]),
])
def test_left_padded_caches_cupy(dtype, sizes, options, leftpad, monkeypatch):
    """cache_leftpad on CuPy against the oracle: 16-bit calls on
    the decode kernel (CacheEntry.first: its tiles start at each entry's first key; with splits, rotary,
    new keys it appends itself, windows and ALiBi counted from the entry's start), never the general path;
    float32 on the general kernels over the cache shifted per entry."""
    from cupyflash._kvcache import device

    if dtype != "float32":
        monkeypatch.setattr(device, "_general", lambda *args, **kwargs: pytest.fail("took the general path"))
    dtype, sizes, options = _options(cupy, (dtype, sizes, options))
    _check(cupy, dtype, dict(options, cache_leftpad=cupy.asarray(np.asarray(leftpad, np.int32))), **sizes)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_out_of_range_leftpad_gives_nan_rows_cupy(dtype, monkeypatch):
    """A CuPy cache_leftpad entry outside [0, cache_seqlens] makes its batch entry's rows NaN (the decode
    kernel's CacheEntry, the general path's poison), the others finite; CUPYFLASH_CHECK=1 raises instead."""
    sizes = dict(DECODE, lengths=[50, 37, 20], capacity=64, headdim=64, headdim_v=64)
    (q, k_cache, v_cache), arrays = _inputs(cupy, dtype, **sizes, seed=9)
    arrays["cache_leftpad"] = cupy.asarray(np.array([3, 38, -1], np.int32))
    out = to_host(cupyflash.flash_attention_with_kvcache(q, k_cache, v_cache, **arrays)).astype(np.float32)
    assert np.isfinite(out[0]).all() and np.isnan(out[1:]).all()
    monkeypatch.setenv("CUPYFLASH_CHECK", "1")
    with pytest.raises(ValueError, match="cache_leftpad"):
        cupyflash.flash_attention_with_kvcache(q, k_cache, v_cache, **arrays)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, sizes, options", [
    ("bfloat16", dict(DECODE, seqlen_q=70, new=40, lengths=[0, 300, 760], capacity=800, page_size=16), {"causal": True}),
    ("float16", dict(DECODE, seqlen_q=65, new=0, lengths=[500, 64, 1], capacity=640, page_size=64),
     {"window_size": (100, 0), "alibi": True}),
    ("bfloat16", dict(DECODE, seqlen_q=130, new=130, lengths=[880, 3, 512], capacity=1024, page_size=256, headdim=64,
                      headdim_v=64, rotary_dim=32), {"causal": True}),
    ("bfloat16", dict(DECODE, seqlen_q=80, new=20, lengths=[200, 0, 77], capacity=320, page_size=64, headdim=256,
                      headdim_v=256), {"causal": True, "softcap": 30.0}),
    ("float16", dict(DECODE, seqlen_q=66, new=3, lengths=[91, 40, 13], capacity=96, page_size=24), {"causal": True}),
    ("bfloat16", dict(DECODE, seqlen_q=72, new=8, lengths=[150, 33, 0], capacity=192, page_size=32, headdim=192,
                      headdim_v=192), {"causal": True}),
])
def test_paged_prefill_on_the_hopper_forward(dtype, sizes, options, monkeypatch):
    """A paged cache's prefill (more than 64 queries) on the Hopper 16-bit forward, whose producer reads each
    key tile from the pages: pages of 16, 24 (8-row boxes),
    64 and 256 rows, boxes of 16 at head dim 256 (80-key tiles), pages of 32 at head dim 192 (96-key tiles;
    V's boxes, as at head dims 128 and 256, span every 64-column atom), an entry filling its capacity (boxes past
    it on page -1), table entries of -1 past every entry's used pages, new keys appended first, rotary,
    windows, ALiBi, softcap, the maximum score; against the oracle, the pages read in place. The device is
    described with 8 SMs, so that these small chunks fill it (paged_prefill routes by work tiles)."""
    from cupyflash import _families
    from cupyflash._kvcache import device

    real = _families.common.current_device()
    if real.capability != 90:
        pytest.skip("the Hopper forward runs on compute capability 9.0")
    monkeypatch.setattr(_families.common, "current_device", lambda: dataclasses.replace(real, sm_count=8))
    decisions = []  # paged_prefill's answers: True where the Hopper forward reads the pages in place
    paged_prefill = device.paged_prefill
    monkeypatch.setattr(device, "paged_prefill", lambda *args: decisions.append(paged_prefill(*args)) or decisions[-1])
    inputs = _inputs

    def unused_pages_minus_one(*args, **kwargs):
        """The inputs with every table entry past its entry's used pages -1 (FlashAttention-2's callers leave
        anything there)."""
        arrays, kwargs_out = inputs(*args, **kwargs)
        table = kwargs_out["block_table"]
        used_keys = np.asarray(kwargs["lengths"]) + kwargs.get("new", 0)
        for b, keys in enumerate(used_keys):
            table[b, -(-int(keys) // kwargs["page_size"]):] = -1
        return arrays, kwargs_out

    monkeypatch.setattr(sys.modules[__name__], "_inputs", unused_pages_minus_one)
    dtype, sizes, options = _options(cupy, (dtype, sizes, options))
    _check(cupy, dtype, options, max_score=True, **sizes)
    assert decisions and all(decisions)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, sizes, options, clusters", [
    ("bfloat16", dict(DECODE, seqlen_q=70, new=40, lengths=[0, 300, 760], capacity=800, page_size=16), {"causal": True},
     None),
    ("float16", dict(DECODE, seqlen_q=200, new=0, lengths=[500, 64, 1], capacity=640, page_size=32),
     {"window_size": (100, 0)}, 2),
    ("bfloat16", dict(DECODE, seqlen_q=130, new=130, lengths=[880, 3, 512], capacity=1024, page_size=8),
     {"causal": True}, 3),
    ("float16", dict(DECODE, seqlen_q=66, new=3, lengths=[91, 40, 13], capacity=96, page_size=24, heads=4),
     {"causal": True}, None),
    ("bfloat16", dict(DECODE, seqlen_q=300, new=0, lengths=[1000, 517, 129], capacity=1024, page_size=32, heads=16,
                      heads_k=4), {}, 2),
])
def test_paged_prefill_in_clusters_of_two_query_heads(dtype, sizes, options, clusters, monkeypatch):
    """The paired forward (sm90_fwd_pairs: clusters of two CTAs on two query heads of one kv head, each CTA
    issuing half of every key tile's boxes into both): pages of 8 (16 boxes a tile, V by atoms), 16, 24 (8-row
    boxes, V by atoms) and 32 (four boxes a tile), causal, a window, non-causal, entries of 0, 1 and
    their full capacity, new keys appended first, against the oracle. Where ``clusters`` is set the device
    runs that many clusters at once, so that each takes many work tiles in turn (the work hand-off through
    both of its slots, the rings across tiles)."""
    from cupyflash import _families, _kvcache, _plan
    from cupyflash._families import sm90

    real = _families.common.current_device()
    if real.capability != 90:
        pytest.skip("the Hopper forward runs on compute capability 9.0")
    monkeypatch.setattr(_families.common, "current_device", lambda: dataclasses.replace(real, sm_count=8))
    if clusters is not None:
        monkeypatch.setattr(sm90, "max_active_clusters", lambda *args: clusters)
    # A fresh plan cache: a plan of these shapes cached by an earlier test would skip FORWARD.plan (and its
    # grid would be of the real device's SMs and clusters).
    monkeypatch.setattr(_kvcache, "PLANS", _plan.PlanCache())
    kernels = []
    plan = sm90.FORWARD.plan
    monkeypatch.setattr(sm90.FORWARD, "plan", lambda b, variant, *args: kernels.append(variant.kernel) or plan(b, variant, *args))
    dtype, sizes, options = _options(cupy, (dtype, sizes, options))
    _check(cupy, dtype, options, max_score=False, **sizes)
    assert kernels and set(kernels) == {sm90.FWD_PAIRS}


@pytest.mark.parametrize("paged, leftpad", [(False, True), (True, False)])
def test_kernel_arguments_fill_every_field(paged, leftpad):
    """The KV-cache kernels' KvCacheArgs are filled positionally (cupyflash/_kvcache/device.py's _fill_args,
    as DecodePlan fills them, from plan slots): every field of the struct gets its value, and the index
    arrays' addresses land in their own fields. (A field added to the struct and not to the tuple would
    fail every CuPy call before its launch.)"""
    from cupyflash import _params, _plan
    from cupyflash._kvcache import call, device

    sizes = dict(DECODE, new=0, page_size=16 if paged else 0)
    (q, k_cache, v_cache), arrays = _inputs(np, "bfloat16", **sizes, seed=1)
    if leftpad:
        arrays["cache_leftpad"] = np.array([3, 0, 0], np.int32)
    c = call.check(q, k_cache, v_cache, k=None, v=None, cache_seqlens=arrays["cache_seqlens"], cache_batch_idx=None,
                   block_table=arrays.get("block_table"), rotary_cos=None, rotary_sin=None, rotary_interleaved=False,
                   causal=True, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, softmax_scale=None, num_splits=0,
                   max_splits=128, precision="highest", cache_leftpad=arrays.get("cache_leftpad"))
    slots = {name: _plan.Slot(n, x.shape, x.dtype) for n, (name, x) in enumerate(
        (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), *((n, x) for n, x in arrays.items())))}
    cs = dataclasses.replace(c, **{name: slot for name, slot in slots.items() if name != "block_table" or paged})
    out = _plan.Slot(20, c.out_shape, c.dtype)
    args = device._fill_args(np.zeros(1, _params.KV_CACHE_ARGS), cs, slots["q"], out, None)
    for name in ("cache_seqlens", "cache_leftpad", "block_table"):
        expected = slots[name].data.ptr if name in slots else 0
        assert int(args[name][0]) == expected, name
    assert int(args["seqlen_new"][0]) == 0 and int(args["page_size"][0]) == (16 if paged else 0)
    assert int(args["out"]["ptr"][0]) == out.data.ptr


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, sizes, int_seqlens", [
    ("bfloat16", dict(DECODE, seqlen_q=100, new=0, lengths=[300, 0, 517], capacity=600), False),
    ("float16", dict(DECODE, seqlen_q=80, new=80, lengths=[200, 200, 200], capacity=320, rotary_dim=32), True),
    ("float32", dict(DECODE, seqlen_q=3, new=3, lengths=[40, 17, 0], capacity=64, headdim=64, headdim_v=64), False),
    ("bfloat16", dict(DECODE, seqlen_q=70, new=5, lengths=[0, 300, 500], capacity=512, page_size=64), False),
], ids=["dense", "int-lengths-rotary", "float32", "paged-in-place"])
def test_general_path_calls_run_their_plan(dtype, sizes, int_seqlens, monkeypatch):
    """Calls the decode kernel does not take (chunks of many queries, float32; on an H100/H200 a paged
    prefill read in place by the Hopper forward) keep a plan of their layout (_kvcache/device.py's
    GeneralPlan): three calls with other values, lengths and new tokens, the first building the plan,
    the others running it (the third its generated code), each against the oracle; an out-of-range
    cache_seqlens entry in the third gives that entry NaN rows and leaves the others exact. The device is
    described with 8 SMs so that the paged chunk fills it."""
    from cupyflash import _families, _kvcache
    from cupyflash._kvcache import device

    real = _families.common.current_device()
    if sizes.get("page_size") and real.capability != 90:
        pytest.skip("a paged cache's pages are read in place on compute capability 9.0")
    monkeypatch.setattr(_families.common, "current_device", lambda: dataclasses.replace(real, sm_count=8))
    _kvcache.PLANS.clear()
    for call in range(3):
        lengths = list(sizes["lengths"]) if call == 0 else [n - 7 * call if n >= 7 * call else n for n in sizes["lengths"]]
        (q, k_cache, v_cache), arrays = _inputs(cupy, dtype, **dict(sizes, lengths=lengths), seed=40 + call)
        if int_seqlens:
            arrays["cache_seqlens"] = lengths[0]
        host = {n: to_host(x) if not isinstance(x, int) else x for n, x in arrays.items()}
        bad = call == 2 and not int_seqlens
        if bad:
            capacity = sizes["capacity"]
            arrays["cache_seqlens"][1] = capacity + 1  # past the capacity: entry 1 is bad
        args = [to_host(x) for x in (q, k_cache, v_cache)]
        want = reference.attention_with_kvcache(*args, **host, causal=True)
        base = reference.attention_with_kvcache(*args, **host, causal=True, compute_dtype=DTYPES[dtype])
        out, lse = cupyflash.flash_attention_with_kvcache(q, k_cache, v_cache, **arrays, causal=True, return_lse=True)
        (plan,) = _kvcache.PLANS._plans.values()
        assert isinstance(plan, device.GeneralPlan)
        good = [0, 2] if bad else [0, 1, 2]
        assert_within_rule("out", out[good], want[0][good], base[0][good], OUTPUT_FACTOR)
        assert_within_rule("lse", lse[good], want[1][good], base[1][good], OUTPUT_FACTOR)
        if bad:
            assert bool(cupy.isnan(out[1]).all()) and bool(cupy.isnan(lse[1]).all())
        else:
            for got, expected in ((k_cache, want[2]), (v_cache, want[3])):
                np.testing.assert_array_equal(to_host(got).astype(np.float64), expected.astype(DTYPES[dtype]).astype(np.float64))
