"""The Hopper kernels (cupyflash/_families/sm90.py) on the H200: every head-dim bucket, both 16-bit dtypes,
odd sizes that end mid-tile (seqlens 1, 113, 203, 1025), seqlen_q != seqlen_k both ways, GQA and MQA,
forward and backward against the float64 oracle (head dims the sm90 backward does not cover take the
sm80 one); that dispatch picks them there; that the deterministic backward is bitwise reproducible; that
inputs a TMA cannot address take the sm80 kernels with the same results; that packed sequences do not
read their neighbours' rows; and that the causal backward's key tiles, handed out in turn by groups of
(batch entry, kv head) pairs or across the last pairs, are all computed. GPU only; the sm90 cases skip
on other GPUs. The mask, softcap, ALiBi and varlen cases of test_gpu_features.py run on the sm90 kernels
too (helpers.with_families)."""

import numpy as np
import pytest
from helpers import DTYPES, check_dense, gpu_available, random_qkv

import cupyflash
from cupyflash import _families, _problem
from cupyflash._families import common, sm80, sm90

pytestmark = pytest.mark.gpu

if gpu_available():
    import cupy

    HOPPER = int(cupy.cuda.Device().compute_capability) == sm90.CAPABILITY
else:
    cupy = None
    HOPPER = False

needs_hopper = pytest.mark.skipif(not HOPPER, reason="the sm90 kernels run on compute capability 9.0 only")

# (batch, seqlen_q, seqlen_k, heads, heads_k, headdim, headdim_v), dtype, causal
CASES = [
    ((2, 1, 1, 2, 2, 64, 64), "bfloat16", False),
    ((1, 113, 203, 4, 2, 64, 64), "float16", True),
    ((1, 1025, 1025, 2, 1, 64, 64), "bfloat16", True),
    ((2, 203, 113, 2, 2, 96, 96), "bfloat16", True),
    ((1, 1025, 203, 2, 2, 80, 80), "float16", False),
    ((1, 113, 1025, 4, 1, 128, 128), "bfloat16", False),
    ((1, 1025, 1025, 2, 2, 128, 128), "float16", True),
    ((2, 203, 203, 2, 1, 120, 128), "bfloat16", False),
    ((1, 113, 203, 2, 2, 192, 128), "bfloat16", True),
    ((1, 203, 113, 2, 1, 160, 160), "float16", False),
    ((1, 1025, 1025, 2, 2, 192, 192), "bfloat16", True),
    ((1, 203, 1025, 2, 2, 256, 256), "float16", True),
    ((2, 113, 113, 2, 2, 256, 256), "bfloat16", False),
    ((1, 1, 203, 2, 2, 64, 128), "float16", False),
    # Longer walks of head dim 64's 192-row tile of three consumer warpgroups.
    ((1, 2100, 2100, 2, 1, 64, 64), "float16", True),
    ((1, 203, 2113, 3, 3, 64, 64), "bfloat16", False),
]


def _id(case):
    (b, sq, sk, h, hk, d, dv), dtype, causal = case
    return f"b{b}_q{sq}_k{sk}_h{h}_hk{hk}_d{d}_dv{dv}_{dtype}_causal{int(causal)}"


@needs_hopper
@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_matches_oracle(case, monkeypatch):
    monkeypatch.setenv("CUPYFLASH_FAMILY", "sm90")
    sizes, dtype, causal = case
    check_dense(cupy, sizes, dtype, causal=causal)


@needs_hopper
@pytest.mark.parametrize("headdim, headdim_v, expected", [
    (64, 64, (64, 64)), (40, 40, (64, 64)), (96, 96, (96, 96)), (128, 128, (128, 128)), (64, 128, (128, 128)),
    (192, 128, (192, 128)), (160, 192, (192, 192)), (256, 256, (256, 256)),
])
def test_dispatch_picks_sm90_on_hopper(headdim, headdim_v, expected):
    q, k, v = random_qkv(cupy, 1, 8, 8, 2, 2, headdim, headdim_v, DTYPES["bfloat16"], seed=0)
    p = _problem.forward_problem(q, k, v)
    family, variant = _families.select(_families.FORWARD, p, common.current_device(), (q, k, v))
    assert family is sm90.FORWARD
    assert (variant.param("headdim"), variant.param("headdim_v")) == expected


