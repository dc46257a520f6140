"""One MLA decode step twice (for ncu's --launch-skip): batch 64, 8192 keys in pages of 64, bf16, the
latent cache (576 columns, v_cache the view of its first 512), argv[1] query heads."""
import sys

import cupy
import ml_dtypes
import numpy

import cupyflash

heads = int(sys.argv[1])
batch, context, page = 64, 8192, 64
rng = numpy.random.default_rng(0)
pages = batch * context // page
latent = cupy.asarray(rng.standard_normal((pages, page, 1, 576), dtype=numpy.float32)).astype(ml_dtypes.bfloat16)
q = cupy.asarray(rng.standard_normal((batch, 1, heads, 576), dtype=numpy.float32)).astype(ml_dtypes.bfloat16)
table = cupy.asarray(rng.permutation(pages).reshape(batch, -1).astype(numpy.int32))
seqlens = cupy.full((batch,), context, dtype=numpy.int32)
for _ in range(2):
    cupyflash.flash_attention_with_kvcache(q, latent, latent[..., :512], cache_seqlens=seqlens, block_table=table,
                                           softmax_scale=576 ** -0.5)
    cupy.cuda.Device().synchronize()
