// Dropout's keep decisions, as cupyflash/_dropout.py defines them (that file is the specification; the
// NumPy twin, the reference's masks and cupyflash.dropout_mask draw from it, tests/test_training.py
// compares this header with it bit for bit, on the host with a C++ compiler and on the GPU).
//
// The decision for batch entry b, query head h, query i and key j (from 0 within the sequence) takes the
// 16-bit half bit0(j) of word 2 * bit3(i) + bit3(j) of Philox4x32-10 at counter (I, J, b * heads + h,
// offset) and key (seed mod 2^32, seed >> 32), I = i without bit 3, J = j without bits 0 and 3; the entry
// is kept when that half is at least threshold = floor(p * 2^16). One call decides the eight entries
// {i, i ^ 8} x {j, j ^ 1, j ^ 8, j ^ 9}: what one thread of an mma.sync / wgmma accumulator holds of two
// rows (r, r + 8) and two 8-column blocks (columns 2c, 2c + 1 of each).
//
// Host and device code alike (the host build is the tests' check against the Python definition).
#pragma once
#include "common/host_device.cuh"

namespace cupyflash {

// Dropout of one call. threshold 0 keeps everything (dropout_p < 2^-16 draws nothing).
struct DropoutArg {
    unsigned long long seed;
    unsigned offset;
    unsigned threshold;  // floor(dropout_p * 2^16)
    double scale;        // 1 / (1 - dropout_p), the factor of a kept probability (float64 for float64 inputs)
    int enabled;         // 1: dropout_p > 0
};

// The high and low 32 bits of a * b.
CUPYFLASH_HD void mul_hi_lo(unsigned a, unsigned b, unsigned& hi, unsigned& lo) {
#if defined(__CUDA_ARCH__)
    hi = __umulhi(a, b);
    lo = a * b;
#else
    const unsigned long long p = static_cast<unsigned long long>(a) * b;
    hi = static_cast<unsigned>(p >> 32);
    lo = static_cast<unsigned>(p);
#endif
}

// One round of Philox4x32 (Salmon et al., SC 2011): two 32 x 32 -> 64-bit products mixed with the key.
CUPYFLASH_HD void philox_round(unsigned (&w)[4], unsigned k0, unsigned k1) {
    unsigned hi0, lo0, hi1, lo1;
    mul_hi_lo(0xD2511F53u, w[0], hi0, lo0);
    mul_hi_lo(0xCD9E8D57u, w[2], hi1, lo1);
    const unsigned c1 = w[1], c3 = w[3];
    w[0] = hi1 ^ c1 ^ k0;
    w[1] = lo1;
    w[2] = hi0 ^ c3 ^ k1;
    w[3] = lo0;
}

// Philox4x32-10: ten rounds, the key bumped by the Weyl constants between rounds. w holds the counter on
// entry and the four output words on exit.
CUPYFLASH_HD void philox4x32_10(unsigned (&w)[4], unsigned k0, unsigned k1) {
#pragma unroll
    for (int round = 0; round < 10; ++round) {
        philox_round(w, k0, k1);
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
}

// Two Philox4x32-10 calls of one key, their rounds interleaved: each round's products wait several
// cycles, and a call's ten rounds depend on each other, so one call alone leaves the scheduler idle
// between them (the sm90 forward with dropout issued 44% of its slots, session 29's profile); the other
// call's round fills that wait.
CUPYFLASH_HD void philox4x32_10_x2(unsigned (&w)[4], unsigned (&x)[4], unsigned k0, unsigned k1) {
#pragma unroll
    for (int round = 0; round < 10; ++round) {
        philox_round(w, k0, k1);
        philox_round(x, k0, k1);
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
}

// The counter words of the call that decides entry (i, j).
CUPYFLASH_HD unsigned dropout_row_word(int i) { return static_cast<unsigned>(((i >> 4) << 3) | (i & 7)); }
CUPYFLASH_HD unsigned dropout_col_word(int j) { return static_cast<unsigned>(((j >> 4) << 2) | ((j >> 1) & 3)); }

// The eight keep decisions of the call at counter (row_word, col_word, bh, offset), as bits: bit
// 2 * (2 * bit3(i) + bit3(j)) + bit0(j) is entry (i, j)'s.
// A word's high half is at least threshold (< 2^16) iff the word is at least threshold << 16, and its low
// half iff the word shifted left by 16 is: one shift and two comparisons per word, each selecting its
// bit's value, where extracting the halves took two more instructions.
CUPYFLASH_HD unsigned keep_bits_of(const unsigned (&w)[4], unsigned threshold) {
    const unsigned high = threshold << 16;
    unsigned bits = 0;
#pragma unroll
    for (int x = 0; x < 4; ++x) {
        bits |= ((w[x] << 16) >= high ? 1u << (2 * x) : 0u) | (w[x] >= high ? 2u << (2 * x) : 0u);
    }
    return bits;
}

CUPYFLASH_HD unsigned dropout_keep_bits(const DropoutArg& d, unsigned bh, unsigned row_word, unsigned col_word) {
    unsigned w[4] = {row_word, col_word, bh, d.offset};
    philox4x32_10(w, static_cast<unsigned>(d.seed), static_cast<unsigned>(d.seed >> 32));
    return keep_bits_of(w, d.threshold);
}

// dropout_keep_bits of two calls, (row_word0, col_word0) into bits0 and (row_word1, col_word1) into bits1,
// drawn together (philox4x32_10_x2).
CUPYFLASH_HD void dropout_keep_bits_x2(const DropoutArg& d, unsigned bh, unsigned row_word0, unsigned col_word0,
                                       unsigned row_word1, unsigned col_word1, unsigned& bits0, unsigned& bits1) {
    unsigned w[4] = {row_word0, col_word0, bh, d.offset};
    unsigned x[4] = {row_word1, col_word1, bh, d.offset};
    philox4x32_10_x2(w, x, static_cast<unsigned>(d.seed), static_cast<unsigned>(d.seed >> 32));
    bits0 = keep_bits_of(w, d.threshold);
    bits1 = keep_bits_of(x, d.threshold);
}

// Entry (i, j)'s bit in dropout_keep_bits.
CUPYFLASH_HD int dropout_bit(int i, int j) { return 2 * (2 * ((i >> 3) & 1) + ((j >> 3) & 1)) + (j & 1); }

// The keep decision of one entry (a whole generator call: for code that needs entries one at a time).
CUPYFLASH_HD bool dropout_keep(const DropoutArg& d, unsigned bh, int i, int j) {
    return (dropout_keep_bits(d, bh, dropout_row_word(i), dropout_col_word(j)) >> dropout_bit(i, j)) & 1u;
}

}  // namespace cupyflash
