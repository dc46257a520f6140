"""``python -m cupyflash``: a self-check against the float64 reference and a small benchmark.

On a CUDA GPU it checks the kernels at a small size for every dtype and times one forward and backward
against plain CuPy attention; without one it runs the NumPy path and says so. Exit status 1 when a
self-check fails, 2 for a bad command line.
"""

import argparse
import sys
import time

import numpy

from . import __version__, _problem, reference
from ._api import flash_attention, flash_attention_backward, flash_attention_with_kvcache

# Self-check tolerance: the error against float64 relative to the output's scale, per dtype (the tests
# apply the stricter same-precision rule; this is a quick sanity check that catches broken installs).
_TOLERANCE = {"float16": 5e-3, "bfloat16": 3e-2, "float32": 1e-5, "float64": 1e-12}


def _gpu_status():
    """(True, device name) when CuPy sees a CUDA GPU, else (False, why not)."""
    try:
        import cupy
    except ImportError as exc:
        return False, f"CuPy is not installed ({exc})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CUDARuntimeError without a driver or device, among others
        return False, f"no GPU found (CUDA reports: {exc})"
    if count == 0:
        return False, "no GPU found"
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    return True, f"{props['name'].decode()} (compute capability {props['major']}.{props['minor']})"


def _relative_error(got, ref):
    got = numpy.asarray(got, dtype=numpy.float64)
    return float(numpy.abs(got - ref).max() / max(numpy.abs(ref).max(), 1e-300))


def self_check(xp):
    """Forward and backward on a small odd-sized GQA causal problem, every dtype; True when all pass."""
    to_host = (lambda x: x.get()) if xp is not numpy else numpy.asarray
    rng = numpy.random.default_rng(0)
    b, sq, sk, h, hk, d, dv = 2, 77, 101, 4, 2, 40, 24
    base = [rng.standard_normal(s) for s in ((b, sq, h, d), (b, sk, hk, d), (b, sk, hk, dv), (b, sq, h, dv))]
    ok = True
    print(f"self-check (batch {b}, seqlen_q {sq}, seqlen_k {sk}, heads {h}/{hk}, headdim {d}/{dv}, causal):")
    for name, dtype in _problem.SUPPORTED_DTYPES.items():
        q, k, v, dout = (xp.asarray(x.astype(dtype)) for x in base)
        out, lse = flash_attention(q, k, v, causal=True, return_lse=True)
        grads = flash_attention_backward(dout, q, k, v, out, lse, causal=True)
        host = [to_host(x).astype(numpy.float64) for x in (q, k, v, dout)]
        ref_out, _ = reference.attention(*host[:3], causal=True)
        ref_grads = reference.attention_backward(host[3], *host[:3], causal=True)
        errors = [_relative_error(to_host(out), ref_out)]
        errors += [_relative_error(to_host(g), r) for g, r in zip(grads, ref_grads)]
        passed = max(errors) <= _TOLERANCE[name]
        ok &= passed
        print(
            f"  {name:<9} max relative error out {errors[0]:.1e}  dq {errors[1]:.1e}  dk {errors[2]:.1e}  "
            f"dv {errors[3]:.1e}  {'ok' if passed else 'FAILED'}"
        )
    return ok & kvcache_check(xp)


