"""Issue 24 probe: where a Hopper backward CTA's first microseconds go (session 52). Session 46's CTA
clocks (bench/runs/2026-12-06-s46/probe/cta_clocks.py, whose documents, walks and kept modules this
reuses) plus, from start_probe.patch, when the consumers saw K and V and their first Q and dO stage.
Prints per row (dense causal, documents, ragged documents): the CTAs' mean times from their start to
K/V and to the first stage, the fitted fixed cost and the epilogue, by walk length.

Run on a GPU from a tree with the patch applied (never landed):

    patch -p1 < bench/runs/2026-12-07-s52/start_probe.patch
    PYTHONPATH=$PWD python bench/runs/2026-12-07-s52/start_probe.py
"""

import importlib.util
from pathlib import Path

import cupy
import ml_dtypes
import numpy as np

import cupyflash

_spec = importlib.util.spec_from_file_location(
    "cta_clocks", Path(__file__).resolve().parents[1] / "2026-12-06-s46" / "probe" / "cta_clocks.py")
clocks46 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(clocks46)  # (replaces cupy.RawModule by its kept module)


def run(label, q, k, v, dout, options, tile_walks):
    out, lse = cupyflash.flash_attention(q, k, v, causal=True, return_lse=True, **options)
    for _ in range(2):
        cupyflash.flash_attention_backward(dout, q, k, v, out, lse, causal=True, **options)
    name, module = next((n, m) for n, m in reversed(clocks46.MODULES) if "sm90_bwd<" in n)
    probe = cupy.ndarray((1 << 16, 8), cupy.uint64, memptr=module.get_global("cupyflash_cta_clock"))
    probe[:] = 0
    cupy.cuda.Device().synchronize()
    cupyflash.flash_attention_backward(dout, q, k, v, out, lse, causal=True, **options)
    cupy.cuda.Device().synchronize()
    c = cupy.asnumpy(probe)
    c = c[c[:, 0] != 0].astype(np.int64)
    start, main_end, end, kv, first = c[:, 0], c[:, 1], c[:, 2], c[:, 6], c[:, 7]
    walk = tile_walks[c[:, 3] & 0xFFFF]
    us = lambda x: x / 1e3  # noqa: E731
    duration = us(end - start)
    slope, fixed = np.polyfit(walk, duration, 1)
    print(f"\n{label}: {len(c)} CTAs, kernel {us(end.max() - start.min()):.0f} us; duration = {fixed:.2f} + "
          f"{slope:.3f} x walk; start -> K/V {us(kv - start).mean():.2f} us, -> first Q/dO "
          f"{us(first - start).mean():.2f} us, epilogue {us(end - main_end).mean():.2f} us (means)")
    print("  walk    CTAs  -> K/V us  -> Q/dO us  epilogue us  duration us")
    for lo, hi in ((0, 4), (4, 8), (8, 16), (16, 32), (32, 64), (64, 128), (128, 257)):
        m = (walk >= lo) & (walk < hi)
        if m.any():
            print(f"  {lo:>3}-{hi - 1:<3} {m.sum():>5} {us(kv - start)[m].mean():>9.2f} {us(first - start)[m].mean():>9.2f} "
                  f"{us(end - main_end)[m].mean():>12.2f} {duration[m].mean():>12.2f}")


def main():
    n, heads, d = clocks46.SEQLEN, clocks46.HEADS, clocks46.HEADDIM
    rng = np.random.default_rng(1)
    q, k, v, dout = (cupy.asarray(rng.standard_normal((1, n, heads, d)).astype(ml_dtypes.bfloat16)) for _ in range(4))
    m, kn = clocks46.BLOCK_M, clocks46.BLOCK_N
    dense = np.array([sum(1 for qt in range(n // m) if qt * m + m - 1 >= kt * kn) for kt in range(n // kn)])
    run("dense causal", q, k, v, dout, {}, dense)
    for ragged in (False, True):
        doc = clocks46.documents(ragged)
        mask = cupyflash.BlockMask.from_mask_mod(lambda b, h, qi, ki, dd: dd[b, qi] == dd[b, ki], 1, 1, n, n,
                                                 (128, 128), (cupy.asarray(doc[None]),))
        run("ragged documents" if ragged else "documents", q, k, v, dout, {"block_mask": mask}, clocks46.walks(doc))


if __name__ == "__main__":
    main()
