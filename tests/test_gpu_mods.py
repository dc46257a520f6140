"""Score and mask functions on the GPU (GPU only): the general kernels built with the generated code of a
score_mod or a mask_mod (kernels_cu/common/user_calls.cuh) against the float64 oracle under the tolerance
rule, with the buffers' gradients; the built-ins written as score_mods against the built-ins; the
compiled variants cached by expression."""

import functools

import numpy as np
import pytest
from helpers import DTYPES, check_dense, check_varlen, gpu_available, random_qkv, to_host, use_family
from test_mods import _alibi_mod, _documents, _softcap_mod, _table, gated, rel_bias, same_document

import cupyflash
from cupyflash import _kernels, mods

pytestmark = pytest.mark.gpu

if gpu_available():
    import cupy
else:
    cupy = None


@pytest.mark.parametrize("dtype, family", [("float64", ""), ("float64", "general"), ("float32", ""), ("float32", "sm80"),
                                           ("float32", "general"), ("bfloat16", ""), ("bfloat16", "sm80"),
                                           ("bfloat16", "general"), ("float16", "")])
def test_score_mod_against_the_oracle(dtype, family, monkeypatch):
    """T5 relative bias with its learned table (the table's gradient too), GQA, causal, odd sizes: the
    forward on every family's kernels (float32 on the Hopper planes, float64 on the float64 tensor cores),
    the backward on sm80's (16-bit) or the general kernels'."""
    use_family(monkeypatch, family)
    table = cupy.asarray(_table((4, 21), seed=5) * np.float32(0.5))
    check_dense(cupy, (2, 37, 45, 4, 2, 24, 16), DTYPES[dtype], causal=True, score_mod=rel_bias,
                score_mod_buffers=(table,))


@pytest.mark.parametrize("local", [True, False])
def test_buffer_gradients_on_the_tensor_cores(local, monkeypatch):
    """An additive bias's table gradient from the sm80 backward (which the H200 takes at head dim 64 too):
    summed per CTA in shared memory, or with the room taken away, added per element into the
    accumulators; the forward on sm80's kernel too. Rows long enough for tiles past the bias's clip
    (FrozenScores) and near it."""
    from cupyflash._families import sm80

    use_family(monkeypatch, "sm80")
    if not local:
        monkeypatch.setattr(sm80, "LOCAL_GRAD_MAX_FLOATS", 0)
    table = cupy.asarray(_table((4, 21), seed=23))
    check_dense(cupy, (2, 150, 190, 4, 2, 64, 64), DTYPES["bfloat16"], causal=True, score_mod=rel_bias,
                score_mod_buffers=(table,))


@pytest.mark.parametrize("headdim, deterministic", [(128, False), (96, False), (128, True)])
def test_buffer_gradients_on_the_hopper_backward(headdim, deterministic, monkeypatch):
    """An additive bias's table gradient from the Hopper backward (head dims 96 and 128, where it takes
    them): tiles past the bias's clip sum their dS^T per thread (FrozenScores), the others add each
    pair's, read back from the dS^T buffer; causal, GQA, odd sizes, rows long enough for both kinds of
    tile, and the deterministic exact sums. The call's own plan (built afresh) takes that kernel."""
    from cupyflash import _api
    from cupyflash._families import sm90

    _api.PLANS.clear()
    chosen = []
    select = sm90.BACKWARD.select
    monkeypatch.setattr(sm90.BACKWARD, "select", lambda *args: chosen.append(select(*args)) or chosen[-1])
    table = cupy.asarray(_table((4, 21), seed=29))
    check_dense(cupy, (2, 300, 333, 4, 2, headdim, headdim), DTYPES["bfloat16"], causal=True,
                deterministic=deterministic, score_mod=rel_bias, score_mod_buffers=(table,))
    assert any(v is not None and v.key.startswith(f"sm90_bwd_bf16_d{headdim}_") and v.user is not None for v in chosen)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_fast_forms_on_16_bit_inputs(dtype):
    """16-bit inputs take the fast forms (special-function approximations, fused arithmetic) on every
    kernel of the call: a sigmoid-gated bias whose buckets, (k - q) / 1.7 floored, stay exact; its
    gradient reads the score, so the backward is the general kernels', in the same forms."""
    table = cupy.asarray(_table((4, 21), seed=32))

    def fn(s, b, h, qi, ki, t):
        return s * mods.sigmoid(t[h, mods.clip(mods.floor((ki - qi) / 1.7).astype(np.int32) + 10, 0, 20)])

    check_dense(cupy, (2, 70, 90, 4, 2, 64, 64), DTYPES[dtype], causal=True, score_mod=fn, score_mod_buffers=(table,))


