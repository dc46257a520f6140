"""The attention kernels under compute-sanitizer: odd shapes with masks, score modifications, GQA and packed
batches (their device check included), forward and both backward modes, on every family (sm90, sm80 and
general, forced with CUPYFLASH_FAMILY; float32 and float64 on sm80 and general), each call twice so the second runs
its plan with new arrays.
Run on a GPU from the repository root:

    PYTHONPATH=$PWD compute-sanitizer --tool memcheck --error-exitcode 1 python3 tests/sanitize_attention.py
    PYTHONPATH=$PWD compute-sanitizer --tool racecheck --error-exitcode 1 python3 tests/sanitize_attention.py sm90

It checks no values (the GPU tests do); the sanitizer reports any access outside an allocation, or any
shared-memory race. Every run includes the joined sinks and seqused_k (varlen paged keys too); the sm90
and general runs include their dropout kernels and the device dropout mask,
and the kernels built with score and mask functions, the sm90 run the FP8 and tf32 forwards (or
"sm90:float8_e4m3fn", "sm90:tf32" alone); every run, the kernels that keep the maximum score.
Sizes are small so the instrumented run takes a minute or two. Arguments name the families to run
(default: all three), or a family and one of its dtypes ("sm80:float32").
"""

import os
import sys

import cupy
import ml_dtypes
import numpy

import cupyflash

rng = numpy.random.default_rng(0)


def normal(shape, dtype):
    return cupy.asarray(rng.standard_normal(shape).astype(dtype))


def dense(dtype):
    slopes = cupy.asarray(numpy.array([0.5, 0.25], numpy.float32))
    for (sq, sk, h, hk, d, options) in ((113, 203, 4, 2, 64, {"causal": True}),
                                         (203, 113, 2, 1, 128, {"window_size": (37, 5)}),
                                         (257, 257, 2, 2, 96, {"causal": True, "softcap": 20.0}),
                                         (130, 300, 2, 2, 256, {"alibi_slopes": slopes}),
                                         # Head dim 192's dQ share over the P' buffer.
                                         (203, 330, 2, 1, 192, {"causal": True}),
                                         # Head dim 64's warpgroups skipping key tiles at both ends.
                                         (300, 700, 2, 1, 64, {"window_size": (150, 0)}),
                                         (1, 77, 4, 4, 128, {}),
                                         # Long walks: head dim 64's 192 rows past 2k keys, head dim
                                         # 128's ring turning over many times.
                                         (150, 2100, 2, 1, 64, {"causal": True}),
                                         (70, 4200, 2, 2, 128, {})):
        for _ in range(2):
            q, k, v, do = (normal(s, dtype) for s in ((1, sq, h, d), (1, sk, hk, d), (1, sk, hk, d), (1, sq, h, d)))
            out, lse = cupyflash.flash_attention(q, k, v, return_lse=True, **options)
            for deterministic in (False, True):
                cupyflash.flash_attention_backward(do, q, k, v, out, lse, deterministic=deterministic, **options)


def packed(dtype):
    # Head dim 64 with a sequence past 2048 keys: the sm90 forward's 192-row tile on packed rows.
    for d, lengths in ((128, [0, 5, 130, 1, 77]), (64, [3, 2100, 1, 200])):
        lengths = numpy.array(lengths)
        cu = cupy.asarray(numpy.concatenate([[0], numpy.cumsum(lengths)]).astype(numpy.int32))
        total, longest = int(lengths.sum()), int(lengths.max())
        options = {"max_seqlen_q": longest, "max_seqlen_k": longest, "causal": True}
        for _ in range(2):
            q, k, v, do = (normal(s, dtype) for s in ((total, 4, d), (total, 2, d), (total, 2, d), (total, 4, d)))
            out, lse = cupyflash.flash_attention_varlen(q, k, v, cu, cu, return_lse=True, **options)
            cupyflash.flash_attention_varlen_backward(do, q, k, v, out, lse, cu, cu, **options)
    # A malformed cu_seqlens (an offset past the end, above the next one): the device check, and the NaN
    # fill of every result.
    bad = cu.copy()
    bad[2] = total + 400
    out, lse = cupyflash.flash_attention_varlen(q, k, v, bad, bad, return_lse=True, **options)
    cupyflash.flash_attention_varlen_backward(do, q, k, v, out, lse, bad, bad, **options)


