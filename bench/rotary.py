"""apply_rotary's bandwidth (issue 23: at least 80% of the device copy rate on (8, 4096, 32, 128) bf16).

Run from the repository root on a GPU::

    python bench/rotary.py                       # the issue's shape, both pair layouts
    python bench/rotary.py --shape 2,1024,16,64 --dtypes bf16,fp32

Per row: the GB/s of a device copy of x (``cupy.copyto``, one read and one write) and of apply_rotary (the
fused kernel, kernels_cu/common/rotary.cu), each counted as one read and one write of x (the tables are small
and stay in L2), and the fused kernel's share of the copy rate. Times are CUDA events around calls enqueued
back to back (medians).
"""

import argparse
import sys

import harness


def _parse_shape(text):
    shape = tuple(int(x) for x in text.split(","))
    if len(shape) != 4 or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"expected batch,seqlen,heads,headdim; got {text!r}")
    return shape


def _rows(name, shape, repeats, clock):
    """The table's lines of one dtype: the copy rate and the fused kernel's, both pair layouts."""
    import cupy

    import cupyflash

    x = harness.make_inputs(shape, harness.dtype(name), seed=0, count=1)[0]
    out = cupy.empty_like(x)
    seqlen, headdim = shape[1], shape[3]
    angles = cupy.arange(seqlen, dtype=cupy.float32)[:, None] * cupy.logspace(0, -4, headdim // 2, dtype=cupy.float32)
    cos, sin = cupy.cos(angles), cupy.sin(angles)
    moved = 2 * x.nbytes / 1e9

    def rate(call):
        return moved / (harness.median(harness.time_back_to_back(call, 3, repeats, clock)) / 1e3)

    copy = rate(lambda: cupy.copyto(out, x))
    lines = []
    for interleaved in (False, True):
        fused = rate(lambda: cupyflash.apply_rotary(x, cos, sin, interleaved=interleaved))
        layout = "interleaved" if interleaved else "halves"
        lines.append(f"{name:6} {layout:12} {copy:10.0f} {fused:8.0f} {fused / copy:11.2f}")
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", type=_parse_shape, default=(8, 4096, 32, 128), help="batch,seqlen,heads,headdim")
    parser.add_argument("--dtypes", default="bf16", help="comma-separated: fp16, bf16, fp32, fp64")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    harness.require_gpu("rotary.py")

    clock = harness.cupy_clock()
    print(f"{'dtype':6} {'layout':12} {'copy GB/s':>10} {'fused':>8} {'fused/copy':>11}")
    for name in args.dtypes.split(","):
        for line in _rows(name, args.shape, args.repeats, clock):
            print(line)
        harness.release_cached_memory()
    return 0


if __name__ == "__main__":
    sys.exit(main())
