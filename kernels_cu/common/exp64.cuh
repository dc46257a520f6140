// e^x in float64 for the float64 softmax (fragment/softmax.cuh): a table of 2^(j/64) and a degree-5
// polynomial, about 10 FP64 operations a probability where CUDA's exp takes about 16 and as many
// constant moves again, beside the DMMA products they share the issue slots with.
//
// x = (64 n + j) ln2 / 64 + r with n, j integers (0 <= j < 64) and |r| <= ln2 / 128 (Cody and Waite's
// reduction, ln2 / 64 in two parts, each product unrounded inside its FMA), so e^x = 2^n 2^(j/64) e^r.
// e^r - 1 is its Taylor polynomial of degree 5 (the next term, r^6 / 720 < 3.5e-17, is a sixth of an ulp
// of 1), 2^(j/64) e^r = t + t (e^r - 1) rounds once, and 2^n goes into the exponent bits. Error at most
// 1.3 ulps, 0.34 on average (t's rounding, then the sum's; tests/test_training.py measures it as host
// C++ against long double), where CUDA's exp keeps within 1 ulp: a difference the float64 outputs' own
// rounding (sums over the keys) does not show. The range is the softmax's: x <= 700; x < -707 (and -inf)
// gives 0 (e^-707 = 9e-308, the edge of the normal range, and against a row's largest probability, at
// least 1, nothing); NaN gives NaN.
#pragma once
#include "common/host_device.cuh"
#if !defined(__CUDACC__)
#include <cmath>
#include <cstring>
#endif

namespace cupyflash {

// 2^(j / 64), j = 0 .. 63, rounded to nearest (from 60-digit decimals).
__device__ const double kExp2Sixty4ths[64] = {
    1.0, 1.0108892860517005, 1.0218971486541166, 1.0330248790212284,
    1.0442737824274138, 1.0556451783605572, 1.0671404006768237, 1.0787607977571199,
    1.0905077326652577, 1.102382583307841, 1.1143867425958924, 1.1265216186082418,
    1.1387886347566916, 1.1511892299529827, 1.1637248587775775, 1.1763969916502812,
    1.189207115002721, 1.202156731452703, 1.215247359980469, 1.22848053610687,
    1.241857812073484, 1.255380757024691, 1.2690509571917332, 1.2828700160787783,
    1.2968395546510096, 1.3109612115247644, 1.3252366431597413, 1.339667524053303,
    1.3542555469368927, 1.3690024229745905, 1.383909881963832, 1.3989796725383112,
    1.4142135623730951, 1.42961333839197, 1.4451808069770467, 1.460917794180647,
    1.4768261459394993, 1.4929077282912648, 1.5091644275934228, 1.5255981507445384,
    1.5422108254079407, 1.559004400237837, 1.5759808451078865, 1.593142151342267,
    1.6104903319492543, 1.6280274218573478, 1.645755478153965, 1.6636765803267364,
    1.681792830507429, 1.7001063537185235, 1.718619298122478, 1.7373338352737062,
    1.7562521603732995, 1.7753764925265212, 1.7947090750031072, 1.8142521755003989,
    1.8340080864093424, 1.8539791250833855, 1.8741676341103, 1.8945759815869656,
    1.9152065613971474, 1.9360617934922943, 1.9571441241754002, 1.978456026387951,
};

CUPYFLASH_HD double exp2_sixty4th(int j) {
#if defined(__CUDA_ARCH__)
    return __ldg(&kExp2Sixty4ths[j]);
#else
    return kExp2Sixty4ths[j];
#endif
}

// The low and high 32-bit words of a double, and the double of two words.
CUPYFLASH_HD int double_lo(double x) {
#if defined(__CUDA_ARCH__)
    return __double2loint(x);
#else
    long long bits;
    std::memcpy(&bits, &x, 8);
    return static_cast<int>(bits);
#endif
}

CUPYFLASH_HD int double_hi(double x) {
#if defined(__CUDA_ARCH__)
    return __double2hiint(x);
#else
    long long bits;
    std::memcpy(&bits, &x, 8);
    return static_cast<int>(bits >> 32);
#endif
}

CUPYFLASH_HD double words_double(int hi, int lo) {
#if defined(__CUDA_ARCH__)
    return __hiloint2double(hi, lo);
#else
    const long long bits = static_cast<long long>(static_cast<unsigned long long>(static_cast<unsigned>(hi)) << 32 |
                                                  static_cast<unsigned>(lo));
    double x;
    std::memcpy(&x, &bits, 8);
    return x;
#endif
}

CUPYFLASH_HD double exp_table(double x) {
    constexpr double kShift = 6755399441055744.0;        // 1.5 * 2^52: x + kShift holds rint(x) in its low word
    constexpr double k64OverLn2 = 92.33248261689366;
    constexpr double kLn2Over64Hi = 0.010830424696249145;  // ln2 / 64 rounded, and the rest
    constexpr double kLn2Over64Lo = 3.623510646634843e-19;
    const double shifted = fma(x, k64OverLn2, kShift);
    const double k = shifted - kShift;                   // 64 n + j
    const int kint = double_lo(shifted);
    const double r = fma(k, -kLn2Over64Lo, fma(k, -kLn2Over64Hi, x));
    const double poly = fma(fma(fma(fma(1.0 / 120.0, r, 1.0 / 24.0), r, 1.0 / 6.0), r, 0.5), r, 1.0);
    const double t = exp2_sixty4th(kint & 63);
    const double y = fma(t, r * poly, t);                // 2^(j/64) e^r, in [0.99, 2.02)
    const double scaled = words_double(double_hi(y) + (kint >> 6) * (1 << 20), double_lo(y));  // times 2^n
    return x >= -707.0 ? scaled : (x != x ? x : 0.0);
}

}  // namespace cupyflash
