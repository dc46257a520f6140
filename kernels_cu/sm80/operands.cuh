// The operands of the sm80 forward's and backward's mma.sync products, per storage type: how a k-step's A and B
// fragments come from shared memory (Q, K, V) and from the score registers (P), and the product of one
// 16 x 8 output tile. The main loop (sm80/fwd.cu) is written once against this interface.
//   float16/bfloat16: m16n8k16, fragments by ldmatrix, P packed in registers (fragment/operand.cuh).
//   float32: each operand split at load into three bfloat16 parts that sum to it exactly, and six
//   m16n8k16 products per product (the error of one float32 rounding, at the cost of three TF32
//   products: bfloat16 products run at twice TF32's rate); fragments by 8-byte (Q, K) and 4-byte (V)
//   shared-memory loads. kTf32 (precision="tf32"): two parts and three products.
//   float64: the float64 tensor cores' 16x8x8 product (sm80/mma.cuh), float64 accumulators, fragments
//   by 8-byte shared-memory loads.
//
// Sums (kSplitSums): the tensor cores round each product's float32 result toward zero (bench/mma_probe.py
// on the H200: c + 0.75 ulp returns c), so every mma.sync into a running sum adds a bias of up to one ulp
// of that sum. Chained into one accumulator, the six products of each k-step cost six such ulps, and O,
// carried across every key tile, a bias that grows with the sequence (in a NumPy emulation of the
// truncation, 4x the plain float32 error of lse at one key, 5x that of O at 4096 keys). So S keeps two
// sums, the five small products in `small` (whose truncations are 2^-8 of the result's) and the leading
// products a_hi b_hi, each k-step's from zero and added with a round-to-nearest FADD (mma_rn), the two
// added once a key tile's k-steps are done; and the main loop sums each key tile's P V products from
// zero before adding them to O with a FADD, so that the truncations are of the tile's share, not of O
// (sm80/fwd.cu). bench/NOTES.md (session 19) has the emulation and the H200's errors.
// float64's tensor cores round to nearest, but each product adds its eight terms into the accumulator
// one after another (mma_probe.py: four products of 0.25 ulp leave c unchanged), like a loop of FMAs:
// chained over 128 head-dim columns or over every key, their rounding errors grew to 1.4x the rule's
// allowance for S at head dim 128 and 2x for O at 4096 keys (emulated; 3.8x measured on the H200). So
// float64 splits its sums the same way, without the small sum: each k-step of S from zero, then a DADD;
// each key tile's P V from zero, then added to O (kSmallSum false).

#pragma once
#include "common/dtypes.cuh"
#include "common/score_mod.cuh"
#include "fragment/operand.cuh"
#include "sm80/mma.cuh"
#include "sm80/tile.cuh"

namespace cupyflash {

// The scores of the 16-bit kernels (log2 units) and of the float32 and float64 ones (natural-log units).
template <typename T> struct Sm80Scores { using type = Log2Scores; };
template <> struct Sm80Scores<float> { using type = NaturalScores<float>; };
template <> struct Sm80Scores<double> { using type = NaturalScores<double>; };

// kTf32 (float32 only, precision="tf32"): the two leading parts alone, x ~ hi + mid (16 significant
// bits, a relative error of 2^-17, where TF32 keeps 11), and three products instead of six.
template <typename T, bool kTf32 = false>
struct Sm80Operands {
    static_assert(!kTf32, "precision='tf32' applies to float32 operands only");
    using Acc = float;             // the accumulators' type
    static constexpr int kK = 16;  // the product's k
    static constexpr bool kSplitSums = false;
    static constexpr bool kSmallSum = false;
    using Stored = T;                 // the shared-memory tiles' element
    static constexpr int kPlanes = 1;  // tiles per operand (kPlane elements apart; float32's forward: 3)
    struct A {
        unsigned r[4];
    };
    struct B2 {  // two 8-column n-tiles: r[0..1] and r[2..3]
        unsigned r[4];
    };

