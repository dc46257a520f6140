// Storage types and their accumulators. The only header that includes the fp16/bf16 headers.
//
// float16, bfloat16 and float32 accumulate in float32 (float32 in true float32: TF32 only where a call
// asks for precision="tf32");
// float64 accumulates in float64. acc_t<T> is that accumulator type; to_acc/from_acc convert
// (from_acc rounds to nearest even); lse_t<T> is the type of the saved log-sum-exp; pack2 rounds two
// floats into one register of 16-bit values (the operand format of the tensor-core products).
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace cupyflash {

template <typename T> struct AccOf { using type = float; };
template <> struct AccOf<double> { using type = double; };
template <typename T> using acc_t = typename AccOf<T>::type;

// The two-element vector of a float or double (8- and 16-byte loads and stores of pairs).
template <typename T> struct VecOf;
template <> struct VecOf<float> { using type2 = float2; };
template <> struct VecOf<double> { using type2 = double2; };

// The log-sum-exp is stored in float64 for float32 (and float64) inputs: the backward pass recomputes
// every probability as exp(s - lse), so a float32 lse would put half an ulp of |lse| (up to 4.8e-7 at
// |lse| ~ 10) into each of them, about 3x the error of a plain float32 softmax. float16/bfloat16
// results are dominated by their own rounding and keep a float32 lse.
template <typename T> struct LseOf { using type = float; };
template <> struct LseOf<float> { using type = double; };
template <> struct LseOf<double> { using type = double; };
template <typename T> using lse_t = typename LseOf<T>::type;

__device__ __forceinline__ float to_acc(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_acc(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_acc(float x) { return x; }
__device__ __forceinline__ double to_acc(double x) { return x; }

template <typename T> __device__ __forceinline__ T from_acc(acc_t<T> x);
template <> __device__ __forceinline__ __half from_acc<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}
template <> __device__ __forceinline__ float from_acc<float>(float x) { return x; }
template <> __device__ __forceinline__ double from_acc<double>(double x) { return x; }

// Two floats rounded to nearest even into one register of two 16-bit values (lo in the low half).
template <typename T> __device__ __forceinline__ unsigned pack2(float lo, float hi);
template <> __device__ __forceinline__ unsigned pack2<__half>(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<unsigned*>(&h);
}
template <> __device__ __forceinline__ unsigned pack2<__nv_bfloat16>(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<unsigned*>(&h);
}

// SelectType<B, X, Y>::type: X where B, else Y (NVRTC builds without the standard library).
template <bool B, typename X, typename Y> struct SelectType { using type = X; };
template <typename X, typename Y> struct SelectType<false, X, Y> { using type = Y; };

// FP8 inputs (ml_dtypes.float8_e4m3fn): a tag for the kernels' storage type (1 byte; the tensor cores
// and cvt read the bits).
struct E4m3 {
    unsigned char bits;
};

// Four floats rounded to nearest even into the e4m3 bytes of one register, x0 in the low byte; finite
// values beyond 448 saturate (cvt's .satfinite; the format has no infinity), NaN stays NaN.
__device__ __forceinline__ unsigned pack4_e4m3(float x0, float x1, float x2, float x3) {
    unsigned short lo, hi;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(lo) : "f"(x1), "f"(x0));  // the first source: the high byte
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(hi) : "f"(x3), "f"(x2));
    return static_cast<unsigned>(lo) | static_cast<unsigned>(hi) << 16;
}

// The two values of a pack2 register, lo in .x.
template <typename T> __device__ __forceinline__ float2 unpack2(unsigned x);
template <> __device__ __forceinline__ float2 unpack2<__half>(unsigned x) {
    return __half22float2(*reinterpret_cast<const __half2*>(&x));
}
template <> __device__ __forceinline__ float2 unpack2<__nv_bfloat16>(unsigned x) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&x));
}

}  // namespace cupyflash
