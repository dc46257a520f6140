"""ncu target for issue 26: paged_order.py's problem (512 causal queries over a 32k cache, GQA 32/8, d128,
bf16), one call on the dense cache, then one on a pool of 128-key pages in order (the same bytes at the
same addresses: in session 46 it ran 10% slower, 575 against 639 TFLOP/s). PYTHONPATH=$PWD python paged_ncu.py"""
import cupy
import ml_dtypes
import numpy as np

import cupyflash

rng = np.random.default_rng(1)
seqlen_q, context, heads, heads_k, d, page = 512, 32768, 32, 8, 128, 128
q = cupy.asarray(rng.standard_normal((1, seqlen_q, heads, d)).astype(ml_dtypes.bfloat16))
kc, vc = (cupy.asarray(rng.standard_normal((1, context, heads_k, d)).astype(ml_dtypes.bfloat16)) for _ in range(2))
pools = [x.reshape(context // page, page, heads_k, d) for x in (kc, vc)]  # page j = pool entry j
table = cupy.arange(context // page, dtype=cupy.int32)[None]
dense = cupyflash.flash_attention_with_kvcache(q, kc, vc, cache_seqlens=context, causal=True)
paged = cupyflash.flash_attention_with_kvcache(q, *pools, cache_seqlens=context, block_table=table, causal=True)
cupy.cuda.Device().synchronize()
print("max |dense - paged|:", float(cupy.abs(dense.astype(cupy.float32) - paged.astype(cupy.float32)).max()))
