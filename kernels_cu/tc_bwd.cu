// Tensor-core backward (float16/bfloat16, sm_80+, head dims up to 128), two kernels, no atomics:
//   tc_bwd_dkdv  one CTA per 64 keys of one (batch, kv head): dK and dV stay in registers while the CTA
//                walks the query blocks (TcBwdTraits::kCols rows each) of every query head of its group
//                (GQA/MQA sum in the CTA);
//   tc_bwd_dq    one CTA per 64 queries of one (batch, head), walking the key blocks.
// Both recompute S = Q K^T and P = exp2(S * scale * LOG2E - LOG2E * lse) from the saved lse, then
// dP = dO V^T and dS = P * (dP - delta) with delta from general_bwd_delta. Every gradient element is
// written once by one CTA after a fixed-order sum, so the backward is deterministic; the price is
// computing S and dP twice (7 matrix products instead of 5).
//
// Fragment roles (mma.cuh): with warps owning keys (dK/dV), S^T = K Q^T takes K as A (ldmatrix) and Q as
// B (ldmatrix of Q rows); dV += P^T dO and dK += dS^T Q take P^T and dS^T straight from the accumulator
// registers as A and dO / Q as B through ldmatrix.trans. With warps owning queries (dQ), S = Q K^T and
// dP = dO V^T mirror the forward, and dQ += dS K takes K through ldmatrix.trans.
#include "block_info.cuh"
#include "dtypes.cuh"
#include "mask.cuh"
#include "mma.cuh"
#include "tc_softmax.cuh"
#include "tc_tile.cuh"

namespace cupyflash {

// acc[m-tile rows][kNTiles] = A (16 rows of a_tile at a_row0) x B^T (b_tile rows b_row0..+8*kNTiles),
// summed over kDepth columns: the common shape of S = Q K^T, S^T = K Q^T and dP = dO V^T.
template <int kNTiles, int kDepth, int kLd, typename T>
__device__ __forceinline__ void tile_product_abt(float (&acc)[kNTiles][4], const T* a_tile, int a_row0,
                                                 const T* b_tile) {
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kDepth / 16; ++kk) {
        unsigned a[4];
        load_a_frag<kLd>(a, a_tile, a_row0, 16 * kk);
#pragma unroll
        for (int np = 0; np < kNTiles / 2; ++np) {
            unsigned b[4];
            load_bt_frags<kLd>(b, b_tile, 16 * np, 16 * kk);
            mma_16816<T>(acc[2 * np], a, b);
            mma_16816<T>(acc[2 * np + 1], a, b + 2);
        }
    }
}

// acc[kOTiles] += W (the thread's accumulator-layout weights w, 16 rows x 8 * kWTiles columns, rounded
// to T) x X (x_tile rows 0..8 * kWTiles, all kOTiles * 8 columns, read through ldmatrix.trans).
template <int kWTiles, int kOTiles, int kLd, typename T>
__device__ __forceinline__ void tile_product_wx(float (&acc)[kOTiles][4], const float (&w)[kWTiles][4],
                                                const T* x_tile) {
#pragma unroll
    for (int kk = 0; kk < kWTiles / 2; ++kk) {
        const unsigned a[4] = {pack2<T>(w[2 * kk][0], w[2 * kk][1]), pack2<T>(w[2 * kk][2], w[2 * kk][3]),
                               pack2<T>(w[2 * kk + 1][0], w[2 * kk + 1][1]),
                               pack2<T>(w[2 * kk + 1][2], w[2 * kk + 1][3])};
#pragma unroll
        for (int cp = 0; cp < kOTiles / 2; ++cp) {
            unsigned b[4];
            load_b_frags_trans<kLd>(b, x_tile, 16 * kk, 16 * cp);
            mma_16816<T>(acc[2 * cp], a, b);
            mma_16816<T>(acc[2 * cp + 1], a, b + 2);
        }
    }
}

// Writes rows [row0, row0 + 16) of a warp's accumulator (times scale) to a (rows x cols) slice.
template <int kOTiles, typename T>
__device__ __forceinline__ void store_rows(T* base, long long row_stride, int rows, int cols, int row0,
                                           const float (&acc)[kOTiles][4], float scale) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = row0 + lane / 4 + 8 * r;
        if (row >= rows) continue;
        T* out_row = base + static_cast<long long>(row) * row_stride;
