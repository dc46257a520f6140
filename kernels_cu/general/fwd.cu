// General-path forward: one CTA per (query tile, batch entry, head) and output column chunk, looping over
// the key tiles its rows see with an online softmax. The score matrix lives only in registers and
// shared memory.
//
// Grid: x = query tiles * batch * heads (query tiles fastest), y = ceil(headdim_v / kChunk).
// Every chunk recomputes the scores of its query tile (cheap next to never refusing a head dim);
// chunk 0 writes the log-sum-exp.
//
// kDropout: each exponential joins the row's sum, then is zeroed where common/dropout.cuh drops its
// entry (one generator call per entry: this path's columns are strided over the lanes), and the output
// takes the 1 / (1 - p) of the kept ones at the end. lse stays the softmax's before dropout.
//
// ScoreFn and MaskFn: a score_mod's and a mask_mod's generated code (common/user_calls.cuh), or
// NoUserScore and NoUserMask. The score_mod replaces the softcap and ALiBi (the host refuses both
// together); the mask_mod runs on the tiles the block-sparse lists mark partial.
#include "common/dtypes.cuh"
#include "common/mask.cuh"
#include "common/max_score.cuh"
#include "common/params.cuh"
#include "common/reduce.cuh"
#include "common/scheduler.cuh"
#include "common/score_mod.cuh"
#include "common/sequence.cuh"
#include "common/softmax.cuh"
#include "common/user_calls.cuh"
#include "general/tile.cuh"

namespace cupyflash {

template <typename T, bool kDropout, typename ScoreFn = NoUserScore, typename MaskFn = NoUserMask>
__global__ void __launch_bounds__(GeneralTraits<T>::kThreads, GeneralTraits<T>::min_ctas_per_sm(kDropout))
general_fwd(const CUPYFLASH_GRID_CONSTANT FwdArgs args) {
    using Tr = GeneralTraits<T>;
    using Acc = acc_t<T>;
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
    const RowView<T> K{head_rows<const T>(a.k, b, seq.k_start, hk), a.k.row_stride, seq.seqlen_k, a.headdim};
    const RowView<T> V{head_rows<const T>(a.v, b, seq.k_start, hk), a.v.row_stride, seq.seqlen_k, a.headdim_v};
    const Mask mask(a, seq);
    const BlockLayout layout(a, b, h);
    const typename ScoresOf<ScoreFn, NaturalScores<Acc>>::type scores(a, seq, b, h);
    const int mask_b = user_mask_batch(a, b), mask_h = user_mask_head(a, h);

    const int row = threadIdx.x / Tr::kLanesPerRow;
    const int lane = threadIdx.x % Tr::kLanesPerRow;
    const int i = m0 + row;

    // Main loop.
    OnlineSoftmaxRow<Acc> stats;
    bool saw_nan = false;  // a NaN score among this lane's (the maximum score's, which fmax would skip)
    Acc o[Tr::kOutPerThread];
#pragma unroll
    for (int j = 0; j < Tr::kOutPerThread; ++j) o[j] = 0;

    const TileRange tiles = key_tiles<Tr::kBlockM, Tr::kBlockN>(a, mask, layout, work.tile);
    for (int it = 0; it < tiles.count; ++it) {
        const int entry = tiles.entry(it);
        const int n0 = entry_tile(entry) * Tr::kBlockN;
        const bool partial = entry_partial(entry);
        const bool full = !partial && mask.tile_is_full(m0, Tr::kBlockM, n0, Tr::kBlockN);
        Acc s[Tr::kScoresPerThread];
        score_tile<true>(s, Q, m0, K, n0, a.headdim, sm);
        Acc block_max = Consts<Acc>::neg_inf();
#pragma unroll
        for (int j = 0; j < Tr::kScoresPerThread; ++j) {
            const int col = n0 + lane + Tr::kLanesPerRow * j;
            Acc unused_grad;
            s[j] = scores.modified(s[j], i, col, &unused_grad);
            bool visible = pair_visible(a, mask, layout, i, col, full, partial);
            if constexpr (MaskFn::kEnabled) {
                if (partial && visible) visible = user_mask_visible<MaskFn>(a, mask_b, mask_h, i, col, &s[j]);
            }
            if (!visible) s[j] = Consts<Acc>::neg_inf();
            block_max = fmax(block_max, s[j]);
            saw_nan |= s[j] != s[j];
        }
        Acc rescale;
        const Acc base = stats.advance(group_max<Tr::kLanesPerRow>(block_max), &rescale);
        Acc block_sum = 0;
#pragma unroll
        for (int j = 0; j < Tr::kScoresPerThread; ++j) {
            s[j] = exp_acc(s[j] - base);
            block_sum += s[j];
        }
        stats.sum = stats.sum * rescale + group_sum<Tr::kLanesPerRow>(block_sum);
        if constexpr (kDropout) {
            const unsigned bh = static_cast<unsigned>(b * a.heads + h);
#pragma unroll
            for (int j = 0; j < Tr::kScoresPerThread; ++j) {
                if (!dropout_keep(a.dropout, bh, i, n0 + lane + Tr::kLanesPerRow * j)) s[j] = Acc(0);
            }
        }
#pragma unroll
        for (int j = 0; j < Tr::kOutPerThread; ++j) o[j] *= rescale;
        store_weights(s, sm);
        accumulate_chunk(o, V, n0, c0, sm);
    }

    // Epilogue. A row that saw no key has sum 0: its output is 0 (not 0/0) and its lse is -inf. An
    // attention sink joins the sum here (its row then always has a sum).
    if (i >= seq.seqlen_q) return;
    if (args.max_score != nullptr && blockIdx.y == 0) {
        // The row's largest score: the running maximum, or NaN where a lane of the row saw one.
        const bool row_nan = group_sum<Tr::kLanesPerRow>(static_cast<int>(saw_nan)) != 0;
        const float top = row_nan ? __int_as_float(0x7FC00000) : static_cast<float>(stats.max);
        if (lane == 0) record_max_score(args.max_score + static_cast<long long>(b) * a.heads + h, top);
    }
    Acc own = Acc(1);  // the factor of the accumulated outputs (exactly 1 without a sink)
    const float sink = attention_sink(a, h);
    if (sink != Consts<float>::neg_inf()) own = stats.add_sink(static_cast<Acc>(sink));
    const bool seen = stats.seen();
    T* out_row = head_rows<T>(args.out, b, seq.q_start, h) + static_cast<long long>(i) * args.out.row_stride;
#pragma unroll
    for (int j = 0; j < Tr::kOutPerThread; ++j) {
        const int c = c0 + lane + Tr::kLanesPerRow * j;
        Acc value = seen ? o[j] * own / stats.sum : Acc(0);
        if constexpr (kDropout) value *= static_cast<Acc>(a.dropout.scale);
        if (c < a.headdim_v) out_row[c] = from_acc<T>(value);
    }
    if (blockIdx.y == 0 && lane == 0) {
        static_cast<lse_t<T>*>(args.lse.ptr)[rows_index(args.lse, b, h, seq.q_start) + i] = stats.template lse<lse_t<T>>();
    }
}

}  // namespace cupyflash
