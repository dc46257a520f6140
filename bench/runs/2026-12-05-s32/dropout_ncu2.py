"""The plain and dropout Hopper forwards (bf16, d128, 4k, batch 4, 16 heads), causal and not, for ncu."""
import cupy
import ml_dtypes
import numpy as np

import cupyflash

rng = np.random.default_rng(0)
q, k, v = (cupy.asarray(rng.standard_normal((4, 4096, 16, 128)).astype(ml_dtypes.bfloat16)) for _ in range(3))
for causal in (False, True):
    for p in (0.0, 0.1):
        cupyflash.flash_attention(q, k, v, causal=causal, dropout_p=p, dropout_seed=1 if p else None)
cupy.cuda.Device().synchronize()
