"""merge_attention_states and its stacked form: attention over disjoint key sets, merged, against the
attention over their union (the float64 oracle, with the tolerance rule), against the reference merge,
on rows that saw no key and NaN rows, in both layouts; validation. NumPy always; CuPy on a GPU, where
the merge is one kernel, also against the reference merge past one launch's parts and on strided views."""

import numpy as np
import pytest
from helpers import (
    DTYPES,
    OUTPUT_FACTOR,
    assert_within_rule,
    gpu_available,
    oracle,
    packed_offsets,
    plain,
    random_normal,
    random_qkv,
    to_host,
)

import cupyflash
from cupyflash import reference

if gpu_available():
    import cupy
else:
    cupy = None

MODULES = [pytest.param("numpy", id="numpy"), pytest.param("cupy", id="cupy", marks=pytest.mark.gpu)]


def _xp(name):
    return np if name == "numpy" else cupy


def _split_attention(xp, sizes, dtype, splits, seed):
    """q, k, v, and each key range's (out, lse) from cupyflash with the scale of the whole head dim."""
    batch, seqlen_q, seqlen_k, heads, heads_k, headdim, headdim_v = sizes
    q, k, v = random_qkv(xp, batch, seqlen_q, seqlen_k, heads, heads_k, headdim, headdim_v, DTYPES[dtype], seed)
    bounds = [0, *splits, seqlen_k]
    parts = [cupyflash.flash_attention(q, k[:, a:b], v[:, a:b], return_lse=True, softmax_scale=headdim**-0.5)
             for a, b in zip(bounds[:-1], bounds[1:])]  # noqa: RUF007 (itertools.pairwise needs Python 3.10)
    return q, k, v, parts


@pytest.mark.parametrize("module", MODULES)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32", "float64"])
def test_merged_parts_are_attention_over_all_keys(module, dtype):
    """Keys split in two (one part of a single key): the merge meets the tolerance rule of attention over
    all keys at once."""
    xp = _xp(module)
    sizes = (2, 37, 101, 4, 2, 32, 48)
    q, k, v, (a, b) = _split_attention(xp, sizes, dtype, [100], seed=1)
    out, lse = cupyflash.merge_attention_states(*a, *b)
    assert out.dtype == q.dtype and lse.dtype == a[1].dtype
    ref, base = oracle(q, k, v), plain(q, k, v)
    assert_within_rule("out", out, ref["out"], base["out"], OUTPUT_FACTOR)
    assert_within_rule("lse", lse, ref["lse"], base["lse"], OUTPUT_FACTOR)


@pytest.mark.parametrize("module", MODULES)
def test_stacked_parts_are_attention_over_all_keys(module):
    """Four parts in one stacked call."""
    xp = _xp(module)
    sizes = (1, 53, 97, 2, 1, 64, 64)
    q, k, v, parts = _split_attention(xp, sizes, "float32", [10, 50, 80], seed=2)
    out, lse = cupyflash.merge_attention_states_stacked(xp.stack([p[0] for p in parts]), xp.stack([p[1] for p in parts]))
    ref, base = oracle(q, k, v), plain(q, k, v)
    assert_within_rule("out", out, ref["out"], base["out"], OUTPUT_FACTOR)
    assert_within_rule("lse", lse, ref["lse"], base["lse"], OUTPUT_FACTOR)


