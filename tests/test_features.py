"""Windows, softcap, ALiBi, block masks and packed batches on the NumPy path, against the float64 oracle
with the tolerance rule; the host-side policy and the block-sparse lists against brute force; NaN
propagation; and the bugs found by trying the package as a new user would."""

import subprocess
import sys

import numpy as np
import pytest
from cases import DENSE, VARLEN, build, dense_ids, varlen_ids
from helpers import check_dense, check_varlen, oracle, random_layout, random_qkv

import cupyflash
from cupyflash import _numpy_impl, _policy, _problem, reference

pytestmark = pytest.mark.filterwarnings("error")


@pytest.mark.parametrize("case", DENSE, ids=dense_ids())
def test_dense_features(case):
    _, sizes, dtype, causal, options = case
    batch, seqlen_q, seqlen_k, heads = sizes[:4]
    check_dense(np, sizes, dtype, causal=causal, **build(np, batch, heads, seqlen_q, seqlen_k, options))


@pytest.mark.parametrize("case", VARLEN, ids=varlen_ids())
def test_varlen_features(case):
    _, lengths_q, lengths_k, heads, heads_k, headdim, headdim_v, dtype, causal, options = case
    check_varlen(np, lengths_q, lengths_k, heads, heads_k, headdim, headdim_v, dtype, causal=causal,
                 **build(np, len(lengths_q), heads, 0, 0, options))


@pytest.mark.parametrize("blocks", [(16, 8), (8, 16), (32, 32)], ids=lambda b: f"bm{b[0]}-bn{b[1]}")
@pytest.mark.parametrize("options", [
    {"window_size": (7, 0)}, {"window_size": (3, 11)}, {"window_size": (-1, 2)},
    {"block_mask": (4, 12)}, {"block_mask": (24, 8), "window_size": (20, 5)},
], ids=lambda o: "-".join(f"{k}{v}" for k, v in o.items()))
@pytest.mark.parametrize("pair", [(45, 45), (37, 70), (70, 37)], ids=lambda p: f"q{p[0]}-k{p[1]}")
def test_tile_edges(pair, options, blocks):
    """The twin with small tiles against the oracle, float64, fixed tolerance: which tiles are visited,
    which are full and where the element mask applies (a wrong bound errs by O(1))."""
    seqlen_q, seqlen_k = pair
    q, k, v = random_qkv(np, 2, seqlen_q, seqlen_k, 4, 2, 8, 8, np.float64, seed=hash((pair, blocks)) % 2**31)
    dout = np.random.default_rng(1).standard_normal((2, seqlen_q, 4, 8))
    built = dict(options)
    if "block_mask" in built:
        block = built["block_mask"]
        shape = (2, 4, -(-seqlen_q // block[0]), -(-seqlen_k // block[1]))
        built["block_mask"] = cupyflash.BlockMask.from_dense(random_layout(shape, 0.4, 3), block)
    for causal in (False, True):
        p = _problem.forward_problem(q, k, v, causal=causal, **built)
        out, lse = _numpy_impl.forward(q, k, v, p, *blocks)
        grads = _numpy_impl.backward(dout, q, k, v, out, lse, p, *blocks)
        ref = oracle(q, k, v, causal, dout=dout, **built)
        for name, got in zip(("out", "lse", "dq", "dk", "dv"), (out, lse, *grads)):
            np.testing.assert_allclose(got, ref[name].astype(np.float64), rtol=1e-10, atol=1e-10,
                                       err_msg=f"{name} causal={causal}")


def _brute_window(seqlen_q, seqlen_k, left, right):
    i = np.arange(seqlen_q)[:, None]
    j = np.arange(seqlen_k)[None, :]
    offset = seqlen_k - seqlen_q
    visible = np.ones((seqlen_q, seqlen_k), bool)
    if left >= 0:
        visible &= j >= i + offset - left
    if right >= 0:
        visible &= j <= i + offset + right
    return visible


@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (0, 0), (3, 1), (10, -1), (2, 40), (100, 100)])
@pytest.mark.parametrize("pair", [(1, 1), (13, 13), (9, 30), (30, 9), (64, 64), (5, 0)])
def test_policy_against_brute_force(pair, window):
    """Window ranges, full tiles and element mask of cupyflash/_policy.py (the rules of kernels_cu/common/mask.cuh)."""
    seqlen_q, seqlen_k = pair
    w = _policy.Window.of(seqlen_q, seqlen_k, *window)
    visible = _brute_window(seqlen_q, seqlen_k, *window)
    i = np.arange(seqlen_q)[:, None]
    j = np.arange(seqlen_k)[None, :]
    np.testing.assert_array_equal(w.visible(i, j), visible)
    for tile_q, tile_k in ((4, 8), (8, 4), (16, 16)):
        for m0 in range(0, seqlen_q, tile_q):
            rows = visible[m0:m0 + tile_q]
            keys = np.flatnonzero(rows.any(axis=0))
            begin, end = w.key_range(m0, tile_q)
            if keys.size:
                assert (begin, end) == (keys[0], keys[-1] + 1)
            else:
                assert end <= begin
            for n0 in range(0, max(seqlen_k, 1), tile_k):
                tile = np.zeros((tile_q, tile_k), bool)
                part = rows[:, n0:n0 + tile_k]
                tile[: part.shape[0], : part.shape[1]] = part
                real = tile[: min(tile_q, seqlen_q - m0)]
                assert w.tile_is_full(m0, tile_q, n0, tile_k) == bool(real.all()), (m0, n0)
        for n0 in range(0, seqlen_k, tile_k):
            queries = np.flatnonzero(visible[:, n0:n0 + tile_k].any(axis=1))
            begin, end = w.query_range(n0, tile_k)
            if queries.size:
                assert (begin, end) == (queries[0], queries[-1] + 1)
            else:
                assert end <= begin


