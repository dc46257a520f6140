"""Which MLA sm90 walks finish: one call per key count (1-5 tiles), 128 heads, dense, bf16, synchronized."""
import sys
import time

import cupy
import ml_dtypes
import numpy as np

import cupyflash

rng = np.random.default_rng(0)
for keys in (64, 128, 192, 100, 320):
    latent = cupy.asarray(rng.standard_normal((1, 320, 1, 576)).astype(ml_dtypes.bfloat16))
    q = cupy.asarray(rng.standard_normal((1, 1, 128, 576)).astype(ml_dtypes.bfloat16))
    t = time.time()
    out = cupyflash.flash_attention_with_kvcache(q, latent, latent[..., :512], cache_seqlens=keys)
    cupy.cuda.Device().synchronize()
    print(keys, "ok", f"{time.time() - t:.2f} s", bool(cupy.isfinite(out).all()), flush=True)
sys.exit(0)
