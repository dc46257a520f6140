// Which keys a query sees, and the block ranges that follow from it.
//
// Causal masking is aligned to the bottom-right corner of the score matrix (FlashAttention 2.1+):
// with offset = seqlen_k - seqlen_q, query i sees key j iff j <= i + offset. For seqlen_q = 3 and
// seqlen_k = 5 (offset 2) the visible keys are
//     query 0: keys 0..2      query 1: keys 0..3      query 2: keys 0..4
// and for seqlen_q = 5, seqlen_k = 3 (offset -2) queries 0 and 1 see no key at all.
#pragma once

namespace cupyflash {

template <bool kCausal>
struct Mask {
    int seqlen_q;
    int seqlen_k;
    int offset;  // seqlen_k - seqlen_q

    __device__ __forceinline__ Mask(int sq, int sk) : seqlen_q(sq), seqlen_k(sk), offset(sk - sq) {}

    // Key j is a real key that query i may attend to (padding rows and columns are not visible).
    __device__ __forceinline__ bool visible(int i, int j) const {
        return i < seqlen_q && j < seqlen_k && (!kCausal || j <= i + offset);
    }

    // One past the last key any query of [m0, m0 + block_m) sees; <= 0 when none sees a key.
    __device__ __forceinline__ int key_end(int m0, int block_m) const {
        if (!kCausal) return seqlen_k;
        return min(seqlen_k, m0 + block_m + offset);
    }

    // First query (rounded down to a multiple of block_q) that sees any key of [n0, ...).
    __device__ __forceinline__ int query_begin(int n0, int block_q) const {
        if (!kCausal) return 0;
        const int first = max(0, n0 - offset);
        return first - first % block_q;
    }
};

}  // namespace cupyflash