    // Q rows row0..row0+15, head-dim columns col0..col0+kK-1.
    template <int kLd, int kPlane = 0>
    __device__ __forceinline__ static void load_q(A& a, const T* tile, int row0, int col0) {
        load_a_frag<kLd>(a.r, tile, row0, col0);
    }
    // For S = Q K^T: keys n0..n0+15 (two n-tiles), head-dim columns k0..k0+kK-1.
    template <int kLd, int kPlane = 0>
    __device__ __forceinline__ static void load_k(B2& b, const T* tile, int n0, int k0) {
        load_bt_frags<kLd>(b.r, tile, n0, k0);
    }
    // For O = P V: keys k0..k0+kK-1, value columns c0..c0+15 (two n-tiles).
    template <int kLd, int kPlane = 0>
    __device__ __forceinline__ static void load_v(B2& b, const T* tile, int k0, int c0) {
        load_b_frags_trans<kLd>(b.r, tile, k0, c0);
    }
    // P's k-step kk (keys kK kk ..) from the probabilities of a 16-row m-tile.
    template <int kNTiles>
    __device__ __forceinline__ static void pack_p(A& a, const float (&s)[kNTiles][4], int kk) {
        pack_a_fragment<T>(a.r, s[2 * kk], s[2 * kk + 1]);
    }
    // d += a * (n-tile `half` of b).
    __device__ __forceinline__ static void mma(float (&d)[4], const A& a, const B2& b, int half) {
        mma_16816<T>(d, a.r, b.r + 2 * half);
    }
};

template <bool kTf32>
struct Sm80Operands<float, kTf32> {
    using Acc = float;
    static constexpr int kK = 16;
    static constexpr bool kSplitSums = true;
    static constexpr bool kSmallSum = true;
    using Stored = float;
    static constexpr int kPlanes = 1;
    using Bf16 = __nv_bfloat16;
    struct A {
        unsigned hi[4], mid[4], lo[4];
    };
    struct B2 {
        unsigned hi[4], mid[4], lo[4];
    };

    // Two floats (x0 in the low halves) as their three bfloat16 parts, each pair packed. hi rounds x to
    // 8 significant bits, mid the exact rest x - hi, lo the exact rest of that, which 8 bits hold: x =
    // hi + mid + lo exactly (float32's 24 bits; for normal numbers, the parts' exponents being float32's).
    // kTf32 leaves lo unset (no product reads it).
    __device__ __forceinline__ static void split2(float x0, float x1, unsigned& hi, unsigned& mid, unsigned& lo) {
        hi = pack2<Bf16>(x0, x1);
        const float2 h = unpack2<Bf16>(hi);
        const float r0 = x0 - h.x, r1 = x1 - h.y;
        mid = pack2<Bf16>(r0, r1);
        if constexpr (!kTf32) {
            const float2 m = unpack2<Bf16>(mid);
            lo = pack2<Bf16>(r0 - m.x, r1 - m.y);
        }
    }
    __device__ __forceinline__ static void split2(float2 x, unsigned& hi, unsigned& mid, unsigned& lo) {
        split2(x.x, x.y, hi, mid, lo);
    }

