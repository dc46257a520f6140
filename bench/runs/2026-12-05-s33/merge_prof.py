"""Host profile of the cascade row's two merges (bench/decode.py cascade_row's shapes, 8 parts): where
their ~100 us a call goes (issue 26)."""
import cProfile
import pstats
import time

import cupy
import ml_dtypes
import numpy as np

import cupyflash

rng = np.random.default_rng(0)
splits, requests, heads, d = 8, 64, 32, 128
out_p = cupy.asarray(rng.standard_normal((splits, requests, 1, heads, d)).astype(ml_dtypes.bfloat16))
lse_p = cupy.asarray(rng.standard_normal((splits, heads, requests)).astype(np.float32)).transpose(0, 2, 1)[..., None]
own = cupy.asarray(rng.standard_normal((requests, 1, heads, d)).astype(ml_dtypes.bfloat16))
own_lse = cupy.asarray(rng.standard_normal((requests, heads, 1)).astype(np.float32))


def merges():
    s, sl = cupyflash.merge_attention_states_stacked(out_p, lse_p)
    return cupyflash.merge_attention_states(s, sl, own, own_lse)


for f, name in ((merges, "both"), (lambda: cupyflash.merge_attention_states_stacked(out_p, lse_p), "stacked")):
    f()
    cupy.cuda.Device().synchronize()
    t = time.perf_counter()
    for _ in range(200):
        f()
    host = (time.perf_counter() - t) / 200 * 1e6
    cupy.cuda.Device().synchronize()
    print(f"{name}: {host:.1f} us host per call (back to back)")
prof = cProfile.Profile()
prof.enable()
for _ in range(200):
    merges()
prof.disable()
cupy.cuda.Device().synchronize()
pstats.Stats(prof).sort_stats("tottime").print_stats(18)
