"""Issue 26, session 57: paged_order.py's problem (512 causal queries over a 32k cache, GQA 32/8, d128, bf16,
pages in a random order), only dense and pages of 16 and 64, for A/B rounds on a short device budget.
PYTHONPATH=<tree> python paged16_ab.py [--precompile] [--pages 16,32,64] (pages of 16 and 64 by default)"""
import os
import sys

import cupy
import ml_dtypes
import numpy as np

import cupyflash

if "--precompile" in sys.argv:  # the one forward variant these calls take, compiled (trees in parallel)
    from cupyflash import _families, _kernels
    _kernels.precompile([v for v in _families.VARIANTS if v.kernel.name == "sm90_fwd" and v.dtype == "bfloat16"
                         and v.tile[:2] == (128, 128) and not any(v.flags)], max_workers=1)
    sys.exit()
sys.path.insert(0, os.path.join(os.getcwd(), "bench"))
import harness  # noqa: E402

rng = np.random.default_rng(1)
seqlen_q, context, heads, heads_k, d = 512, 32768, 32, 8, 128
q = cupy.asarray(rng.standard_normal((1, seqlen_q, heads, d)).astype(ml_dtypes.bfloat16))
kc, vc = (cupy.asarray(rng.standard_normal((1, context, heads_k, d)).astype(ml_dtypes.bfloat16)) for _ in range(2))
flops = 4 * heads * d * (seqlen_q * (context - seqlen_q) + seqlen_q * (seqlen_q + 1) / 2)


def tflops(f):
    return flops / harness.median(harness.time_grouped(f, warmup=1, repeats=5, inner=4)) / 1e9


def dense():
    return cupyflash.flash_attention_with_kvcache(q, kc, vc, cache_seqlens=context, causal=True)


ref = dense()
row = [f"dense {tflops(dense):.0f}"]
pages = sys.argv[sys.argv.index("--pages") + 1] if "--pages" in sys.argv else "16,64"
for page in (int(x) for x in pages.split(",")):
    n = context // page
    order = cupy.asarray(rng.permutation(n).astype(np.int32))
    pools = []
    for x in (kc, vc):
        pool = cupy.empty((n, page, heads_k, d), x.dtype)
        pool[order] = x.reshape(n, page, heads_k, d)
        pools.append(pool)

    def f(pools=pools, table=order[None]):
        return cupyflash.flash_attention_with_kvcache(q, *pools, cache_seqlens=context, block_table=table, causal=True)

    diff = float(abs(f().astype(np.float32) - ref.astype(np.float32)).max())
    row.append(f"{page}: {tflops(f):.0f}" + (f" (max difference from dense {diff:.3g})" if diff > 0.02 else ""))
print(" | ".join(row), flush=True)
