"""Which kernels run the relative-bias backward (bench/mods.py's relbias row) and how fast, with the
table gradient summed per CTA in shared memory, with global atomics, and without a gradient (an int
table): the probe behind bench/NOTES.md's session 25 numbers."""
import time

import cupy
import numpy as np

import cupyflash
from cupyflash import _families, _problem, mods
from cupyflash._families import common, sm80

_problem.NEW_KERNELS_ENABLED = True
S, H, D = 16384, 16, 128
import ml_dtypes  # noqa: E402

rng = cupy.random.RandomState(0)
q, k, v, dout = (rng.standard_normal((1, S, H, D), dtype=np.float32).astype(ml_dtypes.bfloat16) for _ in range(4))
table = rng.standard_normal((H, 257), dtype=np.float32)
itable = cupy.asarray(np.random.default_rng(0).integers(-3, 3, (H, 257)).astype(np.int32))


def rel(s, b, h, qi, ki, t):
    return s + t[h, mods.clip(ki - qi + 128, 0, 256)]


def irel(s, b, h, qi, ki, t):
    return s + 0.125 * t[h, mods.clip(ki - qi + 128, 0, 256)]


flops = 2.5 * 4 * H * S * S * D
for label, fn, buf, local in (("float table, local sums", rel, table, None), ("float table, global atomics", rel, table, 0),
                              ("int table (no gradient)", irel, itable, None)):
    if local is not None:
        sm80.LOCAL_GRAD_MAX_FLOATS = local
    else:
        sm80.LOCAL_GRAD_MAX_FLOATS = 16384
    out, lse = cupyflash.flash_attention(q, k, v, return_lse=True, score_mod=fn, score_mod_buffers=(buf,))
    call = lambda: cupyflash.flash_attention_backward(dout, q, k, v, out, lse, score_mod=fn, score_mod_buffers=(buf,))
    call()
    cupy.cuda.Device().synchronize()
    t = time.perf_counter()
    for _ in range(3):
        call()
    cupy.cuda.Device().synchronize()
    ms = (time.perf_counter() - t) / 3 * 1e3
    print(f"{label:32s} {ms:8.2f} ms {flops / ms / 1e9:7.1f} TF/s", flush=True)
from cupyflash._families import sm90  # noqa: E402
print("dispatch:", [(f.name, vv.key) for f, vv in [_families.select(_families.BACKWARD, _problem.forward_problem(
    q, k, v, score_mod=rel, score_mod_buffers=(table,)), common.current_device(), (q, k, v, dout))]])

# BlockMask.from_mask_mod at 16k x 16k: the classification alone (the lists are built at first use), then
# the lists at the Hopper forward's tile.
doc = cupy.asarray(np.repeat(np.arange(8, dtype=np.int32), S // 8)[None])


def same_document(b, h, qi, ki, d):
    return d[b, qi] == d[b, ki]


for _ in range(2):
    cupy.cuda.Device().synchronize()
    t = time.perf_counter()
    mask = cupyflash.BlockMask.from_mask_mod(same_document, 1, 1, S, S, buffers=(doc,))
    cupy.cuda.Device().synchronize()
    built = (time.perf_counter() - t) * 1e3
    t = time.perf_counter()
    mask.tile_lists(cupy, 128, 128)
    cupy.cuda.Device().synchronize()
    print(f"from_mask_mod {built:.3f} ms, then its lists at 128 x 128 {(time.perf_counter() - t) * 1e3:.3f} ms", flush=True)
