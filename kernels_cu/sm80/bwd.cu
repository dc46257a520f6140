// Tensor-core backward (float16/bfloat16, sm_80+, head dims up to 256; float32 in bfloat16 parts,
// sm80_bwd_parts, and float64 on the float64 tensor cores, sm80_bwd_dmma, up to 128): after bwd_delta
// (common/bwd_rows.cu: delta = rowsum(dO * O), the dQ buffers zeroed),
//   sm80_bwd             one CTA per kBlockN keys of one (batch entry, kv head): dK and dV stay in
//                      registers while the CTA walks the query tiles of every query head of its GQA
//                      group (so the group's sum needs no per-head copies), and each tile's dQ share is
//                      added into a float32 buffer;
// and bwd_dq_convert (common/bwd_rows.cu): dQ = softmax_scale * buffer, rounded to T.
// Per query tile the CTA recomputes S^T = K Q^T and P^T = exp2(S^T * scale * LOG2E - LOG2E * lse)
// from the saved lse (no probability is stored between passes), then dP^T = V dO^T,
// dS^T = P^T * (dP^T - delta), dQ += dS K, dV += P^T dO and dK += dS^T Q: five matrix products.
// Phases and warp tiles: sm80/bwd_tile.cuh; which query tiles, and which need the mask: common/mask.cuh.
// With deterministic != 0 the CTAs of a (batch entry, kv head) add into each query tile of the buffer
// in a fixed key-tile order (ordered_sum.cuh), so dQ is bitwise reproducible; dK and dV always are
// (one CTA writes each element once).
#include "common/dtypes.cuh"
#include "common/mask.cuh"
#include "common/ordered_sum.cuh"
#include "common/params.cuh"
#include "common/scheduler.cuh"
#include "common/score_mod.cuh"
#include "common/sequence.cuh"
#include "common/tile_queue.cuh"
#include "fragment/epilogue.cuh"
#include "fragment/scores.cuh"
#include "fragment/softmax.cuh"
#include "sm80/bwd_tile.cuh"
#include "sm80/mma.cuh"
#include "sm80/operands.cuh"
#include "sm80/tile.cuh"

