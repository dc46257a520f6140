"""Session 58: the dense bf16 forward calls whose kernel time ncu compares between two trees (the V-box patch
makes the dense kernels read V's descriptor offsets at run time: ~4 more SASS instructions a k-step between
O += P V's wgmmas). d128 and d256 at 4k, b4 h16 (d256 h8), causal and not, 3 calls each.
PYTHONPATH=<tree> ncu ... python dense_calls.py"""
import cupy
import ml_dtypes
import numpy as np

import cupyflash

rng = np.random.default_rng(2)
for d, heads in ((128, 16), (256, 8)):
    q, k, v = (cupy.asarray(rng.standard_normal((4, 4096, heads, d)).astype(ml_dtypes.bfloat16)) for _ in range(3))
    for causal in (False, True):
        for _ in range(4):
            cupyflash.flash_attention(q, k, v, causal=causal)
cupy.cuda.Device().synchronize()