@pytest.mark.parametrize("block, tile", [((64, 64), (64, 64)), ((16, 48), (32, 32)), ((128, 128), (128, 32)),
                                         ((64, 64), (128, 128)), ((7, 5), (16, 8))])
def test_block_mask_lists_against_brute_force(block, tile):
    """kv/q lists at a kernel's tile shape: exactly the tiles covering a set block, ascending, with
    partial set where a tile covers set and clear blocks."""
    layout = random_layout((2, 3, 9, 11), 0.3, seed=5)
    mask = cupyflash.BlockMask.from_dense(layout, block)
    lists = mask.tile_lists(np, *tile)
    cells = np.repeat(np.repeat(layout, block[0], axis=2), block[1], axis=3)
    q_tiles, k_tiles = lists.q_tiles, lists.k_tiles
    padded = np.zeros(cells.shape[:2] + (q_tiles * tile[0], k_tiles * tile[1]), bool)
    covered_area = np.zeros_like(padded)
    padded[..., : cells.shape[2], : cells.shape[3]] = cells
    covered_area[..., : cells.shape[2], : cells.shape[3]] = True
    for b in range(2):
        for h in range(3):
            for qt in range(q_tiles):
                expected = []
                for kt in range(k_tiles):
                    sl = (b, h, slice(qt * tile[0], (qt + 1) * tile[0]), slice(kt * tile[1], (kt + 1) * tile[1]))
                    inside = padded[sl][covered_area[sl]]
                    if inside.any():
                        expected.append(2 * kt + int(not inside.all()))
                count = lists.kv_count[b, h, qt]
                assert list(lists.kv_index[b, h, qt, :count]) == expected
    # The transposed lists hold the same pairs.
    pairs_kv = {(b, h, qt, e >> 1, e & 1) for b in range(2) for h in range(3) for qt in range(q_tiles)
                for e in lists.kv_index[b, h, qt, : lists.kv_count[b, h, qt]]}
    pairs_q = {(b, h, e >> 1, kt, e & 1) for b in range(2) for h in range(3) for kt in range(k_tiles)
               for e in lists.q_index[b, h, kt, : lists.q_count[b, h, kt]]}
    assert pairs_kv == pairs_q
    assert mask.kv_num_blocks.shape == (2, 3, 9) and mask.kv_indices.shape == (2, 3, 9, 11)
    np.testing.assert_array_equal(mask.kv_num_blocks, layout.sum(-1))


def test_block_mask_builders():
    longformer = cupyflash.BlockMask.longformer(1000, block_size=(128, 128), window_blocks=1, global_blocks=1)
    layout = longformer.layout[0, 0]
    assert layout.shape == (8, 8)
    assert layout[0].all() and layout[:, 0].all() and layout[5, 4:7].all() and not layout[5, 2]
    bigbird = cupyflash.BlockMask.bigbird(1000, 700, block_size=(128, 64), random_blocks=2, heads=3, seed=4)
    assert bigbird.shape == (1, 3, 8, 11)
    again = cupyflash.BlockMask.bigbird(1000, 700, block_size=(128, 64), random_blocks=2, heads=3, seed=4)
    np.testing.assert_array_equal(bigbird.layout, again.layout)
    base = cupyflash.BlockMask.longformer(1000, 700, block_size=(128, 64)).layout
    assert (bigbird.layout >= base).all()  # the random blocks come on top of Longformer's
    extra = bigbird.layout.sum(-1) - base.sum(-1)
    assert (extra <= 2).all() and extra.sum() > 0
    assert "density" in repr(bigbird)


# --------------------------------------------------------------------------------------------- NaN


