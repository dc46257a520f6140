"""One round of the dense decode rows (GQA 32/8, d128, bf16; TB/s of K and V) by the tree on PYTHONPATH,
beside cuDNN (torch SDPA) in the same process; each figure the best of 3 groups of 50 calls after at least
100 ms of warm-up. PYTHONPATH=$PWD python decode_ab.py LABEL"""
import os
import sys

import cupy
import ml_dtypes
import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import cupyflash

sys.path.insert(0, os.path.join(os.getcwd(), "bench"))  # the tree's bench/harness.py
import harness  # noqa: E402

bf16 = ml_dtypes.bfloat16
rng = np.random.default_rng(0)


def ms_of(f):
    """The fastest of 3 groups of 50 calls back to back (bench/harness.py's time_grouped: its warm-up makes
    at least 100 ms of calls first, since the clocks ramp up)."""
    return min(harness.time_grouped(f, 3, 3, 50))


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
