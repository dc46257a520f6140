"""Ring attention (issue 12): the ring algorithm with N virtual ranks in one process (cupyflash.VirtualRing,
the same per-rank code as an NCCL ring) against the float64 oracle on the unsharded sequence, with the
tolerance rule: forward (out, lse) and backward, causal (zigzag and contiguous shards) and not, GQA,
headdim_v != headdim; the zigzag helpers; validation. NumPy always; CuPy arrays on a GPU (virtual ranks
on one device). The NCCL ring across GPUs is bench/ring.py's, run on a machine with two GPUs."""

import time

import numpy as np
import pytest
from helpers import (
    DTYPES,
    GRAD_FACTOR,
    OUTPUT_FACTOR,
    assert_within_rule,
    gpu_available,
    oracle,
    plain,
    random_qkv,
    seed_from,
)

import cupyflash

if gpu_available():
    import cupy
else:
    cupy = None

CUPY_MARKS = pytest.mark.gpu


def _layout_functions(xp, layout, world, seqlen):
    """(shard(x, rank, axis), unshard(shards, axis)) of a layout."""
    if layout == "zigzag":
        return (lambda x, r, axis=1: cupyflash.zigzag_shard(x, world, r, axis),
                lambda xs, axis=1: cupyflash.zigzag_unshard(xs, axis))
    chunk = seqlen // world

    def shard(x, r, axis=1):
        index = [slice(None)] * x.ndim
        index[axis] = slice(r * chunk, (r + 1) * chunk)
        return x[tuple(index)]

    return shard, lambda xs, axis=1: xp.concatenate(xs, axis=axis)


def _check_ring(xp, dtype, world, causal, layout, window=(-1, -1), sizes=(2, 4, 2, 16, 8), seqlen=24, sinks=False):
    """The ring's results, unsharded, against the oracle; with ``sinks``, also dsinks, which every rank
    must hold bit for bit."""
    batch, heads, heads_k, headdim, headdim_v = sizes
    q, k, v = random_qkv(xp, batch, seqlen, seqlen, heads, heads_k, headdim, headdim_v, DTYPES[dtype],
                         seed_from(dtype, world, causal, layout, window))
    dout = xp.asarray(np.random.default_rng(1).standard_normal((batch, seqlen, heads, headdim_v)).astype(DTYPES[dtype]))
    shard, unshard = _layout_functions(xp, layout, world, seqlen)
    options = {"causal": causal, "layout": layout, "window_size": window}
    extra = {}
    if sinks:
        extra["sinks"] = xp.asarray((np.random.default_rng(world).standard_normal(heads) * 2).astype(np.float32))
        options.update(extra)

    def rank(ring):
        r = ring.rank
        out, vjp = cupyflash.ring_flash_attention_vjp(shard(q, r), shard(k, r), shard(v, r), ring, **options)
        _, lse = cupyflash.ring_flash_attention(shard(q, r), shard(k, r), shard(v, r), ring, return_lse=True,
                                                **options)
        return (out, lse, *vjp(shard(dout, r)))

    results = cupyflash.VirtualRing.run(world, rank)
    got = {"out": unshard([r[0] for r in results]), "lse": unshard([r[1] for r in results], 2)}
    got.update({name: unshard([r[2 + i] for r in results]) for i, name in enumerate(("dq", "dk", "dv"))})
    if sinks:
        dsinks = [r[5] for r in results]
        assert all(bool((x == dsinks[0]).all()) for x in dsinks), "the ranks' dsinks differ"
        got["dsinks"] = dsinks[0]
    want = oracle(q, k, v, causal, dout=dout, window_size=window, **extra)
    base = plain(q, k, v, causal, dout=dout, window_size=window, **extra)
    lse_dtype = np.float64 if np.dtype(DTYPES[dtype]).itemsize >= 4 else np.float32
    for name, value in got.items():
        assert value.dtype == {"lse": lse_dtype, "dsinks": np.float32}.get(name, DTYPES[dtype]), name
        factor = OUTPUT_FACTOR if name in ("out", "lse") else GRAD_FACTOR
        # dsinks: the plain baseline's error is at least the rounding of its terms (helpers._outputs).
        floor = want["dsinks_floor"] if name == "dsinks" else 0.0
        assert_within_rule(name, value, want[name], base[name], factor, floor)


