"""One round of the dense decode rows (GQA 32/8, d128, bf16; TB/s of K and V) by the tree on PYTHONPATH,
beside cuDNN (torch SDPA) in the same process; each figure the best of 3 blocks of 50 calls after 300 ms
of warm-up. PYTHONPATH=$PWD python decode_ab.py LABEL"""
import sys

import cupy
import ml_dtypes
import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import cupyflash

bf16 = ml_dtypes.bfloat16
rng = np.random.default_rng(0)


def ms_of(f, reps=50, blocks=3, warm_ms=300.0):
    """The fastest of ``blocks`` blocks of ``reps`` calls back to back (CUDA events), after at least
    ``warm_ms`` of calls (the clocks ramp up over the first ~100 ms of work: session 40's single warm-up
    call left 10-15% between rounds of the same tree)."""
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    while True:
        for _ in range(10):
            f()
        end.record()
        end.synchronize()
        if cupy.cuda.get_elapsed_time(start, end) >= warm_ms:
            break
    best = float("inf")
    for _ in range(blocks):
        start.record()
        for _ in range(reps):
            f()
        end.record()
        end.synchronize()
        best = min(best, cupy.cuda.get_elapsed_time(start, end) / reps)
    return best


cells = []
for batch, context in ((1, 131072), (8, 32768), (64, 4096)):
    q = cupy.asarray(rng.standard_normal((batch, 1, 32, 128), np.float32)).astype(bf16)
    k, v = (cupy.asarray(rng.standard_normal((batch, context, 8, 128), np.float32)).astype(bf16) for _ in range(2))
    lengths = cupy.full(batch, context, np.int32)
    tb = batch * context * 8 * 128 * 2 * 2 / 1e9
    tq = torch.randn(batch, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
    tk, tv = (torch.randn(batch, 8, context, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    ours = ms_of(lambda: cupyflash.flash_attention_with_kvcache(q, k, v, cache_seqlens=lengths))
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        theirs = ms_of(lambda: torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, enable_gqa=True))
    cells.append(f"{batch}x{context} {tb / ours:.2f} ({ours / theirs:.3f} of cuDNN's time)")
print(f"{sys.argv[1]}: " + " | ".join(cells), flush=True)
