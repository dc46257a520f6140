// Score modifications of FlashAttention-2, for every kernel: the softcap (Gemma 2) and ALiBi, in the
// base-2 units of the 16-bit and FP8 tensor-core paths (Log2Scores) and the natural-log units of the general path
// and of the float32/float64 tensor-core kernels (NaturalScores). The loops that apply them to a tile of
// scores live with each accumulator layout (fragment/scores.cuh; the general kernels' inline, in
// general/fwd.cu and bwd.cu).
#pragma once
#include "common/math.cuh"
#include "common/params.cuh"
#include "common/sequence.cuh"

namespace cupyflash {

// The ALiBi slope of (batch entry b, head h), 0 without ALiBi. A non-finite slope becomes NaN, so every
// score of its head is NaN and every row of that head that sees a key comes out NaN (an infinite slope
// would otherwise hide every key but the diagonal's without a sign): NumPy slopes are checked on the
// host, CuPy ones cannot be without a synchronization.
__device__ __forceinline__ float alibi_slope(const AttnArgs& a, long long b, long long h) {
    if (a.alibi_slopes == nullptr) return 0.0f;
    const float slope = a.alibi_slopes[b * a.alibi_batch_stride + h];
    return isfinite(slope) ? slope : __int_as_float(0x7fc00000);
}

// Score modifications of FlashAttention-2, in its order: the scaled score s = softmax_scale * q . k
// becomes softcap * tanh(s / softcap) (Gemma 2), then gets the ALiBi bias -slope * |i + seqlen_k -
// seqlen_q - j| added, then the mask. The backward needs ds_mod/ds = 1 - tanh^2 of the softcap.
struct ScoreModArgs {
    float slope;  // ALiBi slope of this (batch, head)
    int offset;   // seqlen_k - seqlen_q
    bool softcap;
    bool alibi;

    ScoreModArgs() = default;
    __device__ __forceinline__ ScoreModArgs(const AttnArgs& a, const Sequence& s, long long b, long long h)
        : slope(alibi_slope(a, b, h)),
          offset(s.seqlen_k - s.seqlen_q), softcap(a.softcap != 0.0), alibi(a.alibi_slopes != nullptr) {}

    // |i + seqlen_k - seqlen_q - j|, exact in float up to 2^24.
    __device__ __forceinline__ int distance(int i, int j) const { return abs(i + offset - j); }
};

// The tensor-core path works in base 2 with the scale folded in (fragment/softmax.cuh): from the raw product
// x = q . k it computes s2 = LOG2E * (modified score).
struct Log2Scores {
    float scale_log2;  // softmax_scale * LOG2E
    float cap_in;      // softmax_scale / softcap
    float cap_out;     // softcap * LOG2E
    float bias_log2;   // -slope * LOG2E
    ScoreModArgs mod;

    Log2Scores() = default;
    __device__ __forceinline__ Log2Scores(const AttnArgs& a, const Sequence& s, long long b, long long h)
        : mod(a, s, b, h) {
        scale_log2 = static_cast<float>(a.softmax_scale) * kLog2eF;
        cap_in = mod.softcap ? static_cast<float>(a.softmax_scale / a.softcap) : 0.0f;
        cap_out = static_cast<float>(a.softcap) * kLog2eF;
        bias_log2 = -mod.slope * kLog2eF;
    }

    // tanh.approx: one special-function operation (MUFU.TANH), relative error at most 2^-10.99. The
    // score softcap * tanh(y) is then off by at most 2^-11 of itself: a quarter of what a plain bfloat16
    // implementation loses rounding the score (2^-9), equal to float16's, which is what FlashAttention's
    // tolerance rule compares against. The exact form, 1 - 2 / (2^(2 LOG2E y) + 1), took an ex2 and a
    // reciprocal: with the softmax's ex2, three special-function operations per score, which made the
    // softcap kernels 2.8-3.4x slower than the plain ones on the H200 (bench/NOTES.md).
    __device__ __forceinline__ static float fast_tanh(float y) {
        float t;
        asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(y));
        return t;
    }

    // s2 of query i and key j, from the raw product x; bias is the ALiBi bias of the query's head,
    // -slope * LOG2E (bias_log2 for the head these scores were made for; the decode kernel's rows
    // belong to several heads). *tanh_out receives tanh(s / softcap) (0 without a softcap) for the
    // backward's 1 - tanh^2.
    __device__ __forceinline__ float modified(float x, int i, int j, float bias, float* tanh_out) const {
        float s2;
        float t = 0.0f;
        if (mod.softcap) {
            t = fast_tanh(x * cap_in);
            s2 = t * cap_out;
        } else {
            s2 = x * scale_log2;
        }
        if (mod.alibi) s2 += bias * static_cast<float>(mod.distance(i, j));
        *tanh_out = t;
        return s2;
    }

    // d(modified score) / d(scaled score) of the pair whose modified() gave tanh_v: 1 - tanh^2 (1 without
    // a softcap).
    __device__ __forceinline__ float derivative(float, int, int, float tanh_v) const { return 1.0f - tanh_v * tanh_v; }
};

// The general path, and the float32 tensor-core forward (fragment/scores.cuh's modify_rows_natural),
// work in natural-log units with the scaled score rounded once (common/softmax.cuh).
// Every step is rounded on its own (the _rn operations), so the forward and backward kernels, compiled
// separately, compute bitwise the same modified score.
template <typename Acc>
struct NaturalScores {
    Acc scale;
    Acc softcap;
    Acc slope;
    ScoreModArgs mod;

    NaturalScores() = default;
    __device__ __forceinline__ NaturalScores(const AttnArgs& a, const Sequence& s, long long b, long long h)
        : scale(static_cast<Acc>(a.softmax_scale)), softcap(static_cast<Acc>(a.softcap)), mod(a, s, b, h) {
        slope = static_cast<Acc>(mod.slope);
    }

    // The modified score of pair (i, j) from the raw product x; *grad receives its derivative with
    // respect to the scaled score (1 - tanh^2 under a softcap, else 1).
    __device__ __forceinline__ Acc modified(Acc x, int i, int j, Acc* grad) const {
        Acc s = scale_score(x, scale);
        Acc g = Acc(1);
        if (mod.softcap) {
            const Acc t = tanh_acc(div_rn(s, softcap));
            s = mul_rn(softcap, t);
            g = Acc(1) - t * t;
        }
        if (mod.alibi) s = sub_rn(s, mul_rn(slope, static_cast<Acc>(mod.distance(i, j))));
        *grad = g;
        return s;
    }
};

}  // namespace cupyflash
