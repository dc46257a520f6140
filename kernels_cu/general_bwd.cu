// General-path backward, three kernels:
//   general_bwd_delta  delta_i = sum_c dO_ic * O_ic (accumulator precision), one warp per row;
//   general_bwd_dq     one CTA per (query block, batch, head) and dQ column chunk, looping over key blocks;
//   general_bwd_dkdv   one CTA per (key block, batch, kv head) and dK/dV column chunk, looping over the
//                      query heads that share the kv head and over their query blocks.
// Both main kernels recompute P = exp(s - lse) from the saved lse (nothing of size
// seqlen_q x seqlen_k is stored), then dP = dO V^T and dS = P * (dP - delta). Each gradient element is
// written by exactly one CTA with a fixed summation order, so the general backward is deterministic,
// and GQA/MQA sums dK/dV over the group inside the CTA instead of materializing per-head copies.
#include "block_info.cuh"
#include "dtypes.cuh"
#include "general_tile.cuh"
#include "mask.cuh"
#include "softmax.cuh"

namespace cupyflash {

// Grid: ceil(rows / 4) CTAs of 128 threads; rows = batch * heads * seqlen_q, delta laid out
// (batch, heads, seqlen_q) like lse.
template <typename T>
__global__ void __launch_bounds__(128)
general_bwd_delta(const T* __restrict__ out, const T* __restrict__ dout, acc_t<T>* __restrict__ delta,
                  long long o_sb, long long o_ss, long long o_sh, long long do_sb, long long do_ss,
                  long long do_sh, int seqlen_q, int heads, int headdim_v, long long rows) {
    using Acc = acc_t<T>;
    constexpr int kWarpsPerCta = 4;
    const long long r = static_cast<long long>(blockIdx.x) * kWarpsPerCta + threadIdx.x / 32;
    if (r >= rows) return;
    const int lane = threadIdx.x % 32;
    const long long i = r % seqlen_q;
    const long long h = (r / seqlen_q) % heads;
    const long long b = r / (static_cast<long long>(seqlen_q) * heads);
    const T* o_row = out + b * o_sb + i * o_ss + h * o_sh;
    const T* do_row = dout + b * do_sb + i * do_ss + h * do_sh;
    Acc acc = 0;
    for (int c = lane; c < headdim_v; c += 32) acc += to_acc(o_row[c]) * to_acc(do_row[c]);
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, offset);
    if (lane == 0) delta[r] = acc;
}

// Grid: x = query blocks * batch * heads, y = ceil(headdim / kChunk).
template <typename T, bool kCausal>
__global__ void __launch_bounds__(GeneralTraits<T>::kThreads, GeneralTraits<T>::kMinCtasPerSm)
general_bwd_dq(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
               const T* __restrict__ dout, const lse_t<T>* __restrict__ lse, const acc_t<T>* __restrict__ delta,
               T* __restrict__ dq,
               long long q_sb, long long q_ss, long long q_sh, long long k_sb, long long k_ss, long long k_sh,
               long long v_sb, long long v_ss, long long v_sh, long long do_sb, long long do_ss, long long do_sh,
               long long dq_sb, long long dq_ss, long long dq_sh,
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
    const RowView<T> dO{dout + b * do_sb + h * do_sh, do_ss, seqlen_q, headdim_v};
    const RowView<T> K{k + b * k_sb + hk * k_sh, k_ss, seqlen_k, headdim};
    const RowView<T> V{v + b * v_sb + hk * v_sh, v_ss, seqlen_k, headdim_v};
    const Mask<kCausal> mask(seqlen_q, seqlen_k);

    const int row = threadIdx.x / Tr::kLanesPerRow;
    const int lane = threadIdx.x % Tr::kLanesPerRow;
    const int i = m0 + row;
    // Padding rows (i >= seqlen_q) behave like rows without keys: lse = -inf, so P = 0.
    const lse_t<T> lse_i = i < seqlen_q ? lse[bh * seqlen_q + i] : Consts<lse_t<T>>::neg_inf();
    const Acc delta_i = i < seqlen_q ? delta[bh * seqlen_q + i] : Acc(0);

    Acc acc[Tr::kOutPerThread];
#pragma unroll
    for (int j = 0; j < Tr::kOutPerThread; ++j) acc[j] = 0;

    const int n_end = mask.key_end(m0, Tr::kBlockM);
    for (int n0 = 0; n0 < n_end; n0 += Tr::kBlockN) {
        Acc p[Tr::kScoresPerThread];
        Acc dp[Tr::kScoresPerThread];
        score_tile(p, Q, m0, K, n0, headdim, sm);
        score_tile(dp, dO, m0, V, n0, headdim_v, sm);
#pragma unroll
        for (int j = 0; j < Tr::kScoresPerThread; ++j) {
            const bool visible = mask.visible(i, n0 + lane + Tr::kLanesPerRow * j);
            p[j] = recompute_prob(scale_score(p[j], softmax_scale), lse_i, visible);
            dp[j] = p[j] * (dp[j] - delta_i);  // dS
        }
        store_weights(dp, sm);
        accumulate_chunk(acc, K, n0, c0, sm);
    }

    if (i >= seqlen_q) return;
    T* dq_row = dq + b * dq_sb + static_cast<long long>(i) * dq_ss + h * dq_sh;
#pragma unroll
    for (int j = 0; j < Tr::kOutPerThread; ++j) {
        const int c = c0 + lane + Tr::kLanesPerRow * j;
        if (c < headdim) dq_row[c] = from_acc<T>(acc[j] * softmax_scale);
    }
}

