// Dropout of the tensor-core kernels' fragments (common/dropout.cuh draws the decisions). A thread of an
// mma.sync m16n8 or wgmma m64nN accumulator holds, per 8-key n-tile nt, rows `row` and row + 8 and the
// two keys n0 + 8 nt + col_t + {0, 1} (col_t = 2 (lane % 4)). One generator call decides the sixteen
// entries {i, i + 8} x {j, j + 1, j + 8, j + 9, j + 16, j + 17, j + 24, j + 25} of a 16-row, 32-key block:
// exactly a thread's share of n-tiles 4k .. 4k + 3 when row % 16 < 8, so the forward uses every byte it
// draws; the backward's lanes use half of each call, two lanes sharing it. The kernels' rows and keys start on multiples of 16 within their sequence (tiles of 64 or more
// rows and keys), which these functions require: row % 16 < 8 here, key_row % 16 < 8 below.
#pragma once
#include "common/dropout.cuh"

namespace cupyflash {

// prmt.b32 in its default mode: byte k of the result is the byte of {b, a} (a the low four) that nibble k
// of the selector names by its low three bits, or, with the nibble's bit 3 set, that byte's bit 7 copied
// into all eight bits.
CUPYFLASH_HD unsigned byte_perm_signed(unsigned a, unsigned b, unsigned selector) {
#if defined(__CUDA_ARCH__)
    unsigned r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(selector));
    return r;
#else
    const unsigned long long bytes = a | (static_cast<unsigned long long>(b) << 32);
    unsigned r = 0;
    for (int k = 0; k < 4; ++k) {
        const unsigned nibble = (selector >> (4 * k)) & 0xFu;
        unsigned byte = static_cast<unsigned>(bytes >> (8 * (nibble & 7u))) & 0xFFu;
        if (nibble & 8u) byte = (byte & 0x80u) ? 0xFFu : 0u;
        r |= byte << (8 * k);
    }
    return r;
#endif
}

// Zeroes the dropped probabilities of the forward's P as the A operand of O += P V (fragment/operand.cuh:
// a[kk][0] row `row`, keys n0 + 16 kk + col_t + {0, 1}; a[kk][1] row + 8, the same keys; a[kk][2], a[kk][3]
// the two rows at those keys + 8), packed 16-bit pairs, after the softmax has summed them. The kept ones
// keep their value: the 1 / (1 - p) is applied to the output at the end. A pair is one word's byte pair
// (bit 0 of j picks the byte within it), so its two decisions become a mask of two 16-bit halves by one
// prmt that copies each byte's decision bit (bytes_kept's bit 7) across its half, and one AND.
//
// With an even number of k-steps n0 % 32 == 0, and k-steps 2k and 2k + 1 are one call's 32-key block:
// words 0 and 1 are row `row`'s keys with bit 4 clear and set, words 2 and 3 row + 8's. With an odd number
// (80-key tiles, whose n0 is a multiple of 16 only) each k-step draws its own call, of which the half that
// bit 4 of its keys picks is used. The calls are unrolled: independent, their rounds interleave. bh = b *
// heads + h; row, n0 and the keys counted from the start of the sequence. (Drawn while the tile's products
// run instead, between their issue and the wait, as words packed a block each, the decisions took longer
// back to back: 1.58x the plain forward's time against 1.46x at d128 4k on an H100, session 32.)
template <int kSteps>
__device__ __forceinline__ void drop_operand(unsigned (&a)[kSteps][4], const DropoutArg& d, unsigned bh, int row,
                                             int n0, int col_t) {
    const unsigned not_t4 = not_threshold4(d);
    const unsigned row_word = dropout_row_word(row);
    // The four decisions of `draws` onto a[kk][r] (its bytes 0 and 1) and a[kk][r + 2] (bytes 2 and 3).
    const auto apply = [&](unsigned draws, int kk, int r) {
        const unsigned kept = bytes_kept(draws, not_t4);
        a[kk][r] &= byte_perm_signed(kept, 0u, 0x9988u);
        a[kk][r + 2] &= byte_perm_signed(kept, 0u, 0xBBAAu);
    };
    if constexpr (kSteps % 2 == 0) {
#pragma unroll
        for (int k = 0; k < kSteps / 2; ++k) {
            unsigned w[4];
            dropout_draw(d, bh, row_word, dropout_col_word(n0 + 32 * k + col_t), w);
            apply(w[0], 2 * k, 0);
            apply(w[1], 2 * k + 1, 0);
            apply(w[2], 2 * k, 1);
            apply(w[3], 2 * k + 1, 1);
        }
    } else {
#pragma unroll
        for (int kk = 0; kk < kSteps; ++kk) {
            const int j = n0 + 16 * kk + col_t;
            const bool high = (j >> 4) & 1;
            unsigned w[4];
            dropout_draw(d, bh, row_word, dropout_col_word(j), w);
            apply(high ? w[1] : w[0], kk, 0);
            apply(high ? w[3] : w[2], kk, 1);
        }
    }
}

