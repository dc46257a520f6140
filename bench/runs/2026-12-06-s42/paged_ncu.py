"""Issue 26: ncu target for the paged prefill rows (512 causal queries over a 32k cache, GQA 32/8, d128, bf16;
`runs/2026-12-05-s30/paged_probe.py`'s problem): one call each of the dense cache and pages of 128, 64 and 16
(random page order), in that order, for `ncu -k regex:sm90_fwd`. Pages of 128 run 0.82x dense (session 42),
though their TMA boxes are the dense walk's: what else differs is the producer's paged walk (all 32 lanes)."""
import sys

import cupy
import ml_dtypes
import numpy as np

import cupyflash

rng = np.random.default_rng(1)
seqlen_q, context, heads, heads_k, d = 512, 32768, 32, 8, 128
q = cupy.asarray(rng.standard_normal((1, seqlen_q, heads, d)).astype(ml_dtypes.bfloat16))
kc, vc = (cupy.asarray(rng.standard_normal((1, context, heads_k, d)).astype(ml_dtypes.bfloat16)) for _ in range(2))
for page in (int(x) for x in (sys.argv[1:] or ["0", "128", "64", "16"])):
    if page == 0:
        cupyflash.flash_attention_with_kvcache(q, kc, vc, cache_seqlens=context, causal=True)
        continue
    n = context // page
    order = cupy.asarray(rng.permutation(n).astype(np.int32))
    pools = []
    for x in (kc, vc):
        pool = cupy.empty((n, page, heads_k, d), x.dtype)
        pool[order] = x.reshape(n, page, heads_k, d)
        pools.append(pool)
    cupyflash.flash_attention_with_kvcache(q, *pools, cache_seqlens=context, block_table=order[None], causal=True)
cupy.cuda.Device().synchronize()
