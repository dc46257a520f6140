// A float64 lse for float32 probabilities as two floats, so that the float32 backward's
// P = exp(s - lse) takes no float64 operation (two conversions at a quarter of the FMA rate and a DADD an
// entry, on the critical path of sm90/bwd_planes_mainloop.cuh): hi = fl(lse) and lo = fl(lse - hi)
// (lo's own rounding is 2^-48 |lse|, far below what follows).
//
// The difference d = s - lse is rounded once, as fl32(s - lse) from the float64 lse was: s - hi with its
// rounding error (Knuth's TwoSum, exact: five more additions), the error and -lo summed (a rounding of
// 2^-24 of an ulp of d), then added to s - hi. Where |hi| >= 32 and P is above 1e-7, s is within 16 of
// hi and s - hi is exact anyway (Sterbenz); but the rows of smaller lse (scores within a softcap, short
// rows) round s - hi, and (s - hi) - lo rounded twice, up to an ulp of d: twice the probabilities'
// relative error |d| 2^-24 that the float64 form has. A row with no key (lse = -inf) becomes hi = +inf,
// lo = 0, which the caller tests (common/softmax.cuh recompute_prob). tests/test_training.py builds this
// header as host C++ and checks the one rounding against long double.
#pragma once
#include "common/host_device.cuh"
#if !defined(__CUDACC__)
#include <cmath>
#endif

namespace cupyflash {

#if defined(__CUDACC__)
CUPYFLASH_HD float lse_pair_add(float a, float b) { return __fadd_rn(a, b); }
CUPYFLASH_HD float lse_pair_sub(float a, float b) { return __fsub_rn(a, b); }
CUPYFLASH_HD float lse_pair_float(double x) { return __double2float_rn(x); }
CUPYFLASH_HD bool lse_pair_no_key(double lse) { return lse == __longlong_as_double(0xFFF0000000000000ULL); }
CUPYFLASH_HD float lse_pair_inf() { return __int_as_float(0x7F800000); }
CUPYFLASH_HD bool lse_pair_finite(float x) { return fabsf(x) < __int_as_float(0x7F800000); }
#else
struct float2 {
    float x, y;
};
inline float2 make_float2(float x, float y) { return float2{x, y}; }
CUPYFLASH_HD float lse_pair_add(float a, float b) { return a + b; }
CUPYFLASH_HD float lse_pair_sub(float a, float b) { return a - b; }
CUPYFLASH_HD float lse_pair_float(double x) { return static_cast<float>(x); }
CUPYFLASH_HD bool lse_pair_no_key(double lse) { return lse == -INFINITY; }
CUPYFLASH_HD float lse_pair_inf() { return INFINITY; }
CUPYFLASH_HD bool lse_pair_finite(float x) { return std::fabs(x) < INFINITY; }
#endif

// (hi, lo) of a float64 lse; (+inf, 0) for -inf.
CUPYFLASH_HD float2 split_lse(double lse) {
    if (lse_pair_no_key(lse)) return make_float2(lse_pair_inf(), 0.0f);
    const float hi = lse_pair_float(lse);
    return make_float2(hi, lse_pair_float(lse - static_cast<double>(hi)));
}

// Two queries' split_lse pairs (fragment/scores.cuh probabilities_cols_natural's lse_pair: first, second).
struct SplitLsePair {
    float2 x, y;
};

// s - (hi + lo), rounded once (to within 2^-24 of an ulp). An infinite s - hi is the difference itself:
// a score of -inf (a score_mod's mask, FlexAttention's idiom) gives -inf and so P = 0, where TwoSum's
// -inf - (-inf) would make it NaN (selected, not branched: bitwise the same for every finite d).
CUPYFLASH_HD float lse_pair_difference(float s, float2 lse) {
    const float d = lse_pair_sub(s, lse.x);
    // TwoSum of s and -hi: d + err = s - hi exactly.
    const float s_part = lse_pair_add(d, lse.x);       // d - (-hi)
    const float hi_part = lse_pair_sub(d, s_part);     // d - s_part
    const float err = lse_pair_add(lse_pair_sub(s, s_part), lse_pair_sub(-lse.x, hi_part));
    const float rounded = lse_pair_add(d, lse_pair_sub(err, lse.y));
    return lse_pair_finite(d) ? rounded : d;
}

}  // namespace cupyflash
