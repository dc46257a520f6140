// A consumer warpgroup's accumulator rows staged in shared memory for TMA stores (the forward's O,
// sm90/fwd_epilogue.cuh, and the backward's dK and dV, sm90/bwd_epilogue.cuh).
#pragma once
#include "common/dtypes.cuh"
#include "fragment/epilogue.cuh"

namespace cupyflash {

// Writes a warpgroup's 64 x (8 kTiles) float accumulator (wgmma's layout: warp w holds rows 16 w + g and
// 16 w + g + 8, g = lane / 4, and of n-tile n the columns 8 n + 2 (lane % 4) and the next), row r's values
// times scale[r], rounded to T, into 64-column atoms of 128-byte rows, `atom_bytes` apart from `rows`
// (the warpgroup's first row in atom 0), in the layout of a TMA box with the 128-byte swizzle: 16-byte
// chunk c of row i at c ^ (i % 8). The caller orders the writes before the TMA's reads
// (fence_proxy_async, then a barrier with the issuing thread).
template <typename T, int kTiles>
__device__ __forceinline__ void stage_swizzled_rows(unsigned char* rows, int atom_bytes, const float (&acc)[kTiles][4],
                                                    const float (&scale)[2]) {
    static_assert(kTiles % 4 == 0, "whole 32-column groups");
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = 16 * ((threadIdx.x / 32) % 4) + g + 8 * r;  // row % 8 = g
#pragma unroll
        for (int group = 0; group < kTiles / 4; ++group) {
            unsigned x[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                x[j] = pack2<T>(acc[4 * group + j][2 * r] * scale[r], acc[4 * group + j][2 * r + 1] * scale[r]);
            }
            transpose_quad(x);  // lane t: the eight columns of n-tile 4 group + t
            const int chunk = 4 * group + t;
            unsigned char* dst = rows + (chunk / 8) * atom_bytes + row * 128 + ((chunk % 8) ^ g) * 16;
            *reinterpret_cast<uint4*>(dst) = make_uint4(x[0], x[1], x[2], x[3]);
        }
    }
}

}  // namespace cupyflash