def test_causal_parts_with_rows_that_see_no_key():
    """Causal attention of 40 queries over 40 keys, as keys 0-24 and 25-39. Query i sees key j iff
    j <= i; with the bottom-right alignment that is window (-1, 15) over the first 25 keys (offset
    -15) and causal over the last 15 (offset -25), which queries 0-24 do not see at all."""
    q, k, v = random_qkv(np, 1, 40, 40, 2, 2, 16, 16, DTYPES["float64"], seed=3)
    a = cupyflash.flash_attention(q, k[:, :25], v[:, :25], window_size=(-1, 15), return_lse=True)
    b = cupyflash.flash_attention(q, k[:, 25:], v[:, 25:], causal=True, return_lse=True)
    assert np.isneginf(b[1][:, :, :25]).all()
    out, lse = cupyflash.merge_attention_states(*a, *b)
    ref = oracle(q, k, v, causal=True)
    np.testing.assert_allclose(out, ref["out"], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, ref["lse"], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("module", MODULES)
@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "float64"])
def test_matches_the_reference_merge_on_special_rows(module, dtype):
    """Random parts with a row where one part saw no key, one where no part did, and a NaN row."""
    xp = _xp(module)
    rng = np.random.default_rng(4)
    dt = DTYPES[dtype]
    lse_dtype = np.float32 if dt.itemsize == 2 else np.float64
    outs = [random_normal(xp, (2, 5, 3, 8), dt, rng) for _ in range(3)]
    lses = [xp.asarray((rng.standard_normal((2, 3, 5)) * 30).astype(lse_dtype)) for _ in range(3)]
    lses[1][0, 0, 1] = -np.inf
    for lse in lses:
        lse[1, 2, 3] = -np.inf
    for out in outs:
        out[1, 3, 2] = 0  # what a row that saw no key holds
    lses[2][0, 1, 4] = np.nan
    out, lse = cupyflash.merge_attention_states_stacked(xp.stack(outs), xp.stack(lses))
    ref_out, ref_lse = reference.merge_attention_states(outs, lses)
    got_out, got_lse = to_host(out).astype(np.float64), to_host(lse).astype(np.float64)
    ref_out, ref_lse = to_host(ref_out), to_host(ref_lse)
    assert np.isneginf(got_lse[1, 2, 3]) and not got_out[1, 3, 2].any()
    assert np.isnan(got_lse[0, 1, 4]) and np.isnan(got_out[0, 4, 1]).all()
    finite = np.isfinite(ref_lse)
    assert np.array_equal(np.isfinite(got_lse), finite)
    tol = 4e-3 if dt.itemsize == 2 else 1e-6 if dt == np.float32 else 1e-12
    np.testing.assert_allclose(got_lse[finite], ref_lse[finite], rtol=tol)
    rows = np.isfinite(ref_out)
    np.testing.assert_allclose(got_out[rows], ref_out[rows], rtol=tol, atol=tol * np.abs(ref_out[rows]).max())


@pytest.mark.gpu
@pytest.mark.parametrize(("dtype", "headdim", "parts", "views"),
                         [("bfloat16", 64, 37, False), ("float16", 9, 3, True), ("float32", 24, 17, True),
                          ("float64", 6, 16, False), ("bfloat16", 40, 2, True)])
