// The one place where the scores of an accumulator fragment are modified and masked: every forward and
// decode kernel of the tensor-core families (sm80, sm90, kvcache) calls modify_rows and mask_tile_rows
// on its products, every backward probabilities_cols and mask_tile_cols, so a new score modification or
// mask is added here (and in common/score_mod.cuh or common/mask.cuh, which define them per pair) and
// nowhere else. The exception: the MLA decode kernels (kvcache/mla.cu, mla_sm90.cu) mask causally
// inline and take no other mask or modification (cupyflash/_kvcache/device.py's mla_variant refuses them).
//
// A fragment [kMTiles][kNTiles][4] is the mma.sync C layout (sm80/mma.cuh), which wgmma accumulators
// share per warp: element [mt][nt][e] of a thread lies in row g + 16 mt + 8 (e / 2) and column
// col_t + 8 nt + e % 2 of the warp's tile (g = lane / 4, col_t = 2 (lane % 4)). In a row fragment
// (S = Q K^T: forward, decode) rows are queries and columns keys; in a column fragment (S^T = K Q^T:
// the backward) rows are keys and columns queries. Callers say which query (or key) each of a thread's
// rows is with a function of (mt, r), r = e / 2: a row of one (batch entry, head), or in the decode
// kernel one of the (query, head) pairs of a GQA group, each with its own ALiBi bias.
#pragma once
#include "common/mask.cuh"
#include "common/math.cuh"
#include "common/params.cuh"
#include "common/score_mod.cuh"
#include "common/softmax.cuh"
#include "common/user_calls.cuh"

namespace cupyflash {

// How many of a thread's kBits fragment columns 8 (t / 2) + t % 2 (bit t; increasing in t) lie before
// column x: an interval's ends as bit positions.
template <int kBits>
__device__ __forceinline__ int columns_before(int x) {
    return min(max(2 * (x >> 3) + min(x & 7, 2), 0), kBits);
}

// Row r of each n-tile of a row fragment (bit 2 nt + c: element [nt][2 r + c]) where a tile lies inside
// one block of a mask_mod's layout (its layout bits all ones): the row's interval [begin, end) of columns
// from the thread's first as a range of its bits, with the function's bits one word of what the row
// sees, so each element costs a bit test and a select (R2P and FSEL: about 1.2 instructions), where the
// compares, the layout's bit and the function's took about 19 (4 x 300 a tile at d128, beside a softmax
// of about 400). Hidden elements take `hidden` (scores -inf, the backward's probabilities 0); the
// function's out-of-range reads (poisoned) NaN. The backward's column fragments (mask_cols) are the same
// with keys for rows and queries for columns.
template <int kNTiles, typename Acc>
__device__ __forceinline__ void mask_row_words(Acc (&f)[kNTiles][4], int r, int begin, int end,
                                               unsigned long long user, unsigned long long poisoned, Acc hidden) {
    constexpr int kBits = 2 * kNTiles;
    const unsigned long long range = ((1ull << columns_before<kBits>(end)) - 1) & ~((1ull << columns_before<kBits>(begin)) - 1);
    const unsigned long long seen = range & user;
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
        for (int c = 0; c < 2; ++c) f[nt][2 * r + c] = ((seen >> (2 * nt + c)) & 1) != 0 ? f[nt][2 * r + c] : hidden;
    }
    poisoned &= seen;
    if (poisoned != 0) {
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                if (((poisoned >> (2 * nt + c)) & 1) != 0) f[nt][2 * r + c] = Consts<Acc>::nan();
            }
        }
    }
}