namespace cupyflash {

// Per-CTA values, in shared memory (the fragments need all 255 registers of the larger tiles).
struct Sm80BwdState {
    static constexpr int kRing = 32;
    Sequence seq;
    Mask mask;
    int b, hk, h0;            // batch entry, kv head, first query head of its group
    // (query head of the group, query tile) pairs: each head's query tiles ascending, heads in order.
    // Dense problems give every head the same tiles; block-sparse ones each head its own list.
    TileQueue<kRing> tiles;
};

// Grid: x = ceil(seqlen_k / kBlockN) * batch * heads_k, key tiles fastest (the ordered sum needs each
// CTA's predecessors launched before it). Dynamic shared memory: Sm80BwdTraits::kSmemBytes.
// dq_accum: dq_splits zeroed buffers (float32; float64 for float64 inputs) of rows of dq_ld >= headdim
// (even) elements; key tile j adds into buffer j % dq_splits. dq_turns: zeroed int32 (dq_splits, batch,
// heads, ceil(seqlen_q / kBlockM)), read only when deterministic != 0.
// kWide (float32 in bfloat16 parts, kTf32 for precision="tf32"; float64 on the float64 tensor cores):
// the products through Sm80Operands (warp_abt2_wide, warp_ab_wide), S^T summed as the forward sums S
// so that P^T is the forward's bitwise, probabilities in natural-log units from the float64 lse, and
// P^T, dS^T and the dQ buffers in the accumulators' type.
//
// ScoreFn and MaskFn: a score_mod's and a mask_mod's generated code (common/user_calls.cuh), or
// NoUserScore and NoUserMask; a score_mod whose buffers take gradients on 16-bit inputs only (kScatter).
template <typename T, int kHeadDim, int kBlockN, int kBlockM, int kStages, bool kScoreMod, bool kTf32,
          typename ScoreFn = NoUserScore, typename MaskFn = NoUserMask>
__device__ __forceinline__ void sm80_bwd_body(const BwdArgs& args) {
    using Tr = Sm80BwdTraits<T, kHeadDim, kBlockN, kBlockM, kStages>;
    constexpr bool kModified = kScoreMod || ScoreFn::kEnabled;
    // A score_mod whose buffers take gradients: added per element after the mask (buffer_gradients_cols),
    // summed per CTA in shared memory past the kernel's own (LocalBufferGrads) where the host gave room.
    constexpr bool kScatter = ScoreFn::kBufferGradients;
    using Scores = typename ScoresOf<ScoreFn, typename Sm80Scores<T>::type>::type;
    using KernelScores = typename IfType<kScatter, UserLog2ScoresLate<ScoreFn>, Scores>::type;
    static_assert(!kScatter || sizeof(T) == 2, "buffer gradients: the 16-bit kernels' (float32, float64: general)");
    using Ops = Sm80Operands<T, kTf32>;
    using Acc = typename Tr::Acc;
    using Lse = typename Tr::LseStore;
    constexpr bool kWide = Tr::kWide;
    using Sdp = typename Tr::SdpGrid;
    using Dq = typename Tr::DqGrid;
    using Dkv = typename Tr::DkvGrid;
    constexpr int kLd = Tr::kLd;
    constexpr int kLdP = Tr::kLdP;
    const AttnArgs& a = args.attn;

    extern __shared__ __align__(16) unsigned char smem_raw[];
    require_dynamic_smem<Tr::kSmemBytes>();
    require_sparse_tiles(a, kBlockM, kBlockN);
    T* sK = reinterpret_cast<T*>(smem_raw);
    T* sV = sK + Tr::kKeyTileElems;
    T* sQ = sV + Tr::kKeyTileElems;                 // kStages tiles of kBlockM rows
    T* sdO = sQ + kStages * Tr::kQueryTileElems;    // kStages tiles of kBlockM rows
    T* sP = sdO + kStages * Tr::kQueryTileElems;    // P^T, [key][query]
    T* sdS = sP + Tr::kProbTileElems;               // dS^T, [key][query]
    // kStages x kBlockM each: lse * LOG2E (16-bit) or lse (wide), and delta.
    Lse* sLse2 = reinterpret_cast<Lse*>(sdS + Tr::kProbTileElems);
    Acc* sDelta = reinterpret_cast<Acc*>(sLse2 + kStages * kBlockM);

    static_assert(sizeof(Sm80BwdState) <= Tr::kStateBytes, "the per-CTA state must fit its reserve");
    Sm80BwdState& st = *reinterpret_cast<Sm80BwdState*>(smem_raw + Tr::kSmemBytes - Tr::kStateBytes);
    LocalBufferGrads buffer_grads{reinterpret_cast<float*>(smem_raw + Tr::kSmemBytes), &args.score_grads};

    // Scheduler. Tiles are of keys, heads are kv heads. Key tiles launch last-first under the ordered
    // sum (see the turn below), first-first otherwise (under a causal mask the first ones work longest).
    const TileWork work = schedule_tile(ceil_div(a.seqlen_k, kBlockN), a.heads_k, args.deterministic != 0);
    const int n0 = work.tile * kBlockN;
    const int group = a.heads / a.heads_k;
    auto query_tiles_of = [&](const Mask& mask, int b, int h0, int g) {
        return query_tiles<kBlockM, kBlockN>(a, mask, BlockLayout(a, b, h0 + g), work.tile);
    };
    {
        const Sequence seq(a, work.b);
        if (n0 >= seq.seqlen_k) return;
        // The CTA's K and V tiles load while warp 0 builds the state.
        load_tile_async<kBlockN, kHeadDim, kLd, Tr::kThreads>(sK, head_rows<const T>(a.k, work.b, seq.k_start, work.h),
                                                              a.k.row_stride, n0, seq.seqlen_k, a.headdim, a.vec_loads != 0);
        load_tile_async<kBlockN, kHeadDim, kLd, Tr::kThreads>(sV, head_rows<const T>(a.v, work.b, seq.k_start, work.h),
                                                              a.v.row_stride, n0, seq.seqlen_k, a.headdim_v, a.vec_loads != 0);
        if constexpr (kScatter) buffer_grads.clear(threadIdx.x, Tr::kThreads);
        if (threadIdx.x < 32) {
            const Mask mask(a, seq);
            const int h0 = work.h * group;
            if (threadIdx.x == 0) {
                st.seq = seq;
                st.mask = mask;
                st.b = work.b;
                st.hk = work.h;
                st.h0 = h0;
            }
            st.tiles.start(group, [&](int g) { return query_tiles_of(mask, work.b, h0, g); });
        }
    }
    __syncthreads();
    const bool vec = a.vec_loads != 0;
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;

    // Main loop. Loads query tile `entry` of query head h into buffer `stage`.
    auto load_query_tile = [&](int h, int entry, int stage) {
        const int m0 = entry_tile(entry) * kBlockM;
        load_tile_async<kBlockM, kHeadDim, kLd, Tr::kThreads>(sQ + stage * Tr::kQueryTileElems,
                                                              head_rows<const T>(a.q, st.b, st.seq.q_start, h),
                                                              a.q.row_stride, m0, st.seq.seqlen_q, a.headdim, vec);
        load_tile_async<kBlockM, kHeadDim, kLd, Tr::kThreads>(sdO + stage * Tr::kQueryTileElems,
                                                              head_rows<const T>(args.dout, st.b, st.seq.q_start, h),
                                                              args.dout.row_stride, m0, st.seq.seqlen_q, a.headdim_v, vec);
        const Lse* lse = static_cast<const Lse*>(args.lse.ptr) + rows_index(args.lse, st.b, h, st.seq.q_start) + m0;
        const Acc* delta = static_cast<const Acc*>(args.delta.ptr) + rows_index(args.delta, st.b, h, st.seq.q_start) + m0;
        for (int i = threadIdx.x; i < kBlockM; i += Tr::kThreads) {
            const bool in_range = m0 + i < st.seq.seqlen_q;
            // A row with no probability mass (a padding row, or lse = -inf: a row that saw no key) gets
            // +inf, so that every exp2(s - lse) of it is 0 without a test per element; NaN stays NaN.
            // (wide: -inf, for which recompute_prob gives 0.)
            const Lse l = in_range ? lse[i] : Consts<Lse>::neg_inf();
            if constexpr (kWide) {
                sLse2[stage * kBlockM + i] = l;
            } else {
                sLse2[stage * kBlockM + i] = l == Consts<float>::neg_inf() ? -Consts<float>::neg_inf() : l * kLog2eF;
            }
            sDelta[stage * kBlockM + i] = in_range ? delta[i] : Acc(0);
        }
    };

    if (st.tiles.segment_at(0) >= 0) load_query_tile(st.h0 + st.tiles.segment_at(0), st.tiles.entry_at(0), 0);
    cp_async_commit();

    Acc dk_acc[Dkv::kMTiles][Dkv::kNTiles][4];
    Acc dv_acc[Dkv::kMTiles][Dkv::kNTiles][4];
#pragma unroll
    for (int mt = 0; mt < Dkv::kMTiles; ++mt) {
#pragma unroll
        for (int nt = 0; nt < Dkv::kNTiles; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) dk_acc[mt][nt][e] = dv_acc[mt][nt][e] = Acc(0);
        }
    }

