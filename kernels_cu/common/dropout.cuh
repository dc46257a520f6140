// Dropout's keep decisions, as cupyflash/_dropout.py defines them (that file is the specification; the
// NumPy twin, the reference's masks and cupyflash.dropout_mask draw from it, tests/test_training.py
// compares this header with it bit for bit, on the host with a C++ compiler and on the GPU).
//
// The decision for batch entry b, query head h, query i and key j (from 0 within the sequence) takes byte
// 2 * bit3(j) + bit0(j) of word 2 * bit3(i) + bit4(j) of Philox4x32-7 at counter (I, J, b * heads + h,
// offset) and key (seed mod 2^32, seed >> 32), I = i without bit 3, J = j without bits 0, 3 and 4; the
// entry is kept when that byte is at least threshold = round(256 p) (in [1, 255] for p > 0). One call
// decides the sixteen entries {i, i ^ 8} x {j, j ^ 1, j ^ 8, j ^ 9, j ^ 16, j ^ 17, j ^ 24, j ^ 25}: what one
// thread of an mma.sync / wgmma accumulator holds of two rows (r, r + 8) and a 32-key block (columns
// 2c, 2c + 1 of four 8-column blocks).
//
// Host and device code alike (the host build is the tests' check against the Python definition).
#pragma once
#include "common/host_device.cuh"

namespace cupyflash {

// Dropout of one call. threshold 0 keeps everything (dropout_p = 0 draws nothing).
struct DropoutArg {
    unsigned long long seed;
    unsigned offset;
    unsigned threshold;  // round(256 dropout_p), in [1, 255] for dropout_p > 0
    double scale;        // a kept probability's factor, 256 / (256 - threshold) = 1 / (1 - dropout rate)
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

// Philox4x32-7: seven rounds, the key bumped by the Weyl constants between rounds. w holds the counter on
// entry and the four output words on exit.
CUPYFLASH_HD void philox4x32_7(unsigned (&w)[4], unsigned k0, unsigned k1) {
#pragma unroll
    for (int round = 0; round < 7; ++round) {
        philox_round(w, k0, k1);
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
}

// The counter words of the call that decides entry (i, j).
CUPYFLASH_HD unsigned dropout_row_word(int i) { return static_cast<unsigned>(((i >> 4) << 3) | (i & 7)); }
CUPYFLASH_HD unsigned dropout_col_word(int j) { return static_cast<unsigned>(((j >> 5) << 2) | ((j >> 1) & 3)); }

// The sixteen draws (bytes of w) of the call at counter (row_word, col_word, bh, offset).
CUPYFLASH_HD void dropout_draw(const DropoutArg& d, unsigned bh, unsigned row_word, unsigned col_word, unsigned (&w)[4]) {
    w[0] = row_word;
    w[1] = col_word;
    w[2] = bh;
    w[3] = d.offset;
    philox4x32_7(w, static_cast<unsigned>(d.seed), static_cast<unsigned>(d.seed >> 32));
}

// Entry (i, j)'s byte among its call's sixteen: word (byte >> 2), bits 8 (byte & 3) and up.
CUPYFLASH_HD int dropout_byte(int i, int j) {
    return 4 * (2 * ((i >> 3) & 1) + ((j >> 4) & 1)) + 2 * ((j >> 3) & 1) + (j & 1);
}

// The four byte decisions of a word at once (SWAR): bit 7 of byte k of the result is set iff byte k of
// draws is at least the threshold t, with not_t4 = ~(t * 0x01010101). Per byte, (x | y) - ((x ^ y) >> 1)
// with y = 255 - t is the rounded-up mean of x and y, which is at least 128 iff x + 255 - t >= 255; its
// terms never borrow across bytes ((x ^ y) with bit 0 cleared, halved, is below x | y in every byte).
CUPYFLASH_HD unsigned bytes_kept(unsigned draws, unsigned not_t4) {
    return (draws | not_t4) - (((draws ^ not_t4) & 0xFEFEFEFEu) >> 1);
}

// ~(threshold replicated into four bytes), bytes_kept's second argument.
CUPYFLASH_HD unsigned not_threshold4(const DropoutArg& d) { return ~(d.threshold * 0x01010101u); }

// The keep decision of one entry (a whole generator call: for code that needs entries one at a time).
CUPYFLASH_HD bool dropout_keep(const DropoutArg& d, unsigned bh, int i, int j) {
    unsigned w[4];
    dropout_draw(d, bh, dropout_row_word(i), dropout_col_word(j), w);
    const int byte = dropout_byte(i, j);
    return ((w[byte >> 2] >> (8 * (byte & 3))) & 0xFFu) >= d.threshold;
}

}  // namespace cupyflash