@needs_hopper
@pytest.mark.parametrize("headdim, headdim_v, expected", [
    (64, 64, (64, 64)), (40, 40, (64, 64)), (96, 96, (96, 96)), (80, 80, (96, 96)), (128, 128, (128, 128)),
    (64, 128, (128, 128)),
    (192, 128, (192, 192)), (160, 160, (192, 192)), (256, 256, (256, 256)),
])
def test_backward_dispatch_on_hopper(headdim, headdim_v, expected):
    """Every head dim up to 256 takes the sm90 backward (above 128 its split-column kernel)."""
    q, k, v = random_qkv(cupy, 1, 8, 8, 2, 2, headdim, headdim_v, DTYPES["float16"], seed=0)
    p = _problem.forward_problem(q, k, v)
    family, variant = _families.select(_families.BACKWARD, p, common.current_device(), (q, k, v))
    if expected is None:
        assert family is sm80.BACKWARD
    else:
        assert family is sm90.BACKWARD
        assert (variant.param("headdim"), variant.param("headdim_v")) == expected


@needs_hopper
def test_unaligned_inputs_take_the_sm80_kernels(monkeypatch):
    """A head dim of 59 gives 118-byte rows: no TMA can read them, and sm80's kernels give the result."""
    q, _, _ = random_qkv(cupy, 1, 113, 203, 2, 2, 59, 59, DTYPES["bfloat16"], seed=3)
    assert not sm90.tma_addressable(q, False)
    monkeypatch.setenv("CUPYFLASH_FAMILY", "sm90")
    check_dense(cupy, (1, 113, 203, 2, 2, 59, 59), "bfloat16", causal=True)


@needs_hopper
def test_unaligned_dout_takes_the_sm80_backward(monkeypatch):
    """dout is the user's array: a view whose rows are not 16-byte aligned cannot be a TMA source."""
    monkeypatch.setenv("CUPYFLASH_FAMILY", "sm90")
    dtype = DTYPES["bfloat16"]
    q, k, v = random_qkv(cupy, 1, 203, 113, 2, 1, 64, 64, dtype, seed=4)
    out, lse = cupyflash.flash_attention(q, k, v, causal=True, return_lse=True)
    wide = cupy.asarray(np.random.default_rng(5).standard_normal((1, 203, 2, 68)).astype(dtype))
    dout = wide[..., 1:65]  # a 2-byte offset: misaligned for TMA, fine for the sm80 kernels
    assert not sm90.tma_addressable(dout, False)
    got = cupyflash.flash_attention_backward(dout, q, k, v, out, lse, causal=True)
    want = cupyflash.flash_attention_backward(cupy.ascontiguousarray(dout), q, k, v, out, lse, causal=True)
    assert got[0].dtype == dtype
    for a, b in zip(got, want):  # two kernels, two summation orders: equal to bfloat16 rounding
        b = cupy.asnumpy(b.astype(cupy.float32))
        np.testing.assert_allclose(cupy.asnumpy(a.astype(cupy.float32)), b, rtol=2e-2, atol=2e-2 * np.abs(b).max())


@needs_hopper
@pytest.mark.parametrize("sizes, causal", [((2, 700, 650, 4, 2, 64, 64), False), ((1, 1025, 1025, 2, 1, 128, 128), True),
                                           ((1, 333, 300, 2, 1, 256, 256), True),
                                           ((1, 1100, 3000, 3, 1, 128, 128), False),
                                           ((1, 150, 2100, 2, 2, 256, 256), False),
                                           ((1, 200, 8500, 1, 1, 256, 256), False)])
