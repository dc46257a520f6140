// Online softmax over mma.sync accumulator fragments: for 16-bit and FP8 inputs in base 2 with the
// softmax scale folded in (below); for float32 and float64 in natural-log units (kNatural).
//
// A thread holds, for every 8-key n-tile, two rows of the warp's 16 (rows g and g + 8) and two columns of
// each; the four lanes of a quad share a row. Scores are carried as s2 = s * softmax_scale * LOG2E so
// each probability is one ex2 on the special-function unit. Per row the thread keeps the running
// maximum m2 (log2 units, identical across the quad; it may lag the true maximum by up to kMaxSlack)
// and its own partial running sum l over its columns; the quad's partial sums are added once at the end.
// The row's log-sum-exp in natural-log units is
//     lse = ln(sum_j exp(softmax_scale * q . k_j)) = LN2 * (m2 + log2(l)).
// (The general path and the float32/float64 kernels, kNatural, work in natural-log units for their
// accuracy; for float16/bfloat16 the storage rounding dominates and the folded scale is the cheaper choice.)
#pragma once
#include "common/math.cuh"
#include "common/exp64.cuh"
#include "common/poly_exp2.cuh"
#include "common/reduce.cuh"

namespace cupyflash {

// kNatural (the float32 and float64 kernels): scores in natural-log units as the general kernels round
// them (NaturalScores), probabilities by exp (float64: common/exp64.cuh's exp_table) and the lse m +
// ln(l): float32 (float64) accuracy, which the folded scale (three roundings of one constant: a
// systematic 1e-7 of every score) and ex2.approx (2^-22) do not give (bench/NOTES.md, session 18). m2 then holds the natural-log maximum. Acc: the
// accumulators' type (double for float64 inputs, which needs kNatural). kTop (return_max_score): also
// each row's exact largest score, which m2 may lag (row_max_score). kOffset (log2 units; the FP8 kernel's
// 8): probabilities are taken as 2^(s - m2 + kOffset), so the largest of a row is 2^kOffset rather than
// 1 and e4m3, whose smallest value is 2^-9, keeps those down to 2^-(9 + kOffset) of it (FlashAttention-3's
// offset); the maximum then moves only when a block passes it by more than kMaxSlack = 0.75, so no
// probability passes 2^8.75 = 430.5, below e4m3's largest finite value, 448.
// kPolyShare (log2 units only): of every 4 n-tiles, this many take their probabilities from poly_exp2
// (common/poly_exp2.cuh, on the FMA pipe; degree 2 beside e4m3's rounding, else 3) instead of ex2, so the
// special-function unit issues fewer (the FP8 kernel, whose products run twice as fast as 16-bit ones).
template <int kNTiles, bool kNatural = false, typename Acc = float, bool kTop = false, int kOffset = 0,
          int kPolyShare = 0>
struct FragmentSoftmax {
    static_assert(kPolyShare == 0 || !kNatural, "the polynomial is for log2 units");
    static_assert(kNatural || sizeof(Acc) == 4, "float64 scores are in natural-log units");
    static_assert(kOffset == 0 || !kNatural, "the offset is for log2 units");
    static constexpr bool kNaturalUnits = kNatural;
    static constexpr bool kTracksTop = kTop;
    // Log2 units by which a block's maximum may pass the running one before it moves (update_max);
    // kSlack is the same bound in the kernel's units.
    static constexpr Acc kMaxSlack = kOffset != 0 ? 0.75f : 8.0f;
    static_assert(kOffset == 0 || kOffset == 8, "the slack of an offset keeps 2^(kOffset + slack) below e4m3's 448");
    static constexpr Acc kSlack = kNatural ? kMaxSlack * (sizeof(Acc) == 8 ? kLn2 : kLn2F) : kMaxSlack;
    Acc m2[2] = {Consts<Acc>::neg_inf(), Consts<Acc>::neg_inf()};
    Acc l[2] = {0, 0};
    Acc base[2];  // the maxima the probabilities of the current block are taken against
    // kTop: the largest score of each row so far, in the units update_max received (raw products for
    // the raw overload, whose scale rounds once at the end, as the reference's does), -inf for none.
    Acc top[2] = {Consts<Acc>::neg_inf(), Consts<Acc>::neg_inf()};

    // Folds a block of scaled scores s (log2 units, -inf where masked) into the running statistics and
    // turns s into probabilities in place. The output accumulator o is rescaled only when some row of the
    // warp has a new maximum (a warp-uniform branch). Maxima and sums are trees over the thread's
    // columns and the two rows are processed together: with 8 warps per SM the fixed-latency chains
    // of a sequential reduction were the kernel's main stall (ncu, headdim 128).
    template <int kOTiles>
    __device__ __forceinline__ void step(Acc (&s)[kNTiles][4], Acc (&o)[kOTiles][4]) {
        Acc rescale[2];
        const bool moved = update_max(s, rescale);
        if (__any_sync(0xffffffffu, moved)) rescale_rows(o, rescale);
        exponentiate(s);
    }