// s = -inf where the mask hides the pair (query row_of(mt, r), key n0 + col_t + 8 nt + e % 2) of row
// fragment element [mt][nt][e]; with kLayout also where the block layout does, read as one word of bits
// per row and 64 keys (where a tile can span blocks: BlockLayout::tiles_in_blocks), and where a mask_mod
// (user, a UserMaskAt) does: where the tile lies inside one block, as one word of bits per row
// (mask_row_words). Otherwise, with kRowIntervals, per row the
// interval of keys it sees and per element a compare for each side in kCuts (Mask::key_cuts: the sides
// of the intervals that fall inside the tile; the others cannot hide a pair of it) and a select.
// Otherwise Mask::visible per element, which needs fewer registers.
template <bool kLayout, bool kRowIntervals, int kCuts, int kMTiles, int kNTiles, typename RowOf, typename Acc,
          typename User>
__device__ __forceinline__ void mask_rows(Acc (&s)[kMTiles][kNTiles][4], const Mask& mask, const BlockLayout& layout,
                                          const AttnArgs& a, const RowOf& row_of, int n0, int col_t, const User& user) {
    // Keys whose layout cells one word of bits holds: the whole tile up to 64 keys, else 64 per word.
    constexpr int kWordKeys = kNTiles * 8 <= 64 ? kNTiles * 8 : 64;
    // Whether the tile lies inside one block, whose layout bits are then all ones: beside a mask_mod
    // once here (two divisions), else in the loop (a register held across it spilled the d192 forward).
    const bool whole = kLayout && User::kEnabled && BlockLayout::tiles_in_blocks(a);
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
        // The mask_mod's bits of the two rows' columns (bit 2 nt + c), then a select per element.
        unsigned long long user_rows[2] = {~0ull, ~0ull}, poisoned_rows[2] = {0, 0};
        if constexpr (kLayout && User::kEnabled) {
            user.template bits<false, kNTiles>({row_of(mt, 0), row_of(mt, 1)}, n0 + col_t, user_rows, poisoned_rows);
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = row_of(mt, r);
            if constexpr (kLayout && kRowIntervals && User::kEnabled) {
                if (whole) {
                    int begin, end;
                    mask.keys_of(row, n0 + col_t, &begin, &end);
                    mask_row_words(s[mt], r, begin, end, user_rows[r], poisoned_rows[r], Consts<Acc>::neg_inf());
                    continue;
                }
            }
            // Both sides: the interval from n0, compared with each element's column col_t + 8 nt + e % 2
            // (a form the registers of the larger tiles hold without spilling). One side: from the
            // thread's first column, so each compare takes its column as an immediate.
            constexpr bool kFromThread = kCuts != Mask::kCutsBoth;
            int begin, end;
            if constexpr (kRowIntervals) mask.keys_of(row, kFromThread ? n0 + col_t : n0, &begin, &end);
            const unsigned long long user_bits = user_rows[r], poisoned = poisoned_rows[r];
#pragma unroll
            for (int chunk = 0; chunk < (kNTiles + 7) / 8; ++chunk) {
                // (Past the layout, rows and keys are past seqlen_q and seqlen_k: the mask's intervals
                // hide the keys, and the forward never stores the rows.)
                const bool inside = User::kEnabled ? whole : BlockLayout::tiles_in_blocks(a);
                const unsigned long long bits = !kLayout ? 0
                                                : inside ? ~0ull
                                                         : layout.key_bits(a, row, n0 + 64 * chunk, kWordKeys);
#pragma unroll
                for (int nt = 8 * chunk; nt < kNTiles && nt < 8 * chunk + 8; ++nt) {
#pragma unroll
                    for (int c = 0; c < 2; ++c) {
                        const int column = 8 * nt + c;  // past the thread's first column col_t
                        const int offset = col_t + column;
                        bool visible;
                        if constexpr (!kRowIntervals) {
                            visible = mask.visible(row, n0 + offset);
                        } else if constexpr (!kFromThread) {
                            visible = offset >= begin && offset < end;
                        } else {
                            visible = (kCuts == Mask::kCutsEnd || column >= begin) &&
                                      (kCuts == Mask::kCutsStart || column < end);
                        }
                        if constexpr (kLayout) visible &= ((bits >> (offset - 64 * chunk)) & 1) != 0;
                        Acc& x = s[mt][nt][2 * r + c];
                        if constexpr (kLayout && User::kEnabled) {
                            // A pair the function reads out of range for stays visible, its score NaN.
                            const int bit = 2 * nt + c;
                            visible &= ((user_bits >> bit) & 1) != 0;
                            if (visible && ((poisoned >> bit) & 1) != 0) x = Consts<Acc>::nan();
                        }
                        x = visible ? x : Consts<Acc>::neg_inf();
                    }
                }
            }
        }
    }
}