def test_deterministic_backward_is_reproducible(sizes, causal, monkeypatch):
    """deterministic=True: right (tolerance rule) and bitwise identical over 20 runs; head dim 256 on the
    split-column kernel. Unmasked problems of at most one key tile per SM take the rotated walks
    (common/ordered_sum.cuh), with more query tiles than key tiles in a chain (GQA too) and fewer (ties);
    8500 keys at head dim 256 are 133 key tiles, past the H200's 132 SMs: the launch order."""
    monkeypatch.setenv("CUPYFLASH_FAMILY", "sm90")
    check_dense(cupy, sizes, "bfloat16", causal=causal, deterministic=True, seed=11)
    q, k, v = random_qkv(cupy, *sizes, DTYPES["bfloat16"], seed=11)
    out, lse = cupyflash.flash_attention(q, k, v, causal=causal, return_lse=True)
    dout = cupy.asarray(np.random.default_rng(12).standard_normal(out.shape).astype(out.dtype))
    first = [g.get() for g in cupyflash.flash_attention_backward(dout, q, k, v, out, lse, causal=causal, deterministic=True)]
    for _ in range(19):
        again = cupyflash.flash_attention_backward(dout, q, k, v, out, lse, causal=causal, deterministic=True)
        for a, b in zip(first, again):
            assert np.array_equal(a, b.get())


@needs_hopper
def test_causal_key_tiles_taken_in_turn_by_groups_of_pairs(monkeypatch):
    """The causal backward hands out the key tiles of groups of (batch entry, kv head) pairs in turn
    (sm90.bwd_tile_group, common/scheduler.cuh): 15 pairs of 9 key tiles make groups of 132 // 9 = 14
    on an H200, the last of one pair, and every key tile must still be computed once (GQA 2)."""
    monkeypatch.setenv("CUPYFLASH_FAMILY", "sm90")
    sizes = (3, 1025, 1025, 10, 5, 128, 128)
    group = cupy.cuda.Device().attributes["MultiProcessorCount"] // 9
    assert 1 < group < 15 and 15 % group, "the case needs several groups, the last one partial"
    check_dense(cupy, sizes, "bfloat16", causal=True)


