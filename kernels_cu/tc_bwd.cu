// Tensor-core backward (float16/bfloat16, sm_80+, head dims up to 256): after general_bwd_delta,
//   tc_bwd             one CTA per kBlockN keys of one (batch, kv head): dK and dV stay in registers
//                      while the CTA walks the query blocks of every query head of its GQA group (so the
//                      group's sum needs no per-head copies), and each block's dQ share is added into a
//                      float32 buffer (batch, heads, seqlen_q, dq_ld);
//   tc_bwd_dq_convert  dQ = softmax_scale * buffer, rounded to T.
// Per query block the CTA recomputes S^T = K Q^T and P^T = exp2(S^T * scale * LOG2E - LOG2E * lse)
// from the saved lse (no probability is stored between passes), then dP^T = V dO^T,
// dS^T = P^T * (dP^T - delta), dQ += dS K, dV += P^T dO and dK += dS^T Q: five matrix products.
// Phases and warp tiles: tc_bwd_tile.cuh. With deterministic != 0 the CTAs of a (batch, kv head) add
// into each query block of the buffer in a fixed key-block order (ordered_sum.cuh), so dQ is bitwise
// reproducible; dK and dV always are (one CTA writes each element once).
#include "block_info.cuh"
#include "dtypes.cuh"
#include "mask.cuh"
#include "mma.cuh"
#include "ordered_sum.cuh"
#include "tc_bwd_tile.cuh"
#include "tc_softmax.cuh"
#include "tc_tile.cuh"