// The scores of a row fragment from the raw products x = q . k in natural-log units, for the float32
// and float64 kernels (FragmentSoftmax<kNTiles, true, Acc>): NaturalScores::modified (or a score_mod's
// UserNaturalScores; without
// kScoreMod, its first step alone, softmax_scale * x), the score rounded step by step as the general
// kernels round it, so the general backward recomputes the probabilities this forward's lse normalizes.
template <bool kScoreMod, int kMTiles, int kNTiles, typename RowOf, typename Acc, typename Scores>
__device__ __forceinline__ void modify_rows_natural(Acc (&s)[kMTiles][kNTiles][4], const Scores& scores,
                                                    const RowOf& row_of, int n0, int col_t) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                if constexpr (kScoreMod) {
                    Acc unused_grad;
                    s[mt][nt][e] = scores.modified(s[mt][nt][e], row_of(mt, e / 2), n0 + 8 * nt + col_t + e % 2, &unused_grad);
                } else {
                    s[mt][nt][e] = scale_score(s[mt][nt][e], scores.scale);
                }
            }
        }
    }
}

// The scores of a row fragment from the raw products x = q . k, in log2 units: with kScoreMod the score
// modifications (Log2Scores::modified, or UserLog2Scores' score_mod; bias_of(mt, r) is the row's ALiBi
// bias, -slope * LOG2E), else
// x * softmax_scale * LOG2E, or x itself with kRawScale (the softmax then applies the scale, which needs
// softmax_scale > 0: raw and scaled scores order alike).
template <bool kScoreMod, bool kRawScale, int kMTiles, int kNTiles, typename RowOf, typename BiasOf, typename Scores>
__device__ __forceinline__ void modify_rows(float (&s)[kMTiles][kNTiles][4], const Scores& scores,
                                            const RowOf& row_of, const BiasOf& bias_of, int n0, int col_t) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                if constexpr (kScoreMod) {
                    float unused_tanh;
                    s[mt][nt][e] = scores.modified(s[mt][nt][e], row_of(mt, e / 2), n0 + 8 * nt + col_t + e % 2,
                                                   bias_of(mt, e / 2), &unused_tanh);
                } else if constexpr (!kRawScale) {
                    s[mt][nt][e] *= scores.scale_log2;
                }
            }
        }
    }
}

// The mask of a row fragment's tile (mask_rows), for a tile that needs the element mask: one that is not
// full, or that a block-sparse list marks partial (where a mask_mod, user, runs too). Callers test that
// in a uniform branch of its own, which keeps the tiles inside the mask free of its predicates. cuts:
// Mask::key_cuts of the rows the caller's branch is uniform over (Mask::kCutsBoth where it does not know
// them); with row intervals, the tiles cut on one side only (the causal diagonal, a window's left edge)
// test that side alone.
template <bool kRowIntervals, int kMTiles, int kNTiles, typename RowOf, typename Acc, typename User = UserMaskAt<NoUserMask>>
__device__ __forceinline__ void mask_tile_rows(Acc (&s)[kMTiles][kNTiles][4], const Mask& mask,
                                               const BlockLayout& layout, const AttnArgs& a, const RowOf& row_of,
                                               int n0, int col_t, bool partial, int cuts, const User& user = User()) {
    const Mask m = mask;
    if (partial) {
        mask_rows<true, kRowIntervals, Mask::kCutsBoth>(s, m, layout, a, row_of, n0, col_t, user);
    } else if (kRowIntervals && cuts == Mask::kCutsEnd) {
        mask_rows<false, kRowIntervals, Mask::kCutsEnd>(s, m, layout, a, row_of, n0, col_t, user);
    } else if (kRowIntervals && cuts == Mask::kCutsStart) {
        mask_rows<false, kRowIntervals, Mask::kCutsStart>(s, m, layout, a, row_of, n0, col_t, user);
    } else {
        mask_rows<false, kRowIntervals, Mask::kCutsBoth>(s, m, layout, a, row_of, n0, col_t, user);
    }
}

