// The element formats the Hopper forward reads through K-major operands only (sm90/fwd_kmajor_mainloop.cuh):
// e4m3 (8-bit wgmma, k = 32) and tf32 (float32 storage, k = 8). wgmma transposes neither, so V is stored
// transposed (V^T, keys contiguous) by a pre-pass (sm90/kmajor_values.cu). In bytes the two formats agree:
// a k-step reads 32 bytes of every row, four steps to a 128-byte swizzle atom, so the tiles, descriptors
// and TMA boxes are the same; they differ in the columns an atom holds, how the probabilities become the
// A operand of O += P V, the order V^T keeps a k-step's keys in, and the softmax's scale of P.
//
// P's A operand comes from the scores' accumulators as they are, with no exchange between threads: a
// thread holds, in rows g and g + 8, keys 2t and 2t + 1 of each 8-key n-tile (the C layout), while the A
// fragment wants other keys of the k-step in its registers. So the k-step's keys are taken in another
// order, the one the thread's registers give, and V^T stores each k-step's keys in that order.
#pragma once
#include "common/dtypes.cuh"

namespace cupyflash {

struct Tf32;  // the tf32 operand tag of generated/wgmma_ops.cuh

// e4m3 (FP8 inputs). A's register 0 of k-step kk packs row g's probabilities of keys 2t, 2t + 1 of
// n-tiles 4 kk and 4 kk + 1 (A's keys 4t .. 4t + 3), register 2 those of n-tiles 4 kk + 2, 4 kk + 3 (A's
// keys 16 + 4t .. 19 + 4t), registers 1 and 3 row g + 8's: A's key 4t + j (j < 4) is the step's key
// 8 (j / 2) + 2t + j % 2, and 16 more for A's 16 + 4t + j.
struct E4m3Operands {
    using Tag = E4m3;
    static constexpr int kBytes = 1;
    static constexpr int kStep = 32;      // keys (and q.k columns) per k-step
    static constexpr int kAtomCols = 128;  // columns of a 128-byte atom
    // P is scaled by 2^8 before its rounding (fragment/softmax.cuh's kOffset): e4m3 keeps probabilities
    // down to 2^-17 of a row's largest, where a largest of 1 would lose all below 2^-10.
    static constexpr int kOffset = 8;
    // Of every 4 n-tiles of probabilities, those computed on the FMA pipe (fragment/softmax.cuh's
    // kPolyShare): none. At head dim 128 one warpgroup's ex2s of a tile take about as many clocks on the
    // special-function unit as its two QGMMA products, so moving a quarter could pay, but the degree-2
    // polynomial's 2e-3 relative error reaches the sums (bench/NOTES.md, session 28: measure a degree-3
    // share against the H100/H200 rows before turning it on).
    static constexpr int kPolyExp2Share = 0;

    // The step's position p (0 .. 31) holds key key_at(p) of the step (the order above, for V^T).
    __host__ __device__ static constexpr int key_at(int p) {
        return 16 * (p / 16) + 8 * ((p % 4) / 2) + 2 * ((p % 16) / 4) + p % 2;
    }

    template <int kSteps>
    __device__ __forceinline__ static void to_operand(unsigned (&a)[kSteps][4], const float (&x)[4 * kSteps][4]) {
#pragma unroll
        for (int kk = 0; kk < kSteps; ++kk) {
            const float(&n0)[4] = x[4 * kk], (&n1)[4] = x[4 * kk + 1], (&n2)[4] = x[4 * kk + 2], (&n3)[4] = x[4 * kk + 3];
            a[kk][0] = pack4_e4m3(n0[0], n0[1], n1[0], n1[1]);
            a[kk][1] = pack4_e4m3(n0[2], n0[3], n1[2], n1[3]);
            a[kk][2] = pack4_e4m3(n2[0], n2[1], n3[0], n3[1]);
            a[kk][3] = pack4_e4m3(n2[2], n2[3], n3[2], n3[3]);
        }
    }
};

// tf32 (precision="tf32" on float32 inputs). The tensor cores read a float32's top 19 bits (truncation),
// so every operand is rounded to nearest first: q, k and V^T by the pre-passes, P here (cvt.rna, whose
// ties go away from zero where the pre-passes' go to even: a probability's low 13 bits are an exact tie
// about once in 8192 roundings, and then the two differ by one tf32 ulp). A's registers 0 and 1 of k-step
// kk (one n-tile) are rows g and g + 8 at A's key t, registers 2 and 3 at A's key t + 4: A's key t is the
// step's key 2t, A's key t + 4 the step's key 2t + 1.
struct Tf32Operands {
    using Tag = Tf32;
    static constexpr int kBytes = 4;
    static constexpr int kStep = 8;
    static constexpr int kAtomCols = 32;
    static constexpr int kOffset = 0;
    static constexpr int kPolyExp2Share = 0;  // tf32 products take twice bf16's time: ex2 keeps up

    __host__ __device__ static constexpr int key_at(int p) { return 2 * (p % 4) + p / 4; }

    // x rounded to tf32 (10 mantissa bits) to nearest even, as float32 bits whose low 13 are zero (the
    // pre-passes' rounding, tests/test_gpu.py's _tf32); infinities stay, NaN stays NaN.
    __device__ __forceinline__ static float round_even(float x) {
        const unsigned bits = __float_as_uint(x);
        if ((bits & 0x7f800000u) == 0x7f800000u) return (bits & 0x007fffffu) != 0 ? __uint_as_float(bits | 0x00400000u) : x;
        return __uint_as_float((bits + 0xfffu + ((bits >> 13) & 1u)) & 0xffffe000u);
    }

    __device__ __forceinline__ static unsigned round_tf32(float x) {
        unsigned y;
        asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(y) : "f"(x));
        return y;
    }

    template <int kSteps>
    __device__ __forceinline__ static void to_operand(unsigned (&a)[kSteps][4], const float (&x)[kSteps][4]) {
#pragma unroll
        for (int kk = 0; kk < kSteps; ++kk) {
            a[kk][0] = round_tf32(x[kk][0]);
            a[kk][1] = round_tf32(x[kk][2]);
            a[kk][2] = round_tf32(x[kk][1]);
            a[kk][3] = round_tf32(x[kk][3]);
        }
    }
};

}  // namespace cupyflash