def decode(dtype):
    """The decode kernel with softcap and ALiBi (its score_mod variant), dense and paged."""
    batch, heads, heads_k, d, capacity = 3, 8, 2, 128, 192
    slopes = cupy.asarray(numpy.linspace(0.1, 0.8, heads).astype(numpy.float32))
    for paged in (False, True):
        for _ in range(2):
            q = normal((batch, 1, heads, d), dtype)
            k, v = normal((batch, 1, heads_k, d), dtype), normal((batch, 1, heads_k, d), dtype)
            options = {"k": k, "v": v, "cache_seqlens": cupy.asarray(numpy.array([5, 100, 180], numpy.int32)),
                       "softcap": 30.0, "alibi_slopes": slopes, "causal": True}
            if paged:
                k_cache = normal((batch * capacity // 16, 16, heads_k, d), dtype)
                options["block_table"] = cupy.arange(batch * capacity // 16, dtype=cupy.int32).reshape(batch, -1)
            else:
                k_cache = normal((batch, capacity, heads_k, d), dtype)
            cupyflash.flash_attention_with_kvcache(q, k_cache, k_cache.copy(), num_splits=3, **options)


def dropout(dtype):
    """The kernels built with dropout (the Hopper 16-bit forward, the general kernels) and the device
    mask."""
    options = {"causal": True, "dropout_p": 0.3, "dropout_seed": 7}
    for _ in range(2):
        q, k, v, do = (normal(s, dtype) for s in ((2, 77, 4, 40), (2, 101, 2, 40), (2, 101, 2, 40), (2, 77, 4, 40)))
        out, lse = cupyflash.flash_attention(q, k, v, return_lse=True, **options)
        cupyflash.flash_attention_backward(do, q, k, v, out, lse, **options)
    # Walks of four key tiles: the Hopper forward's dropout past its ring's first round.
    q, k, v = normal((2, 300, 4, 128), dtype), normal((2, 390, 2, 128), dtype), normal((2, 390, 2, 128), dtype)
    cupyflash.flash_attention(q, k, v, dropout_p=0.3, dropout_seed=7)
    cupyflash.dropout_mask(1, (2, 3, 45, 37), 0.3, like=q)


def max_scores(dtype):
    """The forwards and the decode kernel that keep the maximum score (kMaxScore): dense, packed and a
    cache, with a softcap and without."""
    for softcap in (0.0, 20.0):
        q, k, v = normal((2, 77, 4, 40), dtype), normal((2, 101, 2, 40), dtype), normal((2, 101, 2, 40), dtype)
        cupyflash.flash_attention(q, k, v, causal=True, softcap=softcap, return_max_score=True)
        cu = cupy.asarray(numpy.array([0, 30, 30, 77], numpy.int32))
        cupyflash.flash_attention_varlen(q[0], k[0, :77], v[0, :77], cu, cu, causal=True, softcap=softcap,
                                         return_max_score=True)
        cache = normal((3, 150, 2, 64), dtype)
        lengths = cupy.asarray(numpy.array([5, 149, 80], numpy.int32))
        cupyflash.flash_attention_with_kvcache(normal((3, 1, 8, 64), dtype), cache, cache.copy(), cache_seqlens=lengths,
                                               softcap=softcap, num_splits=2, return_max_score=True)


def fp8():
    """The Hopper FP8 forward and its V^T pre-pass: GQA, causal, a block mask, the maximum score, several tiles."""
    q, k, v = normal((2, 77, 4, 64), numpy.float32), normal((2, 101, 2, 64), numpy.float32), normal((2, 101, 2, 64),
                                                                                                    numpy.float32)
    (q8, qd), (k8, kd), (v8, vd) = (cupyflash.quantize_fp8(x) for x in (q, k, v))
    for _ in range(2):
        cupyflash.flash_attention(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd, causal=True,
                                  return_max_score=True)
    layout = numpy.ones((2, 4, 1, 1), bool)
    layout[1, 2] = False
    cupyflash.flash_attention(q8, k8, v8, block_mask=cupyflash.BlockMask.from_dense(layout, (128, 128)))
    # Several query and key tiles a head: the key ring wraps and the warpgroups' turns run over many
    # tiles (also for the 192-row d64 CTAs of bench/runs/2026-12-06-s42/pending/i25_fp8_d64_three_consumers.patch).
    q, k, v = normal((1, 450, 4, 64), numpy.float32), normal((1, 601, 2, 64), numpy.float32), normal((1, 601, 2, 64),
                                                                                                     numpy.float32)
    (q8, qd), (k8, kd), (v8, vd) = (cupyflash.quantize_fp8(x) for x in (q, k, v))
    for causal in (False, True):
        cupyflash.flash_attention(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd, causal=causal)


def functions(dtype):
    """Kernels built with score and mask functions (the Hopper 16-bit forward and backward, the general
    kernels): a relative bias with a table (its
    gradient by atomics; at head dim 128 the Hopper backward's, whose tiles past the clip sum theirs and
    the others read dS^T back from shared memory), a softcap, a document mask built on the device, odd
    sizes, the block classification kernel, and a mask_mod reading an empty buffer."""
    from cupyflash import mods

    table = normal((4, 41), numpy.float32)
    doc = cupy.asarray(numpy.sort(rng.integers(0, 3, (1, 203))).astype(numpy.int32))
    mask = cupyflash.BlockMask.from_mask_mod(lambda b, h, qi, ki, d: d[b, qi] == d[b, ki], 1, 1, 203, 203,
                                             buffers=(doc,))
    for options in ({"score_mod": lambda s, b, h, qi, ki, t: s + t[h, mods.clip(ki - qi + 20, 0, 40)],
                     "score_mod_buffers": (table,)},
                    {"score_mod": lambda s, b, h, qi, ki: 20.0 * mods.tanh(s / 20.0), "block_mask": mask}):
        for d in (64, 128):
            q, k, v, do = (normal(s, dtype) for s in ((1, 203, 4, d), (1, 203, 2, d), (1, 203, 2, d), (1, 203, 4, d)))
            out, lse = cupyflash.flash_attention(q, k, v, return_lse=True, causal=True, **options)
            cupyflash.flash_attention_backward(do, q, k, v, out, lse, causal=True, **options)
    # A mask_mod with an empty buffer: its loads read the zero that stands in for element 0 (NaN rows).
    empty = cupyflash.BlockMask.from_mask_mod(lambda b, h, qi, ki, d: d[ki] == 0, 1, 1, 203, 203,
                                              buffers=(cupy.zeros(0, numpy.int32),))
    cupyflash.flash_attention(q, k, v, causal=True, block_mask=empty)


def sinks_and_counts(dtype):
    """The forwards that join the sinks and the backward's sink terms, packed sequences that use only
    their first keys (seqused_k) and varlen paged keys, gathered on the device and (16-bit on an
    H100/H200) read in place (a sequence with a page outside the pool among them)."""
    from cupyflash import _cuda

    sinks = cupy.asarray(rng.standard_normal(4).astype(numpy.float32))
    q, k, v, do = (normal(s, dtype) for s in ((2, 77, 4, 40), (2, 101, 2, 40), (2, 101, 2, 40), (2, 77, 4, 40)))
    out, lse = cupyflash.flash_attention(q, k, v, causal=True, sinks=sinks, return_lse=True)
    cupyflash.flash_attention_backward(do, q, k, v, out, lse, causal=True, sinks=sinks)
    cu_q, cu_k = (cupy.asarray(numpy.array(x, numpy.int32)) for x in ([0, 30, 30, 77], [0, 50, 61, 101]))
    used = cupy.asarray(numpy.array([49, 0, 40], numpy.int32))
    for _ in range(2):
        cupyflash.flash_attention_varlen(q[0], k[0], v[0], cu_q, cu_k, causal=True, seqused_k=used)
    pool = normal((9, 16, 2, 40), dtype)
    table = cupy.asarray(numpy.array([[0, 1, 2, 3], [4, 5, 9, 0], [6, 7, 8, -1]], numpy.int32))
    read_in_place = _cuda.paged_in_place
    for gathered in (True, False):
        _cuda.paged_in_place = (lambda *args, **kwargs: None) if gathered else read_in_place
        cupyflash.flash_attention_varlen(q[0], pool, pool, cu_q, cupy.asarray(numpy.array([0, 50, 90, 130], numpy.int32)),
                                         causal=True, block_table=table)
    _cuda.paged_in_place = read_in_place


def tf32():
    """The Hopper tf32 forward and its pre-passes (precision="tf32"): head dims padded by the copies (40
    with 24), GQA, causal, a window, the maximum score."""
    for d, dv, options in ((40, 24, {"causal": True}), (128, 128, {"window_size": (70, 9)})):
        q, k, v = normal((2, 77, 4, d), numpy.float32), normal((2, 101, 2, d), numpy.float32), normal((2, 101, 2, dv),
                                                                                                    numpy.float32)
        for _ in range(2):
            cupyflash.flash_attention(q, k, v, precision="tf32", return_max_score=True, **options)


DTYPES = {"float16": numpy.float16, "bfloat16": ml_dtypes.bfloat16, "float32": numpy.float32, "float64": numpy.float64}
FAMILY_DTYPES = {"sm90": ("float16", "bfloat16", "float32"), "sm80": ("float16", "bfloat16", "float32", "float64"),
                 "general": ("float32", "float64")}
# Arguments: families ("sm80"), or a family and one dtype ("sm80:float32").
runs = [(arg.split(":") + [None])[:2] for arg in sys.argv[1:] or FAMILY_DTYPES]
for family, only in runs:
    os.environ["CUPYFLASH_FAMILY"] = family
    for dtype in (DTYPES[name] for name in FAMILY_DTYPES[family] if only in (None, name)):
        dense(dtype)
        packed(dtype)
        if dtype != numpy.float64:
            decode(dtype)
        max_scores(dtype)
        sinks_and_counts(dtype)
        if family in ("sm90", "general"):
            dropout(dtype)
            functions(dtype)
    if family == "sm90" and only in (None, "float8_e4m3fn"):
        fp8()
    if family == "sm90" and only in (None, "tf32"):
        tf32()
cupy.cuda.Device().synchronize()
print("sanitize_attention: done")
