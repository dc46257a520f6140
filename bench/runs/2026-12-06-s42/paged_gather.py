"""Issue 26: paged prefill read in place by the Hopper forward's producer (pages of 16: 0.64x dense, 64: 0.81x,
128: 0.82x on the H200, session 42) against gathering the pages into a dense copy first and running the dense
cache's forward (what the general path does for the calls the in-place walk does not take). 512 causal
queries over a 32k cache, GQA 32/8, d128, bf16 (runs/2026-12-05-s30/paged_probe.py's problem). The gather
reads and writes K and V once (2 x 67 MB each way); the dense forward takes ~390 us, so gathering costs
~15-20% where it replaces a 20-36% loss. Prediction: gather + dense ~0.83-0.87x dense at every page size,
ahead of in place at pages of 16 and 32, about even at 64. PYTHONPATH=$PWD python paged_gather.py"""
import os
import sys

import cupy
import ml_dtypes
import numpy as np

import cupyflash

sys.path.insert(0, os.path.join(os.getcwd(), "bench"))
import harness  # noqa: E402  (the tree's bench/harness.py)

rng = np.random.default_rng(1)
seqlen_q, context, heads, heads_k, d = 512, 32768, 32, 8, 128
q = cupy.asarray(rng.standard_normal((1, seqlen_q, heads, d)).astype(ml_dtypes.bfloat16))
kc, vc = (cupy.asarray(rng.standard_normal((1, context, heads_k, d)).astype(ml_dtypes.bfloat16)) for _ in range(2))
flops = 4 * heads * d * (seqlen_q * (context - seqlen_q) + seqlen_q * (seqlen_q + 1) / 2)


def ms(f):
    return harness.median(harness.time_grouped(f, warmup=1, repeats=5, inner=4))


def dense():
    return cupyflash.flash_attention_with_kvcache(q, kc, vc, cache_seqlens=context, causal=True)


print("| pages | in place | gather + dense | gather alone (ms) |\n|---|---|---|---|")
print(f"| dense | {flops / ms(dense) / 1e9:.0f} | | |")
for page in (16, 32, 64, 128):
    n = context // page
    order = cupy.asarray(rng.permutation(n).astype(np.int32))
    pools = []
    for x in (kc, vc):
        pool = cupy.empty((n, page, heads_k, d), x.dtype)
        pool[order] = x.reshape(n, page, heads_k, d)
        pools.append(pool)
    table = order[None]

    def in_place():
        return cupyflash.flash_attention_with_kvcache(q, *pools, cache_seqlens=context, block_table=table, causal=True)

    def gather():
        return tuple(pool[table].reshape(1, context, heads_k, d) for pool in pools)

    def gathered():
        k, v = gather()
        return cupyflash.flash_attention_with_kvcache(q, k, v, cache_seqlens=context, causal=True)

    print(f"| {page} | {flops / ms(in_place) / 1e9:.0f} | {flops / ms(gathered) / 1e9:.0f} | {ms(gather):.3f} |",
          flush=True)