// The same decisions for a transposed fragment (the backward's S^T, dP^T): its rows are keys (key_row and
// key_row + 8) and its columns queries m0 + 8 nt + col_t + {0, 1}, so p[nt][e + 2 r] is the entry of query
// m0 + 8 nt + col_t + e and key key_row + 8 r. The call of query i (bit 3 clear) and key_row decides the
// entries {i, i + 8} x {key_row, key_row + 8} (bytes bit0(key_row) and 2 + bit0(key_row) of words
// bit4(key_row), for query i, and 2 + bit4(key_row), for i + 8) and the same four of key_row ^ 1, whose
// keys the lane 4 apart holds (lane / 4 is the key's low three bits) beside the same queries. So of a
// 16-query block's two calls (columns e = 0, 1) each lane of such a pair draws one, e = bit0(key_row), and
// sends the partner its four decisions: half a call a lane per (block, column) instead of a whole one.
//
// dropout_pair_draw is a lane's part for the block of queries i0 + {0, 1} (i0 = m0 + 16 block + col_t):
// its own four decisions of column bit0(key_row) in bits 0-3 and its partner's in bits 4-7, each in the
// order of the keep bits below. bytes_kept's bit 7 of each byte becomes one bit by a product whose partial
// products land on distinct bits (bits 7, 15, 23, 31 to 28, 29, 30, 31).
CUPYFLASH_HD unsigned dropout_pair_draw(const DropoutArg& d, unsigned bh, int key_row, int i0) {
    const int own = key_row & 1;
    unsigned w[4];
    dropout_draw(d, bh, dropout_row_word(i0 + own), dropout_col_word(key_row), w);
    const bool high = (key_row >> 4) & 1;
    const unsigned query = high ? w[1] : w[0], query8 = high ? w[3] : w[2];
    const unsigned not_t4 = not_threshold4(d);
    const auto four = [&](int key_bit) {  // bytes key_bit, 2 + key_bit of both words, as four bits
        const unsigned kept = bytes_kept(byte_perm_signed(query, query8, 0x6420u + 0x1111u * key_bit), not_t4);
        return ((kept & 0x80808080u) * 0x00204081u) >> 28;
    };
    return four(own) | (four(own ^ 1) << 4);
}

// The keep bits of dropout_bits_transposed for one (block, both columns) from this lane's pair draw and
// its partner's: the own column's four from `mine`, the other column's from `partners`' bits 4-7.
CUPYFLASH_HD unsigned dropout_pair_bits(unsigned mine, unsigned partners, int key_row) {
    const unsigned own = mine & 0xFu, other = partners >> 4;
    return (key_row & 1) ? other | (own << 4) : own | (other << 4);
}

#if defined(__CUDACC__)
// The lane 4 apart's value (lanes 4 apart hold keys key_row ^ 1): dropout_bits_transposed's exchange on
// the device (the host tests pass their own).
struct LaneXor4 {
    __device__ __forceinline__ unsigned operator()(unsigned x, int) const { return __shfl_xor_sync(0xffffffffu, x, 4); }
};
#endif

// Returns the keep bits, 4 per (block, column e) k = 2 block + e: (i, key_row), (i, key_row + 8), (i + 8,
// key_row), (i + 8, key_row + 8); apply_dropout_transposed applies them. exchange(x, block) returns the
// partner lane's x of that block (LaneXor4; the host test passes the partner's draw). One pair draw a step
// of a loop that is not unrolled, so that one call's registers are live at a time (the backward's
// consumers have none to spare: two calls a step put six local-memory accesses into the d128 consumers).
// The queries must start on a multiple of 16 (m0 % 16 == 0: the backward's query tiles do); every lane
// of the warp runs the loop (the exchange is a warp shuffle). The calls need no fragment: a kernel draws
// them while its products run.
template <int kNTiles, typename Exchange>
__device__ __forceinline__ unsigned long long dropout_bits_transposed(const DropoutArg& d, unsigned bh, int key_row,
                                                                      int m0, int col_t, Exchange exchange) {
    static_assert(kNTiles % 2 == 0 && kNTiles <= 16, "16-query blocks, at most 8 (one 64-bit mask)");
    // 8 bits per block. Each step shifts the mask down and puts its bits at the top (constant shifts: a
    // shift by 8 k of a 64-bit mask, k the loop counter, costs more instructions), so after the last step
    // block 0 is at bit 64 - 4 kNTiles and one shift puts it at 0.
    unsigned long long kept = 0;
#pragma unroll 1
    for (int block = 0; block < kNTiles / 2; ++block) {
        const unsigned mine = dropout_pair_draw(d, bh, key_row, m0 + 16 * block + col_t);
        const unsigned bits = dropout_pair_bits(mine, exchange(mine, block), key_row);
        kept = (kept >> 8) | (static_cast<unsigned long long>(bits) << 56);
    }
    return kept >> (64 - 4 * kNTiles);
}

// p[nt][e + 2 r] = kept ? p * scale : 0 for the bits of dropout_bits_transposed.
template <int kNTiles, typename Acc>
__device__ __forceinline__ void apply_dropout_transposed(Acc (&p)[kNTiles][4], unsigned long long kept, Acc scale) {
#pragma unroll
    for (int nt = 0; nt < kNTiles; nt += 2) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const unsigned four = static_cast<unsigned>(kept >> (4 * (nt + e)));  // k = 2 (nt / 2) + e
            p[nt][e] = (four & 1u) ? p[nt][e] * scale : Acc(0);
            p[nt][e + 2] = (four & 2u) ? p[nt][e + 2] * scale : Acc(0);
            p[nt + 1][e] = (four & 4u) ? p[nt + 1][e] * scale : Acc(0);
            p[nt + 1][e + 2] = (four & 8u) ? p[nt + 1][e + 2] * scale : Acc(0);
        }
    }
}

}  // namespace cupyflash
