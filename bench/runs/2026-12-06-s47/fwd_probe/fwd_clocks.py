"""Issue 22 probe: where the float32 Hopper forward's short rows lose (1.64-1.91x torch's memory-efficient
at 1k, floor 2x; 2.06-2.56x at 4k). Every (work tile, consumer warpgroup) of one forward gets four clocks
(fwd_clocks.patch: Q ready, the split of Q into planes done, main loop done, epilogue done) with its SM,
CTA and walk. Per row: the warpgroups' time split into the split, the main loop (fitted as fixed + a key
tile's cost x walk), the epilogue and the waits between work tiles (Q not yet published or loaded), and
the SMs' busy fraction.

Prediction (session 47): at 1k (walks of 4.5 key tiles on average, causal) the split, the epilogue and the
waits between tiles take ~25-35% of a warpgroup's time, at 4k ~8-10%; a key tile costs the same at both.

Run on a GPU from a copy of the tree with the patch applied (never landed):

    patch -p1 < bench/runs/2026-12-06-s47/fwd_probe/fwd_clocks.patch
    PYTHONPATH=$PWD python bench/runs/2026-12-06-s47/fwd_probe/fwd_clocks.py
"""

import cupy
import ml_dtypes
import numpy as np

import cupyflash

MODULES = []


class _KeptModule(cupy.RawModule):
    """cupy.RawModule, kept, so the probe array of the forward's module can be read."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        MODULES.append(((kwargs.get("name_expressions") or ("",))[0], self))


cupy.RawModule = _KeptModule  # (cupyflash's get_kernel looks it up at each compile)

ROWS = [  # (dtype, head dim, causal, seqlen, batch, heads): bench.py's float32 rows, and bf16 beside one
    ("float32", 128, True, 1024, 16, 16),
    ("float32", 128, True, 4096, 4, 16),
    ("float32", 128, False, 1024, 16, 16),
    ("float32", 64, True, 1024, 16, 32),
    ("bfloat16", 128, True, 1024, 16, 16),
]


def probe(kernel):
    name, module = next((n, m) for n, m in reversed(MODULES) if kernel in n)
    clocks = cupy.ndarray((1 << 18, 6), cupy.uint64, memptr=module.get_global("cupyflash_fwd_clock"))
    count = cupy.ndarray((1,), cupy.uint32, memptr=module.get_global("cupyflash_fwd_clock_count"))
    return name, clocks, count


def run(dtype, d, causal, seqlen, batch, heads):
    rng = np.random.default_rng(1)
    cast = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32
    q, k, v = (cupy.asarray(rng.standard_normal((batch, seqlen, heads, d)).astype(cast)) for _ in range(3))
    for _ in range(3):
        cupyflash.flash_attention(q, k, v, causal=causal, return_lse=True)
    name, clocks, count = probe("sm90_fwd_planes<" if dtype == "float32" else "sm90_fwd<")
    clocks[:] = 0
    count[:] = 0
    cupy.cuda.Device().synchronize()
    cupyflash.flash_attention(q, k, v, causal=causal, return_lse=True)
    cupy.cuda.Device().synchronize()
    n = int(count.get()[0])
    c = cupy.asnumpy(clocks[:n]).astype(np.int64)
    t0, t1, t2, t3 = (c[:, i] for i in range(4))
    sm, cta, wg = c[:, 4] >> 48, (c[:, 4] >> 16) & 0xFFFFFFFF, (c[:, 4] >> 8) & 0xFF
    walk = c[:, 5] >> 48
    start = t0.min()
    makespan = (t3.max() - start) / 1e3
    split, main, epilogue = (t1 - t0) / 1e3, (t2 - t1) / 1e3, (t3 - t2) / 1e3
    slope, fixed = np.polyfit(walk, main, 1) if len(np.unique(walk)) > 1 else (main.mean() / walk.mean(), 0.0)
    gaps, first_waits = [], []
    lanes = 0
    for key in np.unique(cta * 4 + wg):
        m = cta * 4 + wg == key
        order = np.argsort(t0[m])
        s, e = t0[m][order], t3[m][order]
        gaps.extend((s[1:] - e[:-1]) / 1e3)
        first_waits.append((s[0] - start) / 1e3)
        lanes += 1
    busy = (t3 - t0).sum() / 1e3 / (lanes * makespan)
    total = (t3 - t0).sum() / 1e3 + np.sum(gaps)
    flops = 4 * batch * heads * seqlen * seqlen * d / (2 if causal else 1)
    print(f"\n{dtype} d{d} {'causal' if causal else 'full'} {seqlen} b{batch} h{heads}: {name[:60]}")
    print(f"  {n} (work tile, warpgroup) entries on {len(np.unique(sm))} SMs, {lanes} warpgroups; kernel "
          f"{makespan:.0f} us ({flops / makespan / 1e6:.1f} TFLOP/s inside it); warpgroups busy {busy:.1%}")
    print(f"  a work tile: split {split.mean():.2f} us, main loop {main.mean():.2f} us = {fixed:.2f} + "
          f"{slope:.3f} x walk (mean {walk.mean():.1f}), epilogue {epilogue.mean():.2f} us; wait before the "
          f"next {np.mean(gaps) if gaps else 0:.2f} us; first start {np.mean(first_waits):.2f} us after the kernel's")
    print(f"  shares of the warpgroups' time: split {split.sum() / 1e3 / total:.1%}, main-loop fixed "
          f"{fixed * n / total:.1%}, key tiles {slope * walk.sum() / total:.1%}, epilogue "
          f"{epilogue.sum() / 1e3 / total:.1%}, waits {np.sum(gaps) / total:.1%}")


def main():
    for row in ROWS:
        run(*row)


if __name__ == "__main__":
    main()