#pragma unroll
        for (int c = 0; c < kOTiles; ++c) {
            const int col = 8 * c + 2 * (lane % 4);
            if (col < cols) out_row[col] = from_acc<T>(acc[c][2 * r] * scale);
            if (col + 1 < cols) out_row[col + 1] = from_acc<T>(acc[c][2 * r + 1] * scale);
        }
    }
}

// Grid: x = ceil(seqlen_k / kBlock) * batch * heads_k. Dynamic shared memory: TcBwdTraits::kSmemBytes.
template <typename T, int kHeadDim, bool kCausal>
__global__ void __launch_bounds__(TcBwdTraits<T, kHeadDim>::kThreads, TcBwdTraits<T, kHeadDim>::kMinCtasPerSm)
tc_bwd_dkdv(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ dout,
            const float* __restrict__ lse, const float* __restrict__ delta, T* __restrict__ dk, T* __restrict__ dv,
            long long q_sb, long long q_ss, long long q_sh, long long k_sb, long long k_ss, long long k_sh,
            long long v_sb, long long v_ss, long long v_sh, long long do_sb, long long do_ss, long long do_sh,
            long long dk_sb, long long dk_ss, long long dk_sh, long long dv_sb, long long dv_ss, long long dv_sh,
            int seqlen_q, int seqlen_k, int heads, int heads_k, int headdim, int headdim_v,
            float softmax_scale, int vec_loads) {
    using Tr = TcBwdTraits<T, kHeadDim>;
    constexpr int kLd = Tr::kLd;
    constexpr int kB = Tr::kBlock;         // keys owned by the CTA
    constexpr int kC = Tr::kCols;          // queries per iteration
    constexpr int kNTiles = kC / 8;        // query n-tiles of S^T
    constexpr int kOTiles = kHeadDim / 8;  // column n-tiles of dK and dV

    extern __shared__ __align__(16) unsigned char smem_raw[];
    require_dynamic_smem<Tr::kSmemBytes>();
    T* sK = reinterpret_cast<T*>(smem_raw);
    T* sV = sK + Tr::kOwnedTileElems;
    T* sQ = sV + Tr::kOwnedTileElems;                    // kStages tiles of kC rows
    T* sdO = sQ + Tr::kStages * Tr::kStreamTileElems;    // kStages tiles of kC rows
    float* sLse2 = reinterpret_cast<float*>(sdO + Tr::kStages * Tr::kStreamTileElems);  // kStages x kC
    float* sDelta = sLse2 + Tr::kStages * kC;                                           // kStages x kC

    const BlockInfo blk(seqlen_k, kB, heads_k, false);  // rows are keys, heads are kv heads
    const int n0 = blk.row0;
    const long long hk = blk.h, b = blk.b;
    const int group = heads / heads_k;
    const bool vec = vec_loads != 0;
    const Mask<kCausal> mask(seqlen_q, seqlen_k);
    const float scale_log2 = softmax_scale * kLog2eF;

    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int t = lane % 4;
    const int keys[2] = {n0 + 16 * warp + lane / 4, n0 + 16 * warp + lane / 4 + 8};

    // Iterations run over (query head of the group, query block), the blocks of each head starting at
    // the first one that sees any of this CTA's keys.
    const int m_begin = mask.query_begin(n0, kC);
    const int q_blocks = seqlen_q > m_begin ? (seqlen_q - m_begin + kC - 1) / kC : 0;
    const int iterations = group * q_blocks;

    auto load_query_block = [&](int it, int stage) {
        const long long h = hk * group + it / q_blocks;
        const int m0 = m_begin + (it % q_blocks) * kC;
        load_tile_async<kC, kHeadDim, kLd, Tr::kThreads>(sQ + stage * Tr::kStreamTileElems,
                                                         q + b * q_sb + h * q_sh, q_ss, m0, seqlen_q, headdim, vec);
        load_tile_async<kC, kHeadDim, kLd, Tr::kThreads>(sdO + stage * Tr::kStreamTileElems,
                                                         dout + b * do_sb + h * do_sh, do_ss, m0, seqlen_q,
                                                         headdim_v, vec);
        for (int i = threadIdx.x; i < kC; i += Tr::kThreads) {
            const bool in_range = m0 + i < seqlen_q;
            const long long row = (b * heads + h) * seqlen_q + m0 + i;
            // Padding rows get lse = -inf, hence P = 0; -inf * LOG2E stays -inf.
            sLse2[stage * kC + i] = in_range ? lse[row] * kLog2eF : Consts<float>::neg_inf();
            sDelta[stage * kC + i] = in_range ? delta[row] : 0.0f;
        }
    };

    load_tile_async<kB, kHeadDim, kLd, Tr::kThreads>(sK, k + b * k_sb + hk * k_sh, k_ss, n0, seqlen_k, headdim, vec);
    load_tile_async<kB, kHeadDim, kLd, Tr::kThreads>(sV, v + b * v_sb + hk * v_sh, v_ss, n0, seqlen_k, headdim_v, vec);
    if (iterations > 0) load_query_block(0, 0);
    cp_async_commit();

    float dk_acc[kOTiles][4];
    float dv_acc[kOTiles][4];
#pragma unroll
    for (int c = 0; c < kOTiles; ++c) {
#pragma unroll
        for (int e = 0; e < 4; ++e) dk_acc[c][e] = dv_acc[c][e] = 0.0f;
    }

    for (int it = 0; it < iterations; ++it) {
        const int stage = it % Tr::kStages;
        if (it + 1 < iterations) load_query_block(it + 1, (it + 1) % Tr::kStages);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const T* sQs = sQ + stage * Tr::kStreamTileElems;
        const T* sdOs = sdO + stage * Tr::kStreamTileElems;
        const int m0 = m_begin + (it % q_blocks) * kC;

        float p[kNTiles][4];   // S^T, then P^T
        float ds[kNTiles][4];  // dP^T, then dS^T
        tile_product_abt<kNTiles, kHeadDim, kLd>(p, sK, 16 * warp, sQs);
        tile_product_abt<kNTiles, kHeadDim, kLd>(ds, sV, 16 * warp, sdOs);
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int col = 8 * nt + 2 * t + e % 2;
                const float lse2 = sLse2[stage * kC + col];
                const bool live = lse2 != Consts<float>::neg_inf() && mask.visible(m0 + col, keys[e / 2]);
                p[nt][e] = live ? fast_exp2(p[nt][e] * scale_log2 - lse2) : 0.0f;
                ds[nt][e] = p[nt][e] * (ds[nt][e] - sDelta[stage * kC + col]);
            }
        }
        tile_product_wx<kNTiles, kOTiles, kLd>(dv_acc, p, sdOs);
        tile_product_wx<kNTiles, kOTiles, kLd>(dk_acc, ds, sQs);
        __syncthreads();  // every warp is done with this stage before iteration it + 1 loads block it + 2 into it
    }
    cp_async_wait<0>();

    store_rows(dk + b * dk_sb + hk * dk_sh, dk_ss, seqlen_k, headdim, n0 + 16 * warp, dk_acc, softmax_scale);
    store_rows(dv + b * dv_sb + hk * dv_sh, dv_ss, seqlen_k, headdim_v, n0 + 16 * warp, dv_acc, 1.0f);
}

