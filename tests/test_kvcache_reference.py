"""cupyflash.reference.attention_with_kvcache and apply_rotary (the oracle of the KV-cache API, issue 11)
against independent constructions: a paged cache is a dense one with its pages shuffled, appending is
attending to the concatenation, rotary embedding is a complex multiplication, cache_batch_idx permutes
the cache rows. NumPy, float64."""

import numpy as np
import pytest

from cupyflash import reference

RNG = np.random.default_rng(11)


def _normal(*shape):
    return RNG.standard_normal(shape)


def _paged(cache, page_size, table=None):
    """A paged copy of a dense cache (batch, capacity, heads, dim) and its block table: the pages in
    shuffled order, or placed by the given table."""
    batch, capacity = cache.shape[:2]
    pages = capacity // page_size
    if table is None:
        table = RNG.permutation(batch * pages).reshape(batch, pages).astype(np.int32)
    paged = np.empty((batch * pages, page_size) + cache.shape[2:])
    for b in range(batch):
        for p in range(pages):
            paged[table[b, p]] = cache[b, p * page_size:(p + 1) * page_size]
    return paged, table


@pytest.mark.parametrize("causal, window", [(False, (-1, -1)), (True, (-1, -1)), (False, (5, 2))])
def test_dense_cache_is_attention_to_its_prefix(causal, window):
    q = _normal(3, 4, 4, 16)
    k_cache, v_cache = _normal(3, 40, 2, 16), _normal(3, 40, 2, 8)
    lengths = np.array([40, 7, 0], np.int32)
    out, lse, kc, vc = reference.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, causal=causal,
                                                        window_size=window)
    assert np.array_equal(kc, k_cache) and np.array_equal(vc, v_cache)
    for b, n in enumerate(lengths):
        want_out, want_lse = reference.attention(q[b:b + 1], k_cache[b:b + 1, :n], v_cache[b:b + 1, :n], causal,
                                                 window_size=window)
        np.testing.assert_array_equal(out[b:b + 1], want_out)
        np.testing.assert_array_equal(lse[b:b + 1], want_lse)
    assert np.isneginf(lse[2]).all() and not out[2].any()


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_paged_cache_equals_dense(page_size):
    q = _normal(2, 3, 4, 16)
    k_cache, v_cache = _normal(2, 32, 2, 16), _normal(2, 32, 2, 16)
    k_new, v_new = _normal(2, 3, 2, 16), _normal(2, 3, 2, 16)
    lengths = np.array([13, 29], np.int32)
    dense = reference.attention_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new, cache_seqlens=lengths, causal=True)
    k_paged, table = _paged(k_cache, page_size)
    v_paged, _ = _paged(v_cache, page_size, table)
    paged = reference.attention_with_kvcache(q, k_paged, v_paged, k=k_new, v=v_new, cache_seqlens=lengths,
                                             block_table=table, causal=True)
    np.testing.assert_array_equal(paged[0], dense[0])
    np.testing.assert_array_equal(paged[1], dense[1])
    for b in range(2):  # the appended keys landed at positions 13-15 and 29-31 of the right pages
        for i, t in enumerate(range(lengths[b], lengths[b] + 3)):
            assert np.array_equal(paged[2][table[b, t // page_size], t % page_size], k_new[b, i])
            assert np.array_equal(dense[2][b, t], k_new[b, i])


def test_append_is_attention_to_the_concatenation():
    q = _normal(2, 5, 6, 8)
    k_cache, v_cache = _normal(2, 20, 3, 8), _normal(2, 20, 3, 8)
    k_new, v_new = _normal(2, 5, 3, 8), _normal(2, 5, 3, 8)
    lengths = np.array([4, 15], np.int32)
    slopes = np.abs(_normal(2, 6)).astype(np.float32)
    out, lse, kc, _ = reference.attention_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new, cache_seqlens=lengths,
                                                       causal=True, softcap=3.0, alibi_slopes=slopes)
    for b, n in enumerate(lengths):
        keys = np.concatenate([k_cache[b, :n], k_new[b]])[None]
        values = np.concatenate([v_cache[b, :n], v_new[b]])[None]
        want_out, want_lse = reference.attention(q[b:b + 1], keys, values, True, softcap=3.0, alibi_slopes=slopes[b])
        np.testing.assert_allclose(out[b:b + 1], want_out, rtol=1e-14, atol=1e-14)
        np.testing.assert_allclose(lse[b:b + 1], want_lse, rtol=1e-14)
        assert np.array_equal(kc[b, :n], k_cache[b, :n]) and np.array_equal(kc[b, n + 5:], k_cache[b, n + 5:])


@pytest.mark.parametrize("interleaved", [True, False])
def test_rotary_is_a_complex_rotation(interleaved):
    x = _normal(2, 3, 2, 12)
    rotary_dim = 8
    angles = _normal(10, rotary_dim // 2)
    positions = np.array([[0, 4, 9], [3, 3, 7]])
    got = reference.apply_rotary(x, np.cos(angles), np.sin(angles), positions, interleaved)
    if interleaved:
        z = x[..., 0:rotary_dim:2] + 1j * x[..., 1:rotary_dim:2]
    else:
        z = x[..., :rotary_dim // 2] + 1j * x[..., rotary_dim // 2:rotary_dim]
    z = z * np.exp(1j * angles[positions])[:, :, None, :]
    want = x.copy()
    if interleaved:
        want[..., 0:rotary_dim:2], want[..., 1:rotary_dim:2] = z.real, z.imag
    else:
        want[..., :rotary_dim // 2], want[..., rotary_dim // 2:rotary_dim] = z.real, z.imag
    np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-14)
    assert np.array_equal(got[..., rotary_dim:], x[..., rotary_dim:])


@pytest.mark.parametrize("causal", [False, True])
def test_rotary_positions_of_queries_and_new_keys(causal):
    """New keys at their cache positions; queries at theirs when causal, all at cache_seqlens otherwise."""
    q = _normal(1, 3, 2, 8)
    k_cache, v_cache = _normal(1, 12, 1, 8), _normal(1, 12, 1, 8)
    k_new, v_new = _normal(1, 3, 1, 8), _normal(1, 3, 1, 8)
    angles = _normal(12, 2)
    cos, sin = np.cos(angles), np.sin(angles)
    out, _, kc, _ = reference.attention_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new, cache_seqlens=5,
                                                     rotary_cos=cos, rotary_sin=sin, causal=causal)
    k_rot = reference.apply_rotary(k_new, cos, sin, np.array([[5, 6, 7]]))
    np.testing.assert_array_equal(kc[0, 5:8], k_rot[0])
    q_rot = reference.apply_rotary(q, cos, sin, np.array([[5, 6, 7]]) if causal else np.array([[5, 5, 5]]))
    keys = np.concatenate([k_cache[0, :5], k_rot[0]])[None]
    values = np.concatenate([v_cache[0, :5], v_new[0]])[None]
    want, _ = reference.attention(q_rot, keys, values, causal)
    np.testing.assert_allclose(out, want, rtol=1e-14, atol=1e-14)


def test_cache_batch_idx_picks_cache_rows():
    q = _normal(2, 1, 2, 8)
    k_cache, v_cache = _normal(3, 10, 2, 8), _normal(3, 10, 2, 8)
    idx = np.array([2, 0], np.int32)
    got = reference.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=np.array([6, 9], np.int32),
                                           cache_batch_idx=idx)
    want = reference.attention_with_kvcache(q, k_cache[idx], v_cache[idx], cache_seqlens=np.array([6, 9], np.int32))
    np.testing.assert_array_equal(got[0], want[0])


def test_overfull_cache_is_refused():
    with pytest.raises(ValueError, match="do not fit caches of 10"):
        reference.attention_with_kvcache(_normal(1, 1, 1, 8), _normal(1, 10, 1, 8), _normal(1, 10, 1, 8),
                                         k=_normal(1, 2, 1, 8), v=_normal(1, 2, 1, 8), cache_seqlens=9)
