// Scalar numerics every kernel shares: the constants of the base-2 softmax, -inf, the fast exponential,
// the correctly rounded operations of the general path, and integer helpers.
#pragma once

namespace cupyflash {

// log2(e) and ln(2) in float (ln 2 also in double, for the float64 lse of float32 inputs): the
// tensor-core paths carry scores in log2 units, s2 = LOG2E * s, so each
// probability is one ex2; lse = LN2 * (m2 + log2 l) takes them back to natural-log units.
constexpr float kLog2eF = 1.4426950408889634f;
constexpr float kLn2F = 0.6931471805599453f;
constexpr double kLn2 = 0.6931471805599453094;

template <typename Acc> struct Consts;
template <> struct Consts<float> {
    static __device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }
    static __device__ __forceinline__ float inf() { return __int_as_float(0x7f800000); }
    static __device__ __forceinline__ float nan() { return __int_as_float(0x7fc00000); }
};
template <> struct Consts<double> {
    static __device__ __forceinline__ double neg_inf() { return __longlong_as_double(0xfff0000000000000ll); }
    static __device__ __forceinline__ double nan() { return __longlong_as_double(0x7ff8000000000000ll); }
};

// 2^x on the special-function unit (ftz; -inf gives 0).
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// s = softmax_scale * dot, rounded here and nowhere else: the _rn intrinsics keep the compiler from
// contracting the product into a later subtraction (an FMA), which would give the forward and the
// backward pass differently rounded scores.
__device__ __forceinline__ float scale_score(float dot, float scale) { return __fmul_rn(dot, scale); }
__device__ __forceinline__ double scale_score(double dot, double scale) { return __dmul_rn(dot, scale); }

__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float sub_rn(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ double sub_rn(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ float div_rn(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ double div_rn(double a, double b) { return __ddiv_rn(a, b); }
__device__ __forceinline__ float tanh_acc(float x) { return tanhf(x); }
__device__ __forceinline__ double tanh_acc(double x) { return tanh(x); }

__device__ __forceinline__ float exp_acc(float x) { return expf(x); }
__device__ __forceinline__ double exp_acc(double x) { return exp(x); }
__device__ __forceinline__ float log_acc(float x) { return logf(x); }
__device__ __forceinline__ double log_acc(double x) { return log(x); }

__device__ __forceinline__ int clamp_int(int x, int lo, int hi) { return min(max(x, lo), hi); }
__device__ __forceinline__ int ceil_div(int a, int b) { return (a + b - 1) / b; }

}  // namespace cupyflash
