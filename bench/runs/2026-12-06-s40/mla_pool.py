"""Diagnostic: MLA decode at batch 64 x 8192 keys, pages of 64, bf16, with the block table drawn from a
pool of P distinct pages (P = all: every page its own, 604 MB; P = 256: 19 MB, L2-resident), so the
products and the copies into shared memory stay the same while DRAM's traffic goes away.
Each figure: the fastest of 3 groups of 20 calls after at least 100 ms of calls (`call3.sh` of session 40 timed 20
calls after one). Run inside the tree to time: PYTHONPATH=$PWD python mla_pool.py HEADS POOL [POOL ...]"""
import os
import sys

import cupy
import ml_dtypes
import numpy as np

import cupyflash

sys.path.insert(0, os.path.join(os.getcwd(), "bench"))  # the tree's bench/harness.py
import harness  # noqa: E402

rng = np.random.default_rng(1)
bf16 = ml_dtypes.bfloat16
batch, context, page = 64, 8192, 64
pages = batch * context // page
latent = cupy.asarray(rng.standard_normal((pages, page, 1, 576)).astype(np.float32)).astype(bf16)
heads = int(sys.argv[1])
q = cupy.asarray(rng.standard_normal((batch, 1, heads, 576)).astype(np.float32)).astype(bf16)
for pool in sys.argv[2:]:
    p = pages if pool == "all" else int(pool)
    table = cupy.asarray(rng.choice(p, size=pages, replace=p < pages).reshape(batch, -1).astype(np.int32))
    opts = dict(cache_seqlens=cupy.full((batch,), context, np.int32), block_table=table, softmax_scale=576 ** -0.5)
    f = lambda: cupyflash.flash_attention_with_kvcache(q, latent, latent[..., :512], **opts)  # noqa: E731
    ms = min(harness.time_grouped(f, 3, 3, 20))  # (its warm-up: at least 100 ms of calls)
    print(f"heads {heads} pool {pool}: {ms:.3f} ms, {2 * batch * heads * context * 1088 / ms / 1e9:.0f} TFLOP/s", flush=True)