    for (int it = 0; st.tiles.segment_at(it) >= 0; ++it) {
        const int stage = kStages == 2 ? it % 2 : 0;
        const int b = st.b;
        const int h = st.h0 + st.tiles.segment_at(it);
        const int entry = st.tiles.entry_at(it);
        const int m0 = entry_tile(entry) * kBlockM;
        const bool partial = entry_partial(entry);
        cp_async_wait<0>();
        // Tile `it` has landed, and every warp is done with iteration it - 1: its P^T/dS^T and, with
        // two stages, the buffer that the next tile now loads into.
        __syncthreads();
        const bool has_next = st.tiles.segment_at(it + 1) >= 0;
        if (kStages == 2 && has_next) load_query_tile(st.h0 + st.tiles.segment_at(it + 1), st.tiles.entry_at(it + 1), (it + 1) % 2);
        cp_async_commit();
        if (warp == 0) st.tiles.advance(it, group, [&](int gg) { return query_tiles_of(st.mask, st.b, st.h0, gg); });
        const BlockLayout layout(a, b, h);
        const KernelScores scores(a, st.seq, b, h);
        const T* sQs = sQ + stage * Tr::kQueryTileElems;
        const T* sdOs = sdO + stage * Tr::kQueryTileElems;
        const Lse* lse2 = sLse2 + stage * kBlockM;
        const Acc* delta_s = sDelta + stage * kBlockM;
        const bool needs_mask = partial || !st.mask.tile_is_full(m0, kBlockM, n0, kBlockN);

        // Phase 1: S^T and dP^T for the warp's keys x queries, then P^T and dS^T, rounded to T.
#pragma unroll
        for (int pass = 0; pass < Tr::Passes::kSdp; ++pass) {
            const int r0 = Sdp::row0(warp), c0 = pass * (kBlockM / Tr::Passes::kSdp) + Sdp::col0(warp);
            // sd[0]: S^T, then P^T; sd[1]: dP^T, then dS^T.
            Acc sd[2][Sdp::kMTiles][Sdp::kNTiles][4];
            if constexpr (kWide) {
                warp_abt2_wide<Ops, Sdp::kMTiles, Sdp::kNTiles, kHeadDim, kLd>(sd, sK, sQs, sV, sdOs, r0, c0);
            } else {
                warp_abt2<Sdp::kMTiles, Sdp::kNTiles, kHeadDim, kLd>(sd, sK, sQs, sV, sdOs, r0, c0);
            }
            auto& p = sd[0];
            auto& ds = sd[1];
            // The rows' lse (16-bit: times LOG2E) and delta, by pairs of this thread's query columns.
            using LsePair = typename VecOf<Lse>::type2;
            using AccPair = typename VecOf<Acc>::type2;
            const auto lse2_pair = [&](int nt) { return *reinterpret_cast<const LsePair*>(lse2 + c0 + 8 * nt + 2 * t); };
            const auto delta_pair = [&](int nt) { return *reinterpret_cast<const AccPair*>(delta_s + c0 + 8 * nt + 2 * t); };
            const auto gradients = [&](const auto& sc) {
                if constexpr (kWide) {
                    probabilities_cols_natural<kModified>(p, ds, sc, lse2_pair, delta_pair, n0 + r0 + g, m0 + c0, 2 * t);
                } else {
                    probabilities_cols<kModified>(p, ds, sc, lse2_pair, delta_pair, n0 + r0 + g, m0 + c0, 2 * t);
                }
                if (needs_mask) {
                    mask_tile_cols(p, st.mask, layout, a, n0 + r0 + g, m0 + c0, 2 * t, partial, UserMaskAt<MaskFn>(a, b, h));
                }
                score_gradients<kModified>(ds, p, delta_pair);
                if constexpr (kScatter) buffer_gradients_cols(ds, sc, buffer_grads, n0 + r0 + g, m0 + c0, 2 * t);
            };
            if constexpr (FreezesScores<ScoreFn>::value) {
                // The warp's keys and queries: a tile over which the score_mod's parts that read the
                // positions hold one value takes them once (FrozenScores), and its buffer gradients are
                // the sum of its ds_mod, scattered once per thread.
                const int q0 = m0 + c0, k0 = n0 + r0;
                if (scores.uniform(q0, q0 + 8 * Sdp::kNTiles - 1, k0, k0 + 16 * Sdp::kMTiles - 1)) {
                    gradients(FrozenScores<KernelScores>(scores, q0, k0));
                } else {
                    gradients(scores);
                }
            } else {
                gradients(scores);
            }
#pragma unroll
            for (int mt = 0; mt < Sdp::kMTiles; ++mt) {
#pragma unroll
                for (int nt = 0; nt < Sdp::kNTiles; ++nt) {
                    const int col = c0 + 8 * nt + 2 * t;
#pragma unroll
                    for (int r = 0; r < 2; ++r) {
                        const int row = r0 + 16 * mt + g + 8 * r;
                        if constexpr (kWide) {
                            *reinterpret_cast<AccPair*>(sP + row * kLdP + col) = AccPair{p[mt][nt][2 * r], p[mt][nt][2 * r + 1]};
                            *reinterpret_cast<AccPair*>(sdS + row * kLdP + col) = AccPair{ds[mt][nt][2 * r], ds[mt][nt][2 * r + 1]};
                        } else {
                            *reinterpret_cast<unsigned*>(sP + row * kLdP + col) = pack2<T>(p[mt][nt][2 * r], p[mt][nt][2 * r + 1]);
                            *reinterpret_cast<unsigned*>(sdS + row * kLdP + col) =
                                pack2<T>(ds[mt][nt][2 * r], ds[mt][nt][2 * r + 1]);
                        }
                    }
                }
            }
        }
        __syncthreads();

        // Phase 2: this tile's dQ share, dS K over the CTA's keys, added into the float32 buffer;
        // phase 3: dV += P^T dO and dK += dS^T Q for the warp's keys x columns.
        // Ordered sum: the key tiles that see query tile m0 / kBlockM add, per buffer (tile % dq_splits),
        // last first, and the CTAs are launched in that order too, so a CTA only waits for CTAs launched
        // before it. Under a causal mask a higher key tile starts nearer the diagonal and reaches each
        // query tile kBlockN / kBlockM or more iterations earlier than a lower one, so the turns come
        // in the order the CTAs arrive and cost almost no wait. Without a mask they all reach the first
        // tile together and pass its turn down a chain of one hand-over per key tile; splitting the sum
        // over dq_splits buffers shortens that chain dq_splits times.
        const int split = work.tile % args.dq_splits;
        int* turn = nullptr;
        int my_turn = 0;
        if (args.deterministic) {
            const int q_tile = m0 / kBlockM;
            turn = dq_turn_counter<kBlockM>(args, b, h, q_tile, split);
            my_turn = later_key_tiles<kBlockM, kBlockN>(a, st.mask, layout, q_tile, work.tile, args.dq_splits);
        }
        Acc* dq_rows = static_cast<Acc*>(args.dq_accum.ptr) + split * args.dq_split_stride +
                       (rows_index(args.dq_accum, b, h, st.seq.q_start) + m0) * static_cast<long long>(args.dq_ld);
        auto dq_share = [&](Acc (&dq_part)[Dq::kMTiles][Dq::kNTiles][4], int r0, int c0) {
#pragma unroll
            for (int mt = 0; mt < Dq::kMTiles; ++mt) {
#pragma unroll
                for (int nt = 0; nt < Dq::kNTiles; ++nt) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) dq_part[mt][nt][e] = Acc(0);
                }
            }
            if constexpr (kWide) {
                warp_ab_wide<Ops, true, Dq::kMTiles, Dq::kNTiles, kBlockN, kLdP, kLd>(dq_part, sdS, r0, sK, c0);
            } else {
                warp_ab<true, Dq::kMTiles, Dq::kNTiles, kBlockN, kLdP, kLd>(dq_part, sdS, r0, sK, c0);
            }
        };
        auto add_dq_share = [&](const Acc (&dq_part)[Dq::kMTiles][Dq::kNTiles][4], int r0, int c0) {
#pragma unroll
            for (int mt = 0; mt < Dq::kMTiles; ++mt) {
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const int row = r0 + 16 * mt + g + 8 * r;
                    if (m0 + row >= st.seq.seqlen_q) continue;
#pragma unroll
                    for (int nt = 0; nt < Dq::kNTiles; ++nt) {
                        const int col = c0 + 8 * nt + 2 * t;  // even, and dq_ld is even
                        if (col < args.dq_ld) {
                            Acc* dst = dq_rows + static_cast<long long>(row) * args.dq_ld + col;
                            if constexpr (sizeof(Acc) == 8) {
                                atomicAdd(dst, dq_part[mt][nt][2 * r]);
                                atomicAdd(dst + 1, dq_part[mt][nt][2 * r + 1]);
                            } else {
                                reduce_add_f32x2(dst, dq_part[mt][nt][2 * r], dq_part[mt][nt][2 * r + 1]);
                            }
                        }
                    }
                }
            }
        };
        auto dkdv_update = [&]() {
            const int r0 = Dkv::row0(warp), c0 = Dkv::col0(warp);
            if constexpr (kWide) {
                warp_ab_wide<Ops, false, Dkv::kMTiles, Dkv::kNTiles, kBlockM, kLdP, kLd>(dv_acc, sP, r0, sdOs, c0);
                warp_ab_wide<Ops, false, Dkv::kMTiles, Dkv::kNTiles, kBlockM, kLdP, kLd>(dk_acc, sdS, r0, sQs, c0);
            } else {
                warp_ab<false, Dkv::kMTiles, Dkv::kNTiles, kBlockM, kLdP, kLd>(dv_acc, sP, r0, sdOs, c0);
                warp_ab<false, Dkv::kMTiles, Dkv::kNTiles, kBlockM, kLdP, kLd>(dk_acc, sdS, r0, sQs, c0);
            }
        };
        if constexpr (Tr::Passes::kDq == 1) {
            // The share stays in registers through phase 3, so under the ordered sum the CTA before this
            // one has had all of phase 3 to pass the turn on before this CTA asks for it.
            const int r0 = Dq::row0(warp), c0 = Dq::col0(warp);
            Acc dq_part[Dq::kMTiles][Dq::kNTiles][4];
            dq_share(dq_part, r0, c0);
            dkdv_update();
            if (turn != nullptr) wait_turn(turn, my_turn);
            add_dq_share(dq_part, r0, c0);
            if (turn != nullptr) pass_turn(turn);
        } else {
            // Column passes (see Sm80BwdPasses): each share is added as soon as it is computed.
#pragma unroll
            for (int pass = 0; pass < Tr::Passes::kDq; ++pass) {
                const int r0 = Dq::row0(warp), c0 = pass * (kHeadDim / Tr::Passes::kDq) + Dq::col0(warp);
                Acc dq_part[Dq::kMTiles][Dq::kNTiles][4];
                dq_share(dq_part, r0, c0);
                if (turn != nullptr && pass == 0) wait_turn(turn, my_turn);
                add_dq_share(dq_part, r0, c0);
            }
            if (turn != nullptr) pass_turn(turn);
            dkdv_update();
        }

        if (kStages == 1 && has_next) {
            __syncthreads();  // every warp is done with the only buffer before the next tile loads into it
            load_query_tile(st.h0 + st.tiles.segment_at(it + 1), st.tiles.entry_at(it + 1), 0);
            cp_async_commit();
        }
    }
    cp_async_wait<0>();
    if constexpr (kScatter) {
        buffer_grads.commit();
        __syncthreads();  // every warp's adds are in
        buffer_grads.flush(threadIdx.x, Tr::kThreads);
    }

    // Epilogue: dK = softmax_scale * dS^T Q (the scale of S = scale * Q K^T, applied once here), dV.
    const int r0 = n0 + Dkv::row0(warp), c0 = Dkv::col0(warp);
    store_fragments_wide<T>(head_rows<T>(args.dk, st.b, st.seq.k_start, st.hk), args.dk.row_stride, r0, st.seq.seqlen_k, c0,
                            a.headdim, dk_acc, static_cast<Acc>(a.softmax_scale));
    store_fragments_wide<T>(head_rows<T>(args.dv, st.b, st.seq.k_start, st.hk), args.dv.row_stride, r0, st.seq.seqlen_k, c0,
                            a.headdim_v, dv_acc, Acc(1));
}

