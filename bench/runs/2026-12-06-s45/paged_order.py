"""Issue 26: is paged prefill's loss the walk or the pages' placement? Pages of 128 lose 18-20% to the dense
cache (session 42-43) with the dense walk's boxes. Same problem as paged_gather.py (512 causal queries over a
32k cache, GQA 32/8, d128, bf16), the pool's pages in order (page j of the sequence at pool entry j) and in a
random permutation, pages of 16, 64 and 128. Prediction if placement: in-order 128 within 3% of dense, random
128 at 0.8x. If the walk: both orders alike. PYTHONPATH=$PWD python paged_order.py"""
import os
import sys

import cupy
import ml_dtypes
import numpy as np

import cupyflash

sys.path.insert(0, os.path.join(os.getcwd(), "bench"))
import harness  # noqa: E402

rng = np.random.default_rng(1)
seqlen_q, context, heads, heads_k, d = 512, 32768, 32, 8, 128
q = cupy.asarray(rng.standard_normal((1, seqlen_q, heads, d)).astype(ml_dtypes.bfloat16))
kc, vc = (cupy.asarray(rng.standard_normal((1, context, heads_k, d)).astype(ml_dtypes.bfloat16)) for _ in range(2))
flops = 4 * heads * d * (seqlen_q * (context - seqlen_q) + seqlen_q * (seqlen_q + 1) / 2)


def tflops(f):
    return flops / harness.median(harness.time_grouped(f, warmup=1, repeats=5, inner=4)) / 1e9


def dense():
    return cupyflash.flash_attention_with_kvcache(q, kc, vc, cache_seqlens=context, causal=True)


ref = dense()
print(f"| pages | in order | random |\n|---|---|---|\n| dense | {tflops(dense):.0f} | |")
for page in (16, 64, 128):
    n = context // page
    row = []
    for order in (np.arange(n, dtype=np.int32), rng.permutation(n).astype(np.int32)):
        order = cupy.asarray(order)
        pools = []
        for x in (kc, vc):
            pool = cupy.empty((n, page, heads_k, d), x.dtype)
            pool[order] = x.reshape(n, page, heads_k, d)
            pools.append(pool)
        table = order[None]

        def f(pools=pools, table=table):
            return cupyflash.flash_attention_with_kvcache(q, *pools, cache_seqlens=context, block_table=table,
                                                          causal=True)

        diff = float(abs(f().astype(np.float32) - ref.astype(np.float32)).max())
        if diff > 0.02:
            print(f"page {page}: max difference from the dense cache {diff}")
        row.append(tflops(f))
    print(f"| {page} | {row[0]:.0f} | {row[1]:.0f} |", flush=True)