    // Q rows row0.., columns col0..col0+15: a0 = A[g][2t, 2t + 1], a1 row g + 8, a2 and a3 columns + 8,
    // each pair one 8-byte load (rows kLd = 8 mod 32 floats apart: a half-warp's 16 pairs in 32 banks).
    template <int kLd, int kPlane = 0>
    __device__ __forceinline__ static void load_q(A& a, const float* tile, int row0, int col0) {
        const int lane = threadIdx.x % 32;
        const float* p = tile + (row0 + lane / 4) * kLd + col0 + 2 * (lane % 4);
        split2(*reinterpret_cast<const float2*>(p), a.hi[0], a.mid[0], a.lo[0]);
        split2(*reinterpret_cast<const float2*>(p + 8 * kLd), a.hi[1], a.mid[1], a.lo[1]);
        split2(*reinterpret_cast<const float2*>(p + 8), a.hi[2], a.mid[2], a.lo[2]);
        split2(*reinterpret_cast<const float2*>(p + 8 * kLd + 8), a.hi[3], a.mid[3], a.lo[3]);
    }
    // B[k][n] = K[n][k], keys n0.. (two n-tiles), columns k0..k0+15: b0 = K[n0 + g][k0 + 2t, + 1], b1 the
    // columns + 8; the second n-tile's from key n0 + 8 + g.
    template <int kLd, int kPlane = 0>
    __device__ __forceinline__ static void load_k(B2& b, const float* tile, int n0, int k0) {
        const int lane = threadIdx.x % 32;
        const float* p = tile + (n0 + lane / 4) * kLd + k0 + 2 * (lane % 4);
        split2(*reinterpret_cast<const float2*>(p), b.hi[0], b.mid[0], b.lo[0]);
        split2(*reinterpret_cast<const float2*>(p + 8), b.hi[1], b.mid[1], b.lo[1]);
        split2(*reinterpret_cast<const float2*>(p + 8 * kLd), b.hi[2], b.mid[2], b.lo[2]);
        split2(*reinterpret_cast<const float2*>(p + 8 * kLd + 8), b.hi[3], b.mid[3], b.lo[3]);
    }
    // B[k][n] = V[k][n], keys k0..k0+15, columns c0.. (two n-tiles): b0 = V[k0 + 2t, k0 + 2t + 1][c0 + g], b1
    // the keys + 8; a pair is two rows, two 4-byte loads (rows kLdV = 4 mod 32 floats apart: rows 2t and
    // 2t + 1 in banks 8t + g and 8t + 4 + g).
    template <int kLdV, int kPlane = 0>
    __device__ __forceinline__ static void load_v(B2& b, const float* tile, int k0, int c0) {
        const int lane = threadIdx.x % 32;
        const float* p = tile + (k0 + 2 * (lane % 4)) * kLdV + c0 + lane / 4;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float* q = p + (i % 2) * 8 * kLdV + (i / 2) * 8;  // keys + 8, then columns + 8
            split2(q[0], q[kLdV], b.hi[i], b.mid[i], b.lo[i]);
        }
    }
    // P's k-step kk from n-tiles 2 kk and 2 kk + 1 of the probabilities, as pack_a_fragment pairs them.
    template <int kNTiles>
    __device__ __forceinline__ static void pack_p(A& a, const float (&s)[kNTiles][4], int kk) {
        split2(s[2 * kk][0], s[2 * kk][1], a.hi[0], a.mid[0], a.lo[0]);
        split2(s[2 * kk][2], s[2 * kk][3], a.hi[1], a.mid[1], a.lo[1]);
        split2(s[2 * kk + 1][0], s[2 * kk + 1][1], a.hi[2], a.mid[2], a.lo[2]);
        split2(s[2 * kk + 1][2], s[2 * kk + 1][3], a.hi[3], a.mid[3], a.lo[3]);
    }
    // big += a_hi b_hi and small += the five products below it (a_mid b_lo, a_lo b_mid and a_lo b_lo,
    // below 2^-24 of a b, are left out): the two sums of kSplitSums. kTf32: the two products of hi and
    // mid alone (what it leaves out is below 2^-15 of a b). kSwapped: the products in the order of the
    // same sums with the operands' roles exchanged, so that the backward's S^T = K Q^T adds, element by
    // element, the very products of the forward's S = Q K^T in the same order (bitwise the same scores).
    template <bool kSwapped = false>
    __device__ __forceinline__ static void mma(float (&big)[4], float (&small)[4], const A& a, const B2& b, int half) {
        if constexpr (!kTf32) {
            mma_16816<Bf16>(small, kSwapped ? a.hi : a.lo, (kSwapped ? b.lo : b.hi) + 2 * half);
            mma_16816<Bf16>(small, kSwapped ? a.lo : a.hi, (kSwapped ? b.hi : b.lo) + 2 * half);
            mma_16816<Bf16>(small, a.mid, b.mid + 2 * half);
        }
        mma_16816<Bf16>(small, kSwapped ? a.hi : a.mid, (kSwapped ? b.mid : b.hi) + 2 * half);
        mma_16816<Bf16>(small, kSwapped ? a.mid : a.hi, (kSwapped ? b.hi : b.mid) + 2 * half);
        mma_16816<Bf16>(big, a.hi, b.hi + 2 * half);
    }
    // The same with d += a_hi b_hi rounded to nearest: the leading products summed from zero, then one
    // FADD, so that their truncation is of this k-step's share of d, not of d (the scores' sum).
    template <bool kSwapped = false>
    __device__ __forceinline__ static void mma_rn(float (&d)[4], float (&small)[4], const A& a, const B2& b, int half) {
        float z[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        mma<kSwapped>(z, small, a, b, half);
#pragma unroll
        for (int i = 0; i < 4; ++i) d[i] += z[i];
    }
    // The backward's B operands from [k][n] tiles: load_v's layout.
    template <int kLd>
    __device__ __forceinline__ static void load_b_kn(B2& b, const float* tile, int k0, int n0) {
        load_v<kLd>(b, tile, k0, n0);
    }
    // A[m][k] = tile[k][m] (the backward's dS from dS^T in shared memory), rows m0.., columns k0..k0+15: a0
    // = A[g][2t, 2t + 1] = tile[k0 + 2t, + 1][m0 + g], a1 rows + 8, a2 columns + 8, a3 both; two 4-byte loads
    // a pair.
    template <int kLd>
    __device__ __forceinline__ static void load_a_km(A& a, const float* tile, int m0, int k0) {
        const int lane = threadIdx.x % 32;
        const float* p = tile + (k0 + 2 * (lane % 4)) * kLd + m0 + lane / 4;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float* q = p + (i / 2) * 8 * kLd + (i % 2) * 8;  // a1: rows (m) + 8; a2: columns (k) + 8
            split2(q[0], q[kLd], a.hi[i], a.mid[i], a.lo[i]);
        }
    }
};

