// General-path backward: after bwd_delta (common/bwd_rows.cu: delta_i = sum_c dO_ic * O_ic, in the
// accumulator precision), two kernels:
//   general_bwd_dq     one CTA per (query tile, batch entry, head) and dQ column chunk, over key tiles;
//   general_bwd_dkdv   one CTA per (key tile, batch entry, kv head) and dK/dV column chunk, over the
//                      query heads that share the kv head and their query tiles.
// Both main kernels recompute P = exp(s - lse) from the saved lse (nothing of size
// seqlen_q x seqlen_k is stored), then dP = dO V^T and dS = P * (dP - delta), times the softcap's
// 1 - tanh^2. With kDropout, Z = keep / (1 - p) (common/dropout.cuh, the forward's draws): dV takes P * Z
// and dS = P * (dP * Z - delta). Each gradient element is written by exactly one CTA with a fixed summation order, so
// the general backward is deterministic, and GQA/MQA sums dK/dV over the group inside the CTA
// instead of materializing per-head copies.
//
// ScoreFn and MaskFn as in general/fwd.cu. With a score_mod, grad is its derivative, and dQ's CTAs of
// the first column chunk add the gradients of its floating-point buffers (ds_mod = P * (dP - delta)
// times the function's derivative by each element it read) with atomics, which makes those gradients,
// and only those, depend on the order of the adds.
#include "common/dtypes.cuh"
#include "common/mask.cuh"
#include "common/params.cuh"
#include "common/scheduler.cuh"
#include "common/score_mod.cuh"
#include "common/sequence.cuh"
#include "common/softmax.cuh"
#include "common/user_calls.cuh"
#include "general/tile.cuh"