CASES = [
    ("float64", 3, True, "zigzag", (-1, -1)),
    ("float32", 2, False, None, (-1, -1)),
    ("float32", 4, True, "zigzag", (-1, -1)),
    ("float32", 3, True, "contiguous", (-1, -1)),
    ("bfloat16", 3, True, "zigzag", (-1, -1)),
    ("float16", 1, True, "zigzag", (-1, -1)),
    # Sliding windows: shorter than a shard (the contiguous ring stops after one step), reaching two
    # shards back, one-sided, and across the zigzag chunks.
    ("float64", 4, False, "contiguous", (3, 2)),
    ("float32", 3, True, "contiguous", (10, -1)),
    ("float32", 3, False, "contiguous", (-1, 5)),
    ("float32", 4, True, "zigzag", (4, -1)),
    ("bfloat16", 3, False, "zigzag", (2, 6)),
]
IDS = [f"{d}-world{w}-{layout or 'full'}" + ("" if window == (-1, -1) else f"-window{window[0]},{window[1]}")
       for d, w, _, layout, window in CASES]
GPU_CASES = [(c, i) for c, i in zip(CASES, IDS) if c[0] in ("bfloat16", "float32") and c[1] > 1][:4] + [
    (c, i) for c, i in zip(CASES, IDS) if c[4] != (-1, -1) and c[0] == "bfloat16"]


@pytest.mark.parametrize("dtype, world, causal, layout, window", CASES, ids=IDS)
def test_virtual_ring_numpy(dtype, world, causal, layout, window):
    _check_ring(np, dtype, world, causal, layout, window)


@pytest.mark.parametrize("dtype, causal, layout, window", [("float32", True, "zigzag", (-1, -1)),
                                                           ("float64", False, None, (-1, -1)),
                                                           ("float32", True, "contiguous", (20, -1))])
def test_virtual_ring_numpy_eight_ranks(dtype, causal, layout, window):
    """Eight ranks, issue 27's ring (one GPU each there; threads of one process here), GQA: zigzag causal
    (16 chunks of 3 rows), the full ring non-causal, and a window reaching more than two shards back."""
    _check_ring(np, dtype, 8, causal, layout, window, seqlen=48)


@pytest.mark.parametrize("dtype, world, causal, layout, window", [c for c, _ in GPU_CASES],
                         ids=[i for _, i in GPU_CASES])
@pytest.mark.gpu
def test_virtual_ring_cupy(dtype, world, causal, layout, window):
    # Windows scaled with the sequence (16x): a few hundred keys wide.
    window = tuple(w if w < 0 else 16 * w for w in window)
    _check_ring(cupy, dtype, world, causal, layout, window, sizes=(2, 8, 2, 128, 128), seqlen=384)


@pytest.mark.parametrize("dtype, world, causal, layout", [("float32", 3, True, "zigzag"), ("bfloat16", 4, False, None),
                                                         ("float64", 2, True, "contiguous")])
def test_virtual_ring_sinks(dtype, world, causal, layout):
    """Sinks join once after the merge; dsinks sums every rank's rows in rank order on every rank."""
    _check_ring(np, dtype, world, causal, layout, sizes=(2, 6, 2, 16, 8), sinks=True)


@pytest.mark.gpu
def test_virtual_ring_sinks_cupy():
    _check_ring(cupy, "bfloat16", 3, True, "zigzag", sizes=(2, 8, 2, 128, 128), seqlen=384, sinks=True)


