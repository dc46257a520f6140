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

// Philox4x32-10 (Salmon et al., SC 2011): ten rounds of two 32 x 32 -> 64-bit products, the key bumped
// by the Weyl constants between rounds. w holds the counter on entry and the four output words on exit.
CUPYFLASH_HD void philox4x32_10(unsigned (&w)[4], unsigned k0, unsigned k1) {
#pragma unroll
    for (int round = 0; round < 10; ++round) {
        unsigned hi0, lo0, hi1, lo1;
        mul_hi_lo(0xD2511F53u, w[0], hi0, lo0);
        mul_hi_lo(0xCD9E8D57u, w[2], hi1, lo1);
        const unsigned c1 = w[1], c3 = w[3];
        w[0] = hi1 ^ c1 ^ k0;
        w[1] = lo1;
        w[2] = hi0 ^ c3 ^ k1;
        w[3] = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
}

// The counter words of the call that decides entry (i, j).
CUPYFLASH_HD unsigned dropout_row_word(int i) { return static_cast<unsigned>(((i >> 4) << 3) | (i & 7)); }
CUPYFLASH_HD unsigned dropout_col_word(int j) { return static_cast<unsigned>(((j >> 4) << 2) | ((j >> 1) & 3)); }

// The eight keep decisions of the call at counter (row_word, col_word, bh, offset), as bits: bit
// 2 * (2 * bit3(i) + bit3(j)) + bit0(j) is entry (i, j)'s.
CUPYFLASH_HD unsigned dropout_keep_bits(const DropoutArg& d, unsigned bh, unsigned row_word, unsigned col_word) {
    unsigned w[4] = {row_word, col_word, bh, d.offset};
    philox4x32_10(w, static_cast<unsigned>(d.seed), static_cast<unsigned>(d.seed >> 32));
    unsigned bits = 0;
#pragma unroll
    for (int x = 0; x < 4; ++x) {
        bits |= static_cast<unsigned>((w[x] & 0xFFFFu) >= d.threshold) << (2 * x);
        bits |= static_cast<unsigned>((w[x] >> 16) >= d.threshold) << (2 * x + 1);
    }
    return bits;
}

// Entry (i, j)'s bit in dropout_keep_bits.
CUPYFLASH_HD int dropout_bit(int i, int j) { return 2 * (2 * ((i >> 3) & 1) + ((j >> 3) & 1)) + (j & 1); }

// The keep decision of one entry (a whole generator call: for code that needs entries one at a time).
CUPYFLASH_HD bool dropout_keep(const DropoutArg& d, unsigned bh, int i, int j) {
    return (dropout_keep_bits(d, bh, dropout_row_word(i), dropout_col_word(j)) >> dropout_bit(i, j)) & 1u;
}

}  // namespace cupyflash
