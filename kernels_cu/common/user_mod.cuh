// What the code generated from a score_mod or mask_mod (cupyflash/_trace.py's cuda_source) is written in:
// the buffers' argument block and the scalar operations, each with the semantics cupyflash/_trace.py
// defines and its NumPy evaluation computes. Floating-point + - * / and sqrt are the correctly rounded
// _rn forms, which the compiler does not contract into FMAs, so the forward and the backward kernels
// compute bitwise the same modified score, and the same as NumPy; the other functions are the CUDA math
// library's (a few ulps from NumPy's). The 16-bit tensor-core kernels take fast forms instead (below),
// whose results may differ by roundings between kernels and from NumPy, within those inputs' tolerance.
//
// Host and device code alike (tests/test_mods.py builds the generated code as host C++ and compares it
// with the NumPy evaluation).
#pragma once
#include "common/host_device.cuh"
#if !defined(__CUDACC__)
#include <cmath>
#endif

namespace cupyflash {

constexpr int kMaxModBuffers = 8;
constexpr int kMaxModRank = 4;

// One buffer of a score or mask function: C-contiguous, its sizes per axis (axes past its rank unused),
// fewer than 2^31 elements (the host checks), so positions are 32-bit: a load in a kernel's inner loop
// then costs one compare per axis and one multiply-add per axis past the first.
struct ModBuffer {
    const void* data;
    int size[kMaxModRank];
};

struct ModBuffers {
    ModBuffer buf[kMaxModBuffers];
};

// Where the backward adds the gradients of the floating-point buffers of a score function: one array of
// the accumulation dtype per buffer, shaped like it (null for buffers that take none), or with `exact`
// (the deterministic backward) one exact accumulator per element (common/exact_sum.cuh:
// exact_sum_slots<accumulation type>() int64 words each). A kernel that sums them per CTA in shared
// memory first (common/user_calls.cuh's LocalBufferGrads) finds buffer b's part at floats
// [local_offset[b], local_offset[b + 1]) of it; local_offset[kMaxModBuffers] == 0: none.
struct ModGrads {
    void* data[kMaxModBuffers];
    int local_offset[kMaxModBuffers + 1];
    int exact;
};

// Whether every index is in range (a negative one, as unsigned, is past any size).
CUPYFLASH_HD bool user_in_range(const ModBuffer& m, const int* index, int rank) {
    bool in = true;
    for (int d = 0; d < rank; ++d) in &= static_cast<unsigned>(index[d]) < static_cast<unsigned>(m.size[d]);
    return in;
}

// The linear position of an in-range element.
CUPYFLASH_HD unsigned user_offset(const ModBuffer& m, const int* index, int rank) {
    unsigned linear = 0;
    for (int d = 0; d < rank; ++d) linear = linear * static_cast<unsigned>(m.size[d]) + static_cast<unsigned>(index[d]);
    return linear;
}

// The buffer's element at the given indices, if every one is in range (else *ok is false and 0 returned).
template <typename T>
CUPYFLASH_HD T user_load(const ModBuffer& m, const int* index, int rank, bool* ok) {
    const bool in = user_in_range(m, index, rank);
    *ok = in;
    return in ? static_cast<const T*>(m.data)[user_offset(m, index, rank)] : T(0);
}

// user_load for a mask_mod's code (cupyflash/_trace.py's cuda_source). On the device the load is never
// predicated: an index out of range loads element 0 (every device buffer has one: cupyflash/_families/
// common.py's mod_buffers gives an empty one a zero of its own), which the select discards. A predicated
// load holds one of a warp's seven predicate registers until its value is used, so the loop that
// evaluates a mask_mod over a fragment's positions (UserMaskAt::bits) issued its loads one or two at a
// time, each waiting out its latency; unpredicated, its unrolled iterations issue them together, and the
// two rows' loads of one position merge. (A score_mod's loads keep user_load: evaluated over a whole
// fragment at once, unpredicated loads issued early took registers the Hopper backward spilled.)
template <typename T>
CUPYFLASH_HD T user_mask_load(const ModBuffer& m, const int* index, int rank, bool* ok) {
#if defined(__CUDA_ARCH__)
    const bool in = user_in_range(m, index, rank);
    *ok = in;
    const T value = static_cast<const T*>(m.data)[in ? user_offset(m, index, rank) : 0u];
    return in ? value : T(0);
#else
    return user_load<T>(m, index, rank, ok);
#endif
}

// 32-bit ints wrap, as NumPy's int32 does (signed overflow is undefined in C++, unsigned is not).
CUPYFLASH_HD int user_add(int a, int b) { return static_cast<int>(static_cast<unsigned>(a) + static_cast<unsigned>(b)); }
CUPYFLASH_HD int user_sub(int a, int b) { return static_cast<int>(static_cast<unsigned>(a) - static_cast<unsigned>(b)); }
CUPYFLASH_HD int user_mul(int a, int b) { return static_cast<int>(static_cast<unsigned>(a) * static_cast<unsigned>(b)); }
CUPYFLASH_HD int user_neg(int a) { return static_cast<int>(0u - static_cast<unsigned>(a)); }
CUPYFLASH_HD int user_abs(int a) { return a < 0 ? user_neg(a) : a; }

// Python's // and % (toward minus infinity; the remainder takes the divisor's sign); a divisor of 0
// gives 0, as NumPy does, and INT_MIN // -1 wraps to INT_MIN.
CUPYFLASH_HD int user_floordiv(int a, int b) {
    if (b == 0) return 0;
    if (b == -1) return user_neg(a);
    const int q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
CUPYFLASH_HD int user_mod(int a, int b) {
    if (b == 0 || b == -1) return 0;
    const int r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}

#if defined(__CUDA_ARCH__)
CUPYFLASH_HD float user_add(float a, float b) { return __fadd_rn(a, b); }
CUPYFLASH_HD double user_add(double a, double b) { return __dadd_rn(a, b); }
CUPYFLASH_HD float user_sub(float a, float b) { return __fsub_rn(a, b); }
CUPYFLASH_HD double user_sub(double a, double b) { return __dsub_rn(a, b); }
CUPYFLASH_HD float user_mul(float a, float b) { return __fmul_rn(a, b); }
CUPYFLASH_HD double user_mul(double a, double b) { return __dmul_rn(a, b); }
CUPYFLASH_HD float user_div(float a, float b) { return __fdiv_rn(a, b); }
CUPYFLASH_HD double user_div(double a, double b) { return __ddiv_rn(a, b); }
CUPYFLASH_HD float user_sqrt(float a) { return __fsqrt_rn(a); }
CUPYFLASH_HD double user_sqrt(double a) { return __dsqrt_rn(a); }
// Truncation toward zero with saturation; NaN gives 0 (cvt.rzi.s32).
CUPYFLASH_HD int user_to_int(float a) { return __float2int_rz(a); }
CUPYFLASH_HD int user_to_int(double a) { return __double2int_rz(a); }
CUPYFLASH_HD float user_nan(float) { return __int_as_float(0x7fc00000); }
CUPYFLASH_HD double user_nan(double) { return __longlong_as_double(0x7ff8000000000000ll); }
CUPYFLASH_HD float user_inf(float) { return __int_as_float(0x7f800000); }
CUPYFLASH_HD double user_inf(double) { return __longlong_as_double(0x7ff0000000000000ll); }
#else
// The host build (x86-64 without -mfma: nothing to contract into) computes the IEEE operations too.
CUPYFLASH_HD float user_add(float a, float b) { return a + b; }
CUPYFLASH_HD double user_add(double a, double b) { return a + b; }
CUPYFLASH_HD float user_sub(float a, float b) { return a - b; }
CUPYFLASH_HD double user_sub(double a, double b) { return a - b; }
CUPYFLASH_HD float user_mul(float a, float b) { return a * b; }
CUPYFLASH_HD double user_mul(double a, double b) { return a * b; }
CUPYFLASH_HD float user_div(float a, float b) { return a / b; }
CUPYFLASH_HD double user_div(double a, double b) { return a / b; }
CUPYFLASH_HD float user_sqrt(float a) { return std::sqrt(a); }
CUPYFLASH_HD double user_sqrt(double a) { return std::sqrt(a); }
template <typename F>
CUPYFLASH_HD int user_to_int(F a) {
    if (a != a) return 0;
    if (a >= F(2147483647.0)) return 2147483647;
    if (a <= F(-2147483648.0)) return -2147483647 - 1;
    return static_cast<int>(a);
}
CUPYFLASH_HD float user_nan(float) { return NAN; }
CUPYFLASH_HD double user_nan(double) { return NAN; }
CUPYFLASH_HD float user_inf(float) { return INFINITY; }
CUPYFLASH_HD double user_inf(double) { return INFINITY; }
#endif

CUPYFLASH_HD float user_exp(float a) { return expf(a); }
CUPYFLASH_HD double user_exp(double a) { return exp(a); }
CUPYFLASH_HD float user_exp2(float a) { return exp2f(a); }
CUPYFLASH_HD double user_exp2(double a) { return exp2(a); }
CUPYFLASH_HD float user_log(float a) { return logf(a); }
CUPYFLASH_HD double user_log(double a) { return log(a); }
CUPYFLASH_HD float user_log2(float a) { return log2f(a); }
CUPYFLASH_HD double user_log2(double a) { return log2(a); }
CUPYFLASH_HD float user_tanh(float a) { return tanhf(a); }
CUPYFLASH_HD double user_tanh(double a) { return tanh(a); }
CUPYFLASH_HD float user_floor(float a) { return floorf(a); }
CUPYFLASH_HD double user_floor(double a) { return floor(a); }
CUPYFLASH_HD float user_ceil(float a) { return ceilf(a); }
CUPYFLASH_HD double user_ceil(double a) { return ceil(a); }
CUPYFLASH_HD float user_abs(float a) { return fabsf(a); }
CUPYFLASH_HD double user_abs(double a) { return fabs(a); }
CUPYFLASH_HD float user_pow(float a, float b) { return powf(a, b); }
CUPYFLASH_HD double user_pow(double a, double b) { return pow(a, b); }
template <typename F>
CUPYFLASH_HD F user_sigmoid(F a) { return user_div(F(1), user_add(F(1), user_exp(-a))); }

// The fast forms a score function takes in the 16-bit tensor-core kernels (cupyflash/_trace.py's
// cuda_source(..., fast=True)): the special-function unit's approximations (ex2, lg2: about 2^-22
// relative error; tanh: 2^-11, as the built-in softcap's), far below the bfloat16 and float16 roundings
// of those kernels' scores, and one instruction where the accurate forms take several; their + - * are
// plain operators (cupyflash/_trace.py writes them so the compiler may fuse FMAs) and their divisions
// __fdividef or, by a constant, products with its reciprocal. Values that decide something discrete (an
// int, a comparison, a bucket, an index) keep the accurate forms (cupyflash/_trace.py's _exact_nodes).
// double, and the host build, keep the accurate functions.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
CUPYFLASH_HD float user_fast_exp2(float a) { return exp2f(a); }  // ex2.approx.ftz under -ftz: exact at integers
CUPYFLASH_HD float user_fast_log2(float a) { return __log2f(a); }
CUPYFLASH_HD float user_fast_tanh(float a) {
    float y;
    asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(a));
    return y;
}
CUPYFLASH_HD float user_fast_exp(float a) { return __expf(a); }
CUPYFLASH_HD float user_fast_log(float a) { return __logf(a); }
CUPYFLASH_HD float user_fast_div(float a, float b) { return __fdividef(a, b); }
// 1 / (1 + e^-a): the reciprocal of a number >= 1 (or inf, whose reciprocal is 0) on the special-function
// unit, which keeps the limits 0 and 1.
CUPYFLASH_HD float user_fast_sigmoid(float a) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(1.0f + user_fast_exp(-a)));
    return y;
}
#else
CUPYFLASH_HD float user_fast_div(float a, float b) { return a / b; }
CUPYFLASH_HD float user_fast_sigmoid(float a) { return user_sigmoid(a); }
CUPYFLASH_HD float user_fast_exp2(float a) { return user_exp2(a); }
CUPYFLASH_HD float user_fast_log2(float a) { return user_log2(a); }
CUPYFLASH_HD float user_fast_tanh(float a) { return user_tanh(a); }
CUPYFLASH_HD float user_fast_exp(float a) { return user_exp(a); }
CUPYFLASH_HD float user_fast_log(float a) { return user_log(a); }
#endif
CUPYFLASH_HD double user_fast_exp2(double a) { return user_exp2(a); }
CUPYFLASH_HD double user_fast_log2(double a) { return user_log2(a); }
CUPYFLASH_HD double user_fast_tanh(double a) { return user_tanh(a); }
CUPYFLASH_HD double user_fast_exp(double a) { return user_exp(a); }
CUPYFLASH_HD double user_fast_log(double a) { return user_log(a); }
CUPYFLASH_HD double user_fast_div(double a, double b) { return a / b; }
CUPYFLASH_HD double user_fast_sigmoid(double a) { return user_sigmoid(a); }
template <typename F>
CUPYFLASH_HD F user_neg(F a) { return -a; }

// NumPy's minimum and maximum: NaN if either is NaN (fminf/fmaxf would drop it).
template <typename T>
CUPYFLASH_HD T user_minimum(T a, T b) { return (a != a || b != b) ? user_add(a, b) : (b < a ? b : a); }
template <typename T>
CUPYFLASH_HD T user_maximum(T a, T b) { return (a != a || b != b) ? user_add(a, b) : (b > a ? b : a); }
template <>
CUPYFLASH_HD int user_minimum(int a, int b) { return b < a ? b : a; }
template <>
CUPYFLASH_HD int user_maximum(int a, int b) { return b > a ? b : a; }

// float x float -> float mod and floordiv: floor(a / b) and a - b * floor(a / b), each step rounded.
template <typename F>
CUPYFLASH_HD F user_floordiv(F a, F b) { return user_floor(user_div(a, b)); }
template <typename F>
CUPYFLASH_HD F user_mod(F a, F b) { return user_sub(a, user_mul(b, user_floordiv(a, b))); }

}  // namespace cupyflash
