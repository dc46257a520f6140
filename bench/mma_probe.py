"""Tensor-core probes for issue 22 (float32 and float64 on the tensor cores): what each mma.sync operand
type delivers on this GPU, and how its float32 (float64) accumulation rounds.

Run from the repository root on a GPU of compute capability 8.0 or newer::

    python bench/mma_probe.py                # both probes
    python bench/mma_probe.py --rounding     # the rounding probe only (one warp, microseconds)

Throughput: every warp of (multiprocessors x --ctas-per-sm) CTAs of 4 warps issues --iterations rounds
of 8 independent products on non-zero operands, timed between CUDA events; TFLOP/s counts 2 m n k per
product (bf16 m16n8k16, tf32 m16n8k8, f64 m8n8k4; on sm_90 also f64 m16n8k8 and m16n8k16). It bounds
what an attention kernel built on that product can reach: 3xTF32 pays three products per float32
product, a three-way bf16 split six.

Rounding: one product of each type with a single non-zero output element d = c + sum_k a_k b_k, the
operands chosen so that the exact result lies between two neighbouring accumulator values; the table
prints the exact sum (in accumulator ulps above c), what the tensor cores returned and what
round-to-nearest-even would give. Whether they round to nearest, truncate, or drop low-order products
before the sum decides whether a float32 kernel can add its products' small terms in the accumulator
(bench/NOTES.md, session 18).

wgmma (sm_90 only): the same rounding cases through one warpgroup's wgmma (bf16 m64n8k16 and tf32
m64n8k8, A from registers in row 0 of warp 0, B all ones in shared memory, the accumulator loaded
with c), which decides whether a Hopper float32 kernel needs the split sums of the mma.sync one.

Fragment maps (sm_90 only): the float64 m16n8k8 and m16n8k16 shapes' register layouts as
:func:`f64_fragments` and :func:`f64_result` assume them, checked by one product of small integers
against A B on the host (a float64 forward on those shapes needs them).

Order (sm_90 only): which sequence of roundings the float64 shapes compute, D = C + A B on random
operands spread over 2^-30..2^30 against chains of FMAs emulated exactly on the host (:func:`fma_chain`).
The general kernels sum float64 scores in the order found (kernels_cu/general/tile.cuh), so that the
general backward recomputes the tensor-core forward's scores bitwise.
"""

import argparse
import sys

import harness

#: (name, instruction, a / b / c register counts, a / b / c register kind, m, n, k) per operand type.
TYPES = {
    "bf16": ("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", 4, 2, 4, "r", "f", 16, 8, 16),
    "tf32": ("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32", 4, 2, 4, "r", "f", 16, 8, 8),
    "f64": ("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64", 1, 1, 2, "d", "d", 8, 8, 4),
}
#: The larger float64 shapes of sm_90 (throughput only; their rounding is that of m8n8k4's DMMA units).
SM90_TYPES = {
    "f64k8": ("mma.sync.aligned.m16n8k8.row.col.f64.f64.f64.f64", 4, 2, 4, "d", "d", 16, 8, 8),
    "f64k16": ("mma.sync.aligned.m16n8k16.row.col.f64.f64.f64.f64", 8, 4, 4, "d", "d", 16, 8, 16),
}
ALL_TYPES = {**TYPES, **SM90_TYPES}
#: Independent products in flight per warp in the throughput loop.
CHAINS = 8


def asm_operands(kind, count, first):
    return ", ".join(f"%{first + i}" for i in range(count))


def mma_statement(name, a, b, c):
    """An inline-asm statement d = a b + d on the operand arrays a, b and the accumulator array c."""
    instruction, na, nb, nc, ak, ck = ALL_TYPES[name][:6]
    regs = "{" + asm_operands(ck, nc, 0) + "}, {" + asm_operands(ak, na, nc) + "}, {" + asm_operands(ak, nb, nc + na)
    regs += "}, {" + asm_operands(ck, nc, 0) + "}"
    outs = ", ".join(f'"+{ck}"({c}[{i}])' for i in range(nc))
    ins = ", ".join([f'"{ak}"({a}[{i}])' for i in range(na)] + [f'"{ak}"({b}[{i}])' for i in range(nb)])
    return f'asm volatile("{instruction} {regs};" : {outs} : {ins});'


