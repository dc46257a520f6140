// Dropout of an accumulator fragment's probabilities (common/dropout.cuh draws the decisions): a thread
// of an mma.sync m16n8 or wgmma m64nN accumulator holds, per 8-key n-tile nt, rows `row` and row + 8 and
// the two keys n0 + 8 nt + col_t + {0, 1} (col_t = 2 (lane % 4)), as p[nt][0..1] and p[nt][2..3]. One
// generator call decides the eight entries {i, i + 8} x {j, j + 1, j + 8, j + 9} of a 16-row, 16-key
// block, which is exactly a thread's share of n-tiles 2k and 2k + 1 when row % 16 < 8: every word the
// call draws is used. A fragment whose row is 8-15 mod 16 (a tile that does not start on a multiple of
// 16 rows) takes one call per row and 16-key block instead, half of each used.
#pragma once
#include "common/dropout.cuh"

namespace cupyflash {

// Zeroes the dropped probabilities of p (the kept ones keep their value: the 1 / (1 - p) of the kept
// ones is applied to the output at the end). bh = b * heads + h; row, n0 and the keys counted from the
// start of the sequence; n0 a multiple of 16. The calls run two at a time (dropout_keep_bits_x2, whose
// rounds interleave) in a loop that is not unrolled, collecting their eight bits each into one mask, so
// that two calls' registers are live at a time (unrolled, the sm90 forward's consumers spilled around
// them); the mask is then applied to the unrolled fragment.
template <int kNTiles, typename Acc>
__device__ __forceinline__ void drop_fragment(Acc (&p)[kNTiles][4], const DropoutArg& d, unsigned bh, int row,
                                              int n0, int col_t) {
    static_assert(kNTiles % 2 == 0 && kNTiles <= 16, "16-key blocks, at most 8 (one 64-bit mask)");
    constexpr int kBlocks = kNTiles / 2;
    const bool aligned = (row & 8) == 0;
    // 8 bits per 16-key block k at bits 8k .. 8k + 7: bits 0-3 row `row`'s keys, 4-7 row + 8's. Each step
    // shifts the mask down and puts its blocks at the top (constant shifts: a shift by 8 k of a 64-bit
    // mask, k the loop counter, cost more instructions than the comparisons), so after the last step
    // block 0 is at bit 64 - 8 * (blocks drawn) and one constant shift puts it at bit 0.
    unsigned long long kept = 0;
    if (aligned) {
        // Blocks k and k + 1 a step (an odd count's last step draws its one block twice: the copy lands
        // past block kBlocks - 1, in bits the fragment does not read).
#pragma unroll 1
        for (int k = 0; k < kBlocks; k += 2) {
            const int k1 = k + 1 < kBlocks ? k + 1 : k;
            unsigned bits0, bits1;
            dropout_keep_bits_x2(d, bh, dropout_row_word(row), dropout_col_word(n0 + 16 * k + col_t),
                                 dropout_row_word(row), dropout_col_word(n0 + 16 * k1 + col_t), bits0, bits1);
            kept = (kept >> 16) | (static_cast<unsigned long long>((bits0 & 0xFFu) | (bits1 << 8)) << 48);
        }
        kept >>= 64 - 16 * ((kBlocks + 1) / 2);
    } else {
        // row has bit 3 set: its entries are the upper half of its call; row + 8 starts the next block.
#pragma unroll 1
        for (int k = 0; k < kBlocks; ++k) {
            const unsigned col_word = dropout_col_word(n0 + 16 * k + col_t);
            unsigned upper, lower;
            dropout_keep_bits_x2(d, bh, dropout_row_word(row), col_word, dropout_row_word(row + 8), col_word, upper,
                                 lower);
            kept = (kept >> 8) | (static_cast<unsigned long long>(((upper >> 4) | (lower << 4)) & 0xFFu) << 56);
        }
        kept >>= 64 - 8 * kBlocks;
    }
#pragma unroll
    for (int nt = 0; nt < kNTiles; nt += 2) {
        const unsigned bits = static_cast<unsigned>(kept >> (4 * nt));  // block nt / 2 in the low 8 bits
        if (!(bits & 1u)) p[nt][0] = Acc(0);
        if (!(bits & 2u)) p[nt][1] = Acc(0);
        if (!(bits & 4u)) p[nt + 1][0] = Acc(0);
        if (!(bits & 8u)) p[nt + 1][1] = Acc(0);
        if (!(bits & 16u)) p[nt][2] = Acc(0);
        if (!(bits & 32u)) p[nt][3] = Acc(0);
        if (!(bits & 64u)) p[nt + 1][2] = Acc(0);
        if (!(bits & 128u)) p[nt + 1][3] = Acc(0);
    }
}

// The same decisions for a transposed fragment (the backward's S^T, dP^T): its rows are keys (key_row and
// key_row + 8) and its columns queries m0 + 8 nt + col_t + {0, 1}, so p[nt][e + 2 r] is the entry of query
// m0 + 8 nt + col_t + e and key key_row + 8 r. A call then serves a thread's four entries of one query
// pair {i, i + 8} (n-tiles 2k and 2k + 1, column e) and its two keys: two calls per 16-query block (drawn
// together, dropout_keep_bits_x2), half of each call's bits used. The queries must start on a multiple of 16 (m0 % 16 == 0: the backward's
// query tiles do); keys 8-15 mod 16 take a second call per pair, as rows do above. Returns the keep bits,
// 4 per (block, column e) k = 2 block + e: (i, key_row), (i, key_row + 8), (i + 8, key_row), (i + 8,
// key_row + 8); apply_dropout_transposed applies them. The calls need no fragment: a kernel draws them
// while its products run.
template <int kNTiles>
__device__ __forceinline__ unsigned long long dropout_bits_transposed(const DropoutArg& d, unsigned bh, int key_row,
                                                                      int m0, int col_t) {
    static_assert(kNTiles % 2 == 0 && kNTiles <= 16, "16-query blocks, at most 8 (one 64-bit mask)");
    const bool aligned = (key_row & 8) == 0;
    const int key_bit = key_row & 1;  // bit 0 of both keys
    unsigned long long kept = 0;
    // The call's bits of (query i, key j), 2 (2 bit3(i) + bit3(j)) + bit0(j), as four bits of key_row's keys.
    const auto four = [key_bit](unsigned bits) {
        return ((bits >> key_bit) & 1u) | (((bits >> (2 + key_bit)) & 1u) << 1) |
               (((bits >> (4 + key_bit)) & 1u) << 2) | (((bits >> (6 + key_bit)) & 1u) << 3);
    };
    if (aligned) {
        // (block, column e) = (k / 2, k % 2): both columns of a block a step.
#pragma unroll 1
        for (int k = 0; k < kNTiles; k += 2) {
            const int m = m0 + 16 * (k / 2) + col_t;
            unsigned bits0, bits1;
            dropout_keep_bits_x2(d, bh, dropout_row_word(m), dropout_col_word(key_row), dropout_row_word(m + 1),
                                 dropout_col_word(key_row), bits0, bits1);
            kept |= (static_cast<unsigned long long>(four(bits0)) << (4 * k)) |
                    (static_cast<unsigned long long>(four(bits1)) << (4 * (k + 1)));
        }
    } else {
        // key_row has bit 3 set (its bits are the bit3(j) = 1 ones of its call); key_row + 8 starts the next
        // 16-key block (bit3(j) = 0 there): the two calls' bits merged as one aligned call's.
#pragma unroll 1
        for (int k = 0; k < kNTiles; ++k) {
            const unsigned row_word = dropout_row_word(m0 + 16 * (k / 2) + col_t + k % 2);
            unsigned upper, lower;
            dropout_keep_bits_x2(d, bh, row_word, dropout_col_word(key_row), row_word, dropout_col_word(key_row + 8),
                                 upper, lower);
            kept |= static_cast<unsigned long long>(four(((upper >> 2) & 0x33u) | ((lower << 2) & 0xCCu))) << (4 * k);
        }
    }
    return kept;
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