// p = 0 where the mask hides the pair of query m0 + col_t + 8 nt + e % 2 and key key_g + 16 mt + 8 (e / 2)
// of column fragment element [mt][nt][e]; with kLayout also where the block layout does, read as one
// word of bits per key and 64 queries, and where a mask_mod (user, a UserMaskAt) does. Per key, the
// interval of queries that see it; per element, two compares and a select; where the tile lies inside one
// block beside a mask_mod, per key one word of bits and per element a bit test and a select
// (mask_row_words).
template <bool kLayout, int kMTiles, int kNTiles, typename Acc, typename User>
__device__ __forceinline__ void mask_cols(Acc (&p)[kMTiles][kNTiles][4], const Mask& mask, const BlockLayout& layout,
                                          const AttnArgs& a, int key_g, int m0, int col_t, const User& user) {
    // Where the tile lies inside one block (its layout bits all ones) beside a mask_mod, each key's
    // queries as one word of bits (mask_row_words, as the forward's rows); not where the caller's
    // registers are spoken for (User::kWords off: a score function beside the mask, whose additive-bias
    // backward went 12 -> 18 consumer local accesses), nor in the 128-query tiles of head dim 64 (51 ->
    // 70).
    constexpr bool kWords = kLayout && User::kWords && kNTiles <= 8;
    const bool whole = kWords && BlockLayout::tiles_in_blocks(a);
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
        // The mask_mod's bits of the two keys' queries (bit 2 nt + c), then a select per element.
        unsigned long long user_rows[2] = {~0ull, ~0ull}, poisoned_rows[2] = {0, 0};
        if constexpr (kLayout && User::kEnabled) {
            user.template bits<true, kNTiles>({key_g + 16 * mt, key_g + 16 * mt + 8}, m0 + col_t, user_rows, poisoned_rows);
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int key = key_g + 16 * mt + 8 * r;
            int begin, end;
            if constexpr (kWords) {
                if (whole) {
                    mask.queries_of(key, m0 + col_t, &begin, &end);
                    mask_row_words(p[mt], r, begin, end, user_rows[r], poisoned_rows[r], Acc(0));
                    continue;
                }
            }
            mask.queries_of(key, m0, &begin, &end);
            const unsigned long long user_bits = user_rows[r], poisoned = poisoned_rows[r];
#pragma unroll
            for (int chunk = 0; chunk < (kNTiles + 7) / 8; ++chunk) {
                // (Only beside a mask_mod: in the kernels without one the branch costs the registers of
                // the larger tiles, and their partial tiles are those of blocks smaller than tiles.)
                const unsigned long long bits = !kLayout ? 0
                                                : User::kEnabled && (kWords ? whole : BlockLayout::tiles_in_blocks(a))
                                                    ? ~0ull
                                                    : layout.query_bits(a, key, m0 + 64 * chunk, 64);
#pragma unroll
                for (int nt = 8 * chunk; nt < kNTiles && nt < 8 * chunk + 8; ++nt) {
#pragma unroll
                    for (int c = 0; c < 2; ++c) {
                        const int offset = col_t + 8 * nt + c;
                        bool visible = offset >= begin && offset < end;
                        if constexpr (kLayout) visible &= ((bits >> (offset - 64 * chunk)) & 1) != 0;
                        Acc& x = p[mt][nt][2 * r + c];
                        if constexpr (kLayout && User::kEnabled) {
                            // A pair the function reads out of range for: its probability NaN.
                            const int bit = 2 * nt + c;
                            visible &= ((user_bits >> bit) & 1) != 0;
                            if (visible && ((poisoned >> bit) & 1) != 0) x = Consts<Acc>::nan();
                        }
                        x = visible ? x : Acc(0);
                    }
                }
            }
        }
    }
}

