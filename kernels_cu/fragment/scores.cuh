// The element mask of the backward kernels, on transposed score fragments (rows are keys, columns
// queries: S^T = K Q^T in the mma.sync C layout, which wgmma accumulators share per warp).
#pragma once
#include "common/mask.cuh"
#include "common/params.cuh"

namespace cupyflash {

// p = 0 where the mask hides the pair of query m0 + col_t + 8 nt + e % 2 and key key_g + 16 mt + 8 (e / 2)
// of the transposed fragment element [mt][nt][e]; with kLayout also where the block layout does, read as
// one word of bits per key and 64 queries. Per key, the interval of queries that see it; per element,
// two compares and a select.
template <bool kLayout, int kMTiles, int kNTiles>
__device__ __forceinline__ void mask_fragments_t(float (&p)[kMTiles][kNTiles][4], const Mask& mask,
                                                 const BlockLayout& layout, const AttnArgs& a, int key_g, int m0,
                                                 int col_t) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int key = key_g + 16 * mt + 8 * r;
            int begin, end;
            mask.queries_of(key, m0, &begin, &end);
#pragma unroll
            for (int chunk = 0; chunk < (kNTiles + 7) / 8; ++chunk) {
                const unsigned long long bits = kLayout ? layout.query_bits(a, key, m0 + 64 * chunk, 64) : 0;
#pragma unroll
                for (int nt = 8 * chunk; nt < kNTiles && nt < 8 * chunk + 8; ++nt) {
#pragma unroll
                    for (int c = 0; c < 2; ++c) {
                        const int offset = col_t + 8 * nt + c;
                        bool visible = offset >= begin && offset < end;
                        if constexpr (kLayout) visible &= ((bits >> (offset - 64 * chunk)) & 1) != 0;
                        float& x = p[mt][nt][2 * r + c];
                        x = visible ? x : 0.0f;
                    }
                }
            }
        }
    }
}

}  // namespace cupyflash
