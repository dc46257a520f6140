// float32 rows split into the bfloat16 planes of a wgmma operand tile in shared memory by the threads
// that will read it, where a pass over the whole tensor (sm80/planes.cu's split_planes) would cost more
// than the kernel's own split: a tile that a CTA reads once (the forward's Q rows, the backward's K and V
// rows). Ops::split2 either way, so the planes are bitwise those of the pass (the backward recomputes the
// forward's scores from them).
#pragma once
#include "common/dtypes.cuh"
#include "sm90/primitives.cuh"

namespace cupyflash {

// Rows row_begin .. row_begin + kRows - 1 of `src` (row 0 of the sequence, row_stride floats apart; a row
// outside [0, seqlen) and the columns from `dim` on read as zeros) split by kThreads threads (`thread`
// from 0) into tile rows tile_row0 .. of a tile of tile_rows rows: plane p at p * plane_bytes, 64-column
// atoms tile_rows * 128 bytes apart, each 16-byte chunk of a row at (column / 8) ^ (row % 8) (the TMA's
// 128-byte swizzle, sm90/primitives.cuh). A thread takes 8 columns of a row at a time and issues all its
// loads before its first split. The caller orders the stores before wgmma reads them
// (fence_proxy_async, then a barrier).
template <typename Ops, int kPlanes, int kHeadDim, int kRows, int kThreads>
__device__ __forceinline__ void split_rows_into_planes(const float* src, long long row_stride, int row_begin,
                                                       int seqlen, int dim, unsigned char* tile, int tile_rows,
                                                       int tile_row0, int plane_bytes, int thread) {
    constexpr int kChunks = kHeadDim / 8;              // 8-column chunks of a row
    constexpr int kTasks = kRows * kChunks / kThreads;  // a thread's chunks
    static_assert(kHeadDim % 8 == 0 && kRows * kChunks % kThreads == 0, "whole chunks per thread");
    float x[kTasks][8];
#pragma unroll
    for (int u = 0; u < kTasks; ++u) {
        const int task = thread + kThreads * u;
        const int r = row_begin + task / kChunks, c0 = 8 * (task % kChunks);
        const float* row = src + static_cast<long long>(r) * row_stride + c0;
        const bool in = r >= 0 && r < seqlen;
        if (in && c0 + 8 <= dim && reinterpret_cast<size_t>(row) % 16 == 0) {
            const float4 lo4 = reinterpret_cast<const float4*>(row)[0], hi4 = reinterpret_cast<const float4*>(row)[1];
            x[u][0] = lo4.x, x[u][1] = lo4.y, x[u][2] = lo4.z, x[u][3] = lo4.w;
            x[u][4] = hi4.x, x[u][5] = hi4.y, x[u][6] = hi4.z, x[u][7] = hi4.w;
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) x[u][e] = in && c0 + e < dim ? row[e] : 0.0f;
        }
    }
#pragma unroll
    for (int u = 0; u < kTasks; ++u) {
        const int task = thread + kThreads * u;
        const int row = tile_row0 + task / kChunks, c0 = 8 * (task % kChunks);
        unsigned planes[3][4];
#pragma unroll
        for (int i = 0; i < 4; ++i) Ops::split2(x[u][2 * i], x[u][2 * i + 1], planes[0][i], planes[1][i], planes[2][i]);
        unsigned char* dst = tile + (c0 / 64) * tile_rows * 128 + row * 128 + (((c0 % 64) / 8) ^ (row % 8)) * 16;
#pragma unroll
        for (int p = 0; p < kPlanes; ++p) {
            *reinterpret_cast<uint4*>(dst + p * plane_bytes) = make_uint4(planes[p][0], planes[p][1], planes[p][2], planes[p][3]);
        }
    }
}

}  // namespace cupyflash