// The backward's probabilities P^T in place of the raw products S^T of a column fragment (keys
// key_g + 16 mt + 8 r, queries m0 + col_t + 8 nt + e % 2): P = 2^(s2 - lse2) with s2 the modified score in
// log2 units and lse2 = lse * LOG2E of the query (+inf for a query without probability mass, so its P is
// 0). lse2_pair(nt) and delta_pair(nt) give the values of queries col_t + 8 nt and col_t + 8 nt + 1.
// With kScoreMod, dP^T becomes (dP^T - delta) * ds_mod/ds (Scores::derivative: the softcap's
// 1 - tanh^2 from the tanh of the score, or a score_mod's derivative); without, dP^T is not touched (it may still be in flight: score_gradients finishes
// it). The mask follows, where the tile needs it (mask_tile_cols).
template <bool kScoreMod, int kMTiles, int kNTiles, typename Lse2Pair, typename DeltaPair, typename Scores>
__device__ __forceinline__ void probabilities_cols(float (&s)[kMTiles][kNTiles][4], float (&dp)[kMTiles][kNTiles][4],
                                                   const Scores& scores, const Lse2Pair& lse2_pair,
                                                   const DeltaPair& delta_pair, int key_g, int m0, int col_t) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
            const float2 l = lse2_pair(nt);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float lse_e = e % 2 ? l.y : l.x;
                if constexpr (kScoreMod) {
                    const float2 d = delta_pair(nt);
                    const int i = m0 + 8 * nt + col_t + e % 2, j = key_g + 16 * mt + 8 * (e / 2);
                    float tanh_v;
                    const float s2 = scores.modified(s[mt][nt][e], i, j, scores.bias_log2, &tanh_v);
                    const float grad = scores.derivative(s[mt][nt][e], i, j, tanh_v);
                    s[mt][nt][e] = fast_exp2(s2 - lse_e);
                    dp[mt][nt][e] = (dp[mt][nt][e] - (e % 2 ? d.y : d.x)) * grad;
                } else {
                    s[mt][nt][e] = fast_exp2(fmaf(s[mt][nt][e], scores.scale_log2, -lse_e));
                }
            }
        }
    }
}

// probabilities_cols for the float32 and float64 backward, in natural-log units: P = exp(s - lse) in
// place of the raw products, s the modified score as the forward rounds it (modify_rows_natural, and so
// bitwise the forward's where the raw products are) and lse the query's float64 log-sum-exp (-inf for a
// query without probability mass: P = 0), or its split_lse pair. With kScoreMod, dP^T becomes (dP^T - delta) * grad, the
// softcap's derivative; without, score_gradients applies delta. lse_pair(nt) and delta_pair(nt) give
// the values of queries col_t + 8 nt and col_t + 8 nt + 1, as (first, second). kSelect (split_lse pairs
// only): recompute_prob_select, the exponentials without a branch each, where the registers allow them
// to interleave.
template <bool kScoreMod, bool kSelect = false, int kMTiles, int kNTiles, typename Acc, typename LsePair,
          typename DeltaPair, typename Scores>