def test_the_merge_kernel_matches_the_reference(dtype, headdim, parts, views):
    """The CuPy merge (one kernel, kernels_cu/common/merge.cu): more parts than a launch takes (16, merged
    in rounds), 16-byte and element loads, parts and lse given as strided views (a padded last axis, lse
    transposed) and float64 lse for 16-bit parts, against the float64 reference merge."""
    rng = np.random.default_rng(8)
    dt = DTYPES[dtype]
    lse_dtype = np.float64 if dtype == "bfloat16" else np.float32 if dt.itemsize == 2 else np.float64
    stack = random_normal(cupy, (parts, 2, 7, 3, headdim + (3 if views else 0)), dt, rng)[..., :headdim]
    lse_values = (rng.standard_normal((parts, 2, 7, 3)) * 20).astype(lse_dtype)
    lse_values[:, 1, 2, 0] = -np.inf  # a row no part saw
    lse_values[: parts // 2, 0, 4, 1] = -np.inf  # a row half of the parts did not see
    stack[:, 1, 2, 0] = 0
    lses = cupy.asarray(lse_values)
    lses = lses.transpose(0, 1, 3, 2) if views else cupy.ascontiguousarray(lses.transpose(0, 1, 3, 2))
    out, lse = cupyflash.merge_attention_states_stacked(stack, lses)
    assert out.dtype == dt and lse.dtype == (np.float32 if dt.itemsize == 2 else np.float64)
    ref_out, ref_lse = reference.merge_attention_states([to_host(p) for p in stack], [to_host(x) for x in lses])
    got_out, got_lse = to_host(out).astype(np.float64), to_host(lse).astype(np.float64)
    assert np.isneginf(got_lse[1, 0, 2]) and not got_out[1, 2, 0].any()
    finite = np.isfinite(ref_lse)
    assert np.array_equal(np.isfinite(got_lse), finite)
    tol = 4e-3 if dt.itemsize == 2 else 1e-6 if dt == np.float32 else 1e-12
    np.testing.assert_allclose(got_lse[finite], ref_lse[finite], rtol=tol)
    np.testing.assert_allclose(got_out, ref_out, rtol=tol, atol=tol * np.abs(ref_out).max())


@pytest.mark.parametrize("module", MODULES)
def test_a_part_that_saw_no_key_changes_nothing(module):
    xp = _xp(module)
    rng = np.random.default_rng(5)
    out_a = random_normal(xp, (1, 4, 2, 8), DTYPES["bfloat16"], rng)
    lse_a = xp.asarray(rng.standard_normal((1, 2, 4)).astype(np.float32))
    out, lse = cupyflash.merge_attention_states(out_a, lse_a, xp.zeros_like(out_a), xp.full_like(lse_a, -np.inf))
    assert np.array_equal(to_host(out).astype(np.float32), to_host(out_a).astype(np.float32))
    assert np.array_equal(to_host(lse), to_host(lse_a))


@pytest.mark.parametrize("module", MODULES)
def test_packed_layout(module):
    """Each packed sequence's keys split at its own middle: merged, the varlen attention over all keys."""
    xp = _xp(module)
    rng = np.random.default_rng(6)
    lengths_q, lengths_k = [7, 0, 30], [12, 5, 41]
    cu_q, cu_k = packed_offsets(lengths_q), packed_offsets(lengths_k)
    q = random_normal(xp, (int(cu_q[-1]), 4, 32), DTYPES["float32"], rng)
    k = random_normal(xp, (int(cu_k[-1]), 2, 32), DTYPES["float32"], rng)
    v = random_normal(xp, (int(cu_k[-1]), 2, 16), DTYPES["float32"], rng)
    half = [n // 2 for n in lengths_k]
    first = np.concatenate([np.arange(s, s + h) for s, h in zip(cu_k[:-1], half)])
    second = np.concatenate([np.arange(s + h, e) for s, h, e in zip(cu_k[:-1], half, cu_k[1:])])
    parts = []
    for rows, sizes in ((first, half), (second, [n - h for n, h in zip(lengths_k, half)])):
        index = xp.asarray(rows)
        cu = xp.asarray(packed_offsets(sizes))
        parts.append(cupyflash.flash_attention_varlen(q, k[index], v[index], xp.asarray(cu_q), cu, return_lse=True))
    out, lse = cupyflash.merge_attention_states(*parts[0], *parts[1])
    full = cupyflash.flash_attention_varlen(q, k, v, xp.asarray(cu_q), xp.asarray(cu_k), return_lse=True)
    np.testing.assert_allclose(to_host(out), to_host(full[0]), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(to_host(lse), to_host(full[1]), rtol=1e-5, atol=1e-5)
    stacked_out, stacked_lse = cupyflash.merge_attention_states_stacked(
        xp.stack([p[0] for p in parts]), xp.stack([p[1] for p in parts]), packed=True)
    np.testing.assert_allclose(to_host(stacked_out), to_host(full[0]), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(to_host(stacked_lse), to_host(full[1]), rtol=1e-5, atol=1e-5)


def test_stacked_refuses_an_unstacked_dense_result():
    """Regression: one unstacked (batch, seqlen_q, heads, headdim_v) result and its lse passed to the
    stacked merge were read as packed parts, and the batch entries were merged with each other."""
    q, k, v = random_qkv(np, 2, 5, 7, 3, 3, 8, 8, DTYPES["float32"], seed=8)
    out, lse = cupyflash.flash_attention(q, k, v, return_lse=True)
    with pytest.raises(ValueError, match=r"out: 4-dimensional array given. Array must be 5-dimensional \(parts, batch, "
                       r"seqlen_q, heads, headdim_v\), or 4-dimensional \(parts, total_q, heads, headdim_v\) with "
                       r"packed=True. A 4-dimensional out is either packed parts \(pass packed=True\) or a single"):
        cupyflash.merge_attention_states_stacked(out, lse)
    # Stacked as one part, the merge is the identity.
    merged, merged_lse = cupyflash.merge_attention_states_stacked(out[None], lse[None])
    np.testing.assert_allclose(merged, out, rtol=1e-6)
    np.testing.assert_array_equal(merged_lse, lse)


def test_validation():
    out = np.zeros((1, 4, 2, 8), np.float32)
    lse = np.zeros((1, 2, 4), np.float64)
    with pytest.raises(TypeError, match="lse_b has dtype float16; expected float32 or float64"):
        cupyflash.merge_attention_states(out, lse, out, lse.astype(np.float16))
    with pytest.raises(TypeError, match="out_b has dtype float64, but out_a has dtype float32"):
        cupyflash.merge_attention_states(out, lse, out.astype(np.float64), lse)
    with pytest.raises(ValueError, match=r"out_b has shape \(1, 4, 2, 9\), but out_a has shape \(1, 4, 2, 8\)"):
        cupyflash.merge_attention_states(out, lse, np.zeros((1, 4, 2, 9), np.float32), lse)
    with pytest.raises(ValueError, match=r"lse_a has shape \(1, 4, 2\); expected \(1, 2, 4\), \(batch, heads, seqlen_q\)"):
        cupyflash.merge_attention_states(out, np.zeros((1, 4, 2)), out, lse)
    with pytest.raises(ValueError, match="out_a: 2-dimensional array given"):
        cupyflash.merge_attention_states(out[0, 0], lse, out, lse)
    with pytest.raises(TypeError, match="out_a must be a cupy.ndarray or numpy.ndarray"):
        cupyflash.merge_attention_states(out.tolist(), lse, out, lse)
    with pytest.raises(ValueError, match="out has 0 parts"):
        cupyflash.merge_attention_states_stacked(np.zeros((0, 1, 4, 2, 8)), np.zeros((0, 1, 2, 4)))
    with pytest.raises(ValueError, match="lse has shape"):
        cupyflash.merge_attention_states_stacked(np.stack([out, out]), np.stack([lse, lse, lse]))
    with pytest.raises(ValueError, match=r"out: 5-dimensional array given. Array must be 4-dimensional \(parts, total_q, "
                       r"heads, headdim_v\) with packed=True"):
        cupyflash.merge_attention_states_stacked(np.stack([out, out]), np.stack([lse, lse]), packed=True)
    with pytest.raises(ValueError, match="out: 3-dimensional array given. Array must be 5-dimensional"):
        cupyflash.merge_attention_states_stacked(out[0], lse[0])
    with pytest.raises(TypeError, match="packed must be a bool, got int 1"):
        cupyflash.merge_attention_states_stacked(np.stack([out, out]), np.stack([lse, lse]), packed=1)
    packed_out, packed_lse = np.zeros((5, 2, 8), np.float32), np.zeros((2, 5))
    assert cupyflash.merge_attention_states(packed_out, packed_lse, packed_out, packed_lse)[0].shape == (5, 2, 8)
    with pytest.raises(ValueError, match=r"expected \(2, 5\), \(heads, total_q\)"):
        cupyflash.merge_attention_states(packed_out, packed_lse.T, packed_out, packed_lse)


def test_more_parts_than_a_launch_merge_in_rounds():
    """Past MERGE_PARTS parts the twin merges in rounds, as the kernel's launches do: 20 parts are the first
    16 merged, rounded to the parts' dtype, then merged with the other 4, bitwise; and still the
    attention over all keys within the reference merge's tolerance."""
    rng = np.random.default_rng(11)
    outs = [random_normal(np, (1, 3, 2, 8), DTYPES["bfloat16"], rng) for _ in range(20)]
    lses = [(rng.standard_normal((1, 2, 3)) * 10).astype(np.float32) for _ in range(20)]
    out, lse = cupyflash.merge_attention_states_stacked(np.stack(outs), np.stack(lses))
    first, first_lse = cupyflash.merge_attention_states_stacked(np.stack(outs[:16]), np.stack(lses[:16]))
    rounds, rounds_lse = cupyflash.merge_attention_states_stacked(np.stack([first, *outs[16:]]),
                                                                  np.stack([first_lse, *lses[16:]]))
    assert np.array_equal(out.view(np.uint16), rounds.view(np.uint16)) and np.array_equal(lse, rounds_lse)
    ref_out, ref_lse = reference.merge_attention_states(outs, lses)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-6)
    np.testing.assert_allclose(out.astype(np.float64), ref_out, rtol=2e-2, atol=2e-2 * np.abs(ref_out).max())


def test_reference_merge_is_attention_over_all_keys():
    """The oracle merge against the oracle attention, three parts, one of them invisible to some rows."""
    q, k, v = random_qkv(np, 2, 21, 33, 2, 1, 8, 8, DTYPES["float64"], seed=7)
    scale = 8**-0.5
    bounds = [(0, 5), (5, 20), (20, 33)]
    # Query i sees key j iff j <= i + 33 - 21 + 3; over keys [a, b) that is the window (-1, 36 - b).
    parts = [reference.attention(q, k[:, a:b], v[:, a:b], softmax_scale=scale, window_size=(-1, 36 - b))
             for a, b in bounds]
    assert np.isneginf(parts[2][1][:, :, :5]).all()
    out, lse = reference.merge_attention_states([p[0] for p in parts], [p[1] for p in parts])
    full_out, full_lse = reference.attention(q, k, v, softmax_scale=scale, window_size=(-1, 3))
    np.testing.assert_allclose(out, full_out, rtol=1e-13, atol=1e-13)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(full_lse))
    finite = np.isfinite(full_lse)
    np.testing.assert_allclose(lse[finite], full_lse[finite], rtol=1e-13)


@pytest.mark.gpu
def test_merges_have_plans_that_take_new_arrays():
    """The CuPy merges keep a plan per layout: later calls with other arrays (other addresses) run it, its
    generated run and graph from the third call on, and still give the reference merge of their own
    parts (stacked parts read where they lie, at their offsets; the two-part form too)."""
    from cupyflash import _api

    _api.PLANS.clear()
    rng = np.random.default_rng(12)
    dt = DTYPES["bfloat16"]
    for _ in range(3):
        stack = random_normal(cupy, (5, 2, 7, 3, 40), dt, rng)
        lses = cupy.asarray((rng.standard_normal((5, 2, 3, 7)) * 10).astype(np.float32))
        out, lse = cupyflash.merge_attention_states_stacked(stack, lses)
        pair_out, pair_lse = cupyflash.merge_attention_states(stack[0], lses[0], stack[1], lses[1])
        for got, got_lse, n in ((out, lse, 5), (pair_out, pair_lse, 2)):
            ref_out, ref_lse = reference.merge_attention_states([to_host(p) for p in stack[:n]],
                                                                [to_host(x) for x in lses[:n]])
            np.testing.assert_allclose(to_host(got_lse), ref_lse, rtol=4e-3)
            np.testing.assert_allclose(to_host(got).astype(np.float64), ref_out, rtol=4e-3,
                                       atol=4e-3 * np.abs(ref_out).max())
    assert len(_api.PLANS) == 2, "one plan for each form"