// Grid: x = key blocks * batch * heads_k, y = ceil(max(headdim, headdim_v) / kChunk). The score tile is
// transposed here: rows are keys, columns are queries.
template <typename T, bool kCausal>
__global__ void __launch_bounds__(GeneralTraits<T>::kThreads, GeneralTraits<T>::kMinCtasPerSm)
general_bwd_dkdv(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                 const T* __restrict__ dout, const lse_t<T>* __restrict__ lse,
                 const acc_t<T>* __restrict__ delta, T* __restrict__ dk, T* __restrict__ dv,
                 long long q_sb, long long q_ss, long long q_sh, long long k_sb, long long k_ss, long long k_sh,
                 long long v_sb, long long v_ss, long long v_sh, long long do_sb, long long do_ss,
                 long long do_sh, long long dk_sb, long long dk_ss, long long dk_sh, long long dv_sb,
                 long long dv_ss, long long dv_sh,
                 int seqlen_q, int seqlen_k, int heads, int heads_k, int headdim, int headdim_v,
                 acc_t<T> softmax_scale) {
    using Tr = GeneralTraits<T>;
    using Acc = acc_t<T>;
    __shared__ GeneralSmem<T> sm;

    const BlockInfo blk(seqlen_k, Tr::kBlockM, heads_k, false);  // rows are keys, heads are kv heads
    const int n0 = blk.row0;
    const long long hk = blk.h, b = blk.b;
    const int group = heads / heads_k;
    const int c0 = blockIdx.y * Tr::kChunk;
    const bool do_dk = c0 < headdim;    // uniform over the CTA
    const bool do_dv = c0 < headdim_v;  // uniform over the CTA

    const RowView<T> K{k + b * k_sb + hk * k_sh, k_ss, seqlen_k, headdim};
    const RowView<T> V{v + b * v_sb + hk * v_sh, v_ss, seqlen_k, headdim_v};
    const Mask<kCausal> mask(seqlen_q, seqlen_k);

    const int row = threadIdx.x / Tr::kLanesPerRow;
    const int lane = threadIdx.x % Tr::kLanesPerRow;
    const int n = n0 + row;

    Acc dk_acc[Tr::kOutPerThread];
    Acc dv_acc[Tr::kOutPerThread];
#pragma unroll
    for (int j = 0; j < Tr::kOutPerThread; ++j) dk_acc[j] = dv_acc[j] = 0;

    const int m_begin = mask.query_begin(n0, Tr::kBlockN);
    for (int g = 0; g < group; ++g) {
        const long long h = hk * group + g;
        const RowView<T> Q{q + b * q_sb + h * q_sh, q_ss, seqlen_q, headdim};
        const RowView<T> dO{dout + b * do_sb + h * do_sh, do_ss, seqlen_q, headdim_v};
        const lse_t<T>* lse_h = lse + (b * heads + h) * seqlen_q;
        const Acc* delta_h = delta + (b * heads + h) * seqlen_q;
        for (int m0 = m_begin; m0 < seqlen_q; m0 += Tr::kBlockN) {
            Acc p[Tr::kScoresPerThread];
            Acc ds[Tr::kScoresPerThread];
            score_tile(p, K, n0, Q, m0, headdim, sm);
            score_tile(ds, V, n0, dO, m0, headdim_v, sm);
#pragma unroll
            for (int j = 0; j < Tr::kScoresPerThread; ++j) {
                const int i = m0 + lane + Tr::kLanesPerRow * j;
                const bool in_range = i < seqlen_q;
                const lse_t<T> lse_i = in_range ? lse_h[i] : Consts<lse_t<T>>::neg_inf();
                const Acc delta_i = in_range ? delta_h[i] : Acc(0);
                p[j] = recompute_prob(scale_score(p[j], softmax_scale), lse_i, mask.visible(i, n));
                ds[j] = p[j] * (ds[j] - delta_i);
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

    if (n >= seqlen_k) return;
    T* dk_row = dk + b * dk_sb + static_cast<long long>(n) * dk_ss + hk * dk_sh;
    T* dv_row = dv + b * dv_sb + static_cast<long long>(n) * dv_ss + hk * dv_sh;
#pragma unroll
    for (int j = 0; j < Tr::kOutPerThread; ++j) {
        const int c = c0 + lane + Tr::kLanesPerRow * j;
        if (do_dk && c < headdim) dk_row[c] = from_acc<T>(dk_acc[j] * softmax_scale);
        if (do_dv && c < headdim_v) dv_row[c] = from_acc<T>(dv_acc[j]);
    }
}

}  // namespace cupyflash
