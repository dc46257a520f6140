// Online softmax over mma.sync accumulator fragments, in base 2 with the softmax scale folded in.
//
// A thread holds, for every 8-key n-tile, two rows of the warp's 16 (rows g and g + 8) and two columns of
// each; the four lanes of a quad share a row. Scores are carried as s2 = s * softmax_scale * LOG2E so
// each probability is one ex2 on the special-function unit. Per row the thread keeps the running
// maximum m2 (log2 units, identical across the quad) and its own partial running sum l over its columns;
// the quad's partial sums are added once at the end. The row's log-sum-exp in natural-log units is
//     lse = ln(sum_j exp(softmax_scale * q . k_j)) = LN2 * (m2 + log2(l)).
// (The general path works in natural-log units for float32/float64 accuracy; for float16/bfloat16 the
// storage rounding dominates and the folded scale is the cheaper choice.)
#pragma once
#include "mma.cuh"
#include "reduce.cuh"
#include "softmax.cuh"

namespace cupyflash {

constexpr float kLog2eF = 1.4426950408889634f;
constexpr float kLn2F = 0.6931471805599453f;

template <int kNTiles>
struct FragmentSoftmax {
    float m2[2] = {Consts<float>::neg_inf(), Consts<float>::neg_inf()};
    float l[2] = {0.0f, 0.0f};

    // Folds a block of scaled scores s (log2 units, -inf where masked) into the running statistics and
    // turns s into probabilities in place. The output accumulator o is rescaled only when some row of the
    // warp has a new maximum (a warp-uniform branch). Maxima and sums are trees over the thread's
    // columns and the two rows are processed together: with 8 warps per SM the fixed-latency chains
    // of a sequential reduction were the kernel's main stall (ncu, headdim 128).
    template <int kOTiles>
    __device__ __forceinline__ void step(float (&s)[kNTiles][4], float (&o)[kOTiles][4]) {
        static_assert((kNTiles & (kNTiles - 1)) == 0, "n-tiles per block must be a power of two");
        float part[2][kNTiles];
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
            part[0][nt] = fmaxf(s[nt][0], s[nt][1]);
            part[1][nt] = fmaxf(s[nt][2], s[nt][3]);
        }
#pragma unroll
        for (int width = kNTiles / 2; width > 0; width /= 2) {
#pragma unroll
            for (int i = 0; i < width; ++i) {
                part[0][i] = fmaxf(part[0][i], part[0][i + width]);
                part[1][i] = fmaxf(part[1][i], part[1][i + width]);
            }
        }
        float base[2];
        float rescale[2];
        bool moved = false;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const float new_max = fmaxf(m2[r], group_max<4>(part[r][0]));
            // A row that has seen no visible key keeps new_max = -inf: subtract 0 instead, so that
            // ex2(-inf - -inf) is not NaN and every probability of the row is ex2(-inf) = 0.
            base[r] = new_max == Consts<float>::neg_inf() ? 0.0f : new_max;
            rescale[r] = fast_exp2(m2[r] - base[r]);  // 1 if the max stayed, 0 on the first visible block
            moved |= new_max != m2[r];
            m2[r] = new_max;
            l[r] *= rescale[r];
        }
        if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
            for (int c = 0; c < kOTiles; ++c) {
                o[c][0] *= rescale[0];
                o[c][1] *= rescale[0];
                o[c][2] *= rescale[1];
                o[c][3] *= rescale[1];
            }
        }
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) s[nt][e] = fast_exp2(s[nt][e] - base[e / 2]);
            part[0][nt] = s[nt][0] + s[nt][1];
            part[1][nt] = s[nt][2] + s[nt][3];
        }
#pragma unroll
        for (int width = kNTiles / 2; width > 0; width /= 2) {
#pragma unroll
            for (int i = 0; i < width; ++i) {
                part[0][i] += part[0][i + width];
                part[1][i] += part[1][i + width];
            }
        }
        l[0] += part[0][0];
        l[1] += part[1][0];
    }

    // Adds the quad's partial sums; returns 1 / l per row (0 for a row that saw no key, whose output
    // must be 0 rather than 0/0) and writes the natural-log lse (-inf for such a row). A NaN score makes
    // l NaN, and NaN != 0: the row's output and lse come out NaN, as the reference's do.
    __device__ __forceinline__ void finish(float (&inv_l)[2], float (&lse)[2]) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const float total = group_sum<4>(l[r]);
            const bool seen = total != 0.0f;
            inv_l[r] = seen ? 1.0f / total : 0.0f;
            lse[r] = seen ? kLn2F * (m2[r] + __log2f(total)) : Consts<float>::neg_inf();
        }
    }
};

}  // namespace cupyflash