__device__ __forceinline__ void probabilities_cols_natural(Acc (&s)[kMTiles][kNTiles][4], Acc (&dp)[kMTiles][kNTiles][4],
                                                           const Scores& scores, const LsePair& lse_pair,
                                                           const DeltaPair& delta_pair, int key_g, int m0, int col_t) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
            const auto l = lse_pair(nt);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                Acc grad;
                const Acc sm = kScoreMod ? scores.modified(s[mt][nt][e], m0 + 8 * nt + col_t + e % 2,
                                                           key_g + 16 * mt + 8 * (e / 2), &grad)
                                         : scale_score(s[mt][nt][e], scores.scale);
                if constexpr (kSelect) {
                    s[mt][nt][e] = recompute_prob_select(sm, e % 2 ? l.y : l.x);
                } else {
                    s[mt][nt][e] = recompute_prob(sm, e % 2 ? l.y : l.x, true);
                }
                if constexpr (kScoreMod) {
                    const auto d = delta_pair(nt);
                    dp[mt][nt][e] = (dp[mt][nt][e] - (e % 2 ? d.y : d.x)) * grad;
                }
            }
        }
    }
}

// The mask of a column fragment's tile (mask_cols), for a tile that needs the element mask (see
// mask_tile_rows; user: a mask_mod).
template <int kMTiles, int kNTiles, typename Acc, typename User = UserMaskAt<NoUserMask>>
__device__ __forceinline__ void mask_tile_cols(Acc (&p)[kMTiles][kNTiles][4], const Mask& mask,
                                               const BlockLayout& layout, const AttnArgs& a, int key_g, int m0,
                                               int col_t, bool partial, const User& user = User()) {
    const Mask m = mask;
    if (partial) {
        mask_cols<true>(p, m, layout, a, key_g, m0, col_t, user);
    } else {
        mask_cols<false>(p, m, layout, a, key_g, m0, col_t, user);
    }
}

// With a score_mod whose buffers take gradients (UserLog2ScoresLate: probabilities_cols left its
// derivative out, so after the mask and score_gradients ds holds ds_mod = P^T (dP^T - delta)): each
// element's ds_mod goes to the buffers' gradients through sink, then ds becomes dS^T = ds_mod *
// d(score_mod)/d(score), for keys key_g + 16 mt + 8 (e / 2) and queries m0 + col_t + 8 nt + e % 2.
// On a FrozenScores tile every pair's terms go to the same elements times the same derivatives: the
// thread's ds_mod are summed and scattered once.
template <int kMTiles, int kNTiles, typename Scores, typename Sink>
__device__ __forceinline__ void buffer_gradients_cols(float (&ds)[kMTiles][kNTiles][4], const Scores& scores, Sink& sink,
                                                      int key_g, int m0, int col_t) {
    if constexpr (IsFrozen<Scores>::value) {
        const float d = scores.derivative_at(m0, key_g);
        float sum = 0.0f;
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
            for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    sum += ds[mt][nt][e];
                    ds[mt][nt][e] *= d;
                }
            }
        }
        scores.scatter(sum, m0, key_g, sink);
        return;
    }
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int i = m0 + 8 * nt + col_t + e % 2, j = key_g + 16 * mt + 8 * (e / 2);
                scores.scatter(ds[mt][nt][e], i, j, sink);
                ds[mt][nt][e] *= scores.derivative_at(i, j);
            }
        }
    }
}

// dS^T = P^T * (dP^T - delta) in place of dP^T, after the mask (with kScoreMod, probabilities_cols applied
// delta and the softcap's derivative already: only the product with P^T is left).
template <bool kScoreMod, int kMTiles, int kNTiles, typename Acc, typename DeltaPair>
__device__ __forceinline__ void score_gradients(Acc (&dp)[kMTiles][kNTiles][4], const Acc (&p)[kMTiles][kNTiles][4],
                                                const DeltaPair& delta_pair) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
            const auto d = delta_pair(nt);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                if constexpr (kScoreMod) {
                    dp[mt][nt][e] *= p[mt][nt][e];
                } else {
                    dp[mt][nt][e] = p[mt][nt][e] * (dp[mt][nt][e] - (e % 2 ? d.y : d.x));
                }
            }
        }
    }
}

}  // namespace cupyflash