    // The first half of step: the new row maxima, l scaled to them, and the factor rescale[r] that takes
    // the output accumulated so far to the new maximum. Returns whether a maximum moved. The sm90
    // kernel splits step here because its accumulator is still being written by an asynchronous
    // product while the next block's scores are folded.
    __device__ __forceinline__ bool update_max(const Acc (&s)[kNTiles][4], Acc (&rescale)[2]) {
        return update_max_impl<false>(s, rescale, Acc(1));
    }

    // The same for raw products s = q . k with the scale (softmax_scale * LOG2E, > 0, so raw and scaled
    // scores order alike) applied here: the maxima stay in log2 units, m2 = scale * max(s).
    __device__ __forceinline__ bool update_max(const float (&s)[kNTiles][4], float (&rescale)[2], float scale) {
        return update_max_impl<true>(s, rescale, scale);
    }

    template <int kOTiles>
    __device__ __forceinline__ static void rescale_rows(Acc (&o)[kOTiles][4], const Acc (&rescale)[2]) {
#pragma unroll
        for (int c = 0; c < kOTiles; ++c) {
            o[c][0] *= rescale[0];
            o[c][1] *= rescale[0];
            o[c][2] *= rescale[1];
            o[c][3] *= rescale[1];
        }
    }

    // The second half of step: probabilities ex2(s - base) and their sum into l.
    __device__ __forceinline__ void exponentiate(Acc (&s)[kNTiles][4]) { exponentiate_impl<false>(s, Acc(1)); }

    // The same for raw products: ex2(scale * s - base), one FFMA and one ex2 per probability.
    __device__ __forceinline__ void exponentiate(float (&s)[kNTiles][4], float scale) {
        exponentiate_impl<true>(s, scale);
    }