// Grid: x = ceil(seqlen_q / kBlock) * batch * heads. Dynamic shared memory: TcBwdTraits::kSmemBytes.
template <typename T, int kHeadDim, bool kCausal>
__global__ void __launch_bounds__(TcBwdTraits<T, kHeadDim>::kThreads, TcBwdTraits<T, kHeadDim>::kMinCtasPerSm)
tc_bwd_dq(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ dout,
          const float* __restrict__ lse, const float* __restrict__ delta, T* __restrict__ dq,
          long long q_sb, long long q_ss, long long q_sh, long long k_sb, long long k_ss, long long k_sh,
          long long v_sb, long long v_ss, long long v_sh, long long do_sb, long long do_ss, long long do_sh,
          long long dq_sb, long long dq_ss, long long dq_sh,
          int seqlen_q, int seqlen_k, int heads, int heads_k, int headdim, int headdim_v,
          float softmax_scale, int vec_loads) {
    using Tr = TcBwdTraits<T, kHeadDim>;
    constexpr int kLd = Tr::kLd;
    constexpr int kB = Tr::kBlock;         // queries owned by the CTA
    constexpr int kC = Tr::kCols;          // keys per iteration
    constexpr int kNTiles = kC / 8;        // key n-tiles of S
    constexpr int kOTiles = kHeadDim / 8;  // column n-tiles of dQ

    extern __shared__ __align__(16) unsigned char smem_raw[];
    require_dynamic_smem<Tr::kSmemBytes>();
    T* sQ = reinterpret_cast<T*>(smem_raw);
    T* sdO = sQ + Tr::kOwnedTileElems;
    T* sK = sdO + Tr::kOwnedTileElems;                  // kStages tiles of kC rows
    T* sV = sK + Tr::kStages * Tr::kStreamTileElems;    // kStages tiles of kC rows

    const BlockInfo blk(seqlen_q, kB, heads, true);
    const int m0 = blk.row0;
    const long long bh = blk.bh, h = blk.h, b = blk.b;
    const long long hk = blk.kv_head(heads, heads_k);
    const T* k_bh = k + b * k_sb + hk * k_sh;
    const T* v_bh = v + b * v_sb + hk * v_sh;
    const bool vec = vec_loads != 0;
    const Mask<kCausal> mask(seqlen_q, seqlen_k);
    const float scale_log2 = softmax_scale * kLog2eF;

    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int t = lane % 4;
    int rows[2];
    float lse2[2];
    float delta_r[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        rows[r] = m0 + 16 * warp + lane / 4 + 8 * r;
        const bool in_range = rows[r] < seqlen_q;
        // Padding rows and rows without keys have lse = -inf: P = 0, dQ = 0.
        lse2[r] = in_range ? lse[bh * seqlen_q + rows[r]] * kLog2eF : Consts<float>::neg_inf();
        delta_r[r] = in_range ? delta[bh * seqlen_q + rows[r]] : 0.0f;
    }

    const int n_end = mask.key_end(m0, kB);
    const int n_blocks = n_end > 0 ? (n_end + kC - 1) / kC : 0;
    load_tile_async<kB, kHeadDim, kLd, Tr::kThreads>(sQ, q + b * q_sb + h * q_sh, q_ss, m0, seqlen_q, headdim, vec);
    load_tile_async<kB, kHeadDim, kLd, Tr::kThreads>(sdO, dout + b * do_sb + h * do_sh, do_ss, m0, seqlen_q,
                                                     headdim_v, vec);
    if (n_blocks > 0) {
        load_tile_async<kC, kHeadDim, kLd, Tr::kThreads>(sK, k_bh, k_ss, 0, seqlen_k, headdim, vec);
        load_tile_async<kC, kHeadDim, kLd, Tr::kThreads>(sV, v_bh, v_ss, 0, seqlen_k, headdim_v, vec);
    }
    cp_async_commit();

    float dq_acc[kOTiles][4];
#pragma unroll
    for (int c = 0; c < kOTiles; ++c) dq_acc[c][0] = dq_acc[c][1] = dq_acc[c][2] = dq_acc[c][3] = 0.0f;

    for (int jb = 0; jb < n_blocks; ++jb) {
        const int n0 = jb * kC;
        const int stage = jb % Tr::kStages;
        if (jb + 1 < n_blocks) {
            const int next = (jb + 1) % Tr::kStages;
            load_tile_async<kC, kHeadDim, kLd, Tr::kThreads>(sK + next * Tr::kStreamTileElems, k_bh, k_ss,
                                                             n0 + kC, seqlen_k, headdim, vec);
            load_tile_async<kC, kHeadDim, kLd, Tr::kThreads>(sV + next * Tr::kStreamTileElems, v_bh, v_ss,
                                                             n0 + kC, seqlen_k, headdim_v, vec);
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const T* sKs = sK + stage * Tr::kStreamTileElems;
        const T* sVs = sV + stage * Tr::kStreamTileElems;

        float p[kNTiles][4];   // S, then P
        float ds[kNTiles][4];  // dP, then dS
        tile_product_abt<kNTiles, kHeadDim, kLd>(p, sQ, 16 * warp, sKs);
        tile_product_abt<kNTiles, kHeadDim, kLd>(ds, sdO, 16 * warp, sVs);
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = e / 2;
                const bool live = lse2[r] != Consts<float>::neg_inf() &&
                                  mask.visible(rows[r], n0 + 8 * nt + 2 * t + e % 2);
                p[nt][e] = live ? fast_exp2(p[nt][e] * scale_log2 - lse2[r]) : 0.0f;
                ds[nt][e] = p[nt][e] * (ds[nt][e] - delta_r[r]);
            }
        }
        tile_product_wx<kNTiles, kOTiles, kLd>(dq_acc, ds, sKs);
        __syncthreads();  // every warp is done with this stage before iteration jb + 1 loads block jb + 2 into it
    }
    cp_async_wait<0>();

    store_rows(dq + b * dq_sb + h * dq_sh, dq_ss, seqlen_q, headdim, m0 + 16 * warp, dq_acc, softmax_scale);
}

}  // namespace cupyflash
