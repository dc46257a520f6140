"""Back-to-back times (CUDA events, median of 5 rounds of 30 calls) of the plain and dropout Hopper
forwards (bf16, d128, 4k, batch 4, 16 heads), causal and not, in alternating order."""
import cupy
import ml_dtypes
import numpy as np

import cupyflash

rng = np.random.default_rng(0)
q, k, v = (cupy.asarray(rng.standard_normal((4, 4096, 16, 128)).astype(ml_dtypes.bfloat16)) for _ in range(3))
configs = [(c, p) for c in (False, True) for p in (0.0, 0.1)]
times = {cfg: [] for cfg in configs}
start, stop = cupy.cuda.Event(), cupy.cuda.Event()
for r in range(5):
    for causal, p in (configs if r % 2 == 0 else configs[::-1]):
        def call(causal=causal, p=p):
            return cupyflash.flash_attention(q, k, v, causal=causal, dropout_p=p, dropout_seed=1234 if p else None)

        call()
        start.record()
        for _ in range(30):
            call()
        stop.record()
        stop.synchronize()
        times[(causal, p)].append(cupy.cuda.get_elapsed_time(start, stop) / 30)
med = {cfg: float(np.median(t)) for cfg, t in times.items()}
for causal in (False, True):
    plain, drop = med[(causal, 0.0)], med[(causal, 0.1)]
    print(f"causal={int(causal)} plain {plain * 1e3:.0f} us dropout {drop * 1e3:.0f} us ratio {drop / plain:.3f}  "
          f"rounds {[round(x * 1e3) for x in times[(causal, 0.1)]]}")