def kvcache_check(xp):
    """A decode step on a paged cache (one new token appended, GQA, causal) against the reference; bfloat16
    and float32. True when both pass."""
    to_host = (lambda x: x.get()) if xp is not numpy else numpy.asarray
    rng = numpy.random.default_rng(2)
    batch, heads, heads_k, d, page, pages = 2, 8, 2, 64, 8, 8
    table = rng.permutation(batch * pages).reshape(batch, pages).astype(numpy.int32)
    lengths = numpy.array([40, 9], numpy.int32)
    base = [rng.standard_normal(s) for s in ((batch, 1, heads, d), (batch * pages, page, heads_k, d),
                                             (batch * pages, page, heads_k, d), (batch, 1, heads_k, d),
                                             (batch, 1, heads_k, d))]
    ok = True
    for name in ("bfloat16", "float32"):
        dtype = _problem.SUPPORTED_DTYPES[name]
        q, k_cache, v_cache, k, v = (x.astype(dtype) for x in base)
        want = reference.attention_with_kvcache(q, k_cache, v_cache, k=k, v=v, cache_seqlens=lengths, block_table=table,
                                                causal=True)[0]
        q, k_cache, v_cache, k, v = (xp.asarray(x) for x in (q, k_cache, v_cache, k, v))
        out = flash_attention_with_kvcache(q, k_cache, v_cache, k=k, v=v, cache_seqlens=xp.asarray(lengths),
                                           block_table=xp.asarray(table), causal=True)
        error = _relative_error(to_host(out), want)
        passed = error <= _TOLERANCE[name]
        ok &= passed
        print(f"  kvcache {name:<9} paged decode, max relative error {error:.1e}  {'ok' if passed else 'FAILED'}")
    return ok


def _time_ms(fn, repeat=10):
    import cupy

    fn()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for _ in range(repeat):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop))
    return float(numpy.median(times))


def benchmark():
    """One forward and backward against plain CuPy attention (matmul, softmax, matmul) in float16."""
    import cupy

    b, s, h, d = 4, 2048, 16, 64
    rng = numpy.random.default_rng(1)
    q, k, v, dout = (cupy.asarray(rng.standard_normal((b, s, h, d)).astype(numpy.float16)) for _ in range(4))
    scale = 1.0 / numpy.sqrt(d)

    def plain_cupy():
        qt, kt, vt = (x.transpose(0, 2, 1, 3) for x in (q, k, v))
        scores = (qt @ kt.transpose(0, 1, 3, 2)).astype(cupy.float32) * scale
        scores -= scores.max(axis=-1, keepdims=True)
        p = cupy.exp(scores)
        p /= p.sum(axis=-1, keepdims=True)
        return p.astype(cupy.float16) @ vt

    out, lse = flash_attention(q, k, v, return_lse=True)
    flops = 4.0 * b * h * s * s * d
    rows = [
        ("cupyflash forward", _time_ms(lambda: flash_attention(q, k, v)), flops),
        ("cupyflash backward", _time_ms(lambda: flash_attention_backward(dout, q, k, v, out, lse)), 2.5 * flops),
        ("plain CuPy forward", _time_ms(plain_cupy), flops),
    ]
    print(f"\nbenchmark float16, batch {b}, seqlen {s}, heads {h}, headdim {d}, non-causal (median of 10):")
    for name, ms, f in rows:
        print(f"  {name:<20} {ms:8.3f} ms  {f / ms / 1e9:7.1f} TFLOP/s")


def _parser():
    return argparse.ArgumentParser(
        prog="python -m cupyflash",
        description=(
            "Self-check cupyflash against the float64 reference (forward and backward, every dtype, a small "
            "odd-sized GQA causal problem) and time one forward and backward pass against plain CuPy "
            "attention. Without a GPU it checks the NumPy path instead and says so."
        ),
        epilog="Exit status: 0 when the self-check passes, 1 when it fails, 2 for a bad command line.",
    )


def main(argv=None):
    _parser().parse_args(argv)
    has_gpu, detail = _gpu_status()
    if has_gpu:
        import cupy

        print(f"cupyflash {__version__} on {detail}")
        ok = self_check(cupy)
        benchmark()
    else:
        print(f"cupyflash {__version__}: {detail}; running the NumPy path on the CPU (the CUDA kernels need a GPU).")
        start = time.perf_counter()
        ok = self_check(numpy)
        print(f"NumPy path self-check took {time.perf_counter() - start:.2f} s")
    print("self-check passed" if ok else "self-check FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