template <typename T, int kHeadDim, int kBlockN, int kBlockM, int kStages, bool kScoreMod, typename ScoreFn = NoUserScore,
          typename MaskFn = NoUserMask>
__global__ void __launch_bounds__(256, 1)
sm80_bwd(const CUPYFLASH_GRID_CONSTANT BwdArgs args) {
    sm80_bwd_body<T, kHeadDim, kBlockN, kBlockM, kStages, kScoreMod, false, ScoreFn, MaskFn>(args);
}

// float32 in bfloat16 parts (kTf32: precision="tf32", two parts), the backward of sm80_fwd_parts: a
// template of its own for its own tile table (cupyflash/_families/sm80.py).
template <typename T, int kHeadDim, int kBlockN, int kBlockM, int kStages, bool kScoreMod, bool kTf32,
          typename ScoreFn = NoUserScore, typename MaskFn = NoUserMask>
__global__ void __launch_bounds__(256, 1)
sm80_bwd_parts(const CUPYFLASH_GRID_CONSTANT BwdArgs args) {
    static_assert(sizeof(T) == 4, "float32 only");
    sm80_bwd_body<T, kHeadDim, kBlockN, kBlockM, kStages, kScoreMod, kTf32, ScoreFn, MaskFn>(args);
}

// float64 on the float64 tensor cores, the backward of sm80_fwd_dmma.
template <typename T, int kHeadDim, int kBlockN, int kBlockM, int kStages, bool kScoreMod, typename ScoreFn = NoUserScore,
          typename MaskFn = NoUserMask>
__global__ void __launch_bounds__(256, 1)
sm80_bwd_dmma(const CUPYFLASH_GRID_CONSTANT BwdArgs args) {
    static_assert(sizeof(T) == 8, "float64 only");
    sm80_bwd_body<T, kHeadDim, kBlockN, kBlockM, kStages, kScoreMod, false, ScoreFn, MaskFn>(args);
}

}  // namespace cupyflash
