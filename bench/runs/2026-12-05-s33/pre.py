"""Precompiles, in the tree it runs from, the variants one A/B arm's benchmark uses: `drop` (bf16 head dim
128 forward and backward, training.py) or `fp32` (the float32 planes kernels, bench.py --dtypes fp32), and
every small helper kernel; `f32`: every float32 variant (the float32 GPU tests)."""
import sys
import time

from cupyflash import _families, _kernels

HEAVY = {"sm90_fwd", "sm80_fwd", "sm80_bwd", "sm80_fwd_parts", "sm90_bwd", "kvc_fwd", "sm80_fwd_dmma",
         "sm90_fwd_planes", "sm90_fwd_fp8", "sm90_bwd_planes", "sm80_bwd_parts", "sm80_bwd_dmma", "general_fwd",
         "general_bwd_dq", "general_bwd_dkdv"}


def wanted(v, mode):
    name = v.kernel.name
    if name not in HEAVY:
        return True
    if mode in ("f32", "f64"):
        return v.dtype == {"f32": "float32", "f64": "float64"}[mode]
    if mode == "drop":
        return name in ("sm90_fwd", "sm90_bwd") and v.dtype == "bfloat16" and v.tile[0] == 128
    return name in ("sm90_fwd_planes", "sm90_bwd_planes")


t = time.time()
variants = [v for v in _families.VARIANTS if wanted(v, sys.argv[1])]
_kernels.precompile(variants, max_workers=int(sys.argv[2]))
print(f"{sys.argv[1]} {len(variants)} variants {time.time() - t:.1f} s", flush=True)