@needs_hopper
def test_causal_last_pairs_take_key_tiles_in_turn(monkeypatch):
    """Above head dim 128 the causal backward hands out the key tiles of the last (batch entry, kv head)
    pairs in turn after the others' tiles fastest (sm90.bwd_tail_pairs, common/scheduler.cuh): 32 pairs
    of 17 key tiles, the last ceil(2 * 132 / 17) = 16 in turn on an H200, and every key tile must still
    be computed once (GQA 2)."""
    monkeypatch.setenv("CUPYFLASH_FAMILY", "sm90")
    sizes = (4, 1025, 1025, 16, 8, 256, 256)
    tail = -(-2 * cupy.cuda.Device().attributes["MultiProcessorCount"] // 17)
    assert 1 < tail < 32, "the case needs pairs before the tail"
    check_dense(cupy, sizes, "bfloat16", causal=True)


@pytest.mark.parametrize("family", ["sm90", "sm80"])
def test_packed_sequences_do_not_read_their_neighbours_values(family, monkeypatch):
    """A tile of sequence 0 runs into sequence 1's rows; an inf there has probability 0 for sequence 0,
    and 0 * inf must not reach sequence 0's output or gradients. Every input tensor gets infs."""
    monkeypatch.setenv("CUPYFLASH_FAMILY", family)
    dtype = DTYPES["bfloat16"]
    rng = cupy.random.default_rng(7)
    q, k, v, dout = (rng.standard_normal((250, 2, 128), dtype=cupy.float32).astype(dtype) for _ in range(4))
    for x in (q, k, v, dout):
        x[100:130] = cupy.inf
    cu = cupy.asarray([0, 100, 250], dtype=cupy.int32)
    out, lse = cupyflash.flash_attention_varlen(q, k, v, cu, cu, return_lse=True)
    grads = cupyflash.flash_attention_varlen_backward(dout, q, k, v, out, lse, cu, cu)
    alone = [x[None, :100] for x in (q, k, v)]
    out_alone, lse_alone = cupyflash.flash_attention(*alone, return_lse=True)
    grads_alone = cupyflash.flash_attention_backward(dout[None, :100], *alone, out_alone, lse_alone)
    for got, want in zip((out, *grads), (out_alone, *grads_alone)):
        first = cupy.asnumpy(got[:100].astype(cupy.float32))
        assert np.isfinite(first).all()
        np.testing.assert_allclose(first, cupy.asnumpy(want[0].astype(cupy.float32)), atol=2e-2)


@needs_hopper
def test_longest_first_counter_is_left_zero(monkeypatch):
    """Causal and other unequal walks take their work tiles through a counter that each launch sets back
    to zero (Sm90QueryTileScheduler::next), with no memset between launches: three calls of one plan,
    interpreted and then through its graph, each against the oracle. A counter left nonzero would skip
    the next launch's first tiles."""
    monkeypatch.setenv("CUPYFLASH_FAMILY", "sm90")
    for seed in range(3):
        check_dense(cupy, (2, 700, 700, 3, 1, 128, 128), "bfloat16", causal=True, backward=False, seed=seed)


@needs_hopper
@pytest.mark.parametrize("family", ["sm90", "sm80"])
def test_running_maximum_that_lags_and_jumps(family, monkeypatch):
    """FragmentSoftmax moves a row's running maximum only when a block's passes it by more than 8 log2
    units: scores that step from key tile to key tile by 3, 7.9, 8.1, 12, 130, -30 and 5 log2 units (blocks
    taken against a maximum that lags, by up to 2^8, then jumps past what float32 holds: a maximum that
    did not move would overflow), causal and not, against the oracle."""
    monkeypatch.setenv("CUPYFLASH_FAMILY", family)
    from helpers import _outputs, oracle, plain

    dtype = DTYPES["bfloat16"]
    batch, seqlen, heads, headdim = 1, 777, 2, 64
    rng = np.random.default_rng(11)
    q = rng.standard_normal((batch, seqlen, heads, headdim)) * 0.1
    k = rng.standard_normal((batch, seqlen, heads, headdim)) * 0.1
    v = rng.standard_normal((batch, seqlen, heads, headdim))
    q[..., 0] = 1.0
    # Column 0 of k sets the scores' level per 128 keys (a key tile of both families at head dim 64): the
    # steps in log2 units, times ln 2 / softmax_scale.
    steps = np.array([3.0, 7.9, 8.1, 12.0, 130.0, -30.0, 5.0])
    level = np.repeat(np.cumsum(steps), 128)[:seqlen] * np.log(2) * np.sqrt(headdim)
    k[..., 0] = level[None, :, None]
    q, k, v = (cupy.asarray(x.astype(dtype)) for x in (q, k, v))
    for causal in (False, True):
        out, lse = cupyflash.flash_attention(q, k, v, causal=causal, return_lse=True)
        _outputs({"out": out, "lse": lse}, oracle(q, k, v, causal), plain(q, k, v, causal), np.dtype(dtype))


@needs_hopper
@pytest.mark.parametrize("options", [{"causal": True}, {"window_size": (150, 0)}, {"window_size": (100, 300)}, {}],
                         ids=["causal", "window_left", "window_both", "dense"])
def test_192_row_tiles_skip_unseen_key_tiles_and_end_at_the_last_row(options, monkeypatch):
    """Head dim 64's 192-row tile: each consumer warpgroup computes only the key tiles its own 64 rows
    see, and the query tiles end at each sequence's last row (Sm90Schedule::align_end), so the first is
    partial, its rows before the sequence never stored. Sequences of 1 to 1000 rows (not multiples of
    192 or 64; seqlen_q != seqlen_k; GQA), packed and dense, forward and backward, against the oracle."""
    monkeypatch.setenv("CUPYFLASH_FAMILY", "sm90")
    from helpers import check_varlen

    lengths_q, lengths_k = [1, 191, 193, 700, 1000, 64], [5, 191, 400, 700, 1000, 129]
    check_varlen(cupy, lengths_q, lengths_k, 4, 2, 64, 64, "bfloat16", **options)
    check_dense(cupy, (2, 1000, 1000, 2, 1, 64, 64), "float16", **options)
    check_dense(cupy, (1, 77, 1111, 2, 2, 64, 64), "bfloat16", **options)
