// Exact, order-independent sums of floating-point numbers (a long accumulator, after Kulisch): each
// addend x = M * 2^E (integer M) is cut into kChunk-bit digits at bit position E - kMinExp, and each
// digit is added into one int64 word of the element's accumulator. Integer adds commute, so any order
// of the adds (atomics from any thread, block or launch) leaves the same words, and finish() turns them
// into the same value every time: the deterministic backward's score_mod buffer gradients, which the
// kernels add in whatever order their threads run.
//
// A digit is below 2^kChunk, so a word can overflow only after 2^(63 - kChunk) adds of one sign (2^39
// for float, 2^33 for double, which a scalar buffer read by every pair of a very large call could
// reach). Infinities and NaN set bits
// of the accumulator's last word instead (kNonFinite), so the sum of an inf and a finite number is inf
// and NaN or inf - inf is NaN, as the float sum would be.
//
// Host and device code alike (tests/test_mods.py checks the host build against exact rational sums).
#pragma once
#include "common/host_device.cuh"
#if !defined(__CUDACC__)
#include <cmath>
#include <cstring>
#endif

namespace cupyflash {

template <typename F>
struct ExactSumFormat;

// float: 24 significant bits, finite values M * 2^E with E in [-149, 104]: bit positions 0 .. 277.
template <>
struct ExactSumFormat<float> {
    using Bits = unsigned;
    static constexpr int kFractionBits = 23;
    static constexpr int kExponentMask = 0xff;
    static constexpr int kMinExp = -149;  // the exponent of the smallest subnormal's bit
    static constexpr int kChunk = 24;
    static constexpr int kPieces = 2;     // digits an addend spans: 24 bits shifted by < 24
    static constexpr int kWords = 12;     // ceil((253 + 24) / 24)
};

// double: 53 significant bits, E in [-1074, 971]: bit positions 0 .. 2098.
template <>
struct ExactSumFormat<double> {
    using Bits = unsigned long long;
    static constexpr int kFractionBits = 52;
    static constexpr int kExponentMask = 0x7ff;
    static constexpr int kMinExp = -1074;
    static constexpr int kChunk = 30;
    static constexpr int kPieces = 3;     // 53 bits shifted by < 30: 82 bits
    static constexpr int kWords = 70;     // ceil((2045 + 53) / 30)
};

// Words of one element's accumulator: the digits, then the non-finite bits.
template <typename F>
constexpr int exact_sum_slots() { return ExactSumFormat<F>::kWords + 1; }

constexpr long long kNonFiniteNan = 1, kNonFinitePosInf = 2, kNonFiniteNegInf = 4;

CUPYFLASH_HD unsigned float_bits(float x) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(x);
#else
    unsigned u;
    std::memcpy(&u, &x, sizeof u);
    return u;
#endif
}
CUPYFLASH_HD unsigned long long float_bits(double x) {
#if defined(__CUDA_ARCH__)
    return static_cast<unsigned long long>(__double_as_longlong(x));
#else
    unsigned long long u;
    std::memcpy(&u, &x, sizeof u);
    return u;
#endif
}

CUPYFLASH_HD double double_from_bits(unsigned long long u) {
#if defined(__CUDA_ARCH__)
    return __longlong_as_double(static_cast<long long>(u));
#else
    double x;
    std::memcpy(&x, &u, sizeof x);
    return x;
#endif
}

// Adds x into the accumulator `words` (exact_sum_slots<F>() of them) through sink.add(word, value),
// sink.set(word, bits) for the non-finite bits: atomics on the device, plain adds on the host.
template <typename F, typename Sink>
CUPYFLASH_HD void exact_sum_add(F x, Sink& sink) {
    using Fmt = ExactSumFormat<F>;
    using Bits = typename Fmt::Bits;
    const Bits bits = float_bits(x);
    const int expo = static_cast<int>(bits >> Fmt::kFractionBits) & Fmt::kExponentMask;
    const Bits fraction = bits & ((Bits(1) << Fmt::kFractionBits) - 1);
    const bool negative = (bits >> (sizeof(Bits) * 8 - 1)) != 0;
    if (expo == Fmt::kExponentMask) {  // inf or NaN
        sink.set(Fmt::kWords, fraction != 0 ? kNonFiniteNan : negative ? kNonFiniteNegInf : kNonFinitePosInf);
        return;
    }
    const Bits m = expo != 0 ? (fraction | (Bits(1) << Fmt::kFractionBits)) : fraction;
    if (m == 0) return;
    // x = m * 2^(expo - bias - fraction bits), the bit position of m's lowest bit from kMinExp: expo - 1
    // for normal numbers, 0 for subnormal ones (expo 0, the same scale as expo 1).
    const int position = expo != 0 ? expo - 1 : 0;
    const int word = position / Fmt::kChunk, shift = position % Fmt::kChunk;
    const Bits digit_mask = (Bits(1) << Fmt::kChunk) - 1;
#pragma unroll
    for (int piece = 0; piece < Fmt::kPieces; ++piece) {
        // Digit `piece` of m << shift: its bits [piece * kChunk, (piece + 1) * kChunk).
        const int low = piece * Fmt::kChunk - shift;  // of m
        const Bits digit = low < 0 ? (m << -low) & digit_mask
                                   : (low < static_cast<int>(sizeof(Bits) * 8) ? (m >> low) & digit_mask : Bits(0));
        if (digit != 0) {
            const long long d = static_cast<long long>(digit);
            sink.add(word + piece, negative ? -d : d);
        }
    }
}