def throughput_source(name):
    _, na, nb, nc, ak, ck, *_ = ALL_TYPES[name]
    operand = "double" if ak == "d" else "unsigned"
    acc = "double" if ck == "d" else "float"
    seed = "1.0 + 1e-3 * threadIdx.x" if ak == "d" else "0x3f803f80u + threadIdx.x"
    return f"""
extern "C" __global__ void probe_{name}(int iterations, {acc}* sink) {{
    {operand} a[{na}], b[{nb}];
    for (int i = 0; i < {na}; ++i) a[i] = {seed};
    for (int i = 0; i < {nb}; ++i) b[i] = {seed};
    {acc} c[{CHAINS}][{nc}];
    for (int j = 0; j < {CHAINS}; ++j)
        for (int i = 0; i < {nc}; ++i) c[j][i] = 0;
    for (int it = 0; it < iterations; ++it) {{
#pragma unroll
        for (int j = 0; j < {CHAINS}; ++j) {{ {acc}* cj = c[j]; {mma_statement(name, "a", "b", "cj")} }}
    }}
    {acc} total = 0;
    for (int j = 0; j < {CHAINS}; ++j)
        for (int i = 0; i < {nc}; ++i) total += c[j][i];
    if (total == 12345) sink[0] = total;  // keeps the products live
}}
"""


def rounding_source(name):
    _, na, nb, nc, ak, ck, *_ = ALL_TYPES[name]
    operand = "double" if ak == "d" else "unsigned"
    acc = "double" if ck == "d" else "float"
    return f"""
extern "C" __global__ void round_{name}(const {operand}* a, const {operand}* b, const {acc}* c, {acc}* d) {{
    const int lane = threadIdx.x;
    {operand} ra[{na}], rb[{nb}];
    {acc} rc[{nc}];
    for (int i = 0; i < {na}; ++i) ra[i] = a[lane * {na} + i];
    for (int i = 0; i < {nb}; ++i) rb[i] = b[lane * {nb} + i];
    for (int i = 0; i < {nc}; ++i) rc[i] = c[lane * {nc} + i];
    {mma_statement(name, "ra", "rb", "rc")}
    for (int i = 0; i < {nc}; ++i) d[lane * {nc} + i] = rc[i];
}}
"""


#: Rounding cases: (label, c, products as multiples of c's ulp), for d[0][0] = c + sum of the products.
CASES = (
    ("one product, 0.75 ulp", 1.0, (0.75,)),
    ("one product, -0.75 ulp", 1.0, (-0.75,)),
    ("one product, 0.5 ulp (a tie)", 1.0, (0.5,)),
    ("four products, 0.25 ulp each", 1.0, (0.25, 0.25, 0.25, 0.25)),
    ("two products, 0.375 ulp each", 1.0, (0.375, 0.375)),
)


