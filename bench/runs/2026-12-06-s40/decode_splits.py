"""Dense decode steps (GQA 32/8, d128, bf16), TB/s of K and V, with num_splits forced, beside cuDNN (torch
SDPA) in the same process, two rounds. PYTHONPATH=$PWD python decode_splits.py"""
import cupy
import ml_dtypes
import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import cupyflash

bf16 = ml_dtypes.bfloat16
rng = np.random.default_rng(0)


def ms_of(f, reps=30):
    f()
    cupy.cuda.Device().synchronize()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for _ in range(reps):
        f()
    end.record()
    end.synchronize()
    return cupy.cuda.get_elapsed_time(start, end) / reps


for batch, context, splits in ((1, 131072, (0, 24, 32, 33, 64)), (8, 32768, (0, 4, 8)), (64, 4096, (0, 1, 2))):
    q = cupy.asarray(rng.standard_normal((batch, 1, 32, 128), np.float32)).astype(bf16)
    k, v = (cupy.asarray(rng.standard_normal((batch, context, 8, 128), np.float32)).astype(bf16) for _ in range(2))
    lengths = cupy.full(batch, context, np.int32)
    tb = batch * context * 8 * 128 * 2 * 2 / 1e9
    tq = torch.randn(batch, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
    tk, tv = (torch.randn(batch, 8, context, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for rnd in range(2):
        cells = []
        for s in splits:
            ms = ms_of(lambda s=s: cupyflash.flash_attention_with_kvcache(q, k, v, cache_seqlens=lengths, num_splits=s))
            cells.append(f"splits {s or 'auto'} {tb / ms:.2f}")
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            ms = ms_of(lambda: torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, enable_gqa=True))
        cells.append(f"cuDNN {tb / ms:.2f}")
        print(f"{batch} x {context} round {rnd}: " + " | ".join(cells), flush=True)
    torch.cuda.empty_cache()
    cupy.get_default_memory_pool().free_all_blocks()