def _window_mask(rows_q, rows_k, left, right):
    """flash_attention's mask: window aligned to the bottom-right corner, -1 unbounded."""
    i, j = np.arange(rows_q)[:, None], np.arange(rows_k)[None, :]
    distance = j - i - (rows_k - rows_q)
    return ((left < 0) | (distance >= -left)) & ((right < 0) | (distance <= right))


def _positions(rank, world, rows, layout):
    if layout == "zigzag":
        half = rows // 2
        return np.concatenate([np.arange(rank * half, (rank + 1) * half),
                               np.arange((2 * world - 1 - rank) * half, (2 * world - rank) * half)])
    return np.arange(rank * rows, (rank + 1) * rows)


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
def test_ring_calls_cover_the_global_mask_once(layout):
    # The planner alone, exhaustively over small rings: the calls of (rank, step) must cover exactly the
    # visible pairs of the global mask, each once, with windows flash_attention accepts.
    from cupyflash import _ring

    for world in (1, 2, 3, 5):
        for rows in (2, 6, 7):
            if layout == "zigzag" and rows % 2:
                continue
            for left in (-1, 0, 1, 4, 9, 40):
                for right in (-1, 0, 2, 5, 13):
                    geometry = _ring._Geometry(world, layout, rows, rows, left, right)
                    for rank in range(world):
                        for step in range(world):
                            owner = (rank - step) % world
                            i = _positions(rank, world, rows, layout)[:, None]
                            j = _positions(owner, world, rows, layout)[None, :]
                            want = ((left < 0) | (j - i >= -left)) & ((right < 0) | (j - i <= right))
                            covered = np.zeros(want.shape, int)
                            calls = geometry.calls(rank, step) if step < geometry.steps else []
                            for rows_q, rows_k, (sub_left, sub_right) in calls:
                                assert sub_left >= -1 and sub_right >= -1
                                sub = covered[rows_q, rows_k]
                                sub += _window_mask(*sub.shape, sub_left, sub_right)
                            case = (world, rows, left, right, rank, step)
                            np.testing.assert_array_equal(covered, want.astype(int), err_msg=str(case))


def test_bounded_windows_shorten_the_ring():
    from cupyflash import _ring

    # Contiguous shards of 8 rows: a backward window within one shard needs the previous rank's block
    # only; one that looks forward needs the next rank's, which comes last.
    assert _ring._Geometry(6, "contiguous", 8, 8, 3, 0).steps == 2
    assert _ring._Geometry(6, "contiguous", 8, 8, 3, 2).steps == 6
    assert _ring._Geometry(6, "contiguous", 8, 8, 9, 0).steps == 3  # reaches two shards back
    assert _ring._Geometry(6, "contiguous", 8, 8, 0, 0).steps == 1  # the diagonal alone: no exchange
    assert _ring._Geometry(6, "contiguous", 8, 8, -1, 0).steps == 6
    assert _ring._Geometry(6, "zigzag", 8, 8, 3, 0).steps == 6  # neighbours on both sides of the ring


