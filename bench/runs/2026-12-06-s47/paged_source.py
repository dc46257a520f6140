"""ncu target for issue 26 (paged_source.sh): the problem of runs/2026-12-06-s45/paged_order.py (512 causal
queries over a 32k cache, GQA 32/8, d128, bf16), one call each on the dense cache and on pools of 128- and
16-key pages in order (the dense cache's bytes at its addresses). PYTHONPATH=$PWD python paged_source.py"""
import cupy
import ml_dtypes
import numpy as np

import cupyflash

rng = np.random.default_rng(1)
seqlen_q, context, heads, heads_k, d = 512, 32768, 32, 8, 128
q = cupy.asarray(rng.standard_normal((1, seqlen_q, heads, d)).astype(ml_dtypes.bfloat16))
kc, vc = (cupy.asarray(rng.standard_normal((1, context, heads_k, d)).astype(ml_dtypes.bfloat16)) for _ in range(2))
dense = cupyflash.flash_attention_with_kvcache(q, kc, vc, cache_seqlens=context, causal=True)
for page in (128, 16):
    pools = [x.reshape(context // page, page, heads_k, d) for x in (kc, vc)]  # page j = pool entry j
    table = cupy.arange(context // page, dtype=cupy.int32)[None]
    paged = cupyflash.flash_attention_with_kvcache(q, *pools, cache_seqlens=context, block_table=table, causal=True)
    cupy.cuda.Device().synchronize()
    print(f"pages of {page}: max |dense - paged|:",
          float(cupy.abs(dense.astype(cupy.float32) - paged.astype(cupy.float32)).max()))
