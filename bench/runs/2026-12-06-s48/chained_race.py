"""The persistent backward's chained key tiles under compute-sanitizer (racecheck, memcheck): 141 key
tiles of 70 queries (two query tiles a walk) for 132 SMs, dense and causal (bottom-right), bf16 d128."""
import cupy
import ml_dtypes
import numpy

import cupyflash

rng = numpy.random.default_rng(0)
for options in ({}, {"causal": True}):
    q, k, v, do = (cupy.asarray(rng.standard_normal(s).astype(ml_dtypes.bfloat16))
                   for s in ((1, 70, 1, 128), (1, 18000, 1, 128), (1, 18000, 1, 128), (1, 70, 1, 128)))
    out, lse = cupyflash.flash_attention(q, k, v, return_lse=True, **options)
    for _ in range(2):
        cupyflash.flash_attention_backward(do, q, k, v, out, lse, **options)
cupy.cuda.Device().synchronize()
print("done")
