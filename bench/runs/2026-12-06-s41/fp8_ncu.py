"""ncu target: issue 25's FP8 forward row (1 x 16384, 16 heads, d128, non-causal, e4m3 with per-head
descales), then the same inputs in bf16; one call each. PYTHONPATH=$PWD python fp8_ncu.py"""
import cupy
import ml_dtypes
import numpy as np

import cupyflash

rng = np.random.default_rng(0)
q, k, v = (cupy.asarray(rng.standard_normal((1, 16384, 16, 128), np.float32)).astype(ml_dtypes.bfloat16)
           for _ in range(3))
(q8, qd), (k8, kd), (v8, vd) = (cupyflash.quantize_fp8(x) for x in (q, k, v))
cupyflash.flash_attention(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd)
cupyflash.flash_attention(q, k, v)
cupy.cuda.Device().synchronize()