def operand_layout(name, values):
    """Per lane registers of a and b giving d[0][0] = sum_k values[k] (a[0][k] = values[k], b[k][0] = 1),
    every other element of a and b zero, as flat lists (lane-major) of operand words or doubles."""
    import numpy

    _, na, nb, nc, ak, _, m, n, k = TYPES[name]
    A = numpy.zeros((m, k))
    B = numpy.zeros((k, n))
    A[0, : len(values)] = values
    B[: len(values), 0] = 1.0
    if name == "f64":
        a = [A[lane // 4, lane % 4] for lane in range(32)]  # a0 = A[g][t]
        b = [B[lane % 4, lane // 4] for lane in range(32)]  # b0 = B[t][g]
        return numpy.array(a), numpy.array(b)
    if name == "tf32":
        f = numpy.float32
        a = [[A[g, t], A[g + 8, t], A[g, t + 4], A[g + 8, t + 4]] for g, t in (divmod(lane, 4) for lane in range(32))]
        b = [[B[t, g], B[t + 4, g]] for g, t in (divmod(lane, 4) for lane in range(32))]
        return numpy.array(a, f).view(numpy.uint32).ravel(), numpy.array(b, f).view(numpy.uint32).ravel()
    import ml_dtypes

    def pack(x0, x1):
        pair = numpy.array([x0, x1], ml_dtypes.bfloat16).view(numpy.uint16).astype(numpy.uint32)
        return int(pair[0] | (pair[1] << 16))

    a, b = [], []
    for lane in range(32):
        g, t = divmod(lane, 4)
        a += [pack(A[g, 2 * t], A[g, 2 * t + 1]), pack(A[g + 8, 2 * t], A[g + 8, 2 * t + 1]),
              pack(A[g, 2 * t + 8], A[g, 2 * t + 9]), pack(A[g + 8, 2 * t + 8], A[g + 8, 2 * t + 9])]
        b += [pack(B[2 * t, g], B[2 * t + 1, g]), pack(B[2 * t + 8, g], B[2 * t + 9, g])]
    return numpy.array(a, numpy.uint32), numpy.array(b, numpy.uint32)


def rounding_rows():
    """(type, case, exact sum in ulps above c, returned in ulps, round-to-nearest in ulps) per probe."""
    import cupy
    import numpy

    rows = []
    for name in TYPES:
        acc = numpy.float64 if name == "f64" else numpy.float32
        kernel = cupy.RawKernel(rounding_source(name), f"round_{name}")
        nc = TYPES[name][3]
        for label, c0, multiples in CASES:
            ulp = float(numpy.spacing(acc(c0)))
            a, b = operand_layout(name, [m * ulp for m in multiples])
            c = numpy.zeros(32 * nc, acc)
            c[0] = c0
            d = cupy.zeros(32 * nc, acc)
            kernel((1,), (32,), (cupy.asarray(a), cupy.asarray(b), cupy.asarray(c), d))
            exact = sum(multiples)
            nearest = (float(acc(c0 + exact * ulp)) - c0) / ulp
            rows.append((name, label, exact, (float(d[0].get()) - c0) / ulp, nearest))
    return rows


#: wgmma shapes of the rounding probe: (instruction, the word of two (bf16) or one (tf32) ones, trailing
#: immediates: imm-scale-a, imm-scale-b and, for 16-bit operands, imm-trans-b).
WGMMA = {
    "bf16": ("wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16", "0x3f803f80u", "1, 1, 0"),
    "tf32": ("wgmma.mma_async.sync.aligned.m64n8k8.f32.tf32.tf32", "0x3f800000u", "1, 1"),
}


def wgmma_rounding_source(name):
    """One warpgroup: d = c + A B with A (64 x k) from registers (each warp's 16 rows in mma.sync's A
    fragment map), B (k x 8) all ones in a 1024-byte-aligned shared tile read through a 128-byte-swizzle
    K-major descriptor (all ones: the layout cannot matter), and the accumulator loaded with c."""
    instruction, one, immediates = WGMMA[name]
    return f"""
extern "C" __global__ void wg_round_{name}(const unsigned* a, const float* c, float* d) {{
    __shared__ __align__(1024) unsigned b[256];
    const int tid = threadIdx.x;
    for (int i = tid; i < 256; i += 128) b[i] = {one};
    __syncthreads();
    asm volatile("fence.proxy.async.shared::cta;\\n" ::: "memory");
    unsigned ra[4];
    float rd[4];
    for (int i = 0; i < 4; ++i) {{ ra[i] = a[tid * 4 + i]; rd[i] = c[tid * 4 + i]; }}
    const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(b));
    const unsigned long long desc = static_cast<unsigned long long>((addr & 0x3FFFF) >> 4) | 1ull << 16 |
                                    64ull << 32 | 1ull << 62;
    asm volatile("wgmma.fence.sync.aligned;\\n" ::: "memory");
    asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, 1, 0;\\n"
                 "{instruction} {{%0, %1, %2, %3}}, {{%4, %5, %6, %7}}, %8, p, {immediates};\\n}}\\n"
                 : "+f"(rd[0]), "+f"(rd[1]), "+f"(rd[2]), "+f"(rd[3])
                 : "r"(ra[0]), "r"(ra[1]), "r"(ra[2]), "r"(ra[3]), "l"(desc));
    asm volatile("wgmma.commit_group.sync.aligned;\\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\\n" ::: "memory");
    for (int i = 0; i < 4; ++i) d[tid * 4 + i] = rd[i];
}}
"""


def wgmma_rounding_rows():
    """(type, case, exact, returned, round-to-nearest) of each wgmma probe, in ulps of c above c."""
    import cupy
    import numpy

    rows = []
    for name in WGMMA:
        kernel = cupy.RawKernel(wgmma_rounding_source(name), f"wg_round_{name}", options=("-arch=sm_90a",))
        for label, c0, multiples in CASES:
            ulp = float(numpy.spacing(numpy.float32(c0)))
            a, _ = operand_layout(name, [m * ulp for m in multiples])
            a = numpy.concatenate([a, numpy.zeros(96 * 4, a.dtype)])  # warps 1-3: rows 16-63 zero
            c = numpy.zeros(128 * 4, numpy.float32)
            c[0] = c0
            d = cupy.zeros(128 * 4, cupy.float32)
            kernel((1,), (128,), (cupy.asarray(a), cupy.asarray(c), d))
            exact = sum(multiples)
            nearest = (float(numpy.float32(c0 + exact * ulp)) - c0) / ulp
            rows.append((f"wg-{name}", label, exact, (float(d[0].get()) - c0) / ulp, nearest))
    return rows


def f64_fragments(name, A, B):
    """Per-lane registers (32, na) and (32, nb) of A (16 x k) and B (k x 8) for an sm_90 float64 shape,
    under the fragment maps assumed for them (lane = 4 g + t; the m16n8k8 maps of PTX's tf32 shape, two
    more column groups for k = 16): a_i = A[g + 8 (i % 2)][t + 4 (i // 2)], b_i = B[t + 4 i][g]."""
    import numpy

    _, na, nb, *_ = ALL_TYPES[name]
    a = numpy.array([[A[g + 8 * (i % 2), t + 4 * (i // 2)] for i in range(na)] for g, t in (divmod(n, 4) for n in range(32))])
    b = numpy.array([[B[t + 4 * i, g] for i in range(nb)] for g, t in (divmod(n, 4) for n in range(32))])
    return a, b


def f64_result(d):
    """D (16 x 8) from per-lane accumulators (32, 4) under the assumed map d_i = D[g + 8 (i // 2)][2 t + i % 2]."""
    import numpy

    D = numpy.zeros((16, 8))
    for lane in range(32):
        g, t = divmod(lane, 4)
        for i in range(4):
            D[g + 8 * (i // 2), 2 * t + i % 2] = d[lane, i]
    return D


def layout_rows():
    """(shape, whether D = A B under the assumed fragment maps, max |difference|) of each sm_90 float64
    shape, on small integers (exact products)."""
    import cupy
    import numpy

    rng = numpy.random.default_rng(0)
    rows = []
    for name in SM90_TYPES:
        k = ALL_TYPES[name][8]
        A, B = rng.integers(-8, 9, (16, k)).astype(numpy.float64), rng.integers(-8, 9, (k, 8)).astype(numpy.float64)
        a, b = f64_fragments(name, A, B)
        d = cupy.zeros(32 * 4, numpy.float64)
        kernel = cupy.RawKernel(rounding_source(name), f"round_{name}")
        kernel((1,), (32,), (cupy.asarray(a.ravel()), cupy.asarray(b.ravel()), cupy.zeros(32 * 4, numpy.float64), d))
        diff = float(numpy.abs(f64_result(d.get().reshape(32, 4)) - A @ B).max())
        rows.append((name, diff == 0.0, diff))
    return rows


def fma_chain(a, b, c, order):
    """c + sum_k a[k] b[k] as FMAs taken in `order`, each rounded to nearest once (exact rationals)."""
    from fractions import Fraction

    for k in order:
        c = float(Fraction(a[k]) * Fraction(b[k]) + Fraction(c))
    return c


#: Candidate orders of the float64 products' FMAs, by k.
ORDERS = {"FMAs in column order": lambda k: range(k), "FMAs in reverse order": lambda k: range(k - 1, -1, -1)}


def order_rows(trials=8):
    """(shape, order, elements that equal the order's chain, elements) for each sm_90 float64 shape."""
    import cupy
    import numpy

    rng = numpy.random.default_rng(0)
    rows = []
    for name in SM90_TYPES:
        k = ALL_TYPES[name][8]
        hits, count = dict.fromkeys(ORDERS, 0), 0
        for _ in range(trials):
            A = rng.standard_normal((16, k)) * 2.0 ** rng.integers(-30, 31, (16, k))
            B, C = rng.standard_normal((k, 8)), rng.standard_normal((16, 8))
            a, b = f64_fragments(name, A, B)
            lanes = [divmod(n, 4) for n in range(32)]
            c = numpy.array([[C[g + 8 * (i // 2), 2 * t + i % 2] for i in range(4)] for g, t in lanes])
            d = cupy.zeros(32 * 4, numpy.float64)
            kernel = cupy.RawKernel(rounding_source(name), f"round_{name}")
            kernel((1,), (32,), (cupy.asarray(a.ravel()), cupy.asarray(b.ravel()), cupy.asarray(c.ravel()), d))
            D = f64_result(d.get().reshape(32, 4))
            for i in range(16):
                for j in range(8):
                    count += 1
                    for label, order in ORDERS.items():
                        hits[label] += fma_chain(A[i], B[:, j], C[i, j], order(k)) == D[i, j]
        rows.extend((name, label, hit, count) for label, hit in hits.items())
    return rows


def throughput_rows(iterations, ctas_per_sm):
    """(type, TFLOP/s) of each operand type."""
    import cupy

    device = cupy.cuda.Device()
    sms = device.attributes["MultiProcessorCount"]
    names = list(TYPES) + (list(SM90_TYPES) if int(device.compute_capability) >= 90 else [])
    rows = []
    for name in names:
        kernel = cupy.RawKernel(throughput_source(name), f"probe_{name}")
        m, n, k = ALL_TYPES[name][6:]
        sink = cupy.zeros(1, cupy.float64 if name.startswith("f64") else cupy.float32)
        grid, block = sms * ctas_per_sm, 128
        kernel((grid,), (block,), (cupy.int32(iterations // 10), sink))  # compile and warm
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        kernel((grid,), (block,), (cupy.int32(iterations), sink))
        end.record()
        end.synchronize()
        seconds = cupy.cuda.get_elapsed_time(start, end) / 1e3
        flops = 2.0 * m * n * k * CHAINS * iterations * grid * (block // 32)
        rows.append((name, flops / seconds / 1e12))
    return rows


def cupy_device_capability():
    import cupy

    return cupy.cuda.Device().compute_capability


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounding", action="store_true", help="the rounding probe only")
    parser.add_argument("--iterations", type=harness.positive_int, default=20000, help="rounds per warp (default 20000)")
    parser.add_argument("--ctas-per-sm", type=harness.positive_int, default=4, help="CTAs of 4 warps per SM (default 4)")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    harness.require_gpu("mma_probe.py", need_cupyflash=False)
    print("rounding: d[0][0] = c + sum of products, c = 1; values in ulps of c above c")
    print(f"{'type':5} {'case':32} {'exact':>10} {'returned':>10} {'nearest':>10}")
    for name, label, exact, got, nearest in rounding_rows():
        print(f"{name:5} {label:32} {exact:10.4g} {got:10.4g} {nearest:10.4g}")
    if int(cupy_device_capability()) == 90:
        for name, label, exact, got, nearest in wgmma_rounding_rows():
            print(f"{name:7} {label:30} {exact:10.4g} {got:10.4g} {nearest:10.4g}")
    if int(cupy_device_capability()) >= 90:
        print("\nfragment maps of the sm_90 float64 shapes (f64_fragments, f64_result):")
        for name, matches, diff in layout_rows():
            print(f"{name:6} {'match' if matches else 'differ'} (max |D - A B| {diff:g})")
        print("\norder of the sm_90 float64 shapes' roundings (D = C + A B, elements equal to the chain):")
        for name, label, hits, count in order_rows():
            print(f"{name:6} {label:24} {hits}/{count}")
    if not args.rounding:
        print("\nthroughput (dense, independent products):")
        for name, tflops in throughput_rows(args.iterations, args.ctas_per_sm):
            print(f"{name:6} {tflops:8.1f} TFLOP/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
