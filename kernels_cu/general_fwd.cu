// General-path forward: one CTA per (query block, batch, head) and output column chunk, looping over the
// key/value blocks with an online softmax. The score matrix lives only in registers and shared memory.
//
// Grid: x = query blocks * batch * heads (query blocks fastest), y = ceil(headdim_v / kChunk).
// Every chunk recomputes the scores of its query block (cheap next to never refusing a head dim);
// chunk 0 writes the log-sum-exp.
#include "block_info.cuh"
#include "dtypes.cuh"
#include "general_tile.cuh"
#include "mask.cuh"
#include "reduce.cuh"
#include "softmax.cuh"

namespace cupyflash {

template <typename T, bool kCausal>
__global__ void __launch_bounds__(GeneralTraits<T>::kThreads, GeneralTraits<T>::kMinCtasPerSm)
general_fwd(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ out,
            lse_t<T>* __restrict__ lse,
            long long q_sb, long long q_ss, long long q_sh, long long k_sb, long long k_ss, long long k_sh,
            long long v_sb, long long v_ss, long long v_sh, long long o_sb, long long o_ss, long long o_sh,
            int seqlen_q, int seqlen_k, int heads, int heads_k, int headdim, int headdim_v,
            acc_t<T> softmax_scale) {
    using Tr = GeneralTraits<T>;
    using Acc = acc_t<T>;
    __shared__ GeneralSmem<T> sm;

    const BlockInfo blk(seqlen_q, Tr::kBlockM, heads, false);
    const int m0 = blk.row0;
    const long long bh = blk.bh, h = blk.h, b = blk.b;
    const long long hk = blk.kv_head(heads, heads_k);
    const int c0 = blockIdx.y * Tr::kChunk;

    const RowView<T> Q{q + b * q_sb + h * q_sh, q_ss, seqlen_q, headdim};
    const RowView<T> K{k + b * k_sb + hk * k_sh, k_ss, seqlen_k, headdim};
    const RowView<T> V{v + b * v_sb + hk * v_sh, v_ss, seqlen_k, headdim_v};
    const Mask<kCausal> mask(seqlen_q, seqlen_k);

    const int row = threadIdx.x / Tr::kLanesPerRow;
    const int lane = threadIdx.x % Tr::kLanesPerRow;
    const int i = m0 + row;

    OnlineSoftmaxRow<Acc> stats;
    Acc o[Tr::kOutPerThread];
#pragma unroll
    for (int j = 0; j < Tr::kOutPerThread; ++j) o[j] = 0;

    const int n_end = mask.key_end(m0, Tr::kBlockM);
    for (int n0 = 0; n0 < n_end; n0 += Tr::kBlockN) {
        Acc s[Tr::kScoresPerThread];
        score_tile(s, Q, m0, K, n0, headdim, sm);
        Acc block_max = Consts<Acc>::neg_inf();
#pragma unroll
        for (int j = 0; j < Tr::kScoresPerThread; ++j) {
            s[j] = mask.visible(i, n0 + lane + Tr::kLanesPerRow * j) ? scale_score(s[j], softmax_scale) : Consts<Acc>::neg_inf();
            block_max = fmax(block_max, s[j]);
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
#pragma unroll
        for (int j = 0; j < Tr::kOutPerThread; ++j) o[j] *= rescale;
        store_weights(s, sm);
        accumulate_chunk(o, V, n0, c0, sm);
    }

    if (i >= seqlen_q) return;
    // A row that saw no key has sum 0: its output is 0 (not 0/0) and its lse is -inf.
    const bool seen = stats.sum > Acc(0);
    T* out_row = out + b * o_sb + static_cast<long long>(i) * o_ss + h * o_sh;
#pragma unroll
    for (int j = 0; j < Tr::kOutPerThread; ++j) {
        const int c = c0 + lane + Tr::kLanesPerRow * j;
        if (c < headdim_v) out_row[c] = from_acc<T>(seen ? o[j] / stats.sum : Acc(0));
    }
    if (blockIdx.y == 0 && lane == 0) lse[bh * seqlen_q + i] = stats.template lse<lse_t<T>>();
}

}  // namespace cupyflash