namespace cupyflash {

// Grid: x = ceil(seqlen_k / kBlockN) * batch * heads_k, key blocks fastest (the ordered sum needs each
// CTA's predecessors launched before it). Dynamic shared memory: TcBwdTraits::kSmemBytes.
// dq_accum: dq_splits zeroed float32 buffers (batch, heads, seqlen_q, dq_ld), dq_split_stride elements
// apart, dq_ld >= headdim even; key block j adds into buffer j % dq_splits. dq_turns: zeroed int32
// (dq_splits, batch, heads, ceil(seqlen_q / kBlockM)), turns_split_stride elements per split, read only
// when deterministic != 0.
template <typename T, int kHeadDim, int kBlockN, int kBlockM, int kStages, bool kCausal>
__global__ void __launch_bounds__(256, 1)
tc_bwd(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ dout,
       const float* __restrict__ lse, const float* __restrict__ delta, float* __restrict__ dq_accum,
       int* __restrict__ dq_turns, T* __restrict__ dk, T* __restrict__ dv,
       long long q_sb, long long q_ss, long long q_sh, long long k_sb, long long k_ss, long long k_sh,
       long long v_sb, long long v_ss, long long v_sh, long long do_sb, long long do_ss, long long do_sh,
       long long dk_sb, long long dk_ss, long long dk_sh, long long dv_sb, long long dv_ss, long long dv_sh,
       int seqlen_q, int seqlen_k, int heads, int heads_k, int headdim, int headdim_v, int dq_ld,
       int dq_splits, long long dq_split_stride, long long turns_split_stride, float softmax_scale, int vec_loads,
       int deterministic) {
    using Tr = TcBwdTraits<T, kHeadDim, kBlockN, kBlockM, kStages>;
    using Sdp = typename Tr::SdpGrid;
    using Dq = typename Tr::DqGrid;
    using Dkv = typename Tr::DkvGrid;
    constexpr int kLd = Tr::kLd;
    constexpr int kLdP = Tr::kLdP;

    extern __shared__ __align__(16) unsigned char smem_raw[];
    require_dynamic_smem<Tr::kSmemBytes>();
    T* sK = reinterpret_cast<T*>(smem_raw);
    T* sV = sK + Tr::kKeyTileElems;
    T* sQ = sV + Tr::kKeyTileElems;                 // kStages tiles of kBlockM rows
    T* sdO = sQ + kStages * Tr::kQueryTileElems;    // kStages tiles of kBlockM rows
    T* sP = sdO + kStages * Tr::kQueryTileElems;    // P^T, [key][query]
    T* sdS = sP + Tr::kProbTileElems;               // dS^T, [key][query]
    float* sLse2 = reinterpret_cast<float*>(sdS + Tr::kProbTileElems);  // kStages x kBlockM, lse * LOG2E
    float* sDelta = sLse2 + kStages * kBlockM;                           // kStages x kBlockM

    // Rows are keys, heads are kv heads. Key blocks launch last-first under the ordered sum (see the turn
    // below), first-first otherwise (under a causal mask the first key blocks have the most work).
    const BlockInfo blk(seqlen_k, kBlockN, heads_k, deterministic != 0);
    const int n0 = blk.row0;
    const long long hk = blk.h, b = blk.b;
    const int group = heads / heads_k;
    const bool vec = vec_loads != 0;
    const Mask<kCausal> mask(seqlen_q, seqlen_k);
    const float scale_log2 = softmax_scale * kLog2eF;
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;

    // Iterations run over (query head of the group, query block), each head's blocks going up from the
    // first one that sees any of this CTA's keys (query_begin rounds down to the global kBlockM grid, so
    // all CTAs of a head add into the same dq_turns blocks).
    const int m_begin = mask.query_begin(n0, kBlockM);
    const int q_blocks = seqlen_q > m_begin ? (seqlen_q - m_begin + kBlockM - 1) / kBlockM : 0;
    const int iterations = group * q_blocks;
    const int q_blocks_total = (seqlen_q + kBlockM - 1) / kBlockM;
    auto block_start = [&](int it) { return m_begin + (it % q_blocks) * kBlockM; };

    auto load_query_block = [&](int it, int stage) {
        const long long h = hk * group + it / q_blocks;
        const int m0 = block_start(it);
        load_tile_async<kBlockM, kHeadDim, kLd, Tr::kThreads>(sQ + stage * Tr::kQueryTileElems,
                                                              q + b * q_sb + h * q_sh, q_ss, m0, seqlen_q, headdim, vec);
        load_tile_async<kBlockM, kHeadDim, kLd, Tr::kThreads>(sdO + stage * Tr::kQueryTileElems,
                                                              dout + b * do_sb + h * do_sh, do_ss, m0, seqlen_q,
                                                              headdim_v, vec);
        for (int i = threadIdx.x; i < kBlockM; i += Tr::kThreads) {
            const bool in_range = m0 + i < seqlen_q;
            const long long row = (b * heads + h) * seqlen_q + m0 + i;
            // Padding rows get lse = -inf, hence P = 0 and dS = 0; -inf * LOG2E stays -inf.
            sLse2[stage * kBlockM + i] = in_range ? lse[row] * kLog2eF : Consts<float>::neg_inf();
            sDelta[stage * kBlockM + i] = in_range ? delta[row] : 0.0f;
        }
    };

    load_tile_async<kBlockN, kHeadDim, kLd, Tr::kThreads>(sK, k + b * k_sb + hk * k_sh, k_ss, n0, seqlen_k, headdim, vec);
    load_tile_async<kBlockN, kHeadDim, kLd, Tr::kThreads>(sV, v + b * v_sb + hk * v_sh, v_ss, n0, seqlen_k, headdim_v, vec);
    if (iterations > 0) load_query_block(0, 0);
    cp_async_commit();

    float dk_acc[Dkv::kMTiles][Dkv::kNTiles][4];
    float dv_acc[Dkv::kMTiles][Dkv::kNTiles][4];
#pragma unroll
    for (int mt = 0; mt < Dkv::kMTiles; ++mt) {
#pragma unroll
        for (int nt = 0; nt < Dkv::kNTiles; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) dk_acc[mt][nt][e] = dv_acc[mt][nt][e] = 0.0f;
        }
    }

