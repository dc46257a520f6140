"""Issue 22: the kernels of one float32 forward (and backward) call on bench.py's d128 causal 1k row (batch 16,
heads 16, "highest"), for `ncu --metrics gpu__time_duration.sum`: how the call's time splits between the
planes passes (split_planes), the forward kernel and, for the backward, delta, dQ's conversion and the
kernel. Session 21's ncu gave three passes of 82-84 us beside a forward kernel of 711 us at this row (ncu's
locked clocks), while bench.py's 71.4 TFLOP/s (H100) means ~240 us for the whole call: run under
`ncu --clock-control none`, this settles which. PYTHONPATH=$PWD python fp32_parts.py"""
import cupy
import numpy as np

import cupyflash

rng = np.random.default_rng(0)
q, k, v = (cupy.asarray(rng.standard_normal((16, 1024, 16, 128), np.float32)) for _ in range(3))
out, lse = cupyflash.flash_attention(q, k, v, causal=True, return_lse=True)
dout = cupy.asarray(rng.standard_normal(out.shape, np.float32))
cupyflash.flash_attention_backward(dout, q, k, v, out, lse, causal=True)
cupy.cuda.Device().synchronize()
