// float32 products on Hopper's bfloat16 wgmma (sm_90a): each operand is held as bfloat16 planes (x = hi +
// mid + lo exactly; precision="tf32": hi + mid), in shared memory as 16-bit tiles (the TMA's 64-column
// atoms, 128-byte swizzle: sm90/primitives.cuh) or, for an A operand, in registers as Sm80Operands<float>'s
// fragments. A product is Sm80Operands<float>'s six bfloat16 products (three for tf32) in its order, so
// that its sums are those of the sm80 float32 kernels' mma.sync: wgmma, like mma.sync, truncates each
// product's float32 result toward zero, and the same products in the same order give the same bits
// (bench/NOTES.md, session 21). The forward (sm90/fwd_planes_mainloop.cuh) and the backward
// (sm90/bwd_planes_mainloop.cuh) form all their products here.
#pragma once
#include "generated/wgmma_ops.cuh"
#include "sm80/operands.cuh"
#include "sm90/primitives.cuh"

namespace cupyflash {

template <bool kTf32>
struct Sm90PlaneProducts {
    using Bf16 = __nv_bfloat16;
    using Ops = Sm80Operands<float, kTf32>;  // split2, pack_p and the order of the products
    static constexpr int kPlanes = kTf32 ? 2 : 3;
    enum { kHi = 0, kMid = 1, kLo = 2 };
    // The (A plane, B plane) pairs of the products below a_hi b_hi, in Sm80Operands<float>::mma's order:
    // row 0 as written, row 1 with the operands' roles exchanged (kSwapped: S^T = K Q^T adds the products
    // of S = Q K^T, element by element, in the same order). tf32 keeps the last two.
    static constexpr int kFirst = kTf32 ? 3 : 0;
    __device__ __forceinline__ static constexpr int plane_a(bool swapped, int i) {
        return swapped ? (i == 0 ? kHi : i == 1 ? kLo : i == 2 ? kMid : i == 3 ? kHi : kMid)
                       : (i == 0 ? kLo : i == 1 ? kHi : i == 2 ? kMid : i == 3 ? kMid : kHi);
    }
    __device__ __forceinline__ static constexpr int plane_b(bool swapped, int i) { return plane_a(!swapped, i); }

    // Plane pl of a register A fragment.
    __device__ __forceinline__ static const unsigned (&plane(const typename Ops::A& a, int pl))[4] {
        return pl == kHi ? a.hi : pl == kMid ? a.mid : a.lo;
    }

    template <int kTiles>
    __device__ __forceinline__ static void add_to(float (&d)[kTiles][4], const float (&x)[kTiles][4]) {
#pragma unroll
        for (int c = 0; c < kTiles; ++c) {
#pragma unroll
            for (int e = 0; e < 4; ++e) d[c][e] += x[c][e];
        }
    }

    // s = A B^T (M = 64 rows of A, N = kN rows of B) over kSteps k-steps, A and B K-major plane tiles
    // (planes a_plane and b_plane bytes apart) of kARows and kBRows rows, from rows a_row and b_row;
    // complete on return. The scores' sums: per k-step the small products chain in `small`, and hi x hi
    // is summed from zero (the wgmma's scale-d off) into one of two buffers z, added to s with a FADD
    // once its group is done (wgmma_wait<1>: the next k-step's group runs meanwhile); `small` last.
    template <int kN, int kSteps, int kARows, int kBRows, bool kSwapped>
    __device__ __forceinline__ static void scores(float (&s)[kN / 8][4], unsigned a_tile, int a_row, unsigned a_plane,
                                                  unsigned b_tile, int b_row, unsigned b_plane) {
        using SS = WgmmaSS<Bf16, kN>;
        unsigned long long a[kPlanes], b[kPlanes];
#pragma unroll
        for (int p = 0; p < kPlanes; ++p) {
            a[p] = kmajor_desc(a_tile + p * a_plane, a_row);
            b[p] = kmajor_desc(b_tile + p * b_plane, b_row);
        }
        float small[kN / 8][4];
        float z[2][kN / 8][4];
#pragma unroll
        for (int nt = 0; nt < kN / 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < kSteps; ++kk) {
            const unsigned as = kmajor_step<kARows>(kk), bs = kmajor_step<kBRows>(kk);
            const auto ad = [&](int p) { return desc_advance(a[p], as); };
            const auto bd = [&](int p) { return desc_advance(b[p], bs); };
            wgmma_fence();
#pragma unroll
            for (int i = kFirst; i < 5; ++i) {
                if (kk == 0 && i == kFirst) {
                    SS::overwrite(small, ad(plane_a(kSwapped, i)), bd(plane_b(kSwapped, i)));
                } else {
                    SS::mma(small, ad(plane_a(kSwapped, i)), bd(plane_b(kSwapped, i)), 1);
                }
            }
            SS::overwrite(z[kk % 2], ad(kHi), bd(kHi));
            wgmma_commit();
            if (kk > 0) {
                wgmma_wait<1>();
                fence_fragments(z[(kk - 1) % 2]);
                add_to(s, z[(kk - 1) % 2]);
            }
        }
        wgmma_wait<0>();
        fence_fragments(z[(kSteps - 1) % 2]);
        fence_fragments(small);
        add_to(s, z[(kSteps - 1) % 2]);
        add_to(s, small);
    }