def test_shortened_ring_sends_less():
    # A counting ring: a window inside a shard costs the forward one K/V exchange; the vjp's backward walks
    # back from the block the forward ended on (one K/V exchange back, the accumulators with it) and its
    # sums end at home. ring_flash_attention_backward walks forward again and sends the sums home.
    q, k, v = random_qkv(np, 1, 32, 32, 2, 1, 8, 8, np.float32, 5)
    dout = np.random.default_rng(2).standard_normal(q.shape).astype(np.float32)
    sent = []

    class Counting(cupyflash.VirtualRing):
        def exchange(self, send, recv, tag, hops=1):
            sent.append((self.rank, tag, hops))
            return super().exchange(send, recv, tag, hops)

    def rank(ring):
        rows = slice(8 * ring.rank, 8 * ring.rank + 8)
        out, vjp = cupyflash.ring_flash_attention_vjp(q[:, rows], k[:, rows], v[:, rows], ring, causal=True,
                                                      window_size=(3, 0), layout="contiguous")
        return (out, *vjp(dout[:, rows]))

    results = Counting.run(4, rank)
    assert sorted(sent) == sorted([(r, tag, hops) for r in range(4)
                                   for tag, hops in (("kv", 1), ("kv back", -1), ("dkv back", -1))])
    sent.clear()

    def backward(ring):
        rows = slice(8 * ring.rank, 8 * ring.rank + 8)
        options = {"causal": True, "window_size": (3, 0), "layout": "contiguous"}
        out, lse = cupyflash.ring_flash_attention(q[:, rows], k[:, rows], v[:, rows], ring, return_lse=True, **options)
        grads = cupyflash.ring_flash_attention_backward(dout[:, rows], q[:, rows], k[:, rows], v[:, rows], out, lse,
                                                        ring, **options)
        return (out, *grads)

    forward_walk = Counting.run(4, backward)
    assert sorted(sent) == sorted([(r, tag, hops) for r in range(4)
                                   for tag, hops in (("kv", 1), ("kv", 1), ("dkv", 1), ("dkv home", 3))])
    for back, forth in zip(results, forward_walk):  # the same out; gradients summed in another order
        assert np.array_equal(back[0], forth[0])
        for a, b in zip(back[1:], forth[1:]):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6 * np.abs(b).max())
    want = oracle(q, k, v, True, dout=dout, window_size=(3, 0))
    base = plain(q, k, v, True, dout=dout, window_size=(3, 0))
    for index, name in enumerate(("out", "dq", "dk", "dv")):
        got = np.concatenate([r[index] for r in results], axis=1)
        assert_within_rule(name, got, want[name], base[name], OUTPUT_FACTOR if name == "out" else GRAD_FACTOR)


def test_lse_dtype_and_shapes():
    q, k, v = random_qkv(np, 1, 8, 8, 2, 1, 8, 4, np.float32, 3)
    results = cupyflash.VirtualRing.run(2, lambda ring: cupyflash.ring_flash_attention(
        q[:, 4 * ring.rank:4 * ring.rank + 4], k[:, 4 * ring.rank:4 * ring.rank + 4],
        v[:, 4 * ring.rank:4 * ring.rank + 4], ring, return_lse=True))
    out, lse = results[0]
    assert out.shape == (1, 4, 2, 4) and out.dtype == np.float32
    assert lse.shape == (1, 2, 4) and lse.dtype == np.float64


@pytest.mark.parametrize("world", [1, 2, 3])
def test_zigzag_shard_round_trip(world):
    x = np.arange(2 * 12 * 3).reshape(2, 12, 3)
    shards = [cupyflash.zigzag_shard(x, world, r) for r in range(world)]
    chunk = 12 // (2 * world)
    assert (shards[0][:, :chunk] == x[:, :chunk]).all()
    assert (shards[0][:, chunk:] == x[:, 12 - chunk:]).all()
    assert (cupyflash.zigzag_unshard(shards) == x).all()
    lse = np.arange(2 * 3 * 12).reshape(2, 3, 12)
    assert (cupyflash.zigzag_unshard([cupyflash.zigzag_shard(lse, world, r, axis=2) for r in range(world)],
                                     axis=2) == lse).all()


def test_zigzag_shard_needs_whole_chunks():
    with pytest.raises(ValueError, match="multiple of 2 \\* world = 6"):
        cupyflash.zigzag_shard(np.zeros((1, 10, 1)), 3, 0)
    with pytest.raises(ValueError, match="need 0 <= rank < world"):
        cupyflash.zigzag_shard(np.zeros((1, 12, 1)), 3, 3)