def test_score_mod_with_a_window_and_int_buffer():
    """A gated bias with an int buffer (its gradient None) inside a sliding window, head dims 72 / 40."""
    shift = cupy.asarray(np.array([3], np.int32))

    def fn(s, b, h, qi, ki, t, sh):
        return s * mods.sigmoid(t[h, mods.clip(ki - qi + sh[0], 0, 20)])

    table = cupy.asarray(_table((3, 21), seed=6))
    got = check_dense(cupy, (1, 70, 90, 3, 3, 72, 40), DTYPES["float32"], window_size=(25, 10), score_mod=fn,
                      score_mod_buffers=(table, shift))
    assert "dbuffer0" in got and "dbuffer1" not in got


def test_score_mod_varlen_against_the_oracle():
    """Packed sequences: b is the sequence index (the function reads it)."""
    table = cupy.asarray(_table((3, 21), seed=6))
    check_varlen(cupy, [5, 0, 17, 33], [9, 4, 17, 20], 3, 1, 16, 16, DTYPES["float32"], causal=True, score_mod=gated,
                 score_mod_buffers=(table,))


def test_builtins_written_as_score_mods_are_the_builtins(monkeypatch):
    """On the general kernels, softcap and ALiBi written as score_mods compute the built-ins' operations
    (the same correctly rounded steps): the same forward bits; gradients within a few roundings (the
    derivative is written differently)."""
    use_family(monkeypatch, "general")
    q, k, v = random_qkv(cupy, 2, 19, 23, 4, 4, 16, 16, np.float32, seed=7)
    dout = cupy.asarray(np.random.default_rng(8).standard_normal((2, 19, 4, 16)).astype(np.float32))
    slopes = cupy.asarray(np.random.default_rng(9).uniform(0.1, 1.0, 4).astype(np.float32))
    for builtin, mod in (({"softcap": 3.0}, {"score_mod": _softcap_mod(3.0)}),
                         ({"alibi_slopes": slopes}, {"score_mod": _alibi_mod(19, 23), "score_mod_buffers": (slopes,)})):
        out, lse = cupyflash.flash_attention(q, k, v, causal=True, return_lse=True, **builtin)
        out_m, lse_m = cupyflash.flash_attention(q, k, v, causal=True, return_lse=True, **mod)
        np.testing.assert_array_equal(to_host(out_m), to_host(out))
        np.testing.assert_array_equal(to_host(lse_m), to_host(lse))
        grads = cupyflash.flash_attention_backward(dout, q, k, v, out, lse, causal=True, **builtin)
        grads_m = cupyflash.flash_attention_backward(dout, q, k, v, out_m, lse_m, causal=True, **mod)
        for a, b in zip(grads_m[:3], grads):
            np.testing.assert_allclose(to_host(a), to_host(b), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype, family", [("float32", ""), ("bfloat16", ""), ("bfloat16", "sm80"),
                                           ("bfloat16", "general")])
def test_document_mask_against_the_oracle(dtype, family, monkeypatch):
    """A document mask built on the device from CuPy buffers (the kernels evaluate it on the tiles that
    cover partial blocks), causal."""
    use_family(monkeypatch, family)
    doc = cupy.asarray(_documents(2, 150, 5, 12))
    mask = cupyflash.BlockMask.from_mask_mod(same_document, 2, 1, 150, 150, block_size=(64, 64), buffers=(doc,))
    check_dense(cupy, (2, 150, 150, 4, 2, 16, 16), DTYPES[dtype], causal=True, block_mask=mask)