namespace cupyflash {

// Grid: x = query tiles * batch * heads, y = ceil(headdim / kChunk).
template <typename T, bool kDropout, typename ScoreFn = NoUserScore, typename MaskFn = NoUserMask>
__global__ void __launch_bounds__(GeneralTraits<T>::kThreads, GeneralTraits<T>::min_ctas_per_sm(kDropout))
general_bwd_dq(const CUPYFLASH_GRID_CONSTANT BwdArgs args) {
    using Tr = GeneralTraits<T>;
    using Acc = acc_t<T>;
    using Lse = lse_t<T>;
    __shared__ GeneralSmem<T> sm;
    const AttnArgs& a = args.attn;
    require_sparse_tiles(a, Tr::kBlockM, Tr::kBlockN);

    const TileWork work = schedule_tile(ceil_div(a.seqlen_q, Tr::kBlockM), a.heads, false);
    const Sequence seq(a, work.b);
    const int m0 = work.tile * Tr::kBlockM;
    if (m0 >= seq.seqlen_q) return;
    const int b = work.b, h = work.h, hk = kv_head(h, a.heads, a.heads_k);
    const int c0 = blockIdx.y * Tr::kChunk;

    const RowView<T> Q{head_rows<const T>(a.q, b, seq.q_start, h), a.q.row_stride, seq.seqlen_q, a.headdim};
    const RowView<T> dO{head_rows<const T>(args.dout, b, seq.q_start, h), args.dout.row_stride, seq.seqlen_q, a.headdim_v};
    const RowView<T> K{head_rows<const T>(a.k, b, seq.k_start, hk), a.k.row_stride, seq.seqlen_k, a.headdim};
    const RowView<T> V{head_rows<const T>(a.v, b, seq.k_start, hk), a.v.row_stride, seq.seqlen_k, a.headdim_v};
    const Mask mask(a, seq);
    const BlockLayout layout(a, b, h);
    const typename ScoresOf<ScoreFn, NaturalScores<Acc>>::type scores(a, seq, b, h);
    const int mask_b = user_mask_batch(a, b), mask_h = user_mask_head(a, h);
    AtomicBufferGrads buffer_grads{&args.score_grads};

    const int row = threadIdx.x / Tr::kLanesPerRow;
    const int lane = threadIdx.x % Tr::kLanesPerRow;
    const int i = m0 + row;
    // Padding rows (i >= seqlen_q) behave like rows without keys: lse = -inf, so P = 0.
    const long long stat = rows_index(args.lse, b, h, seq.q_start) + i;
    const Lse lse_i = i < seq.seqlen_q ? static_cast<const Lse*>(args.lse.ptr)[stat] : Consts<Lse>::neg_inf();
    const Acc delta_i = i < seq.seqlen_q ? static_cast<const Acc*>(args.delta.ptr)[rows_index(args.delta, b, h, seq.q_start) + i] : Acc(0);

    Acc acc[Tr::kOutPerThread];
#pragma unroll
    for (int j = 0; j < Tr::kOutPerThread; ++j) acc[j] = 0;

    const TileRange tiles = key_tiles<Tr::kBlockM, Tr::kBlockN>(a, mask, layout, work.tile);
    for (int it = 0; it < tiles.count; ++it) {
        const int entry = tiles.entry(it);
        const int n0 = entry_tile(entry) * Tr::kBlockN;
        const bool partial = entry_partial(entry);
        const bool full = !partial && mask.tile_is_full(m0, Tr::kBlockM, n0, Tr::kBlockN);
        Acc p[Tr::kScoresPerThread];
        Acc dp[Tr::kScoresPerThread];
        score_tile<true>(p, Q, m0, K, n0, a.headdim, sm);
        score_tile<false>(dp, dO, m0, V, n0, a.headdim_v, sm);
#pragma unroll
        for (int j = 0; j < Tr::kScoresPerThread; ++j) {
            const int col = n0 + lane + Tr::kLanesPerRow * j;
            bool visible = pair_visible(a, mask, layout, i, col, full, partial);
            const Acc x = p[j];
            Acc grad;
            Acc s = scores.modified(x, i, col, &grad);
            if constexpr (MaskFn::kEnabled) {
                if (partial && visible) visible = user_mask_visible<MaskFn>(a, mask_b, mask_h, i, col, &s);
            }
            p[j] = recompute_prob(s, lse_i, visible);
            if constexpr (kDropout) {
                const bool kept = dropout_keep(a.dropout, static_cast<unsigned>(b * a.heads + h), i, col);
                dp[j] *= kept ? static_cast<Acc>(a.dropout.scale) : Acc(0);
            }
            const Acc ds_mod = p[j] * (dp[j] - delta_i);  // the gradient of the modified score
            if constexpr (ScoreFn::kEnabled) {
                if (blockIdx.y == 0) {
                    ScoreFn::scatter(scale_score(x, scores.scale), b, h, i, col, a.score_buffers, ds_mod,
                                     buffer_grads);
                }
            }
            dp[j] = ds_mod * grad;  // dS
        }
        store_weights(dp, sm);
        accumulate_chunk(acc, K, n0, c0, sm);
    }

    if (i >= seq.seqlen_q) return;
    T* dq_row = head_rows<T>(args.dq, b, seq.q_start, h) + static_cast<long long>(i) * args.dq.row_stride;
#pragma unroll
    for (int j = 0; j < Tr::kOutPerThread; ++j) {
        const int c = c0 + lane + Tr::kLanesPerRow * j;
        if (c < a.headdim) dq_row[c] = from_acc<T>(acc[j] * scores.scale);
    }
}

// Grid: x = key tiles * batch * heads_k, y = ceil(max(headdim, headdim_v) / kChunk). The score tile is
// transposed here: rows are keys, columns are queries.
template <typename T, bool kDropout, typename ScoreFn = NoUserScore, typename MaskFn = NoUserMask>
__global__ void __launch_bounds__(GeneralTraits<T>::kThreads, GeneralTraits<T>::min_ctas_per_sm(kDropout))
general_bwd_dkdv(const CUPYFLASH_GRID_CONSTANT BwdArgs args) {
    using Tr = GeneralTraits<T>;
    using Acc = acc_t<T>;
    using Lse = lse_t<T>;
    __shared__ GeneralSmem<T> sm;
    const AttnArgs& a = args.attn;
    require_sparse_tiles(a, Tr::kBlockN, Tr::kBlockM);  // tiles: kBlockN queries by kBlockM keys

    const TileWork work = schedule_tile(ceil_div(a.seqlen_k, Tr::kBlockM), a.heads_k, false);
    const Sequence seq(a, work.b);
    const int n0 = work.tile * Tr::kBlockM;
    if (n0 >= seq.seqlen_k) return;
    const int b = work.b, hk = work.h;
    const int group = a.heads / a.heads_k;
    const int c0 = blockIdx.y * Tr::kChunk;
    const bool do_dk = c0 < a.headdim;    // uniform over the CTA
    const bool do_dv = c0 < a.headdim_v;  // uniform over the CTA

    const RowView<T> K{head_rows<const T>(a.k, b, seq.k_start, hk), a.k.row_stride, seq.seqlen_k, a.headdim};
    const RowView<T> V{head_rows<const T>(a.v, b, seq.k_start, hk), a.v.row_stride, seq.seqlen_k, a.headdim_v};
    const Mask mask(a, seq);

    const int row = threadIdx.x / Tr::kLanesPerRow;
    const int lane = threadIdx.x % Tr::kLanesPerRow;
    const int n = n0 + row;

    Acc dk_acc[Tr::kOutPerThread];
    Acc dv_acc[Tr::kOutPerThread];
#pragma unroll
    for (int j = 0; j < Tr::kOutPerThread; ++j) dk_acc[j] = dv_acc[j] = 0;

    for (int g = 0; g < group; ++g) {
        const int h = hk * group + g;
        const RowView<T> Q{head_rows<const T>(a.q, b, seq.q_start, h), a.q.row_stride, seq.seqlen_q, a.headdim};
        const RowView<T> dO{head_rows<const T>(args.dout, b, seq.q_start, h), args.dout.row_stride, seq.seqlen_q, a.headdim_v};
        const Lse* lse_h = static_cast<const Lse*>(args.lse.ptr) + rows_index(args.lse, b, h, seq.q_start);
        const Acc* delta_h = static_cast<const Acc*>(args.delta.ptr) + rows_index(args.delta, b, h, seq.q_start);
        const BlockLayout layout(a, b, h);
        const typename ScoresOf<ScoreFn, NaturalScores<Acc>>::type scores(a, seq, b, h);
        const int mask_b = user_mask_batch(a, b), mask_h = user_mask_head(a, h);
        const TileRange tiles = query_tiles<Tr::kBlockN, Tr::kBlockM>(a, mask, layout, work.tile);
        for (int it = 0; it < tiles.count; ++it) {
            const int entry = tiles.entry(it);
            const int m0 = entry_tile(entry) * Tr::kBlockN;
            const bool partial = entry_partial(entry);
            const bool full = !partial && mask.tile_is_full(m0, Tr::kBlockN, n0, Tr::kBlockM);
            Acc p[Tr::kScoresPerThread];
            Acc ds[Tr::kScoresPerThread];
            score_tile<true>(p, K, n0, Q, m0, a.headdim, sm);
            score_tile<false>(ds, V, n0, dO, m0, a.headdim_v, sm);
#pragma unroll
            for (int j = 0; j < Tr::kScoresPerThread; ++j) {
                const int i = m0 + lane + Tr::kLanesPerRow * j;
                const bool in_range = i < seq.seqlen_q;
                const Lse lse_i = in_range ? lse_h[i] : Consts<Lse>::neg_inf();
                const Acc delta_i = in_range ? delta_h[i] : Acc(0);
                bool visible = pair_visible(a, mask, layout, i, n, full, partial);
                Acc grad;
                Acc s = scores.modified(p[j], i, n, &grad);
                if constexpr (MaskFn::kEnabled) {
                    if (partial && visible) visible = user_mask_visible<MaskFn>(a, mask_b, mask_h, i, n, &s);
                }
                p[j] = recompute_prob(s, lse_i, visible);
                if constexpr (kDropout) {
                    const bool kept = dropout_keep(a.dropout, static_cast<unsigned>(b * a.heads + h), i, n);
                    const Acc z = kept ? static_cast<Acc>(a.dropout.scale) : Acc(0);
                    ds[j] = p[j] * (ds[j] * z - delta_i) * grad;
                    p[j] *= z;  // dV's weights: the probabilities as the forward kept them
                } else {
                    ds[j] = p[j] * (ds[j] - delta_i) * grad;
                }
            }
            if (do_dv) {
                store_weights(p, sm);
                accumulate_chunk(dv_acc, dO, m0, c0, sm);
            }
            if (do_dk) {
                store_weights(ds, sm);
                accumulate_chunk(dk_acc, Q, m0, c0, sm);
            }
        }
    }

    if (n >= seq.seqlen_k) return;
    const Acc scale = static_cast<Acc>(a.softmax_scale);
    T* dk_row = head_rows<T>(args.dk, b, seq.k_start, hk) + static_cast<long long>(n) * args.dk.row_stride;
    T* dv_row = head_rows<T>(args.dv, b, seq.k_start, hk) + static_cast<long long>(n) * args.dv.row_stride;
#pragma unroll
    for (int j = 0; j < Tr::kOutPerThread; ++j) {
        const int c = c0 + lane + Tr::kLanesPerRow * j;
        if (do_dk && c < a.headdim) dk_row[c] = from_acc<T>(dk_acc[j] * scale);
        if (do_dv && c < a.headdim_v) dv_row[c] = from_acc<T>(dv_acc[j]);
    }
}

}  // namespace cupyflash
