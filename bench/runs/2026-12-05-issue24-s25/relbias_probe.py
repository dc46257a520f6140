"""Which kernels run the relative-bias backward (bench/mods.py's relbias row) and how fast: the table
gradient summed per CTA in shared memory, with global atomics, and without a gradient (an int table);
then BlockMask.from_mask_mod at 16k x 16k, the classification alone and its tile lists. The probe behind
bench/NOTES.md's session 25 notes. Run from the repository root with PYTHONPATH=$PWD on a GPU."""

import time

import cupy
import ml_dtypes
import numpy as np

import cupyflash
from cupyflash import _families, _gates, _problem, mods
from cupyflash._families import common, sm80

_gates.FUNCTIONS = True
S, H, D = 16384, 16, 128
rng = cupy.random.RandomState(0)
q, k, v, dout = (rng.standard_normal((1, S, H, D), dtype=np.float32).astype(ml_dtypes.bfloat16) for _ in range(4))
table = rng.standard_normal((H, 257), dtype=np.float32)
itable = cupy.asarray(np.random.default_rng(0).integers(-3, 3, (H, 257)).astype(np.int32))


def rel(s, b, h, qi, ki, t):
    return s + t[h, mods.clip(ki - qi + 128, 0, 256)]


def irel(s, b, h, qi, ki, t):
    return s + 0.125 * t[h, mods.clip(ki - qi + 128, 0, 256)]


def timed(fn, buf, out, lse, repeats=3):
    def call():
        return cupyflash.flash_attention_backward(dout, q, k, v, out, lse, score_mod=fn, score_mod_buffers=(buf,))

    call()
    cupy.cuda.Device().synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        call()
    cupy.cuda.Device().synchronize()
    return (time.perf_counter() - start) / repeats * 1e3


flops = 2.5 * 4 * H * S * S * D
problem = _problem.forward_problem(q, k, v, score_mod=rel, score_mod_buffers=(table,))
family, variant = _families.select(_families.BACKWARD, problem, common.current_device(), (q, k, v, dout))
print("backward dispatch:", family.name, variant.key, flush=True)
for label, fn, buf, local in (("float table, local sums", rel, table, 16384), ("float table, global atomics", rel, table, 0),
                              ("int table (no gradient)", irel, itable, 16384)):
    sm80.LOCAL_GRAD_MAX_FLOATS = local
    out, lse = cupyflash.flash_attention(q, k, v, return_lse=True, score_mod=fn, score_mod_buffers=(buf,))
    ms = timed(fn, buf, out, lse)
    print(f"{label:32s} {ms:8.2f} ms {flops / ms / 1e9:7.1f} TF/s", flush=True)

doc = cupy.asarray(np.repeat(np.arange(8, dtype=np.int32), S // 8)[None])


def same_document(b, h, qi, ki, d):
    return d[b, qi] == d[b, ki]


for _ in range(2):
    cupy.cuda.Device().synchronize()
    start = time.perf_counter()
    mask = cupyflash.BlockMask.from_mask_mod(same_document, 1, 1, S, S, buffers=(doc,))
    cupy.cuda.Device().synchronize()
    built = (time.perf_counter() - start) * 1e3
    start = time.perf_counter()
    mask.tile_lists(cupy, 128, 128)
    cupy.cuda.Device().synchronize()
    print(f"from_mask_mod {built:.3f} ms, then its lists at 128 x 128 {(time.perf_counter() - start) * 1e3:.3f} ms",
          flush=True)