def test_zigzag_unshard_refuses_unequal_shards():
    """Regression: shards of different lengths came back in a wrong order, without an error."""
    x = np.arange(10).reshape(1, 10, 1)
    with pytest.raises(ValueError, match=r"every rank's shard must have one shape; shards\[1\] has shape \(1, 6, 1\), "
                       r"shards\[0\] \(1, 4, 1\)"):
        cupyflash.zigzag_unshard([x[:, :4], x[:, 4:]])
    with pytest.raises(ValueError, match=r"shards\[1\] has shape \(1, 4, 2\), shards\[0\] \(1, 4, 1\)"):
        cupyflash.zigzag_unshard([x[:, :4], np.zeros((1, 4, 2))])


def test_zigzag_unshard_refuses_odd_shards():
    """Regression: odd-length shards (no two equal chunks) came back in a wrong order, without an error."""
    x = np.arange(10).reshape(1, 10, 1)
    with pytest.raises(ValueError, match=r"its length along axis 1 must be even; the shards have shape \(1, 5, 1\)"):
        cupyflash.zigzag_unshard([x[:, :5], x[:, 5:]])


def test_zigzag_axis_out_of_range_is_a_value_error():
    """Regression: an axis past x's last raised IndexError from inside zigzag_shard."""
    x = np.zeros((2, 12, 3))
    with pytest.raises(ValueError, match=r"axis 5 is out of range for x, a 3-dimensional array of shape \(2, 12, 3\); "
                       r"expected -3 <= axis < 3"):
        cupyflash.zigzag_shard(x, 3, 0, axis=5)
    with pytest.raises(ValueError, match=r"axis -4 is out of range for shards\[0\], a 3-dimensional array"):
        cupyflash.zigzag_unshard([x, x], axis=-4)
    with pytest.raises(TypeError, match="axis must be an int, got float 1.0"):
        cupyflash.zigzag_shard(x, 3, 0, axis=1.0)


def test_zigzag_negative_axis_counts_from_the_end():
    lse = np.arange(2 * 3 * 12).reshape(2, 3, 12)
    shards = [cupyflash.zigzag_shard(lse, 3, r, axis=-1) for r in range(3)]
    assert (shards[1] == np.concatenate([lse[..., 2:4], lse[..., 8:10]], axis=-1)).all()
    assert (cupyflash.zigzag_unshard(shards, axis=-1) == lse).all()


@pytest.mark.parametrize(
    "options, error, match",
    [
        ({"causal": True}, ValueError, "a causal ring needs layout='zigzag'"),
        ({"causal": True, "layout": "spiral"}, ValueError, "layout must be one of"),
        ({"window_size": (4, 0)}, ValueError, "a ring with a sliding window needs layout="),
        ({"window_size": (-2, 0), "layout": "contiguous"}, ValueError, "window_size left must be -1"),
        ({"window_size": 4, "layout": "contiguous"}, TypeError, "window_size must be a pair"),
        ({"causal": 1, "layout": "zigzag"}, TypeError, "causal must be a bool"),
    ],
    ids=["causal-without-layout", "bad-layout", "window-without-layout", "window-negative", "window-int",
         "causal-int"],
)
def test_validation(options, error, match):
    q, k, v = random_qkv(np, 1, 4, 4, 2, 1, 8, 8, np.float32, 0)
    ring = cupyflash.VirtualRing.create(1)[0]
    with pytest.raises(error, match=match):
        cupyflash.ring_flash_attention(q, k, v, ring, **options)


def test_comm_must_be_a_ring():
    q, k, v = random_qkv(np, 1, 4, 4, 2, 1, 8, 8, np.float32, 0)
    with pytest.raises(TypeError, match="comm must be a cupy.cuda.nccl.NcclCommunicator"):
        cupyflash.ring_flash_attention(q, k, v, object())


def test_a_failing_rank_releases_the_others():
    q, k, v = random_qkv(np, 1, 4, 4, 2, 1, 8, 8, np.float32, 0)

    def rank(ring):
        if ring.rank == 1:
            raise KeyError("rank 1 fails")
        return cupyflash.ring_flash_attention(q, k, v, ring)

    with pytest.raises(KeyError, match="rank 1 fails"):
        cupyflash.VirtualRing.run(3, rank)


