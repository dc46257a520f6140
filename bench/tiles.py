"""Hopper forward TFLOP/s per tile (query rows, keys per tile, K/V stages) of one head-dim bucket: the
measurements behind cupyflash/_families/sm90.py's FWD_TILES (issue 20).

Run from the repository root on an H100/H200::

    python bench/tiles.py --headdim 64 --tiles 192,128,4 128,128,4
    python bench/tiles.py --headdim 96 --tiles 128,128,2 192,64,3 --seqlens 2048,8192 --causal 1
    python bench/tiles.py --headdim 64 --tiles 192,64,4 --dry-run     # the rows; no GPU

Each tile is forced for every call of the run (the table entry of its bucket replaced, the plan cache
cleared), a tile outside the table included: its kernel compiles on first use. Before timing, each tile's
output on odd shapes (causal and not, seqlen_q != seqlen_k, GQA, a partial last tile) is checked against
a float64 reference; a tile whose error is above the bound is reported and not timed. The grid is
bench.py's (batch x seqlen = 16384 tokens, heads x headdim = 2048), calls back to back between CUDA
events (or --per-call), median of --repeats; the last row, "table", is what dispatch picks on its own.
"""

import argparse
import sys

import harness
import numpy

TOTAL_TOKENS = 16384
MODEL_DIM = 2048
#: Odd shapes of the check: (batch, seqlen_q, seqlen_k, heads, heads_k, causal).
CHECK_SHAPES = ((1, 517, 1111, 2, 2, False), (2, 1000, 1000, 4, 2, True), (1, 77, 2500, 2, 1, True))
#: Largest error against float64 a 16-bit tile may show on the check shapes (bfloat16 outputs round at
#: 2^-8 relative; the plain kernels measured up to 7e-3).
CHECK_BOUND = 2e-2


def parse_tile(text):
    """``192,128,4`` -> (192, 128, 4)."""
    try:
        tile = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a tile is block_m,block_n,stages, got {text!r}") from None
    if len(tile) != 3:
        raise argparse.ArgumentTypeError(f"a tile is block_m,block_n,stages, got {text!r}")
    return tile


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--headdim", type=harness.positive_int, default=64, help="q, k and v head dim (default 64)")
    parser.add_argument("--tiles", type=parse_tile, nargs="+", required=True, help="block_m,block_n,stages ...")
    parser.add_argument("--seqlens", type=lambda t: harness.parse_list(t, harness.positive_int),
                        default=(1024, 2048, 4096, 16384), help="e.g. 1024,16384 (batch = 16384 // seqlen)")
    parser.add_argument("--causal", type=lambda t: harness.parse_list(t, int, (0, 1)), default=(0, 1),
                        help="0, 1 or 0,1")
    parser.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    harness.add_timing_options(parser, repeats=30, warmup=5)
    parser.add_argument("--dry-run", action="store_true", help="print the rows and exit without touching the GPU")
    return parser.parse_args(argv)


def rows(args):
    """(seqlen, batch, heads, causal) of every timed cell, in table order."""
    heads = max(MODEL_DIM // args.headdim, 1)
    return [(s, max(TOTAL_TOKENS // s, 1), heads, bool(c)) for c in args.causal for s in args.seqlens]


def reference(q, k, v, causal):
    """float64 attention of (batch, seqlen, heads, dim) arrays, GQA by repetition, causal bottom-right aligned."""
    import cupy

    qf, kf, vf = (x.astype(cupy.float64) for x in (q, k, v))
    group = q.shape[2] // k.shape[2]
    kf, vf = (cupy.repeat(x, group, axis=2) for x in (kf, vf))
    s = cupy.einsum("bqhd,bkhd->bhqk", qf, kf) / numpy.sqrt(q.shape[-1])
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        s += cupy.triu(cupy.full((sq, sk), -cupy.inf), 1 + sk - sq)
    p = cupy.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return cupy.einsum("bhqk,bkhd->bqhd", p, vf)


def check(attention, headdim, dtype):
    """Largest error of ``attention`` against float64 over CHECK_SHAPES."""
    import cupy

    worst = 0.0
    for index, (b, sq, sk, h, hk, causal) in enumerate(CHECK_SHAPES):
        q, = harness.make_inputs((b, sq, h, headdim), dtype, seed=index, count=1)
        k, v = harness.make_inputs((b, sk, hk, headdim), dtype, seed=100 + index, count=2)
        out = attention(q, k, v, causal=causal).astype(cupy.float64)
        worst = max(worst, float(abs(out - reference(q, k, v, causal)).max()))
    return worst


def main(argv=None):
    """Check and time each tile; returns the exit status."""
    args = parse_args(argv)
    cells = rows(args)
    header = "tile          " + " ".join(f"{s:>6}{'c' if c else ' '}" for s, _, _, c in cells) + "   max err"
    if args.dry_run:
        print(f"head dim {args.headdim}, {args.dtype}; TFLOP/s per tile at (seqlen, causal):\n{header}")
        return 0
    harness.require_gpu("tiles.py", "--dry-run prints the rows without one.")
    import cupyflash
    from cupyflash import _api
    from cupyflash._families import sm90

    dims = sm90.bucket(args.headdim, args.headdim)
    if dims is None:
        print(f"tiles.py: head dim {args.headdim} has no sm90 bucket", file=sys.stderr)
        return harness.EXIT_CANNOT_RUN
    dtype = harness.dtype(args.dtype)
    table = sm90.FWD_TILES[dims]
    settings = harness.Settings(args.warmup, args.repeats, backward=False, peers=False,
                                timing="per-call" if args.per_call else "back-to-back")
    print(f"head dim {args.headdim} (bucket {dims}), {args.dtype}; TFLOP/s per tile, table {table}:\n{header}",
          flush=True)
    for tile in [*args.tiles, None]:
        sm90.FWD_TILES[dims] = table if tile is None else (tile,)
        _api.PLANS.clear()
        err = check(cupyflash.flash_attention, args.headdim, dtype)
        line = f"{'table' if tile is None else ','.join(map(str, tile)):<13} "
        if not err <= CHECK_BOUND:
            print(line + f"not timed: max error {err:.2e} above {CHECK_BOUND:.0e}", flush=True)
            continue
        for seqlen, batch, heads, causal in cells:
            q, k, v = harness.make_inputs((batch, seqlen, heads, args.headdim), dtype, seed=seqlen, count=3)
            flops = harness.forward_flops(batch, heads, seqlen, seqlen, args.headdim, causal)
            result = harness.measure(lambda: lambda: cupyflash.flash_attention(q, k, v, causal=causal), flops,
                                     settings)
            line += f"{result.get('tflops', float('nan')):7.0f} "
        print(line + f"  {err:.1e}", flush=True)
    sm90.FWD_TILES[dims] = table
    return 0


if __name__ == "__main__":
    sys.exit(main())