def test_hopper_backward_writes_the_query_tiles_no_key_tile_visits(monkeypatch):
    """The Hopper 16-bit backward stores each query tile's first dQ share into unzeroed buffers
    (BwdArgs::dq_claims); the conversion writes the rows of tiles no key tile visits as zeros. A mask_mod
    hiding every key from queries 100-255 (an empty 128-row block of the mask: two 64-row tiles no walk
    visits, and part of a partial block's tile), GQA, odd sizes,
    after a call without it of the same shapes, whose buffers the memory pool hands back holding its sums:
    those rows' dQ exactly zero, every gradient the oracle's under the tolerance rule."""
    from cupyflash import _api
    from cupyflash._families import sm90

    sizes = (2, 300, 333, 4, 2, 128, 128)
    q, k, v = random_qkv(cupy, *sizes, DTYPES["bfloat16"], seed=41)
    out, lse = cupyflash.flash_attention(q, k, v, return_lse=True)
    cupyflash.flash_attention_backward(out, q, k, v, out, lse)
    _api.PLANS.clear()
    chosen = []
    select = sm90.BACKWARD.select
    monkeypatch.setattr(sm90.BACKWARD, "select", lambda *args: chosen.append(select(*args)) or chosen[-1])
    mask = cupyflash.BlockMask.from_mask_mod(lambda b, h, qi, ki: (qi < 100) | (qi >= 256), 1, 1, 300, 333,
                                             block_size=(128, 128))
    got = check_dense(cupy, sizes, DTYPES["bfloat16"], block_mask=mask)
    assert any(c is not None and c.key.startswith("sm90_bwd_bf16_d128_") for c in chosen)
    assert not to_host(got["dq"])[:, 100:256].any()


@pytest.mark.parametrize("dtype, family", [("bfloat16", ""), ("float16", ""), ("bfloat16", "sm80")])
def test_tensor_core_kernels_with_both_functions(dtype, family, monkeypatch):
    """The Hopper (or sm80) forward and backward at head dim 128 over several key tiles: a softcap
    score_mod (no buffers) inside a document mask of 8 documents (block size 128), GQA."""
    use_family(monkeypatch, family)
    doc = cupy.asarray(_documents(2, 700, 8, 21))
    mask = cupyflash.BlockMask.from_mask_mod(same_document, 2, 1, 700, 700, buffers=(doc,))
    check_dense(cupy, (2, 700, 700, 4, 2, 128, 128), DTYPES[dtype], causal=True, block_mask=mask,
                score_mod=_softcap_mod(20.0))