# ------------------------------------------------------------------------------------------------
# Mismatched ranks (issue 19): a VirtualRing raises a clear error instead of hanging or broadcasting.

def _shards(world, rows=4, heads=2, seed=0):
    q, k, v = random_qkv(np, 1, rows * world, rows * world, heads, 1, 8, 8, np.float32, seed)
    return [tuple(x[:, rows * r:rows * (r + 1)] for x in (q, k, v)) for r in range(world)]


def _raises_soon(error, match, fn, limit=2.0):
    """``fn()`` raises ``error`` matching ``match`` within ``limit`` seconds."""
    start = time.monotonic()
    with pytest.raises(error, match=match):
        fn()
    assert time.monotonic() - start < limit


def test_virtual_ring_rank_that_returns_without_calling_fails_its_neighbour_at_once():
    shards = _shards(3)

    def rank(ring):
        if ring.rank == 1:
            return None
        return cupyflash.ring_flash_attention(*shards[ring.rank], ring)

    _raises_soon(RuntimeError, r"VirtualRing rank 2 of 3 \(its ring call 1, ring_flash_attention\) waits for the K/V "
                 r"block of step 1 from rank 1, which has returned without sending it",
                 lambda: cupyflash.VirtualRing.run(3, rank, timeout=60))


def test_virtual_ring_rank_that_calls_twice_fails_at_once():
    shards = _shards(2)

    def rank(ring):
        out = cupyflash.ring_flash_attention(*shards[ring.rank], ring)
        if ring.rank == 0:
            out = cupyflash.ring_flash_attention(*shards[ring.rank], ring)
        return out

    _raises_soon(RuntimeError, r"VirtualRing rank 0 of 2 \(its ring call 2, ring_flash_attention\) waits for the K/V "
                 r"block of step 1 from rank 1, which has returned",
                 lambda: cupyflash.VirtualRing.run(2, rank, timeout=60))


def test_virtual_ring_used_from_one_thread_times_out():
    """Ranks of create(2) called one after the other from one thread: rank 0 waits for rank 1's block."""
    ring = cupyflash.VirtualRing.create(2, timeout=0.3)
    assert ring[0].timeout == 0.3
    shards = _shards(2)
    _raises_soon(TimeoutError, r"VirtualRing rank 0 of 2 \(its ring call 1, ring_flash_attention\) waited 0.3 s for "
                 r"the K/V block of step 1 from rank 1, which did not send it: .*each rank from its own thread.*"
                 r"VirtualRing.create\(world, timeout=...\)",
                 lambda: cupyflash.ring_flash_attention(*shards[0], ring[0]))


def test_virtual_ring_backward_timeout_names_the_call():
    """A forward on both ranks, then the backward on rank 0 alone."""
    shards = _shards(2)
    results = cupyflash.VirtualRing.run(2, lambda ring: cupyflash.ring_flash_attention(
        *shards[ring.rank], ring, return_lse=True))
    ring = cupyflash.VirtualRing.create(2, timeout=0.2)
    out, lse = results[0]
    _raises_soon(TimeoutError, r"rank 0 of 2 \(its ring call 1, ring_flash_attention_backward\) waited 0.2 s for the "
                 r"K/V block of step 1 from rank 1",
                 lambda: cupyflash.ring_flash_attention_backward(out, *shards[0], out, lse, ring[0]))


def test_virtual_ring_timeout_is_checked():
    with pytest.raises(ValueError, match="timeout must be a positive number of seconds or None, got 0"):
        cupyflash.VirtualRing.create(2, timeout=0)
    with pytest.raises(ValueError, match="timeout must be a positive number of seconds or None, got nan"):
        cupyflash.VirtualRing.run(2, lambda ring: None, timeout=float("nan"))
    with pytest.raises(TypeError, match="timeout must be a positive number of seconds or None, got str '1'"):
        cupyflash.VirtualRing.create(2, timeout="1")
    assert cupyflash.VirtualRing.create(1, timeout=None)[0].timeout is None
    assert cupyflash.VirtualRing.create(1)[0].timeout == 300


