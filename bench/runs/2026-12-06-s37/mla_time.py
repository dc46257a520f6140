"""MLA decode at batch 64 x 8192 keys, pages of 64, bf16: ms, TB/s and TFLOP/s for the query-head counts
given (default 128 and 16; cupy events, 10 calls back to back after a warm-up), and the largest
difference from the general path (v_cache a copy) on a small odd problem.
Run inside the tree to time: PYTHONPATH=$PWD python mla_time.py [--force-sm90] [HEADS ...]
(--force-sm90: the Hopper kernel below its MLA_SM90_MIN_ROWS too)."""
import sys

import cupy
import ml_dtypes
import numpy as np

import cupyflash
from cupyflash._kvcache import device as _device

if len(sys.argv) > 1 and sys.argv[1] == "--force-sm90":
    _device.MLA_SM90_MIN_ROWS = 1  # the Hopper kernel at every head count
    del sys.argv[1]

rng = np.random.default_rng(1)
bf16 = ml_dtypes.bfloat16
# Small check: 128 heads, 3 entries of 77, 200 and 129 keys, pages of 64.
latent = cupy.asarray(rng.standard_normal((15, 64, 1, 576)).astype(bf16))
table = cupy.asarray(rng.permutation(15)[:15].reshape(3, 5).astype(np.int32))
q = cupy.asarray(rng.standard_normal((3, 1, 128, 576)).astype(bf16))
opts = dict(cache_seqlens=cupy.asarray(np.array([77, 200, 129], np.int32)), block_table=table, softmax_scale=576 ** -0.5)
a = cupyflash.flash_attention_with_kvcache(q, latent, latent[..., :512], **opts).astype(cupy.float32)
b = cupyflash.flash_attention_with_kvcache(q, latent, cupy.ascontiguousarray(latent[..., :512]), **opts).astype(cupy.float32)
print("max |sm90 - general|", float(cupy.abs(a - b).max()), "max |out|", float(cupy.abs(b).max()), flush=True)

batch, context, page = 64, 8192, 64
pages = batch * context // page
latent = cupy.asarray(rng.standard_normal((pages, page, 1, 576)).astype(np.float32)).astype(bf16)
table = cupy.asarray(rng.permutation(pages).reshape(batch, -1).astype(np.int32))
opts = dict(cache_seqlens=cupy.full((batch,), context, np.int32), block_table=table, softmax_scale=576 ** -0.5)
for heads in [int(h) for h in sys.argv[1:]] or [128, 16]:
    q = cupy.asarray(rng.standard_normal((batch, 1, heads, 576)).astype(np.float32)).astype(bf16)
    f = lambda: cupyflash.flash_attention_with_kvcache(q, latent, latent[..., :512], **opts)  # noqa: E731
    f()
    cupy.cuda.Device().synchronize()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for _ in range(10):
        f()
    end.record()
    end.synchronize()
    ms = cupy.cuda.get_elapsed_time(start, end) / 10
    print(f"heads {heads}: {ms:.3f} ms, {batch * context * 576 * 2 / ms / 1e9:.2f} TB/s, "
          f"{2 * batch * heads * context * 1088 / ms / 1e9:.0f} TFLOP/s", flush=True)
