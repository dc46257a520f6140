"""Ring attention (issue 12): the ring algorithm with N virtual ranks in one process (cupyflash.VirtualRing,
the same per-rank code as an NCCL ring) against the float64 oracle on the unsharded sequence, with the
tolerance rule: forward (out, lse) and backward, causal (zigzag and contiguous shards) and not, GQA,
headdim_v != headdim; the zigzag helpers; validation. NumPy always; CuPy arrays on a GPU (virtual ranks
on one device). The NCCL ring across GPUs is bench/ring.py's, run on a machine with two GPUs."""

import numpy as np
import pytest
from helpers import (
    DTYPES,
    GPU_MARKS,
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

CUPY_MARKS = [m for m in GPU_MARKS if m.name != "usefixtures"]


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


def _check_ring(xp, dtype, world, causal, layout, sizes=(2, 4, 2, 16, 8), seqlen=24):
    batch, heads, heads_k, headdim, headdim_v = sizes
    q, k, v = random_qkv(xp, batch, seqlen, seqlen, heads, heads_k, headdim, headdim_v, DTYPES[dtype],
                         seed_from(dtype, world, causal, layout))
    dout = xp.asarray(np.random.default_rng(1).standard_normal((batch, seqlen, heads, headdim_v)).astype(DTYPES[dtype]))
    shard, unshard = _layout_functions(xp, layout, world, seqlen)
    options = dict(causal=causal, layout=layout)

    def rank(ring):
        r = ring.rank
        out, vjp = cupyflash.ring_flash_attention_vjp(shard(q, r), shard(k, r), shard(v, r), ring, **options)
        _, lse = cupyflash.ring_flash_attention(shard(q, r), shard(k, r), shard(v, r), ring, return_lse=True,
                                                **options)
        return (out, lse, *vjp(shard(dout, r)))

    results = cupyflash.VirtualRing.run(world, rank)
    got = {"out": unshard([r[0] for r in results]), "lse": unshard([r[1] for r in results], 2)}
    got.update({name: unshard([r[2 + i] for r in results]) for i, name in enumerate(("dq", "dk", "dv"))})
    want = oracle(q, k, v, causal, dout=dout)
    base = plain(q, k, v, causal, dout=dout)
    lse_dtype = np.float64 if np.dtype(DTYPES[dtype]).itemsize >= 4 else np.float32
    for name, value in got.items():
        assert value.dtype == (lse_dtype if name == "lse" else DTYPES[dtype]), name
        factor = OUTPUT_FACTOR if name in ("out", "lse") else GRAD_FACTOR
        assert_within_rule(name, value, want[name], base[name], factor)


CASES = [
    ("float64", 3, True, "zigzag"),
    ("float32", 2, False, None),
    ("float32", 4, True, "zigzag"),
    ("float32", 3, True, "contiguous"),
    ("bfloat16", 3, True, "zigzag"),
    ("float16", 1, True, "zigzag"),
]
IDS = [f"{d}-world{w}-{layout or 'full'}" for d, w, _, layout in CASES]


@pytest.mark.parametrize("dtype, world, causal, layout", CASES, ids=IDS)
def test_virtual_ring_numpy(dtype, world, causal, layout):
    _check_ring(np, dtype, world, causal, layout)


@pytest.mark.parametrize("dtype, world, causal, layout", [c for c in CASES if c[0] in ("bfloat16", "float32")],
                         ids=[i for c, i in zip(CASES, IDS) if c[0] in ("bfloat16", "float32")])
@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="no CUDA GPU available")
@pytest.mark.usefixtures("compiled_kernels")
def test_virtual_ring_cupy(dtype, world, causal, layout):
    _check_ring(cupy, dtype, world, causal, layout, sizes=(2, 8, 2, 128, 128), seqlen=384)


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


@pytest.mark.parametrize(
    "options, error, match",
    [
        (dict(causal=True), ValueError, "a causal ring needs layout='zigzag'"),
        (dict(causal=True, layout="spiral"), ValueError, "layout must be one of"),
        (dict(window_size=(4, 0)), ValueError, "no sliding window yet"),
        (dict(causal=1, layout="zigzag"), TypeError, "causal must be a bool"),
    ],
    ids=["causal-without-layout", "bad-layout", "window", "causal-int"],
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