    // Adds the quad's partial sums; returns 1 / l per row (0 for a row that saw no key, whose output
    // must be 0 rather than 0/0) and writes the natural-log lse (-inf for such a row). A NaN score makes
    // l NaN, and NaN != 0: the row's output and lse come out NaN, as the reference's do.
    //
    // sink (natural-log units; -inf: none) is the row's attention sink: one more term exp(sink) of the
    // sum, whose value is 0. With the sum's own maximum M = max(m, sink), l' = l exp(m - M) + exp(sink - M)
    // and the output's factor is exp(m - M) / l': nothing overflows, a row that saw no key gets out 0
    // and lse = sink, and a NaN sink makes the row NaN (cupyflash/_merge.py's add_sinks, fused).
    __device__ __forceinline__ void finish(float (&inv_l)[2], float (&lse)[2], float sink) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const float total = group_sum<4>(l[r]);
            l[r] = total;  // the row's whole sum from here on (row_max_score reads it)
            const bool seen = total != 0.0f;
            const float m = m2[r] - kOffset;  // the base of the row's sum
            if (sink == Consts<float>::neg_inf()) {
                inv_l[r] = seen ? 1.0f / total : 0.0f;
                if constexpr (kNatural) {
                    lse[r] = seen ? m + logf(total) : Consts<float>::neg_inf();
                } else {
                    lse[r] = seen ? kLn2F * (m + __log2f(total)) : Consts<float>::neg_inf();
                }
            } else if (!seen) {  // the sink alone: exactly its own lse (no round trip through log2 units)
                inv_l[r] = 0.0f;
                lse[r] = sink;
            } else {
                const float sink_units = kNatural ? sink : sink * kLog2eF;
                const float top = fmaxf(m, sink_units);
                const float own = exp_units(m - top);
                const float sum = total * own + exp_units(sink_units - top);
                inv_l[r] = own / sum;
                if constexpr (kNatural) {
                    lse[r] = top + logf(sum);
                } else {
                    lse[r] = kLn2F * (top + __log2f(sum));
                }
            }
        }
    }

    // finish with the lse in float64 (float32 and float64 inputs, whose lse is saved in float64:
    // common/dtypes.cuh's lse_t), LN2 * m2 + ln(l) in float64: for float32, m2 is a float32 score, and l's
    // own float32 sum is the only rounding the lse keeps. The sink as above, in float64.
    __device__ __forceinline__ void finish(Acc (&inv_l)[2], double (&lse)[2], float sink) {
        static_assert(kOffset == 0, "the float64 lse takes m2 as the base of the row's sum");
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const Acc total = group_sum<4>(l[r]);
            l[r] = total;
            const bool seen = total != Acc(0);
            const double m = kNatural ? static_cast<double>(m2[r]) : kLn2 * static_cast<double>(m2[r]);
            if (sink == Consts<float>::neg_inf()) {
                inv_l[r] = seen ? Acc(1) / total : Acc(0);
                lse[r] = seen ? m + log(static_cast<double>(total)) : Consts<double>::neg_inf();
            } else {
                const double top = fmax(m, static_cast<double>(sink));
                const double own = seen ? exp(m - top) : 0.0;
                const double sum = static_cast<double>(total) * own + exp(static_cast<double>(sink) - top);
                inv_l[r] = static_cast<Acc>(own / sum);
                lse[r] = top + log(sum);
            }
        }
    }

    // kTop, after finish: row r's largest score in natural-log units (`unit` takes top's units there:
    // softmax_scale for raw products, LN2 for log2 units, 1 for natural-log ones), -inf for a row that
    // saw no key. NaN where the row's sum is NaN: a NaN score, which the maxima's fmax skips (exp of one
    // is NaN, and so is every sum after it); but not where the largest score is +inf, whose row's sum is
    // NaN too (inf - inf) while no score is.
    __device__ __forceinline__ float row_max_score(int r, float unit) const {
        static_assert(kTop, "the softmax tracks the largest scores only with kTop");
        const float value = static_cast<float>(top[r]) * unit;
        return l[r] != l[r] && value != Consts<float>::inf() ? Consts<float>::nan() : value;
    }

  private:
    __device__ __forceinline__ static Acc exp_units(Acc x) {
        if constexpr (kNatural && sizeof(Acc) == 8) {
            return exp_table(x);  // (its arguments: x <= kSlack, or -inf)
        } else if constexpr (kNatural) {
            return exp_acc(x);
        } else {
            return fast_exp2(x);
        }
    }

    template <bool kRaw>
    __device__ __forceinline__ bool update_max_impl(const Acc (&s)[kNTiles][4], Acc (&rescale)[2], Acc scale) {
        Acc part[2][kNTiles];
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
            part[0][nt] = fmax(s[nt][0], s[nt][1]);
            part[1][nt] = fmax(s[nt][2], s[nt][3]);
        }
        tree<true>(part);
        bool moved = false;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const Acc row_max = group_max<4>(part[r][0]);
            if constexpr (kTop) top[r] = fmax(top[r], row_max);
            const Acc block_max = kRaw ? row_max * scale : row_max;
            // The maximum moves only when the block's passes it by more than kMaxSlack (a row's first
            // visible block always: -inf + kMaxSlack is -inf). Otherwise the block's probabilities are
            // taken against the old maximum, each at most 2^kMaxSlack, which float32 sums and 16-bit P
            // hold exactly as well (e4m3's P, offset by 2^8, up to 2^8.75); l and m2 stay consistent, so
            // out and lse are the same. Most blocks after a row's first then rescale nothing
            // (FlashAttention-4's conditional rescaling).
            const Acc new_max = block_max > m2[r] + kSlack ? block_max : m2[r];
            // A row that has seen no visible key keeps new_max = -inf: subtract 0 instead, so that
            // ex2(-inf - -inf) is not NaN and every probability of the row is ex2(-inf) = 0.
            const Acc shift = new_max == Consts<Acc>::neg_inf() ? Acc(0) : new_max;
            base[r] = shift - Acc(kOffset);
            rescale[r] = exp_units(m2[r] - shift);  // 1 if the max stayed, 0 on the first visible block
            moved |= new_max != m2[r];
            m2[r] = new_max;
            l[r] *= rescale[r];
        }
        return moved;
    }

    template <bool kRaw>
    __device__ __forceinline__ void exponentiate_impl(Acc (&s)[kNTiles][4], Acc scale) {
        Acc part[2][kNTiles];
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const Acc x = kRaw ? fmaf(s[nt][e], scale, -base[e / 2]) : s[nt][e] - base[e / 2];
                if constexpr (kPolyShare > 0) {
                    s[nt][e] = nt % 4 < kPolyShare ? poly_exp2<kOffset != 0 ? 2 : 3>(x) : exp_units(x);
                } else {
                    s[nt][e] = exp_units(x);
                }
            }
            part[0][nt] = s[nt][0] + s[nt][1];
            part[1][nt] = s[nt][2] + s[nt][3];
        }
        tree<false>(part);
        l[0] += part[0][0];
        l[1] += part[1][0];
    }

    // part[r][0] = max (kMax) or sum of part[r][0 .. kNTiles), as a tree; kNTiles need not be a power
    // of two (the sm90 kernel's 176-key tiles have 22 n-tiles): an odd width folds its last element in.
    template <bool kMax, int kWidth = kNTiles>
    __device__ __forceinline__ static void tree(Acc (&part)[2][kNTiles]) {
        if constexpr (kWidth > 1) {
            constexpr int kHalf = kWidth / 2;
#pragma unroll
            for (int i = 0; i < kHalf; ++i) {
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const Acc other = part[r][kWidth - kHalf + i];
                    part[r][i] = kMax ? fmax(part[r][i], other) : part[r][i] + other;
                }
            }
            tree<kMax, (kWidth + 1) / 2>(part);
        }
    }
};

}  // namespace cupyflash