template <>
struct Sm80Operands<double> {
    using Acc = double;
    static constexpr int kK = 8;
    static constexpr bool kSplitSums = true;
    static constexpr bool kSmallSum = false;
    using Stored = double;
    static constexpr int kPlanes = 1;
    struct A {
        double r[4];
    };
    struct B2 {  // two 8-column n-tiles: r[0..1] and r[2..3]
        double r[4];
    };

    // Q rows row0.., columns col0..col0+7: a_i = A[g + 8 (i % 2)][t + 4 (i / 2)] (rows kLd = 4 mod 16
    // doubles apart: a half-warp's rows g < 4, columns t in 32 banks).
    template <int kLd, int kPlane = 0>
    __device__ __forceinline__ static void load_q(A& a, const double* tile, int row0, int col0) {
        const int lane = threadIdx.x % 32;
        const double* p = tile + (row0 + lane / 4) * kLd + col0 + lane % 4;
        a.r[0] = p[0];
        a.r[1] = p[8 * kLd];
        a.r[2] = p[4];
        a.r[3] = p[8 * kLd + 4];
    }
    // B[k][n] = K[n][k], keys n0.. (two n-tiles), columns k0..k0+7: b_i = K[n0 + g][k0 + t + 4 i], the
    // second n-tile's from key n0 + 8 + g.
    template <int kLd, int kPlane = 0>
    __device__ __forceinline__ static void load_k(B2& b, const double* tile, int n0, int k0) {
        const int lane = threadIdx.x % 32;
        const double* p = tile + (n0 + lane / 4) * kLd + k0 + lane % 4;
        b.r[0] = p[0];
        b.r[1] = p[4];
        b.r[2] = p[8 * kLd];
        b.r[3] = p[8 * kLd + 4];
    }
    // B[k][n] = V[k][n] over one n-tile of keys k0..k0+7 in the score registers' order (pack_p: the
    // product's k = t is key 2 t, k = t + 4 key 2 t + 1), columns c0.. (two n-tiles): b_0 = V[k0 + 2 t][c0
    // + g], b_1 = V[k0 + 2 t + 1][c0 + g] (rows kLdV = 2 mod 16 doubles apart: rows 2 t and 2 t + 1 of a
    // half-warp's columns in 32 banks).
    template <int kLdV, int kPlane = 0>
    __device__ __forceinline__ static void load_v(B2& b, const double* tile, int k0, int c0) {
        const int lane = threadIdx.x % 32;
        const double* p = tile + (k0 + 2 * (lane % 4)) * kLdV + c0 + lane / 4;
        b.r[0] = p[0];
        b.r[1] = p[kLdV];
        b.r[2] = p[8];
        b.r[3] = p[kLdV + 8];
    }
    // P's k-step kk: n-tile kk of the probabilities, whose c_i = P[g + 8 (i / 2)][2 t + i % 2] are the
    // A operand of keys 2 t (a_0, a_1) and 2 t + 1 (a_2, a_3), as load_v orders V.
    template <int kNTiles>
    __device__ __forceinline__ static void pack_p(A& a, const double (&s)[kNTiles][4], int kk) {
        a.r[0] = s[kk][0];
        a.r[1] = s[kk][2];
        a.r[2] = s[kk][1];
        a.r[3] = s[kk][3];
    }
    // B[k][n] = tile[k][n] in the product's own k order (the backward's B operands from shared memory),
    // keys k0..k0+7, columns n0.. (two n-tiles): b_i = tile[k0 + t + 4 i][n0 + g], the second n-tile's
    // columns + 8.
    template <int kLd>
    __device__ __forceinline__ static void load_b_kn(B2& b, const double* tile, int k0, int n0) {
        const int lane = threadIdx.x % 32;
        const double* p = tile + (k0 + lane % 4) * kLd + n0 + lane / 4;
        b.r[0] = p[0];
        b.r[1] = p[4 * kLd];
        b.r[2] = p[8];
        b.r[3] = p[4 * kLd + 8];
    }
    // A[m][k] = tile[k][m] (dS from dS^T), rows m0.., columns k0..k0+7: a_i = tile[k0 + t + 4 (i / 2)][m0 + g
    // + 8 (i % 2)].
    template <int kLd>
    __device__ __forceinline__ static void load_a_km(A& a, const double* tile, int m0, int k0) {
        const int lane = threadIdx.x % 32;
        const double* p = tile + (k0 + lane % 4) * kLd + m0 + lane / 4;
        a.r[0] = p[0];
        a.r[1] = p[8];
        a.r[2] = p[4 * kLd];
        a.r[3] = p[4 * kLd + 8];
    }
    // d += a * (n-tile `half` of b).
    __device__ __forceinline__ static void mma(double (&d)[4], const A& a, const B2& b, int half) {
        mma_1688_f64(d, a.r, b.r + 2 * half);
    }
    // The same summed from zero, then added to d with one DADD: the rounding errors of a k-step's eight
    // FMAs are of its share of d, not of d.
    __device__ __forceinline__ static void mma_rn(double (&d)[4], const A& a, const B2& b, int half) {
        double z[4] = {0.0, 0.0, 0.0, 0.0};
        mma(z, a, b, half);
#pragma unroll
        for (int i = 0; i < 4; ++i) d[i] += z[i];
    }
};