    for (int it = 0; it < iterations; ++it) {
        const int stage = kStages == 2 ? it % 2 : 0;
        const long long h = hk * group + it / q_blocks;
        const int m0 = block_start(it);
        cp_async_wait<0>();
        // Block it has landed, and every warp is done with iteration it - 1: its P^T/dS^T and, with
        // two stages, the buffer that block it + 1 now loads into.
        __syncthreads();
        if (kStages == 2 && it + 1 < iterations) load_query_block(it + 1, (it + 1) % 2);
        cp_async_commit();
        const T* sQs = sQ + stage * Tr::kQueryTileElems;
        const T* sdOs = sdO + stage * Tr::kQueryTileElems;
        const float* lse2 = sLse2 + stage * kBlockM;
        const float* delta_s = sDelta + stage * kBlockM;

        // Phase 1: S^T and dP^T for the warp's keys x queries, then P^T and dS^T, rounded to T.
#pragma unroll
        for (int pass = 0; pass < Tr::Passes::kSdp; ++pass) {
            const int r0 = Sdp::row0(warp), c0 = pass * (kBlockM / Tr::Passes::kSdp) + Sdp::col0(warp);
            // sd[0]: S^T, then P^T; sd[1]: dP^T, then dS^T.
            float sd[2][Sdp::kMTiles][Sdp::kNTiles][4];
            warp_abt2<Sdp::kMTiles, Sdp::kNTiles, kHeadDim, kLd>(sd, sK, sQs, sV, sdOs, r0, c0);
            auto& p = sd[0];
            auto& ds = sd[1];
#pragma unroll
            for (int mt = 0; mt < Sdp::kMTiles; ++mt) {
#pragma unroll
                for (int nt = 0; nt < Sdp::kNTiles; ++nt) {
                    const int col = c0 + 8 * nt + 2 * t;
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int key = n0 + r0 + 16 * mt + g + 8 * (e / 2);
                        const float l2 = lse2[col + e % 2];
                        const bool live = l2 != Consts<float>::neg_inf() && mask.visible(m0 + col + e % 2, key);
                        p[mt][nt][e] = live ? fast_exp2(p[mt][nt][e] * scale_log2 - l2) : 0.0f;
                        ds[mt][nt][e] = p[mt][nt][e] * (ds[mt][nt][e] - delta_s[col + e % 2]);
                    }
#pragma unroll
                    for (int r = 0; r < 2; ++r) {
                        const int row = r0 + 16 * mt + g + 8 * r;
                        *reinterpret_cast<unsigned*>(sP + row * kLdP + col) = pack2<T>(p[mt][nt][2 * r], p[mt][nt][2 * r + 1]);
                        *reinterpret_cast<unsigned*>(sdS + row * kLdP + col) =
                            pack2<T>(ds[mt][nt][2 * r], ds[mt][nt][2 * r + 1]);
                    }
                }
            }
        }
        __syncthreads();

        // Phase 2: this block's dQ share, dS K over the CTA's keys, added into the float32 buffer;
        // phase 3: dV += P^T dO and dK += dS^T Q for the warp's keys x columns.
        // Ordered sum: the key blocks that see query block m0 are 0..last, and those of one buffer
        // (j % dq_splits) add last first. The CTAs are launched in that order too, so a CTA only waits
        // for CTAs launched before it. Under a causal mask a higher key block starts nearer the diagonal
        // and reaches each query block kBlockN / kBlockM or more iterations earlier than a lower one,
        // so the turns come in the order the CTAs arrive and cost almost no wait. Without a mask they all reach the first block together and
        // pass its turn down a chain of one hand-over per key block; splitting the sum over
        // dq_splits buffers shortens that chain dq_splits times.
        const int split = (n0 / kBlockN) % dq_splits;
        int* turn = dq_turns + split * turns_split_stride + (b * heads + h) * q_blocks_total + m0 / kBlockM;
        const int my_turn = ((mask.key_end(m0, kBlockM) - 1) / kBlockN - n0 / kBlockN) / dq_splits;
        float* dq_rows = dq_accum + split * dq_split_stride +
                         ((b * heads + h) * seqlen_q + m0) * static_cast<long long>(dq_ld);
        auto dq_share = [&](float (&dq_part)[Dq::kMTiles][Dq::kNTiles][4], int r0, int c0) {
#pragma unroll
            for (int mt = 0; mt < Dq::kMTiles; ++mt) {
#pragma unroll
                for (int nt = 0; nt < Dq::kNTiles; ++nt) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) dq_part[mt][nt][e] = 0.0f;
                }
            }
            warp_ab<true, Dq::kMTiles, Dq::kNTiles, kBlockN, kLdP, kLd>(dq_part, sdS, r0, sK, c0);
        };
        auto add_dq_share = [&](const float (&dq_part)[Dq::kMTiles][Dq::kNTiles][4], int r0, int c0) {
#pragma unroll
            for (int mt = 0; mt < Dq::kMTiles; ++mt) {
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const int row = r0 + 16 * mt + g + 8 * r;
                    if (m0 + row >= seqlen_q) continue;
#pragma unroll
                    for (int nt = 0; nt < Dq::kNTiles; ++nt) {
                        const int col = c0 + 8 * nt + 2 * t;  // even, and dq_ld is even
                        if (col < dq_ld) {
                            reduce_add_f32x2(dq_rows + static_cast<long long>(row) * dq_ld + col,
                                             dq_part[mt][nt][2 * r], dq_part[mt][nt][2 * r + 1]);
                        }
                    }
                }
            }
        };
        auto dkdv_update = [&]() {
            const int r0 = Dkv::row0(warp), c0 = Dkv::col0(warp);
            warp_ab<false, Dkv::kMTiles, Dkv::kNTiles, kBlockM, kLdP, kLd>(dv_acc, sP, r0, sdOs, c0);
            warp_ab<false, Dkv::kMTiles, Dkv::kNTiles, kBlockM, kLdP, kLd>(dk_acc, sdS, r0, sQs, c0);
        };
        if constexpr (Tr::Passes::kDq == 1) {
            // The share stays in registers through phase 3, so under the ordered sum the CTA before this
            // one has had all of phase 3 to pass the turn on before this CTA asks for it.
            const int r0 = Dq::row0(warp), c0 = Dq::col0(warp);
            float dq_part[Dq::kMTiles][Dq::kNTiles][4];
            dq_share(dq_part, r0, c0);
            dkdv_update();
            if (deterministic) wait_turn(turn, my_turn);
            add_dq_share(dq_part, r0, c0);
            if (deterministic) pass_turn(turn);
        } else {
            // Column passes (see TcBwdPasses): each share is added as soon as it is computed.
#pragma unroll
            for (int pass = 0; pass < Tr::Passes::kDq; ++pass) {
                const int r0 = Dq::row0(warp), c0 = pass * (kHeadDim / Tr::Passes::kDq) + Dq::col0(warp);
                float dq_part[Dq::kMTiles][Dq::kNTiles][4];
                dq_share(dq_part, r0, c0);
                if (deterministic && pass == 0) wait_turn(turn, my_turn);
                add_dq_share(dq_part, r0, c0);
            }
            if (deterministic) pass_turn(turn);
            dkdv_update();
        }

        if (kStages == 1 && it + 1 < iterations) {
            __syncthreads();  // every warp is done with the only buffer before block it + 1 loads into it
            load_query_block(it + 1, 0);
            cp_async_commit();
        }
    }
    cp_async_wait<0>();

    const int r0 = Dkv::row0(warp), c0 = Dkv::col0(warp);
    T* dk_bh = dk + b * dk_sb + hk * dk_sh;
    T* dv_bh = dv + b * dv_sb + hk * dv_sh;
