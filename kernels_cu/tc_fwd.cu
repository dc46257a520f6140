// Tensor-core forward (float16/bfloat16, sm_80+): one CTA per 128 query rows of one (batch, head),
// looping over key/value blocks of kBlockN keys with an online softmax.
//
// Per block: S = Q K^T with mma.sync (Q from registers or shared memory, K fragments by ldmatrix),
// scale and mask (only blocks that cross the causal diagonal or the end of the keys pay for the mask),
// the online softmax in registers, then O += P V with P converted in registers into the A operand and V
// fragments by ldmatrix.trans. K/V blocks are multi-buffered with cp.async (TcFwdTraits::kStages):
// block j + 1 loads while block j is computed. Causal CTAs stop at the last key block any of their rows
// sees, and the grid schedules the query blocks with the most keys first.
//
// Grid: x = query blocks * batch * heads. Dynamic shared memory: TcFwdTraits::kSmemBytes.
#include "block_info.cuh"
#include "dtypes.cuh"
#include "mask.cuh"
#include "mma.cuh"
#include "tc_softmax.cuh"
#include "tc_tile.cuh"

namespace cupyflash {

template <typename T, int kHeadDim, int kBlockN, int kMTiles, bool kCausal>
__global__ void __launch_bounds__(TcFwdTraits<T, kHeadDim, kBlockN, kMTiles>::kThreads,
                                  TcFwdTraits<T, kHeadDim, kBlockN, kMTiles>::kMinCtasPerSm)
tc_fwd(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ out,
       float* __restrict__ lse,
       long long q_sb, long long q_ss, long long q_sh, long long k_sb, long long k_ss, long long k_sh,
       long long v_sb, long long v_ss, long long v_sh, long long o_sb, long long o_ss, long long o_sh,
       int seqlen_q, int seqlen_k, int heads, int heads_k, int headdim, int headdim_v,
       float softmax_scale, int vec_loads) {
    using Tr = TcFwdTraits<T, kHeadDim, kBlockN, kMTiles>;
    constexpr int kLd = Tr::kLd;
    constexpr int kNTiles = kBlockN / 8;   // score n-tiles per m-tile
    constexpr int kOTiles = kHeadDim / 8;  // output n-tiles per m-tile
    constexpr int kDSteps = kHeadDim / 16;

    extern __shared__ __align__(16) unsigned char smem_raw[];
    require_dynamic_smem<Tr::kSmemBytes>();
    T* sQ = reinterpret_cast<T*>(smem_raw);
    T* sK = sQ + Tr::kBlockM * kLd;               // kStages tiles of kBlockN rows
    T* sV = sK + Tr::kStages * kBlockN * kLd;     // kStages tiles of kBlockN rows

    const BlockInfo blk(seqlen_q, Tr::kBlockM, heads, true);
    const int m0 = blk.row0;
    const long long bh = blk.bh, h = blk.h, b = blk.b;
    const long long hk = blk.kv_head(heads, heads_k);
    const T* q_bh = q + b * q_sb + h * q_sh;
    const T* k_bh = k + b * k_sb + hk * k_sh;
    const T* v_bh = v + b * v_sb + hk * v_sh;
    const bool vec = vec_loads != 0;
    const Mask<kCausal> mask(seqlen_q, seqlen_k);

    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int t = lane % 4;
    const int warp_row0 = 16 * kMTiles * warp;  // first row of this warp within the CTA's block
    // Rows held by this thread: m-tile mt, half r (rows g and g + 8 of the 16-row tile).
    int rows[kMTiles][2];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
        rows[mt][0] = m0 + warp_row0 + 16 * mt + lane / 4;
        rows[mt][1] = rows[mt][0] + 8;
    }
    const float scale_log2 = softmax_scale * kLog2eF;

    const int n_end = mask.key_end(m0, Tr::kBlockM);
    const int n_blocks = n_end > 0 ? (n_end + kBlockN - 1) / kBlockN : 0;

    load_tile_async<Tr::kBlockM, kHeadDim, kLd, Tr::kThreads>(sQ, q_bh, q_ss, m0, seqlen_q, headdim, vec);
    if (n_blocks > 0) {
        load_tile_async<kBlockN, kHeadDim, kLd, Tr::kThreads>(sK, k_bh, k_ss, 0, seqlen_k, headdim, vec);
        load_tile_async<kBlockN, kHeadDim, kLd, Tr::kThreads>(sV, v_bh, v_ss, 0, seqlen_k, headdim_v, vec);
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();

    unsigned q_frag[Tr::kQInRegs ? kMTiles : 1][Tr::kQInRegs ? kDSteps : 1][4];
    if constexpr (Tr::kQInRegs) {
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
            for (int kk = 0; kk < kDSteps; ++kk) load_a_frag<kLd>(q_frag[mt][kk], sQ, warp_row0 + 16 * mt, 16 * kk);
        }
    }

