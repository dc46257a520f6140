"""One plain and one dropout Hopper forward (bf16, d128, 4k, batch 4, 16 heads) for ncu: issue-slot and
pipe use of sm90_fwd ..._drop_0 against _drop_1 (issue 23: the Philox draws' cost)."""
import cupy
import ml_dtypes
import numpy as np

import cupyflash

rng = np.random.default_rng(0)
q, k, v = (cupy.asarray(rng.standard_normal((4, 4096, 16, 128)).astype(ml_dtypes.bfloat16)) for _ in range(3))
for p in (0.0, 0.1):
    cupyflash.flash_attention(q, k, v, dropout_p=p, dropout_seed=1 if p else None)
cupy.cuda.Device().synchronize()