// The carry out of the last digit of sign * words normalized into digits in [0, 2^kChunk), each carrying
// into the next: the value is carry * 2^(kWords kChunk) + sum_k digit_k 2^(k kChunk), times 2^kMinExp,
// so its sign is the carry's (or +, for a carry of 0).
template <typename F>
CUPYFLASH_HD long long exact_sum_carry(const long long* words, long long sign) {
    using Fmt = ExactSumFormat<F>;
    long long carry = 0;
    for (int k = 0; k < Fmt::kWords; ++k) {
        const long long t = sign * words[k] + carry;            // |t| < 2^63: digits < 2^kChunk, carries smaller
        const long long low = t & ((1ll << Fmt::kChunk) - 1);   // two's complement: t mod 2^kChunk
        carry = (t - low) >> Fmt::kChunk;                       // exact: t - low is a multiple of 2^kChunk
    }
    return carry;
}

// Bits of a digit (0 for 0).
CUPYFLASH_HD int exact_sum_bit_length(unsigned long long v) {
    int n = 0;
    while (v != 0) {
        ++n;
        v >>= 1;
    }
    return n;
}

// The accumulator's value correctly rounded to F (to nearest, ties to even): the digits of its magnitude
// (the words negated first when the value is negative, so no digit cancels another) from the highest,
// their top 64 bits as an integer whose lowest bit is ORed with every bit below them (round to odd: 64
// bits, at least F's significand + 2, then one rounding to F is the correct rounding of the exact value),
// converted to F once and scaled by a power of two. The scaling is exact: a value below F's smallest
// normal number is a multiple of the smallest subnormal with fewer than 64 bits, so no bit was dropped
// and it is exactly representable; any other stays normal.
template <typename F>
CUPYFLASH_HD F exact_sum_finish(const long long* words) {
    using Fmt = ExactSumFormat<F>;
    const long long flags = words[Fmt::kWords];
    if (flags != 0) {  // NaN, or inf - inf: NaN; else the infinity
        const bool nan = (flags & kNonFiniteNan) || ((flags & kNonFinitePosInf) && (flags & kNonFiniteNegInf));
        return static_cast<F>(double_from_bits(nan ? 0x7ff8000000000000ull
                                                   : (flags & kNonFinitePosInf) ? 0x7ff0000000000000ull
                                                                                : 0xfff0000000000000ull));
    }
    const long long sign = exact_sum_carry<F>(words, 1) < 0 ? -1 : 1;
    // The magnitude's digits, low to high, through a window of the latest four (d0 the latest) and the OR
    // of those that left it; at each nonzero digit (the highest so far) the window is kept: the top digit
    // and the three below it hold at least 1 + 3 * kChunk >= 64 bits.
    long long carry = 0, d0 = 0, d1 = 0, d2 = 0, d3 = 0;
    bool below = false;
    long long w[4] = {0, 0, 0, 0};
    bool w_below = false;
    int top = -1;
    for (int k = 0; k < Fmt::kWords; ++k) {
        const long long t = sign * words[k] + carry;
        const long long low = t & ((1ll << Fmt::kChunk) - 1);
        carry = (t - low) >> Fmt::kChunk;
        below |= d3 != 0;
        d3 = d2;
        d2 = d1;
        d1 = d0;
        d0 = low;
        if (low != 0) {
            top = k;
            w[0] = d0;
            w[1] = d1;
            w[2] = d2;
            w[3] = d3;
            w_below = below;
        }
    }
    if (carry != 0) {  // a digit past the last word: the magnitude's carry (>= 0)
        top = Fmt::kWords;
        w[0] = carry;
        w[1] = d0;
        w[2] = d1;
        w[3] = d2;
        w_below = below || d3 != 0;
    }
    if (top < 0) return F(0);
    unsigned long long sig = 0;  // the magnitude's leading 64 bits (fewer if it has fewer)
    int got = 0;
    int lowest = 0;              // the bit position (from 2^kMinExp) of sig's lowest bit
    bool sticky = w_below;       // a nonzero bit below them
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const unsigned long long v = static_cast<unsigned long long>(w[i]);
        if (got == 64) {
            sticky |= v != 0;
            continue;
        }
        const int width = i == 0 ? exact_sum_bit_length(v) : Fmt::kChunk;
        const int take = width < 64 - got ? width : 64 - got;
        sig = (take == 64 ? 0ull : sig << take) | (v >> (width - take));
        if (take < width) sticky |= (v & ((1ull << (width - take)) - 1)) != 0;
        got += take;
        lowest = (top - i) * Fmt::kChunk + (width - take);
    }
    if (sticky) sig |= 1;
    const F rounded = static_cast<F>(sig);
    return static_cast<F>(ldexp(static_cast<double>(sign) * static_cast<double>(rounded), lowest + Fmt::kMinExp));
}

}  // namespace cupyflash
