"""One decode step twice (for ncu's --launch-skip): GQA 32/8, head dim 128, bf16, a dense cache of
batch x context keys, by cupyflash (argv[3] == "ours") or by torch's SDPA on the same tensors head-major
(cuDNN where torch picks it: argv[3] == "torch"). Usage: python decode_one.py BATCH CONTEXT ours|torch"""
import sys

import cupy
import numpy

import cupyflash

batch, context, who = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
rng = numpy.random.default_rng(0)
q, k, v = (cupy.asarray(rng.standard_normal(s, dtype=numpy.float32)) for s in
           ((batch, 1, 32, 128), (batch, context, 8, 128), (batch, context, 8, 128)))
if who == "ours":
    import ml_dtypes

    q, k, v = (x.astype(ml_dtypes.bfloat16) for x in (q, k, v))
    for _ in range(2):
        cupyflash.flash_attention_with_kvcache(q, k, v)
        cupy.cuda.Device().synchronize()
else:
    import torch

    tq, tk, tv = (torch.as_tensor(x, device="cuda").to(torch.bfloat16).transpose(1, 2).contiguous() for x in (q, k, v))
    for _ in range(2):
        torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, enable_gqa=True)
        torch.cuda.synchronize()
