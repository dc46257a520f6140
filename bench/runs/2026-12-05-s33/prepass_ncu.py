"""One float32 forward and backward at d128 causal 1k (16 x 1k x 16 heads), for ncu of split_planes."""
import sys

sys.path.insert(0, "bench")
import harness  # noqa: E402

import cupyflash  # noqa: E402

q, k, v, dout = harness.make_inputs((16, 1024, 16, 128), harness.dtype("fp32"), seed=1)
for _ in range(2):
    out, lse = cupyflash.flash_attention(q, k, v, causal=True, return_lse=True)
    cupyflash.flash_attention_backward(dout, q, k, v, out, lse, causal=True)
harness.synchronize()
