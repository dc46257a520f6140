"""One float32 forward and backward (batch, seqlen, 16 heads, head dim; causal 0/1 from argv) twice, for
ncu's --launch-skip 1 (issue 22: the Hopper float32 backward)."""
import sys

import cupy
import numpy

import cupyflash

b, s, d, causal = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
rng = numpy.random.default_rng
q, k, v, do = (cupy.asarray(rng(i).standard_normal((b, s, 16, d)).astype(numpy.float32)) for i in range(4))
for _ in range(2):
    out, lse = cupyflash.flash_attention(q, k, v, causal=causal, return_lse=True)
    cupyflash.flash_attention_backward(do, q, k, v, out, lse, causal=causal)
    cupy.cuda.Device().synchronize()
