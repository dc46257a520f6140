// Exact, order-independent sums of floating-point numbers (a long accumulator, after Kulisch): each
// addend x = M * 2^E (integer M) is cut into kChunk-bit digits at bit position E - kMinExp, and each
// digit is added into one int64 word of the element's accumulator. Integer adds commute, so any order
// of the adds (atomics from any thread, block or launch) leaves the same words, and finish() turns them
// into the same value every time: the deterministic backward's score_mod buffer gradients, which the
// kernels add in whatever order their threads run.
//
// A digit is below 2^kChunk, so a word overflows only after 2^(63 - kChunk) adds (2^39 for float,
// 2^33 for double): more than one element receives in any attention call. Infinities and NaN set bits
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

// The accumulator's value, rounded to F: the digits of its magnitude (the words negated first when the
// value is negative, so no digit cancels another), the highest nonzero one and the three below it (a
// window kept in four registers as the digits are made, low to high), summed in double from the
// highest, in that fixed order: 3 * kChunk >= 72 bits below the top digit, more than double's 53.
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
    long long carry = 0;
    long long d0 = 0, d1 = 0, d2 = 0, d3 = 0;  // digits k, k - 1, k - 2, k - 3
    long long t0 = 0, t1 = 0, t2 = 0, t3 = 0;  // the window at the highest nonzero digit so far
    int top = -1;
    for (int k = 0; k < Fmt::kWords; ++k) {
        const long long t = sign * words[k] + carry;
        const long long low = t & ((1ll << Fmt::kChunk) - 1);
        carry = (t - low) >> Fmt::kChunk;
        d3 = d2;
        d2 = d1;
        d1 = d0;
        d0 = low;
        if (low != 0) {
            top = k;
            t0 = d0;
            t1 = d1;
            t2 = d2;
            t3 = d3;
        }
    }
    if (carry != 0) {  // a digit past the last word
        top = Fmt::kWords;
        t3 = d2;
        t2 = d1;
        t1 = d0;
        t0 = carry;
    }
    if (top < 0) return F(0);
    double sum = static_cast<double>(t0);
    sum += ldexp(static_cast<double>(t1), -Fmt::kChunk);
    sum += ldexp(static_cast<double>(t2), -2 * Fmt::kChunk);
    sum += ldexp(static_cast<double>(t3), -3 * Fmt::kChunk);
    return static_cast<F>(ldexp(static_cast<double>(sign) * sum, top * Fmt::kChunk + Fmt::kMinExp));
}

}  // namespace cupyflash
