"""ncu target: one dense decode step, batch x context (default 1 x 131072), GQA 32/8, head dim 128, bf16,
by cupyflash (argument "flash") or cuDNN through torch SDPA (argument "cudnn"); each called 3 times.
PYTHONPATH=$PWD python decode_ncu.py flash|cudnn [BATCH CONTEXT]"""
import sys

import numpy as np

which = sys.argv[1]
batch, context = (int(sys.argv[2]), int(sys.argv[3])) if len(sys.argv) > 3 else (1, 131072)
if which == "flash":
    import cupy
    import ml_dtypes

    import cupyflash

    rng = np.random.default_rng(0)
    bf16 = ml_dtypes.bfloat16
    q = cupy.asarray(rng.standard_normal((batch, 1, 32, 128), np.float32)).astype(bf16)
    k, v = (cupy.asarray(rng.standard_normal((batch, context, 8, 128), np.float32)).astype(bf16) for _ in range(2))
    lengths = cupy.full(batch, context, np.int32)
    for _ in range(3):
        cupyflash.flash_attention_with_kvcache(q, k, v, cache_seqlens=lengths)
    cupy.cuda.Device().synchronize()
else:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(batch, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(batch, 8, context, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        for _ in range(3):
            torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    torch.cuda.synchronize()