def test_hopper_backward_launches_key_tiles_longest_walk_first(monkeypatch):
    """Under a block mask the Hopper backward takes each (batch entry, kv head) pair's key tiles longest
    walk first (kernels_cu/sm90/bwd_key_order.cu), every pair's longest before the rest
    (common/scheduler.cuh's schedule_ranked_tail): its order kernel against the walks counted on the host
    from the mask's layout (causal, GQA, two batch entries with their own documents, a short last tile),
    and the walks' ranges in the lists it leaves for the producers (BwdArgs::walk_ranges);
    and dK and dV are bitwise those of the tiles-fastest order, as no CTA's own sums depend on when it
    runs (a tile computed twice and another never would differ), with the host's tail of pairs in turn
    (here every pair) and with one pair in turn after the others' tiles fastest."""
    from cupyflash import _api, _params, _problem
    from cupyflash._families import common, sm90

    if common.current_device().capability != 90:
        pytest.skip("the Hopper backward runs on compute capability 9.0")
    b, s, h, hk, d = 2, 700, 4, 2, 128
    tile_q, tile_k, group = 64, 128, h // hk  # (the 16-bit backward's tiles at head dim 128)
    doc = cupy.asarray(_documents(b, s, 8, 21))
    mask = cupyflash.BlockMask.from_mask_mod(same_document, b, 1, s, s, buffers=(doc,))
    q, k, v = random_qkv(cupy, b, s, s, h, hk, d, d, DTYPES["bfloat16"], seed=3)
    p = _problem.forward_problem(q, k, v, causal=True, block_mask=mask)
    tiles = -(-s // tile_k)
    args = np.zeros(1, _params.BWD_ARGS)
    args["attn"] = common.attn(p, q, k, v, mask.tile_lists(cupy, tile_q, tile_k))
    order = cupy.full((b * hk, tiles), -1, np.int32)
    ranges = cupy.full((b * hk, tiles, group, 2), -1, np.int32)
    args["key_order"], args["walk_ranges"] = order.data.ptr, ranges.data.ptr
    _kernels.get_kernel(sm90.BWD_KEY_ORDER.variant())((b * hk,), (sm90.KEY_ORDER_THREADS,), (args,),
                                                      shared_mem=4 * tiles)
    layout = to_host(mask.layout)  # (b, 1, blocks, blocks) of 128 x 128
    q_tiles = -(-s // tile_q)
    for pair, (row, pair_ranges) in enumerate(zip(to_host(order), to_host(ranges))):
        # Query tile t (rows 64 t ...) in block row t // 2, listed where its block is set; causal: the
        # walk runs from the key tile's first key on, so its range is the list's entries from there.
        listed = [[t for t in range(q_tiles) if layout[pair // hk, 0, t * tile_q // 128, kt]] for kt in range(tiles)]
        first = np.array([sum(t < kt * tile_k // tile_q for t in ts) for kt, ts in enumerate(listed)])
        counts = np.array([len(ts) for ts in listed]) - first
        assert len(set(counts)) > 2, counts  # (a test of the order needs uneven walks)
        np.testing.assert_array_equal(row, np.argsort(-group * counts, kind="stable"))
        for g in range(group):
            np.testing.assert_array_equal(pair_ranges[:, g], np.stack([first, counts], axis=1))
    out, lse = cupyflash.flash_attention(q, k, v, causal=True, block_mask=mask, return_lse=True)
    dout = cupy.asarray(np.random.default_rng(4).standard_normal(out.shape).astype(np.float32)).astype(out.dtype)
    ordered = [cupyflash.flash_attention_backward(dout, q, k, v, out, lse, causal=True, block_mask=mask)]
    _api.PLANS.clear()
    host_tail = sm90.bwd_tail_pairs
    assert host_tail(p, tiles, False, common.current_device().sm_count, True) == b * hk  # (every pair)
    monkeypatch.setattr(sm90, "bwd_tail_pairs", lambda *_: 1)
    ordered.append(cupyflash.flash_attention_backward(dout, q, k, v, out, lse, causal=True, block_mask=mask))
    _api.PLANS.clear()
    monkeypatch.setattr(sm90, "bwd_tail_pairs", host_tail)
    monkeypatch.setattr(sm90, "KEY_ORDER_MAX_TILES", 0)  # the tiles-fastest order
    plain = cupyflash.flash_attention_backward(dout, q, k, v, out, lse, causal=True, block_mask=mask)
    _api.PLANS.clear()
    for tail, grads in zip(("every pair", "one pair"), ordered):
        for name, got, want in zip(("dk", "dv"), grads[1:], plain[1:]):
            assert cupy.array_equal(got, want), (tail, name)


@pytest.mark.parametrize("dtype, family", [("float32", ""), ("float32", "sm80"), ("float64", "")])
def test_wide_kernels_with_both_functions(dtype, family, monkeypatch):
    """float32 (Hopper planes, or sm80's parts) and float64 (the float64 tensor cores), forward and
    backward, with a softcap score_mod inside a document mask."""
    use_family(monkeypatch, family)
    doc = cupy.asarray(_documents(1, 230, 3, 26))
    mask = cupyflash.BlockMask.from_mask_mod(same_document, 1, 1, 230, 230, block_size=(64, 64), buffers=(doc,))
    check_dense(cupy, (1, 230, 230, 2, 1, 64, 64), DTYPES[dtype], causal=True, block_mask=mask,
                score_mod=_softcap_mod(20.0))


@pytest.mark.parametrize("dtype, family", [("float32", ""), ("float32", "sm80"), ("float64", ""), ("bfloat16", "")])
def test_score_mod_that_masks_with_minus_infinity(dtype, family, monkeypatch):
    """FlexAttention's masking idiom, a score of -inf for the pairs a row must not see (causal, written as a
    score_mod), forward and backward: the float32 backwards take P = exp(s - lse) from the lse as a float
    pair, whose TwoSum made s = -inf NaN (common/lse_pair.cuh), which every gradient then carried."""
    use_family(monkeypatch, family)
    check_dense(cupy, (1, 67, 75, 2, 1, 64, 64), DTYPES[dtype],
                score_mod=lambda s, b, h, qi, ki: mods.where(qi >= ki, s, -np.inf))


@pytest.mark.parametrize("headdim", [64, 256])
def test_hopper_kernels_at_other_head_dims(headdim):
    """An ALiBi-like bias from positions and head alone (no buffers) inside a document mask: the 192-row
    forward tile is not taken at head dim 64, the split-column backward runs at 256."""
    doc = cupy.asarray(_documents(1, 300, 4, 22))
    mask = cupyflash.BlockMask.from_mask_mod(same_document, 1, 1, 300, 300, buffers=(doc,))
    check_dense(cupy, (1, 300, 300, 2, 2, headdim, headdim), DTYPES["bfloat16"], causal=True, block_mask=mask,
                score_mod=lambda s, b, h, qi, ki: s - (h + 1) * 0.25 * mods.abs(qi - ki))


def test_host_built_mask_with_a_score_mod():
    """A mask built on the host (its buffers copied to the device once) with a score_mod: both functions
    in one kernel, float64."""
    doc = _documents(1, 97, 3, 14)
    mask = cupyflash.BlockMask.from_mask_mod(same_document, 1, 1, 97, 97, block_size=(16, 32), buffers=(doc,))
    table = cupy.asarray(_table((2, 21), seed=15))
    check_dense(cupy, (1, 97, 97, 2, 2, 32, 32), DTYPES["float64"], block_mask=mask, score_mod=rel_bias,
                score_mod_buffers=(table,))


def test_mask_mod_window_is_the_window():
    """A sliding window written as a mask_mod gives window_size's result (float64)."""
    q, k, v = random_qkv(cupy, 1, 90, 90, 2, 2, 16, 16, np.float64, seed=13)
    window = cupyflash.BlockMask.from_mask_mod(lambda b, h, qi, ki: (ki <= qi) & (qi - ki <= 20), 1, 1, 90, 90,
                                               block_size=(32, 32))
    np.testing.assert_allclose(to_host(cupyflash.flash_attention(q, k, v, block_mask=window)),
                               to_host(cupyflash.flash_attention(q, k, v, window_size=(20, 0))), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("size", [5, 0])
def test_out_of_range_index_makes_the_rows_nan(size):
    q, k, v = random_qkv(cupy, 1, 4, 6, 1, 1, 8, 8, np.float32, seed=16)
    table = cupy.zeros(size, np.float32)
    out = cupyflash.flash_attention(q, k, v, score_mod=lambda s, b, h, qi, ki, t: s + t[ki], score_mod_buffers=(table,))
    assert np.isnan(to_host(out)).all()  # every row sees key 5, past the table


@pytest.mark.parametrize("dtype, headdim", [("float32", 8), ("bfloat16", 64)])
def test_mask_mod_reading_an_empty_buffer_makes_the_rows_nan(dtype, headdim):
    """A mask_mod's loads read element 0 of a buffer whether or not the index is in range (common/
    user_mod.cuh's user_mask_load), so an empty buffer reads a zero of its own (_families/common.py's
    mod_buffers), and every row is NaN as on NumPy; bfloat16 at head dim 64 on the 16-bit tensor-core
    kernels, whose loop evaluates the function (UserMaskAt::bits)."""
    q, k, v = random_qkv(cupy, 1, 40, 60, 1, 1, headdim, headdim, DTYPES[dtype], seed=16)
    mask = cupyflash.BlockMask.from_mask_mod(lambda b, h, qi, ki, d: d[ki] == 0, 1, 1, 40, 60, block_size=(16, 16),
                                             buffers=(cupy.zeros(0, np.int32),))
    assert np.isnan(to_host(cupyflash.flash_attention(q, k, v, block_mask=mask)).astype(np.float32)).all()


def test_variants_are_cached_by_expression():
    """A new closure with the same expression reuses the compiled kernel; a changed constant is a new
    variant."""
    q, k, v = random_qkv(cupy, 1, 16, 16, 2, 2, 16, 16, np.float32, seed=17)

    def capped(cap):
        return lambda s, b, h, qi, ki: cap * mods.tanh(s / cap)

    cupyflash.flash_attention(q, k, v, score_mod=capped(5.0))
    before = len(_kernels._kernels)
    cupyflash.flash_attention(q, k, v, score_mod=capped(5.0))
    assert len(_kernels._kernels) == before
    cupyflash.flash_attention(q, k, v, score_mod=capped(6.0))
    assert len(_kernels._kernels) == before + 1


@pytest.mark.parametrize("dtype, family", [("bfloat16", ""), ("float32", ""), ("float64", "general")])
def test_deterministic_buffer_gradients(dtype, family, monkeypatch):
    """deterministic=True: the table's gradient from exact sums (kernels_cu/common/exact_sum.cuh), the same
    bits in every run (on the sm80 16-bit backward and the general kernels), and within the rule."""
    use_family(monkeypatch, family)
    table = cupy.asarray(_table((4, 21), seed=19))
    got = check_dense(cupy, (2, 77, 90, 4, 2, 32, 32), DTYPES[dtype], causal=True, deterministic=True,
                      score_mod=rel_bias, score_mod_buffers=(table,))
    q, k, v = random_qkv(cupy, 2, 77, 90, 4, 2, 32, 32, DTYPES[dtype], seed=30)
    dout = cupy.asarray(np.random.default_rng(31).standard_normal((2, 77, 4, 32)).astype(DTYPES[dtype]))
    out, lse = cupyflash.flash_attention(q, k, v, causal=True, return_lse=True, score_mod=rel_bias,
                                         score_mod_buffers=(table,))
    runs = [cupyflash.flash_attention_backward(dout, q, k, v, out, lse, causal=True, deterministic=True,
                                               score_mod=rel_bias, score_mod_buffers=(table,))[3][0]
            for _ in range(3)]
    for again in runs[1:]:
        np.testing.assert_array_equal(to_host(again), to_host(runs[0]))
    assert "dbuffer0" in got


@pytest.mark.parametrize("block_size", [(64, 64), (16, 48), (128, 1)])
def test_device_block_classes_are_the_hosts(block_size):
    """BlockMask.from_mask_mod's kernel (one CTA per block) classifies blocks as the host does: odd
    sizes, heads read by the function, an out-of-range index (keys past the table make their blocks
    set and not full)."""
    doc = _documents(2, 150, 5, 20)
    limit = np.array([140], np.int32)

    def fn(b, h, qi, ki, d, n):
        return ((d[b, qi] == d[b, ki]) & (ki <= qi + h)) | (d[b, mods.minimum(ki, n[0])] < 0)

    host = cupyflash.BlockMask.from_mask_mod(fn, 2, 3, 150, 151, block_size=block_size, buffers=(doc, limit))
    device = cupyflash.BlockMask.from_mask_mod(fn, 2, 3, 150, 151, block_size=block_size,
                                               buffers=(cupy.asarray(doc), cupy.asarray(limit)))
    np.testing.assert_array_equal(to_host(device.layout), host.layout)
    np.testing.assert_array_equal(to_host(device.mask_mod[2]), host.mask_mod[2])


def _fragment_words(visible):
    """The words mask_mod_bits keeps for a block of 128 positions a row (kernels_cu/common/
    mask_mod_blocks.cu): word [i, c] holds at bit t whether row i sees position 2 c + 8 (t // 2) + t % 2."""
    t = np.arange(32)
    words = np.zeros((visible.shape[0], 4), np.uint64)
    for c in range(4):
        cols = 2 * c + 8 * (t // 2) + t % 2
        words[:, c] = (visible[:, cols].astype(np.uint64) << t.astype(np.uint64)).sum(axis=1)
    return words.astype(np.uint32)


def test_device_mask_keeps_its_partial_blocks_as_bits():
    """from_mask_mod on the device keeps the pairs of each partial block (some pair visible, not every)
    as bits, in both orientations and the order a row fragment holds them, checked against the function
    on the host: odd lengths (pairs past them read 0), heads read by the function, and a block where the
    function reads out of range (its pairs stay visible with a NaN score, which bits cannot hold) left to
    the function (slot -1). Other blocks have no slot."""
    seqlen_q, seqlen_k, heads = 300, 333, 2
    doc = _documents(2, 333, 6, 31)
    table = np.ones(290, np.int32)

    def fn(b, h, qi, ki, d, t):
        return ((d[b, qi] == d[b, ki]) & (ki <= qi + 40 * h)) | (t[ki] > 1)

    mask = cupyflash.BlockMask.from_mask_mod(fn, 2, heads, seqlen_q, seqlen_k, buffers=(cupy.asarray(doc),
                                                                                         cupy.asarray(table)))
    slot, bits = (to_host(x) for x in mask._element_bits)
    some, every = to_host(mask.layout), to_host(mask.mask_mod[2])
    bits = bits.reshape(-1, 2, 128 * 4)
    q = np.arange(3 * 128)[:, None]
    k = np.arange(3 * 128)[None, :]
    checked = 0
    for b, h, r, c in np.ndindex(slot.shape):
        poisoned = (c + 1) * 128 > 290  # keys past the table: the blocks of the last column
        if not some[b, h, r, c] or every[b, h, r, c] or poisoned:
            assert slot[b, h, r, c] == -1, (b, h, r, c)
            continue
        qq, kk = q[r * 128:(r + 1) * 128], k[:, c * 128:(c + 1) * 128]
        inside = (qq < seqlen_q) & (kk < seqlen_k)
        seen = (doc[b, np.minimum(qq, seqlen_k - 1)] == doc[b, np.minimum(kk, seqlen_k - 1)]) & (kk <= qq + 40 * h)
        visible = seen & inside
        words = bits[slot[b, h, r, c]]
        np.testing.assert_array_equal(words[0].reshape(128, 4), _fragment_words(visible))
        np.testing.assert_array_equal(words[1].reshape(128, 4), _fragment_words(visible.T))
        checked += 1
    assert checked >= 4
    assert len(np.unique(slot[slot >= 0])) == checked


def test_mask_keeps_no_bits_past_its_limits(monkeypatch):
    """No bits for block sides that are not multiples of 128 (a word holds 128 positions of a row), nor
    past ELEMENT_BITS_MAX_BYTES: the kernels then evaluate the function on every partial tile."""
    from cupyflash import _block_mask

    doc = cupy.asarray(_documents(1, 300, 5, 35))
    build = functools.partial(cupyflash.BlockMask.from_mask_mod, same_document, 1, 1, 300, 300, buffers=(doc,))
    assert build()._element_bits is not None
    assert build(block_size=(64, 128))._element_bits is None
    monkeypatch.setattr(_block_mask, "ELEMENT_BITS_MAX_BYTES", 4095)  # less than one block's 4 KB
    assert build()._element_bits is None


@pytest.mark.parametrize("dtype, headdim, causal", [("bfloat16", 128, True), ("float16", 64, False),
                                                   ("float32", 128, True)])
def test_kernels_read_the_bits_as_the_function(dtype, headdim, causal):
    """A mask whose partial blocks' bits are dropped (the kernels evaluate the function there) gives the
    same output, lse, dK and dV bit for bit as the one that keeps them (dQ's atomic sums may differ in
    their last bits outside the deterministic mode, so the backward runs in it): documents whose
    boundaries fall inside blocks, GQA, a last block cut by the sequence end. And the forward does read
    the bits: with one partial block's words cleared, its rows change."""
    doc = cupy.asarray(_documents(2, 650, 7, 32))
    masks = [cupyflash.BlockMask.from_mask_mod(same_document, 2, 1, 650, 650, buffers=(doc,)) for _ in range(3)]
    assert masks[0]._element_bits is not None
    masks[1]._element_bits = None
    slot, bits = masks[2]._element_bits
    bits[: bits.size // int((slot >= 0).sum())] = 0  # slot 0: its block's pairs hidden
    q, k, v = random_qkv(cupy, 2, 650, 650, 4, 2, headdim, headdim, DTYPES[dtype], seed=33)
    dout = cupy.asarray(np.random.default_rng(34).standard_normal(q.shape).astype(DTYPES[dtype]))
    runs = []
    for mask in masks[:2]:
        out, lse = cupyflash.flash_attention(q, k, v, causal=causal, block_mask=mask, return_lse=True)
        grads = cupyflash.flash_attention_backward(dout, q, k, v, out, lse, causal=causal, block_mask=mask,
                                                   deterministic=True)
        runs.append([to_host(x) for x in (out, lse, *grads)])
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)
    cleared = to_host(cupyflash.flash_attention(q, k, v, causal=causal, block_mask=masks[2]))
    assert not np.array_equal(cleared, runs[0][0])


@pytest.mark.parametrize("dtype, atol", [("float32", 1e-5), ("bfloat16", 2e-2)])
def test_kvcache_score_mod_is_the_builtin_alibi(dtype, atol):
    """flash_attention_with_kvcache with ALiBi as a score_mod against the built-in alibi_slopes (bfloat16:
    the decode kernel built with each, its rows of several heads; float32: the forward families over the
    cache), paged, with new keys appended."""
    rng = np.random.default_rng(25)
    dt = DTYPES[dtype]
    batch, seqlen_q, heads, heads_k, d, page = 3, 1, 8, 2, 64, 16
    q = cupy.asarray(rng.standard_normal((batch, seqlen_q, heads, d)).astype(dt))
    k_new, v_new = (cupy.asarray(rng.standard_normal((batch, seqlen_q, heads_k, d)).astype(dt)) for _ in range(2))
    cache_seqlens = cupy.asarray(np.array([3, 40, 77], np.int32))
    slopes = cupy.asarray(rng.uniform(0.1, 1.0, heads).astype(np.float32))
    keys = cache_seqlens + seqlen_q
    caches = [cupy.asarray(rng.standard_normal((18, page, heads_k, d)).astype(dt)) for _ in range(2)]
    table = cupy.asarray(rng.permutation(18).astype(np.int32).reshape(batch, 6))

    def alibi(s, b, h, qi, ki, sl, n):
        return s - sl[h] * mods.abs(qi + n[b] - seqlen_q - ki)

    results = []
    for options in ({"alibi_slopes": slopes}, {"score_mod": alibi, "score_mod_buffers": (slopes, keys)}):
        k_cache, v_cache = (x.copy() for x in caches)
        results.append(cupyflash.flash_attention_with_kvcache(
            q, k_cache, v_cache, k=k_new, v=v_new, cache_seqlens=cache_seqlens, block_table=table, causal=True,
            **options))
    np.testing.assert_allclose(to_host(results[1]).astype(np.float32), to_host(results[0]).astype(np.float32),
                               rtol=0, atol=atol)


def test_device_built_mask_serves_numpy_calls():
    """A mask built from CuPy buffers serves a NumPy call too (its layout, full blocks and buffers copied to
    the host once), with the NumPy result of the host-built mask."""
    doc = _documents(1, 90, 3, 27)
    device = cupyflash.BlockMask.from_mask_mod(same_document, 1, 1, 90, 90, block_size=(32, 32),
                                               buffers=(cupy.asarray(doc),))
    host = cupyflash.BlockMask.from_mask_mod(same_document, 1, 1, 90, 90, block_size=(32, 32), buffers=(doc,))
    rng = np.random.default_rng(28)
    q, k, v = (rng.standard_normal((1, 90, 2, 16)) for _ in range(3))
    np.testing.assert_array_equal(cupyflash.flash_attention(q, k, v, block_mask=device),
                                  cupyflash.flash_attention(q, k, v, block_mask=host))