    float o[kMTiles][kOTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int c = 0; c < kOTiles; ++c) o[mt][c][0] = o[mt][c][1] = o[mt][c][2] = o[mt][c][3] = 0.0f;
    }
    FragmentSoftmax<kNTiles> softmax[kMTiles];

    for (int jb = 0; jb < n_blocks; ++jb) {
        const int n0 = jb * kBlockN;
        const T* sKj = sK + (jb % Tr::kStages) * kBlockN * kLd;
        const T* sVj = sV + (jb % Tr::kStages) * kBlockN * kLd;
        if (jb + 1 < n_blocks) {
            T* sKn = sK + ((jb + 1) % Tr::kStages) * kBlockN * kLd;
            T* sVn = sV + ((jb + 1) % Tr::kStages) * kBlockN * kLd;
            load_tile_async<kBlockN, kHeadDim, kLd, Tr::kThreads>(sKn, k_bh, k_ss, n0 + kBlockN, seqlen_k, headdim, vec);
            load_tile_async<kBlockN, kHeadDim, kLd, Tr::kThreads>(sVn, v_bh, v_ss, n0 + kBlockN, seqlen_k, headdim_v, vec);
        }
        cp_async_commit();
        cp_async_wait<1>();  // block jb has landed; block jb + 1 may still be in flight
        __syncthreads();

        // S = Q K^T for this warp's rows and the block's kBlockN keys.
        float s[kMTiles][kNTiles][4];
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
            for (int nt = 0; nt < kNTiles; ++nt) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.0f;
        }
#pragma unroll
        for (int kk = 0; kk < kDSteps; ++kk) {
            unsigned a[kMTiles][4];
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt) {
                if constexpr (Tr::kQInRegs) {
#pragma unroll
                    for (int i = 0; i < 4; ++i) a[mt][i] = q_frag[mt][kk][i];
                } else {
                    load_a_frag<kLd>(a[mt], sQ, warp_row0 + 16 * mt, 16 * kk);
                }
            }
#pragma unroll
            for (int np = 0; np < kNTiles / 2; ++np) {
                unsigned bk[4];
                load_bt_frags<kLd>(bk, sKj, 16 * np, 16 * kk);
#pragma unroll
                for (int mt = 0; mt < kMTiles; ++mt) {
                    mma_16816<T>(s[mt][2 * np], a[mt], bk);
                    mma_16816<T>(s[mt][2 * np + 1], a[mt], bk + 2);
                }
            }
        }

        // Scale into log2 units; mask only blocks that reach past the keys or across the diagonal.
        const bool needs_mask = n0 + kBlockN > seqlen_k || (kCausal && n0 + kBlockN - 1 > m0 + mask.offset);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
            for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    s[mt][nt][e] *= scale_log2;
                    if (needs_mask && !mask.visible(rows[mt][e / 2], n0 + 8 * nt + 2 * t + e % 2)) {
                        s[mt][nt][e] = Consts<float>::neg_inf();
                    }
                }
            }
            softmax[mt].step(s[mt], o[mt]);
        }

        // O += P V, with P rounded to T as the A operand straight from the score registers.
#pragma unroll
        for (int kk = 0; kk < kBlockN / 16; ++kk) {
            unsigned p[kMTiles][4];
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt) {
                p[mt][0] = pack2<T>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
                p[mt][1] = pack2<T>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
                p[mt][2] = pack2<T>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                p[mt][3] = pack2<T>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
            }
#pragma unroll
            for (int cp = 0; cp < kOTiles / 2; ++cp) {
                unsigned bv[4];
                load_b_frags_trans<kLd>(bv, sVj, 16 * kk, 16 * cp);
#pragma unroll
                for (int mt = 0; mt < kMTiles; ++mt) {
                    mma_16816<T>(o[mt][2 * cp], p[mt], bv);
                    mma_16816<T>(o[mt][2 * cp + 1], p[mt], bv + 2);
                }
            }
        }
        if constexpr (Tr::kStages == 2) {
            __syncthreads();  // every warp is done with stage jb before block jb + 2 overwrites it
        }
    }

#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
        float inv_l[2];
        float row_lse[2];
        softmax[mt].finish(inv_l, row_lse);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = rows[mt][r];
            if (row >= seqlen_q) continue;
            T* out_row = out + b * o_sb + static_cast<long long>(row) * o_ss + h * o_sh;
#pragma unroll
            for (int c = 0; c < kOTiles; ++c) {
                const int col = 8 * c + 2 * t;
                if (col < headdim_v) out_row[col] = from_acc<T>(o[mt][c][2 * r] * inv_l[r]);
                if (col + 1 < headdim_v) out_row[col + 1] = from_acc<T>(o[mt][c][2 * r + 1] * inv_l[r]);
            }
            if (t == 0) lse[bh * seqlen_q + row] = row_lse[r];
        }
    }
}

}  // namespace cupyflash
