// Numerics of the online softmax of the general path, in natural-log units.
//
// The scaled score s = softmax_scale * (q . k) is rounded once. For each row the forward pass keeps a
// running maximum m of s and a running sum l = sum_j exp(s_j - m), and returns
//     lse = ln(sum_j exp(s_j)) = m + ln(l),
// exactly m when a single key carries the row (l = 1); lse is stored in lse_t (dtypes.cuh). The backward
// pass recomputes P_ij = exp(s_ij - lse_i) from the same rounded s, so P carries only the rounding of
// lse. (Working in log2 units with LOG2E folded into the scale saves a multiply per score but adds three
// roundings of the size of |s|: s * (scale * LOG2E), LN2 * (m + log2 l) and LOG2E * lse. At float64 with
// large logits those put the gradients outside the same-precision tolerance, so the accuracy-first
// general path does not do it; fragment/softmax.cuh is the tensor-core paths' version: base 2 for
// 16-bit and FP8 inputs, natural-log units for float32 and float64.)
#pragma once
#include "common/lse_pair.cuh"
#include "common/math.cuh"

namespace cupyflash {

// Running max and sum of one row of scaled scores.
template <typename Acc>
struct OnlineSoftmaxRow {
    Acc max = Consts<Acc>::neg_inf();  // running maximum of s, -inf before any visible key
    Acc sum = Acc(0);                  // running sum of exp(s - max)

    // Folds in the maximum of a new block of scores. Returns the base b for that block's exponentials
    // exp(s - b) and sets *rescale = exp(old_max - b), the factor for the earlier sum and output.
    __device__ __forceinline__ Acc advance(Acc block_max, Acc* rescale) {
        const Acc new_max = fmax(max, block_max);
        // A row that has seen no visible key yet has new_max = -inf: use 0 as the base so that
        // exp(-inf - -inf) is not NaN. Every exponential of such a row is exp(-inf) = 0.
        const Acc base = new_max == Consts<Acc>::neg_inf() ? Acc(0) : new_max;
        *rescale = exp_acc(max - base);  // exp(-inf) = 0 on the first visible block
        max = new_max;
        return base;
    }

    // A row that saw no key keeps sum == 0. A NaN score makes the sum NaN (fmax skips NaN, so the max
    // stays finite and exp(NaN - max) is NaN), and NaN != 0 counts as seen: the row comes out NaN.
    __device__ __forceinline__ bool seen() const { return sum != Acc(0); }

    // Natural-log log-sum-exp of the row, evaluated in the lse type L (see lse_t in dtypes.cuh);
    // -inf for a row that saw no key.
    template <typename L>
    __device__ __forceinline__ L lse() const {
        return seen() ? L(max) + log_acc(L(sum)) : Consts<L>::neg_inf();
    }

    // Joins the attention sink (natural-log units, finite or NaN) to the row: one more term exp(sink)
    // of the sum, whose value is 0, in the sum's own maximum top = max(max, sink) so nothing overflows.
    // Returns the factor exp(max - top) of the outputs accumulated so far (each then divided by the new
    // sum); sum becomes the row's sum at top, and max becomes top, so lse() is the row's with the sink.
    // A row that saw no key gets factor 0 (out 0) and lse = sink; a NaN sink makes the row NaN.
    __device__ __forceinline__ Acc add_sink(Acc sink) {
        const Acc top = fmax(max, sink);
        const Acc own = seen() ? exp_acc(max - top) : Acc(0);
        sum = sum * own + exp_acc(sink - top);
        max = top;
        return own;
    }
};

// Backward probability P = exp(s - lse) of a visible entry, else 0, with the difference taken in the
// lse type L (exact for a float s and a double lse). lse = -inf marks a row with no key (or a padding
// row); testing it first keeps such a row from computing exp(s + inf).
template <typename Acc, typename L>
__device__ __forceinline__ Acc recompute_prob(Acc s, L lse, bool visible) {
    return (visible && lse != Consts<L>::neg_inf()) ? exp_acc(static_cast<Acc>(L(s) - lse)) : Acc(0);
}

// P = exp(s - lse) of a visible entry from split_lse's pair (common/lse_pair.cuh), else 0. (Its test is a
// branch per entry; a select over all of a thread's exponentials let the compiler interleave them, and
// the head-dim-64 backward's consumers then spilled.)
__device__ __forceinline__ float recompute_prob(float s, float2 lse, bool visible) {
    return (visible && lse.x != Consts<float>::inf()) ? exp_acc(lse_pair_difference(s, lse)) : 0.0f;
}

// The same for a visible entry without the branch: the exponential is always taken (a row with no key
// gives NaN from hi = +inf) and the select after gives 0, so a thread's exponentials are independent
// chains the compiler can interleave. Bitwise recompute_prob's values. The float32 Hopper backward's
// warpgroup 0 ran its 32 a tile one behind the other, a branch each (~940 issue slots a warp, in
// dependent chains), while warpgroup 1 waited for its P' (bench/NOTES.md, session 44).
__device__ __forceinline__ float recompute_prob_select(float s, float2 lse) {
    const float p = exp_acc(lse_pair_difference(s, lse));
    return lse.x != Consts<float>::inf() ? p : 0.0f;
}

}  // namespace cupyflash
