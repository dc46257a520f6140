"""The T5 relative bias (bench/mods.py's relbias row) forward and backward on each tensor-core family
(dispatch, then CUPYFLASH_FAMILY=sm80), beside plain attention, bf16 d128 h16 s16384: what session 26's
frozen tiles (FrozenScores) and the Hopper backward's buffer gradients changed. Run from the repository
root with PYTHONPATH=$PWD on a GPU."""

import os
import time

import cupy
import ml_dtypes
import numpy as np

import cupyflash
from cupyflash import _families, _gates, _problem, mods
from cupyflash._families import common

_gates.FUNCTIONS = True
S, H, D = 16384, 16, 128
rng = cupy.random.RandomState(0)
q, k, v, dout = (rng.standard_normal((1, S, H, D), dtype=np.float32).astype(ml_dtypes.bfloat16) for _ in range(4))
table = rng.standard_normal((H, 257), dtype=np.float32)


def rel(s, b, h, qi, ki, t):
    return s + t[h, mods.clip(ki - qi + 128, 0, 256)]


def timed(call, repeats=5):
    call()
    cupy.cuda.Device().synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        call()
    cupy.cuda.Device().synchronize()
    return (time.perf_counter() - start) / repeats * 1e3


flops = 4 * H * S * S * D
for family in ("", "sm80"):
    os.environ["CUPYFLASH_FAMILY"] = family
    for label, options in (("plain", {}), ("T5 bias", {"score_mod": rel, "score_mod_buffers": (table,)})):
        problem = _problem.forward_problem(q, k, v, **options)
        picked = [_families.select(kind, problem, common.current_device(), (q, k, v, dout))
                  for kind in (_families.FORWARD, _families.BACKWARD)]
        out, lse = cupyflash.flash_attention(q, k, v, return_lse=True, **options)
        fwd = timed(lambda: cupyflash.flash_attention(q, k, v, **options))
        bwd = timed(lambda: cupyflash.flash_attention_backward(dout, q, k, v, out, lse, **options))
        print(f"{family or 'dispatch':8s} {label:8s} fwd {fwd:7.2f} ms {flops / fwd / 1e9:6.1f} TF/s  "
              f"bwd {bwd:7.2f} ms {2.5 * flops / bwd / 1e9:6.1f} TF/s  ({picked[0][1].key}, {picked[1][1].key})",
              flush=True)
