"""flash_attention_with_kvcache under compute-sanitizer (issue 11): every kernel of the KV-cache path
(append with rotary, the decode kernel with and without splits, its split merge and its own append of
unrotated tokens, the MLA and e4m3 decode kernels, the general path's lengths, gather and poison) on dense and paged caches, with
out-of-range cache_seqlens, cache_batch_idx, block_table and cache_leftpad entries among valid ones; on an
H100/H200 also a paged prefill on the Hopper forward. Run on a GPU:

    PYTHONPATH=$PWD compute-sanitizer --tool memcheck --error-exitcode 1 python3 tests/sanitize_kvcache.py

It checks nothing itself (tests/test_kvcache.py does); memcheck reports any access outside an
allocation. Sizes are small so the instrumented run takes seconds."""

import cupy
import ml_dtypes
import numpy

import cupyflash
from cupyflash._kvcache import device as kvcache_device

rng = numpy.random.default_rng(0)


def normal(shape, dtype):
    return cupy.asarray(rng.standard_normal(shape).astype(dtype))


def run(dtype, paged, page_size=16, heads=8, heads_k=2, d=128, seqlen_q=1, new=1, rotary=True, leftpad=False):
    batch, capacity = 4, 256
    q = normal((batch, seqlen_q, heads, d), dtype)
    k, v = normal((batch, new, heads_k, d), dtype), normal((batch, new, heads_k, d), dtype)
    # Positions up to the last query's (causal): capacity - new + seqlen_q - 1.
    positions = max(capacity, capacity - new + seqlen_q)
    angles = numpy.arange(positions)[:, None] * 0.01 * numpy.arange(1, d // 4 + 1)[None, :]
    cos, sin = cupy.asarray(numpy.cos(angles).astype(dtype)), cupy.asarray(numpy.sin(angles).astype(dtype))
    # Entry 1 has no room for its new tokens, entry 3 a negative length; entry 2 a bad page or entry.
    lengths = cupy.asarray(numpy.array([10, capacity, 200, -5], numpy.int32))
    options = dict(k=k, v=v, cache_seqlens=lengths, causal=True, return_lse=True)
    if rotary:
        options.update(rotary_cos=cos, rotary_sin=sin)
    if paged:
        pages = capacity // page_size
        k_cache = normal((batch * pages + 1, page_size, heads_k, d), dtype)
        table = numpy.arange(batch * pages, dtype=numpy.int32).reshape(batch, pages)
        table[2, 1] = 10**6
        table[2, 2] = -3
        table[0, -(-(10 + new) // page_size):] = -1  # past entry 0's used pages (its callers leave anything there)
        options["block_table"] = cupy.asarray(table)
    else:
        k_cache = normal((batch + 1, capacity, heads_k, d), dtype)
        options["cache_batch_idx"] = cupy.asarray(numpy.array([4, 0, 99, 1], numpy.int32))
        if leftpad:  # entry 0 starts past its length (bad for that alone), entry 2 (a valid entry here) at key 150
            options["cache_batch_idx"] = cupy.asarray(numpy.array([4, 0, 2, 1], numpy.int32))
            options["cache_leftpad"] = cupy.asarray(numpy.array([11, 0, 150, 0], numpy.int32))
    v_cache = k_cache.copy()
    for splits in (1, 3):
        cupyflash.flash_attention_with_kvcache(q, k_cache, v_cache, num_splits=splits, **options)
    cupy.cuda.Device().synchronize()


for dtype in (numpy.dtype(ml_dtypes.bfloat16), numpy.float32):
    for paged in (False, True):
        for rotary in (True, False):
            run(dtype, paged, rotary=rotary)
run(numpy.float16, True, page_size=1, heads=4, heads_k=4, d=72, seqlen_q=5, new=3)
run(numpy.float16, False, seqlen_q=40, new=40)  # dense chunk: the forward over the cache with seqused_k
# Left-padded dense caches.
for rotary in (True, False):
    run(numpy.dtype(ml_dtypes.bfloat16), False, rotary=rotary, leftpad=True)
run(numpy.float32, False, leftpad=True)


def run_mla(page_size, heads, seqlen_q, new):
    """The MLA decode kernel (576 / 512, v_cache a view of the latent cache), with and without splits, on
    entries with bad lengths and pages among valid ones (page_size 0: dense, with cache_batch_idx)."""
    batch, capacity = 4, 256
    dtype = numpy.dtype(ml_dtypes.bfloat16)
    q = normal((batch, seqlen_q, heads, 576), dtype)
    lengths = cupy.asarray(numpy.array([10, capacity - new, 200, -5], numpy.int32))
    options = dict(cache_seqlens=lengths, causal=seqlen_q > 1, return_lse=True)
    if new:
        k = normal((batch, new, 1, 576), dtype)
        options.update(k=k, v=k[..., :512])
    if page_size:
        pages = capacity // page_size
        latent = normal((batch * pages + 1, page_size, 1, 576), dtype)
        table = numpy.arange(batch * pages, dtype=numpy.int32).reshape(batch, pages)
        table[2, 1] = 10**6
        options["block_table"] = cupy.asarray(table)
    else:
        latent = normal((batch + 1, capacity, 1, 576), dtype)
        options["cache_batch_idx"] = cupy.asarray(numpy.array([4, 0, 99, 1], numpy.int32))
    chosen = []
    decode_variant = kvcache_device.decode_variant
    kvcache_device.decode_variant = lambda *args, **kwargs: chosen.append(decode_variant(*args, **kwargs)) or chosen[-1]
    for splits in (1, 3):
        cupyflash.flash_attention_with_kvcache(q, latent, latent[..., :512], num_splits=splits, **options)
    kvcache_device.decode_variant = decode_variant
    sm90 = cupy.cuda.Device().compute_capability == "90" and heads * seqlen_q >= kvcache_device.MLA_SM90_MIN_ROWS
    kernel = kvcache_device.MLA_SM90 if sm90 and page_size % 64 == 0 else kvcache_device.MLA
    assert [v.kernel for v in chosen] == [kernel] * 2, chosen
    cupy.cuda.Device().synchronize()


def run_fp8(page_size, d):
    """The e4m3 decode kernel (compute capability 9.0), with and without splits, new tokens appended by
    it, on entries with bad lengths and pages among valid ones (page_size 0: dense, with
    cache_batch_idx)."""
    batch, capacity, heads, heads_k, new = 4, 256, 8, 2, 1
    e4m3 = numpy.dtype(ml_dtypes.float8_e4m3fn)

    def bytes_of(shape):
        return cupy.asarray(rng.standard_normal(shape).astype(e4m3).view(numpy.uint8)).view(e4m3)

    q = bytes_of((batch, 2, heads, d))
    k, v = bytes_of((batch, new, heads_k, d)), bytes_of((batch, new, heads_k, d))
    lengths = cupy.asarray(numpy.array([10, capacity - new, 200, -5], numpy.int32))
    descale = cupy.full((batch, heads_k), 0.5, numpy.float32)
    options = dict(k=k, v=v, cache_seqlens=lengths, causal=True, return_lse=True, q_descale=descale, k_descale=descale,
                   v_descale=descale)
    if page_size:
        pages = capacity // page_size
        k_cache, v_cache = (bytes_of((batch * pages + 1, page_size, heads_k, d)) for _ in range(2))
        table = numpy.arange(batch * pages, dtype=numpy.int32).reshape(batch, pages)
        table[2, 1] = 10**6
        options["block_table"] = cupy.asarray(table)
    else:
        k_cache, v_cache = (bytes_of((batch + 1, capacity, heads_k, d)) for _ in range(2))
        options["cache_batch_idx"] = cupy.asarray(numpy.array([4, 0, 99, 1], numpy.int32))
    for splits in (1, 3):
        cupyflash.flash_attention_with_kvcache(q, k_cache, v_cache, num_splits=splits, **options)
    cupy.cuda.Device().synchronize()


if cupy.cuda.Device().compute_capability == "90":
    run_fp8(16, 128)
    run_fp8(0, 64)
    run_fp8(1, 256)
run_mla(64, 16, 1, 1)
run_mla(1, 128, 2, 0)
run_mla(0, 32, 3, 2)
run_mla(16, 12, 3, 1)
run_mla(64, 128, 1, 1)  # (the Hopper MLA kernel from here on, on compute capability 9.0)
run_mla(128, 64, 2, 0)
# A paged prefill on the Hopper forward (70 queries, on a device described
# with 8 SMs so that these few work tiles take that path): entry 0's table is -1 past its used pages,
# which its producer's boxes of page -1 must read nothing of (entries with bad pages issue none). Query
# heads 8 over kv heads 2 run in clusters of two (sm90_fwd_pairs), 6 over 2 (groups of 3) one CTA a tile.
if cupy.cuda.Device().compute_capability == "90":
    import dataclasses

    from cupyflash._families import common

    device = common.current_device()
    common.current_device = lambda: dataclasses.replace(device, sm_count=8)
    run(numpy.dtype(ml_dtypes.bfloat16), True, page_size=16, seqlen_q=70, new=40, rotary=False)
    run(numpy.dtype(ml_dtypes.bfloat16), True, page_size=16, heads=6, seqlen_q=70, new=40, rotary=False)
    run(numpy.dtype(ml_dtypes.bfloat16), True, page_size=64, seqlen_q=70, new=1, rotary=False, d=256)
print("sanitize_kvcache: done")