    // z = A B over k-steps [kk0, kk1), summed from zero: A from registers (a[kk], Sm80Operands<float>'s
    // fragments), B an MN-major plane tile of kBRows rows (its k) read transposed (planes b_plane bytes
    // apart). All six products of a k-step chain in z, the small ones first. Issued and committed.
    template <int kN, int kBRows, int kSteps>
    __device__ __forceinline__ static void issue_rs(float (&z)[kN / 8][4], const typename Ops::A (&a)[kSteps],
                                                    unsigned b_tile, unsigned b_plane, int kk0, int kk1) {
        using RS = WgmmaRS<Bf16, kN>;
        unsigned long long b[kPlanes];
#pragma unroll
        for (int p = 0; p < kPlanes; ++p) b[p] = mnmajor_desc<kBRows>(b_tile + p * b_plane);
        wgmma_fence();
#pragma unroll
        for (int kk = kk0; kk < kk1; ++kk) {
            const auto bd = [&](int p) { return desc_advance(b[p], mnmajor_step(kk)); };
#pragma unroll
            for (int i = kFirst; i < 5; ++i) {
                RS::mma(z, plane(a[kk], plane_a(false, i)), bd(plane_b(false, i)), i == kFirst ? kk > kk0 : 1);
            }
            RS::mma(z, a[kk].hi, bd(kHi), 1);
        }
        wgmma_commit();
    }

    // z = A B over kSteps k-steps from zero, A and B both MN-major plane tiles read transposed (A: the
    // backward's dS from dS^T, kARows rows; B: K, kBRows rows). Issued and committed.
    template <int kN, int kSteps, int kARows, int kBRows>
    __device__ __forceinline__ static void issue_ss_mn(float (&z)[kN / 8][4], unsigned a_tile, unsigned a_plane,
                                                       unsigned b_tile, unsigned b_plane) {
        using SS = WgmmaSSMn<Bf16, kN>;
        unsigned long long a[kPlanes], b[kPlanes];
#pragma unroll
        for (int p = 0; p < kPlanes; ++p) {
            a[p] = mnmajor_desc<kARows>(a_tile + p * a_plane);
            b[p] = mnmajor_desc<kBRows>(b_tile + p * b_plane);
        }
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kSteps; ++kk) {
            const auto ad = [&](int p) { return desc_advance(a[p], mnmajor_step(kk)); };
            const auto bd = [&](int p) { return desc_advance(b[p], mnmajor_step(kk)); };
#pragma unroll
            for (int i = kFirst; i < 5; ++i) {
                if (kk == 0 && i == kFirst) {
                    SS::overwrite(z, ad(plane_a(false, i)), bd(plane_b(false, i)));
                } else {
                    SS::mma(z, ad(plane_a(false, i)), bd(plane_b(false, i)), 1);
                }
            }
            SS::mma(z, ad(kHi), bd(kHi), 1);
        }
        wgmma_commit();
    }
};

}  // namespace cupyflash