@pytest.mark.parametrize(
    "rank1_options, match",
    [
        ({"causal": False}, r"causal True on rank 0, False on rank 1"),
        ({"layout": "contiguous"}, r"layout 'zigzag' on rank 0, 'contiguous' on rank 1"),
        ({"window_size": (3, -1)}, r"window_size \(-1, -1\) on rank 0, \(3, -1\) on rank 1"),
        ({"softmax_scale": 0.5}, r"softmax_scale 0.3535\d* on rank 0, 0.5 on rank 1"),
        ({"precision": "tf32"}, r"precision 'highest' on rank 0, 'tf32' on rank 1"),
    ],
    ids=["causal", "layout", "window", "scale", "precision"],
)
def test_virtual_ring_ranks_with_different_options_raise(rank1_options, match):
    """Regression: ranks that passed different options returned wrong values without an error."""
    shards = _shards(2)

    def rank(ring):
        options = {"causal": True, "layout": "zigzag"}
        if ring.rank == 1:
            options.update(rank1_options)
        return cupyflash.ring_flash_attention(*shards[ring.rank], ring, **options)

    _raises_soon(ValueError, r"the ranks of a VirtualRing make different ring calls \(call 1\): " + match +
                 r"\. Every rank must make the same ring calls", lambda: cupyflash.VirtualRing.run(2, rank, timeout=60))


def test_virtual_ring_ranks_with_unequal_shards_raise():
    """Regression: unequal shards failed with a broadcasting error from inside the ring."""
    shards = _shards(2, rows=6)
    shards[1] = tuple(x[:, :4] for x in shards[1])
    _raises_soon(ValueError, r"q shape \(1, 6, 2, 8\) on rank 0, \(1, 4, 2, 8\) on rank 1; k shape \(1, 6, 1, 8\) on "
                 r"rank 0, \(1, 4, 1, 8\) on rank 1",
                 lambda: cupyflash.VirtualRing.run(2, lambda ring: cupyflash.ring_flash_attention(*shards[ring.rank],
                                                                                                   ring), timeout=60))


def test_virtual_ring_ranks_with_unequal_head_counts_raise():
    shards = [_shards(2, heads=2)[0], _shards(2, heads=4)[1]]
    _raises_soon(ValueError, r"q shape \(1, 4, 2, 8\) on rank 0, \(1, 4, 4, 8\) on rank 1",
                 lambda: cupyflash.VirtualRing.run(2, lambda ring: cupyflash.ring_flash_attention(*shards[ring.rank],
                                                                                                   ring), timeout=60))


def test_virtual_ring_ranks_making_different_calls_raise():
    shards = _shards(2)

    def rank(ring):
        out, lse = cupyflash.ring_flash_attention(*shards[ring.rank], ring, return_lse=True)
        if ring.rank == 0:
            return cupyflash.ring_flash_attention(*shards[ring.rank], ring)
        return cupyflash.ring_flash_attention_backward(out, *shards[ring.rank], out, lse, ring)

    _raises_soon(ValueError, r"\(call 2\): function 'ring_flash_attention' on rank 0, 'ring_flash_attention_backward' "
                 r"on rank 1", lambda: cupyflash.VirtualRing.run(2, rank, timeout=60))


def test_virtual_ring_block_sent_before_returning_still_arrives():
    """A sender that has returned fails its receiver only when the block is not in the queue."""

    def rank(ring):
        received = [np.zeros(3)]
        pending = ring.exchange([np.full(3, 1.0 + ring.rank)], received, "x")
        if ring.rank == 1:
            return None  # returns without waiting; its block is on the way to rank 0
        time.sleep(0.2)
        pending.wait()
        return received[0]

    np.testing.assert_array_equal(cupyflash.VirtualRing.run(2, rank, timeout=60)[0], np.full(3, 2.0))