// float32's forward from bfloat16 planes (kernels_cu/sm80/planes.cu split the inputs once: hi, mid and lo
// tiles kPlane elements apart in shared memory, rows padded as the 16-bit tiles'), so that its fragments
// load by ldmatrix as the 16-bit kernels' do, with no split in the main loop but P's; the parts, and so
// the products and sums, are Sm80Operands<float>'s, bitwise.
template <bool kTf32 = false>
struct Sm80PlaneOperands : Sm80Operands<float, kTf32> {
    using Base = Sm80Operands<float, kTf32>;
    using typename Base::A;
    using typename Base::B2;
    using Stored = __nv_bfloat16;
    static constexpr int kPlanes = 3;

    template <int kLd, int kPlane>
    __device__ __forceinline__ static void load_q(A& a, const Stored* tile, int row0, int col0) {
        load_a_frag<kLd>(a.hi, tile, row0, col0);
        load_a_frag<kLd>(a.mid, tile + kPlane, row0, col0);
        if constexpr (!kTf32) load_a_frag<kLd>(a.lo, tile + 2 * kPlane, row0, col0);
    }
    template <int kLd, int kPlane>
    __device__ __forceinline__ static void load_k(B2& b, const Stored* tile, int n0, int k0) {
        load_bt_frags<kLd>(b.hi, tile, n0, k0);
        load_bt_frags<kLd>(b.mid, tile + kPlane, n0, k0);
        if constexpr (!kTf32) load_bt_frags<kLd>(b.lo, tile + 2 * kPlane, n0, k0);
    }
    template <int kLd, int kPlane>
    __device__ __forceinline__ static void load_v(B2& b, const Stored* tile, int k0, int c0) {
        load_b_frags_trans<kLd>(b.hi, tile, k0, c0);
        load_b_frags_trans<kLd>(b.mid, tile + kPlane, k0, c0);
        if constexpr (!kTf32) load_b_frags_trans<kLd>(b.lo, tile + 2 * kPlane, k0, c0);
    }
};

// The forward's operand policy: float32 from planes, every other dtype as Sm80Operands.
template <typename T, bool kTf32> struct Sm80FwdOperands { using type = Sm80Operands<T, kTf32>; };
template <bool kTf32> struct Sm80FwdOperands<float, kTf32> { using type = Sm80PlaneOperands<kTf32>; };

}  // namespace cupyflash
