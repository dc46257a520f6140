import sys, cupy, numpy, cupyflash
b, s, d, causal = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
q, k, v, do = (cupy.asarray(numpy.random.default_rng(i).standard_normal((b, s, 16, d)).astype(numpy.float32)) for i in range(4))
for _ in range(2):
    o, l = cupyflash.flash_attention(q, k, v, causal=causal, return_lse=True)
    cupyflash.flash_attention_backward(do, q, k, v, o, l, causal=causal); cupy.cuda.Device().synchronize()
