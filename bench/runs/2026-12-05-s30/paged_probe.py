"""Issue 26: why pages of 16 lose (session 29: 439 TFLOP/s against 590 for pages of 64 and 684 dense).
512 causal queries over a 32k cache, GQA 32/8, d128, bf16. Times each page size with the pages in a random
and in the natural order (a random order costs DRAM locality; the natural one only the TMA boxes' count).
With --ncu: one call each of pages 16 and 64 (random), for ncu -k regex:sm90_fwd. Times: medians of
bench/harness.py's time_grouped (session 30's run took the mean of one group of 20 instead)."""
import os
import sys

import cupy
import ml_dtypes
import numpy as np

import cupyflash

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import harness  # noqa: E402  (bench/harness.py)

rng = np.random.default_rng(1)
seqlen_q, context, heads, heads_k, d = 512, 32768, 32, 8, 128
q = cupy.asarray(rng.standard_normal((1, seqlen_q, heads, d)).astype(ml_dtypes.bfloat16))
kc, vc = (cupy.asarray(rng.standard_normal((1, context, heads_k, d)).astype(ml_dtypes.bfloat16)) for _ in range(2))
flops = 4 * heads * d * (seqlen_q * (context - seqlen_q) + seqlen_q * (seqlen_q + 1) / 2)


def pools(page, order):
    out = []
    for x in (kc, vc):
        pool = cupy.empty((context // page, page, heads_k, d), x.dtype)
        pool[order] = x.reshape(context // page, page, heads_k, d)
        out.append(pool)
    return out


def call(page, natural):
    if not page:
        return lambda: cupyflash.flash_attention_with_kvcache(q, kc, vc, cache_seqlens=context, causal=True)
    n = context // page
    order = cupy.arange(n, dtype=cupy.int32) if natural else cupy.asarray(rng.permutation(n).astype(np.int32))
    k, v = pools(page, order)
    return lambda: cupyflash.flash_attention_with_kvcache(q, k, v, cache_seqlens=context, block_table=order[None],
                                                         causal=True)


def ms(f):
    return harness.median(harness.time_grouped(f, warmup=1, repeats=5, inner=4))


if "--ncu" in sys.argv:
    for page in (16, 64):
        call(page, False)()
    cupy.cuda.Device().synchronize()
    sys.exit()
print("| pages | random order | natural order |\n|---|---|---|")
print(f"| dense | {flops / ms(call(0, False)) / 1e9:.0f} | |")
for page in (16, 32, 64, 128):
    print(f"| {page} | {flops / ms(call(page, False)) / 1e9:.0f} | {flops / ms(call(page, True)) / 1e9:.0f} |")