#pragma unroll
    for (int mt = 0; mt < Dkv::kMTiles; ++mt) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int key = n0 + r0 + 16 * mt + g + 8 * r;
            if (key >= seqlen_k) continue;
#pragma unroll
            for (int nt = 0; nt < Dkv::kNTiles; ++nt) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int col = c0 + 8 * nt + 2 * t + e;
                    // dK = softmax_scale * dS^T Q: the scale of S = scale * Q K^T, applied once here.
                    if (col < headdim) dk_bh[key * dk_ss + col] = from_acc<T>(dk_acc[mt][nt][2 * r + e] * softmax_scale);
                    if (col < headdim_v) dv_bh[key * dv_ss + col] = from_acc<T>(dv_acc[mt][nt][2 * r + e]);
                }
            }
        }
    }
}

// dq[b, s, h, c] = softmax_scale * (sum over the dq_splits buffers, in order, of dq_accum[., b, h, s, c]),
// rounded to T. One thread per element of the (batch, heads, seqlen_q, headdim) index space, grid-stride.
template <typename T>
__global__ void __launch_bounds__(256)
tc_bwd_dq_convert(const float* __restrict__ dq_accum, T* __restrict__ dq, long long dq_sb, long long dq_ss,
                  long long dq_sh, int seqlen_q, int heads, int headdim, int dq_ld, int dq_splits,
                  long long dq_split_stride, long long elements, float softmax_scale) {
    for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < elements;
         i += static_cast<long long>(gridDim.x) * blockDim.x) {
        const int c = static_cast<int>(i % headdim);
        const long long row = i / headdim;  // (b * heads + h) * seqlen_q + s
        const long long s = row % seqlen_q;
        const long long bh = row / seqlen_q;
        const long long h = bh % heads, b = bh / heads;
        float sum = dq_accum[row * dq_ld + c];
        for (int split = 1; split < dq_splits; ++split) sum += dq_accum[split * dq_split_stride + row * dq_ld + c];
        dq[b * dq_sb + s * dq_ss + h * dq_sh + c] = from_acc<T>(sum * softmax_scale);
    }
}

}  // namespace cupyflash
