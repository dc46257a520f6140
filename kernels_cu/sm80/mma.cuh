// Tensor-core and asynchronous-copy primitives (sm_80+): mma.sync m16n8k16 with float32 accumulators,
// the float64 16x8x8 product, ldmatrix, and cp.async with zero fill.
//
// Fragment maps of mma.sync.m16n8k16 (lane = 4 * g + t, g = lane / 4 the "group", t = lane % 4):
//   A (16 x 16, row-major), 4 registers of two 16-bit values:
//       a0 = A[g][2t, 2t+1]   a1 = A[g+8][2t, 2t+1]   a2 = A[g][2t+8, 2t+9]   a3 = A[g+8][2t+8, 2t+9]
//   B (16 x 8, indexed [k][n]), 2 registers:  b0 = B[2t, 2t+1][g]   b1 = B[2t+8, 2t+9][g]
//   C/D (16 x 8, float32), 4 registers:       c0, c1 = C[g][2t, 2t+1]   c2, c3 = C[g+8][2t, 2t+1]
// ldmatrix.x4 loads four 8x8 matrices of 16-bit values; lanes 8i..8i+7 give the row addresses of
// matrix i, and each lane receives element [lane / 4][2 * (lane % 4), +1] of each matrix (with .trans,
// element [2 * (lane % 4), +1][lane / 4]), which is exactly the A/B fragment layout above.
#pragma once
#include "common/dtypes.cuh"

namespace cupyflash {

// d += a * b on one 16x8x16 tile.
template <typename T> __device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned (&a)[4], const unsigned* b);
template <> __device__ __forceinline__ void mma_16816<__half>(float (&d)[4], const unsigned (&a)[4], const unsigned* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <> __device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&d)[4], const unsigned (&a)[4], const unsigned* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// d += a * b on one 16x8x8 tile of float64, the tensor cores rounding each product and sum to nearest
// (bench/mma_probe.py). Fragment maps (lane = 4 g + t): a_i = A[g + 8 (i % 2)][t + 4 (i / 2)], b_i =
// B[t + 4 i][g], d_i = D[g + 8 (i / 2)][2 t + i % 2]. sm_90: one m16n8k8 (twice m8n8k4's rate); sm_80:
// four m8n8k4, each the rows-half h and k-half kh of it (a0 = A[g][t], b0 = B[t][g], d0, d1 = D[g][2 t,
// 2 t + 1] of the 8 x 8 x 4 shape).
__device__ __forceinline__ void mma_1688_f64(double (&d)[4], const double (&a)[4], const double* b) {
#if __CUDA_ARCH__ >= 900
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f64.f64.f64.f64 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+d"(d[0]), "+d"(d[1]), "+d"(d[2]), "+d"(d[3])
        : "d"(a[0]), "d"(a[1]), "d"(a[2]), "d"(a[3]), "d"(b[0]), "d"(b[1]));
#else
#pragma unroll
    for (int kh = 0; kh < 2; ++kh) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0, %1}, {%2}, {%3}, {%0, %1};\n"
                         : "+d"(d[2 * h]), "+d"(d[2 * h + 1])
                         : "d"(a[h + 2 * kh]), "d"(b[kh]));
        }
    }
#endif
}

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
// Two 8x8 matrices; lanes 0..15 give the row addresses (the others are ignored).
__device__ __forceinline__ void ldmatrix_x2(unsigned* r, unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x2_trans(unsigned* r, unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}

// Copies src_bytes (0..16) from global to shared memory and zero-fills the rest of the 16 bytes. Both
// addresses must be 16-byte aligned (even when src_bytes == 0, src must be a valid address).
__device__ __forceinline__ void cp_async_16(unsigned dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" :: "r"(dst), "l"(src), "r"(src_bytes));
}
// The same for a whole 16-byte chunk: no source size to compute, fewer instructions per copy.
__device__ __forceinline__ void cp_async_16(unsigned dst, const void* src) {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" :: "r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(kPending)); }

}  // namespace cupyflash
