"""The FP8 forward (issue 25's targets) beside cupyflash's own bfloat16 forward, on the same grid.

Run from the repository root on an H100/H200::

    python bench/fp8.py                                  # head dims 64, 128, 256; 4k, 8k, 16k; both masks
    python bench/fp8.py --headdims 128 --seqlens 16384 --per-call

Rows: flash_attention at (batch, seqlen, heads, d) with batch * seqlen = 16k tokens and heads * d = 2048
(16 heads of 128), e4m3 inputs with per-head descales (quantize_fp8) and the same inputs in bfloat16;
TFLOP/s (4 B H S^2 D, halved when causal) and FP8 over bfloat16. Targets: d128 16k non-causal at least
1,000 TFLOP/s, d256 1,100, d64 650; causal rows at 16k at least 0.9x their non-causal row; every row
with seqlen >= 4096 at least 1.4x bfloat16. Times: CUDA events around calls enqueued back to back
(medians), or with --per-call each call alone after a synchronize (host time included). An FP8 call the
installed version refuses prints its error.
"""

import argparse
import sys

import harness

TOKENS, WIDTH = 16384, 2048


def _rows(headdim, seqlen, causal, settings):
    import cupyflash

    heads, batch = WIDTH // headdim, max(1, TOKENS // seqlen)
    q, k, v, _ = harness.make_inputs((batch, seqlen, heads, headdim), harness.dtype("bf16"), seed=seqlen + headdim)
    (q8, qd), (k8, kd), (v8, vd) = (cupyflash.quantize_fp8(x) for x in (q, k, v))
    flops = harness.forward_flops(batch, heads, seqlen, seqlen, headdim, causal)
    bf16 = harness.measure(lambda: lambda: cupyflash.flash_attention(q, k, v, causal=causal), flops, settings)
    fp8 = harness.measure(lambda: lambda: cupyflash.flash_attention(q8, k8, v8, q_descale=qd, k_descale=kd,
                                                                    v_descale=vd, causal=causal), flops, settings)
    return bf16, fp8


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--headdims", default="64,128,256", help="comma-separated head dims")
    parser.add_argument("--seqlens", default="4096,8192,16384", help="comma-separated sequence lengths")
    parser.add_argument("--per-call", action="store_true", help="time each call alone (host time included)")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    harness.require_gpu("fp8.py")
    settings = harness.Settings(warmup=3, repeats=args.repeats, backward=False, peers=False,
                                timing="per-call" if args.per_call else "back-to-back")
    print(f"{'d':>4} {'seqlen':>6} {'causal':>6} {'bf16 TFLOP/s':>12} {'fp8 TFLOP/s':>12} {'fp8/bf16':>9}")
    for headdim in (int(d) for d in args.headdims.split(",")):
        for seqlen in (int(s) for s in args.seqlens.split(",")):
            for causal in (False, True):
                bf16, fp8 = _rows(headdim, seqlen, causal, settings)
                cells = [f"{m['tflops']:12.1f}" if "error" not in m else f"{'error':>12}" for m in (bf16, fp8)]
                ratio = (f"{bf16['median_ms'] / fp8['median_ms']:9.2f}" if "error" not in bf16 and "error" not in fp8
                         else f"{'':9}")
                print(f"{headdim:4} {seqlen:6} {int(causal):6} {cells[0]} {cells[1]} {ratio}")
                for m in (bf16, fp8):
                    if "error" in m:
                        print(f"    {m['error'][:110]}")
                harness.release_cached_memory()
    return 0


if __name__ == "__main__":
    sys.exit(main())