def _nan_inputs(where):
    q, k, v = random_qkv(np, 1, 9, 11, 2, 1, 8, 8, np.float32, seed=21)
    if where == "q":
        q[0, 4, 1, 3] = np.nan
    else:
        k[0, 6, 0, 2] = np.nan
    return q, k, v


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("where", ["q", "k"])
@pytest.mark.parametrize("causal", [False, True])
def test_nan_propagates_like_the_reference(causal, where, dtype):
    """Regression: one NaN in k came back as silent zeros (out 0, lse -inf) on the NumPy path."""
    q, k, v = (x.astype(dtype) for x in _nan_inputs(where))
    out, lse = cupyflash.flash_attention(q, k, v, causal=causal, return_lse=True)
    ref_out, ref_lse = reference.attention(q, k, v, causal)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref_out))
    np.testing.assert_array_equal(np.isnan(lse), np.isnan(ref_lse))
    assert np.isnan(lse).any()
    assert (where == "k" and not causal) or not np.isnan(lse).all()  # only the rows that see the NaN
    if not causal:
        dout = np.ones_like(out)
        grads = cupyflash.flash_attention_backward(dout, q, k, v, out, lse)
        for got, ref in zip(grads, reference.attention_backward(dout, q, k, v)):
            np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))


# ------------------------------------------------------------------------------------ new-user bugs


def test_numpy_results_are_c_contiguous():
    """Regression: the NumPy path returned out, dq and dk as non-contiguous views."""
    q, k, v = (x.transpose(0, 2, 1, 3).copy().transpose(0, 2, 1, 3)
               for x in random_qkv(np, 2, 9, 7, 4, 2, 8, 6, np.float32, seed=3))
    out, lse = cupyflash.flash_attention(q, k, v, causal=True, return_lse=True)
    grads = cupyflash.flash_attention_backward(np.ones_like(out), q, k, v, out, lse, causal=True)
    for x in (out, lse, *grads):
        assert x.flags.c_contiguous


def test_big_endian_inputs_are_converted():
    """Regression: a big-endian float32 array was refused as dtype >f4."""
    q, k, v = random_qkv(np, 1, 9, 7, 2, 1, 8, 8, np.float32, seed=4)
    big = [x.astype(">f4") for x in (q, k, v)]
    out, lse = cupyflash.flash_attention(*big, causal=True, return_lse=True)
    want, want_lse = cupyflash.flash_attention(q, k, v, causal=True, return_lse=True)
    assert out.dtype == np.float32 and out.dtype.isnative
    np.testing.assert_array_equal(out, want)
    grads = cupyflash.flash_attention_backward(out.astype(">f4"), *big, out.astype(">f4"), lse.astype(">f8"), causal=True)
    np.testing.assert_array_equal(grads[0], cupyflash.flash_attention_backward(out, q, k, v, out, lse, causal=True)[0])


def test_masked_arrays_are_refused():
    """Regression: a numpy.ma.MaskedArray failed deep inside with a broadcasting error."""
    q, k, v = random_qkv(np, 1, 9, 7, 2, 1, 8, 8, np.float32, seed=4)
    with pytest.raises(TypeError, match=r"q is a numpy.ma.MaskedArray; its mask would be ignored"):
        cupyflash.flash_attention(np.ma.masked_array(q, q > 1), k, v)


def test_main_help_and_unknown_flags():
    """Regression: `python -m cupyflash --help` ran the self-check, and unknown flags were accepted."""
    help_text = subprocess.run([sys.executable, "-m", "cupyflash", "--help"], capture_output=True, text=True)
    assert help_text.returncode == 0 and "usage: python -m cupyflash" in help_text.stdout
    assert "self-check" not in help_text.stdout.split("\n")[0]
    bad = subprocess.run([sys.executable, "-m", "cupyflash", "--bogus"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unrecognized arguments: --bogus" in bad.stderr


def test_varlen_matches_dense_per_sequence():
    """Each packed sequence equals flash_attention on it alone (an independent check of the packing)."""
    lengths_q = [7, 0, 12]
    cu_q = np.array([0, 7, 7, 19], np.int32)
    cu_k = np.array([0, 5, 8, 20], np.int32)  # key lengths 5, 3, 12
    rng = np.random.default_rng(8)
    q = rng.standard_normal((19, 2, 8)).astype(np.float32)
    k = rng.standard_normal((20, 1, 8)).astype(np.float32)
    v = rng.standard_normal((20, 1, 6)).astype(np.float32)
    out, lse = cupyflash.flash_attention_varlen(q, k, v, cu_q, cu_k, causal=True, window_size=(3, -1), return_lse=True)
    assert out.shape == (19, 2, 6) and lse.shape == (2, 19)
    for b in range(3):
        if lengths_q[b] == 0:
            continue
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        want, want_lse = cupyflash.flash_attention(q[None, rows], k[None, keys], v[None, keys], causal=True,
                                                   window_size=(3, -1), return_lse=True)
        np.testing.assert_array_equal(out[rows], want[0])
        np.testing.assert_array_equal(lse[:, rows], want_lse[0])
