// 2^x on the FMA pipe: a polynomial for the fraction and the integer part added to the exponent bits
// (FlashAttention-4's way to move some of the softmax's exponentials off the special-function unit, which
// issues a quarter as many per clock). fragment/softmax.cuh computes a share of a tile's probabilities
// with it.
//
// kDegree 2: relative error below 2.1e-3 (e4m3 probabilities: a thirtieth of their half-ulp); kDegree 3:
// below 8.6e-5 (bfloat16's half-ulp is 2e-3). The coefficients minimize the largest relative error of
// 2^f on [0, 1) with p(0) = 1 (tests/test_training.py checks them, built as host C++). Arguments below
// -127 give 0 (as ex2 of -inf does), NaN gives NaN.
#pragma once

namespace cupyflash {

template <int kDegree>
__device__ __forceinline__ float poly_exp2(float x) {
    static_assert(kDegree == 2 || kDegree == 3, "degree 2 or 3");
    x = x >= -127.0f || x != x ? x : -127.0f;  // (fmaxf would turn NaN into -127)
    const float j = floorf(x);
    const float f = x - j;
    const float p = kDegree == 2 ? fmaf(fmaf(0.32993239f, f, 0.66596097f), f, 1.0f)
                                 : fmaf(fmaf(fmaf(0.07706703f, f, 0.22764499f), f, 0.69511682f), f, 1.0f);
    return __int_as_float(__float_as_int(p) + static_cast<int>(static_cast<unsigned>(static_cast<int>(j)) << 23));
}

}  // namespace cupyflash
