"""Issue 26, ncu source: one paged prefill forward at pages of 16 (paged_order.py's problem: 512 causal
queries over a 32k cache, GQA 32/8, d128, bf16, pages in a random order), warmed up, then one call inside
the profiler range. PYTHONPATH=<tree> ncu --profile-from-start off ... python paged16_source.py"""
import cupy
import ml_dtypes
import numpy as np

import cupyflash

rng = np.random.default_rng(1)
seqlen_q, context, heads, heads_k, d, page = 512, 32768, 32, 8, 128, 16
q = cupy.asarray(rng.standard_normal((1, seqlen_q, heads, d)).astype(ml_dtypes.bfloat16))
n = context // page
order = cupy.asarray(rng.permutation(n).astype(np.int32))
pools = []
for _ in range(2):
    x = cupy.asarray(rng.standard_normal((1, context, heads_k, d)).astype(ml_dtypes.bfloat16))
    pool = cupy.empty((n, page, heads_k, d), x.dtype)
    pool[order] = x.reshape(n, page, heads_k, d)
    pools.append(pool)


def call():
    return cupyflash.flash_attention_with_kvcache(q, *pools, cache_seqlens=context, block_table=order[None],
                                                  causal=True)


for _ in range(3):
    call()
cupy.cuda.Device().synchronize()
cupy.cuda.runtime.profilerStart()
call()
cupy.cuda.Device().synchronize()
cupy.cuda.runtime.profilerStop()
