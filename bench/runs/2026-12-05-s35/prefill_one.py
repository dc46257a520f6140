"""One chunked-prefill step twice (for ncu's --launch-skip): 512 causal queries against a 32k cache, GQA
32/8, head dim 128, bf16, batch 1; argv[1] the page size (0: a dense cache), pages in a random order."""
import sys

import cupy
import ml_dtypes
import numpy

import cupyflash

page_size, seqlen_q, context = int(sys.argv[1]), 512, 32768
rng = numpy.random.default_rng(1)


def normal(shape):
    return cupy.asarray(rng.standard_normal(shape, dtype=numpy.float32)).astype(ml_dtypes.bfloat16)


q, k, v = normal((1, seqlen_q, 32, 128)), normal((1, context, 8, 128)), normal((1, context, 8, 128))
options = {"cache_seqlens": context, "causal": True}
if page_size:
    pages = context // page_size
    order = cupy.asarray(rng.permutation(pages).astype(numpy.int32))
    pools = []
    for x in (k, v):
        pool = cupy.empty((pages, page_size, 8, 128), x.dtype)
        pool[order] = x.reshape(pages, page_size, 8, 128)
        pools.append(pool)
    k, v = pools
    options["block_table"] = order[None, :]
for _ in range(2):
    cupyflash.flash_attention_with_kvcache(q, k, v, **options)
    cupy.cuda.Device().synchronize()
