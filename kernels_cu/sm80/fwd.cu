// Tensor-core forward (float16/bfloat16, float32 in bfloat16 parts: sm80_fwd_parts, float64 on the float64
// tensor cores: sm80_fwd_dmma; sm_80+): one CTA per 128 query rows (float64: 64) of one (batch entry,
// head), looping over the key tiles those rows see with an online softmax.
//
// Scheduler: schedule_tile (scheduler.cuh), the query tiles with the most keys first. Main loop, per key
// tile: S = Q K^T with mma.sync (Q from registers or shared memory, K fragments from shared memory:
// sm80/operands.cuh), the score modifications (kScoreMod: softcap, ALiBi), the mask on the tiles that need it (common/mask.cuh), the online
// softmax in registers, then O += P V with P converted in registers into the A operand and V fragments
// by ldmatrix.trans. K/V tiles are multi-buffered with cp.async (Sm80FwdTraits::kStages): tile j + 1 loads
// while tile j is computed; with one stage (float64 at head dim 128), K tile j + 1 loads while the
// softmax and P V of tile j run and V tile j + 1 while S of tile j + 1 does. Epilogue: O / l and the log-sum-exp (epilogue.cuh). The per-CTA values
// (sequence, mask, the queue of key tiles) live in shared memory (Sm80FwdState): the fragments need all
// 255 registers of the larger tiles.
//
// Grid: x = query tiles * batch * heads. Dynamic shared memory: Sm80FwdTraits::kSmemBytes.
#include "common/dtypes.cuh"
#include "common/mask.cuh"
#include "common/params.cuh"
#include "common/scheduler.cuh"
#include "common/score_mod.cuh"
#include "common/sequence.cuh"
#include "common/tile_queue.cuh"
#include "fragment/epilogue.cuh"
#include "fragment/operand.cuh"
#include "fragment/scores.cuh"
#include "fragment/softmax.cuh"
#include "sm80/mma.cuh"
#include "sm80/operands.cuh"
#include "sm80/tile.cuh"

namespace cupyflash {

// Per-CTA values, in shared memory. Scores: Sm80Scores.
template <typename Scores>
struct Sm80FwdState {
    static constexpr int kRing = 32;
    Sequence seq;
    Mask mask;
    BlockLayout layout;
    Scores scores;
    const void* k_rows;      // row 0 of this (batch entry, kv head) of k and of v
    const void* v_rows;
    int b, h;
    TileQueue<kRing> tiles;  // key tiles, one segment
};

// ScoreFn and MaskFn: a score_mod's and a mask_mod's generated code (common/user_calls.cuh), or
// NoUserScore and NoUserMask. A score_mod takes the modified path (kModified). kMaxScore
// (return_max_score): the softmax also keeps each row's largest score, which the epilogue records.
template <typename T, int kHeadDim, int kBlockN, int kMTiles, bool kScoreMod, bool kTf32, bool kMaxScore,
          typename ScoreFn = NoUserScore, typename MaskFn = NoUserMask>
struct Sm80FwdMainloop {
    using Tr = Sm80FwdTraits<T, kHeadDim, kBlockN, kMTiles>;
    static constexpr bool kModified = kScoreMod || ScoreFn::kEnabled;
    using Ops = typename Sm80FwdOperands<T, kTf32>::type;
    using Stored = typename Ops::Stored;  // the tiles' element: T, or float32's bfloat16 planes
    static_assert(Ops::kPlanes == Tr::kPlanes, "the traits size the operands' planes");
    // float32 and float64 keep their scores in natural-log units, at their accuracy (fragment/softmax.cuh).
    static constexpr bool kNatural = sizeof(T) >= 4;
    using Acc = typename Ops::Acc;
    using Scores = typename ScoresOf<ScoreFn, typename Sm80Scores<T>::type, true>::type;
    using State = Sm80FwdState<Scores>;
    using Softmax = FragmentSoftmax<kBlockN / 8, kNatural, Acc, kMaxScore>;
    static constexpr int kLd = Tr::kLd;
    static constexpr int kLdV = Tr::kLdV;
    static constexpr int kNTiles = kBlockN / 8;   // score n-tiles per m-tile
    static constexpr int kOTiles = kHeadDim / 8;  // output n-tiles per m-tile
    static constexpr int kDSteps = kHeadDim / Ops::kK;  // k-steps of q.k
    // float32 rolls them (its split operands and sums spilled at head dim 128, and rolled ran as fast).
    static constexpr int kDUnroll = Ops::kSmallSum ? 1 : Ops::kSplitSums ? 2 : kDSteps;
    // Q stays in registers where the traits allow it, except beside the score modifications: tanhf's
    // temporaries need the 32 registers it would take (the d64 tile spilled 244 bytes).
    static constexpr bool kQInRegs = Tr::kQInRegs && !kModified;
    // Masked tiles test elements against per-row key intervals (cheaper than Mask::visible), except in
    // the largest tile, 256 columns by 64 keys, where the intervals' registers spilled 16-24 bytes.
    static constexpr bool kRowIntervals = kHeadDim * kBlockN < 256 * 64;
    static_assert(sizeof(State) <= Tr::kStateBytes, "the per-CTA state must fit its reserve");

    // Warp 0: the state of the CTA's tile (query tile qt of batch entry b, head h).
    __device__ __forceinline__ static void init_state(const AttnArgs& a, const Sequence& seq, int b, int h, int qt,
                                                      State& st) {
        const Mask mask(a, seq);
        const BlockLayout layout(a, b, h);
        if (threadIdx.x == 0) {
            st.seq = seq;
            st.mask = mask;
            st.layout = layout;
            st.scores = Scores(a, seq, b, h);
            st.b = b;
            st.h = h;
            st.k_rows = head_rows<const Stored>(a.k, b, seq.k_start, kv_head(h, a.heads, a.heads_k));
            st.v_rows = head_rows<const Stored>(a.v, b, seq.k_start, kv_head(h, a.heads, a.heads_k));
        }
        st.tiles.start(1, [&](int) { return key_tiles<Tr::kBlockM, kBlockN>(a, mask, layout, qt); });
    }

    // Leaves O (unnormalized) and the row statistics of the CTA's rows in o and softmax.
    __device__ __forceinline__ static void run(const AttnArgs& a, State& st, int m0, unsigned char* smem,
                                               Acc (&o)[kMTiles][kOTiles][4], Softmax (&softmax)[kMTiles]) {
        // Q, then kStages K tiles and kStages V tiles, each of Tr::kPlanes planes.
        Stored* sQ = reinterpret_cast<Stored*>(smem);
        Stored* sK = sQ + Tr::kPlanes * Tr::kQPlane;
        Stored* sV = sK + Tr::kStages * Tr::kPlanes * Tr::kKPlane;
        const bool vec = a.vec_loads != 0;
        // Row 0 of this (batch entry, kv head) and key tile `entry`, staged into shared memory; plane p of
        // head h is head p * heads_k + h (kernels_cu/sm80/planes.cu).
        auto load_k = [&](int entry, int stage) {
#pragma unroll
            for (int p = 0; p < Tr::kPlanes; ++p) {
                load_tile_async<kBlockN, kHeadDim, kLd, Tr::kThreads>(
                    sK + (stage * Tr::kPlanes + p) * Tr::kKPlane,
                    static_cast<const Stored*>(st.k_rows) + p * static_cast<long long>(a.heads_k) * a.k.head_stride,
                    a.k.row_stride, entry_tile(entry) * kBlockN, st.seq.seqlen_k, a.headdim, vec);
            }
        };
        auto load_v = [&](int entry, int stage) {
#pragma unroll
            for (int p = 0; p < Tr::kPlanes; ++p) {
                load_tile_async<kBlockN, kHeadDim, kLdV, Tr::kThreads>(
                    sV + (stage * Tr::kPlanes + p) * Tr::kVPlane,
                    static_cast<const Stored*>(st.v_rows) + p * static_cast<long long>(a.heads_k) * a.v.head_stride,
                    a.v.row_stride, entry_tile(entry) * kBlockN, st.seq.seqlen_k, a.headdim_v, vec);
            }
        };

        const int warp = threadIdx.x / 32;
        const int lane = threadIdx.x % 32;
        const int t = lane % 4;
        const int warp_row0 = 16 * kMTiles * warp;  // first row of this warp within the CTA's tile
        // This thread's rows are row_g + 16 mt + 8 r (m-tile mt, half r: rows g and g + 8 of the m-tile).
        const int row_g = m0 + warp_row0 + lane / 4;

        // The Q tile is in flight (the kernel's prologue issued it); the first K/V tile joins its group
        // (one stage: the first K tile; the first V tile, its own group, may stay in flight).
        if (st.tiles.segment_at(0) >= 0) {
            const int first = st.tiles.entry_at(0);
            load_k(first, 0);
            if constexpr (Tr::kStages == 1) cp_async_commit();
            load_v(first, 0);
        }
        cp_async_commit();
        cp_async_wait<Tr::kStages == 1 ? 1 : 0>();
        __syncthreads();

        typename Ops::A q_frag[kQInRegs ? kMTiles : 1][kQInRegs ? kDSteps : 1];
        if constexpr (kQInRegs) {
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
                for (int kk = 0; kk < kDSteps; ++kk) Ops::template load_q<kLd, Tr::kQPlane>(q_frag[mt][kk], sQ, warp_row0 + 16 * mt, Ops::kK * kk);
            }
        }

#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
            for (int c = 0; c < kOTiles; ++c) o[mt][c][0] = o[mt][c][1] = o[mt][c][2] = o[mt][c][3] = 0.0f;
        }

        for (int it = 0; st.tiles.segment_at(it) >= 0; ++it) {
            const int entry = st.tiles.entry_at(it);
            const int n0 = entry_tile(entry) * kBlockN;
            const bool partial = entry_partial(entry);
            const Stored* sKj = sK + (it % Tr::kStages) * Tr::kPlanes * Tr::kKPlane;
            const Stored* sVj = sV + (it % Tr::kStages) * Tr::kPlanes * Tr::kVPlane;
            const bool next = st.tiles.segment_at(it + 1) >= 0;
            if constexpr (Tr::kStages > 1) {
                if (next) {
                    const int entry_next = st.tiles.entry_at(it + 1);
                    load_k(entry_next, (it + 1) % Tr::kStages);
                    load_v(entry_next, (it + 1) % Tr::kStages);
                }
                cp_async_commit();
                cp_async_wait<1>();  // tile it has landed; tile it + 1 may still be in flight
                __syncthreads();
            }
            if (warp == 0) {
                st.tiles.advance(it, 1, [&](int) {
                    return key_tiles<Tr::kBlockM, kBlockN>(a, st.mask, st.layout, m0 / Tr::kBlockM);
                });
            }

            // S = Q K^T for this warp's rows and the tile's kBlockN keys. float32 and float64 sum each k-step
            // from zero (Ops::kSplitSums), float32 its small products in s_small beside s, added once the
            // k-steps are done (Ops::kSmallSum; sm80/operands.cuh).
            Acc s[kMTiles][kNTiles][4];
            Acc s_small[Ops::kSmallSum ? kMTiles : 1][Ops::kSmallSum ? kNTiles : 1][4];
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
                for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        s[mt][nt][i] = 0.0f;
                        if constexpr (Ops::kSmallSum) s_small[mt][nt][i] = 0.0f;
                    }
                }
            }
#pragma unroll (kDUnroll)
            for (int kk = 0; kk < kDSteps; ++kk) {
                typename Ops::A af[kMTiles];
#pragma unroll
                for (int mt = 0; mt < kMTiles; ++mt) {
                    if constexpr (kQInRegs) {
                        af[mt] = q_frag[mt][kk];
                    } else {
                        Ops::template load_q<kLd, Tr::kQPlane>(af[mt], sQ, warp_row0 + 16 * mt, Ops::kK * kk);
                    }
                }
#pragma unroll
                for (int np = 0; np < kNTiles / 2; ++np) {
                    typename Ops::B2 bk;
                    Ops::template load_k<kLd, Tr::kKPlane>(bk, sKj, 16 * np, Ops::kK * kk);
#pragma unroll
                    for (int mt = 0; mt < kMTiles; ++mt) {
                        if constexpr (Ops::kSmallSum) {
                            Ops::mma_rn(s[mt][2 * np], s_small[mt][2 * np], af[mt], bk, 0);
                            Ops::mma_rn(s[mt][2 * np + 1], s_small[mt][2 * np + 1], af[mt], bk, 1);
                        } else if constexpr (Ops::kSplitSums) {
                            Ops::mma_rn(s[mt][2 * np], af[mt], bk, 0);
                            Ops::mma_rn(s[mt][2 * np + 1], af[mt], bk, 1);
                        } else {
                            Ops::mma(s[mt][2 * np], af[mt], bk, 0);
                            Ops::mma(s[mt][2 * np + 1], af[mt], bk, 1);
                        }
                    }
                }
            }
            if constexpr (Ops::kSmallSum) {
#pragma unroll
                for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
                    for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
                        for (int i = 0; i < 4; ++i) s[mt][nt][i] += s_small[mt][nt][i];
                    }
                }
            }

            // One stage: K tile it + 1 loads into the buffer every warp is now done with, during the
            // softmax and P V (its V tile landed meanwhile, or lands before P V reads it).
            if constexpr (Tr::kStages == 1) {
                __syncthreads();
                if (next) load_k(st.tiles.entry_at(it + 1), 0);
                cp_async_commit();
                cp_async_wait<1>();  // V tile it has landed (K tile it + 1 may be in flight)
                __syncthreads();
            }

            // Into log2 units (with the score modifications), then the mask where the tile needs one: a
            // uniform branch of its own, which keeps the unmasked tiles free of the mask's predicates.
            const auto row_of = [&](int mt, int r) { return row_g + 16 * mt + 8 * r; };
            const auto modify = [&](const auto& scores) {
                if constexpr (kNatural) {
                    modify_rows_natural<kModified>(s, scores, row_of, n0, 2 * t);
                } else {
                    modify_rows<kModified, false>(s, scores, row_of, [&](int, int) { return scores.bias_log2; }, n0, 2 * t);
                }
            };
            if constexpr (FreezesScores<ScoreFn>::value) {
                // The warp's rows: a tile over which the score_mod's parts that read the positions hold one
                // value takes them once (FrozenScores).
                const int r0 = m0 + warp_row0;
                if (st.scores.uniform(r0, r0 + 16 * kMTiles - 1, n0, n0 + kBlockN - 1)) {
                    modify(FrozenScores<Scores>(st.scores, r0, n0));
                } else {
                    modify(st.scores);
                }
            } else {
                modify(st.scores);
            }
            if (partial || !st.mask.tile_is_full(m0, Tr::kBlockM, n0, kBlockN)) {
                mask_tile_rows<kRowIntervals>(s, st.mask, st.layout, a, row_of, n0, 2 * t, partial, Mask::kCutsBoth,
                                              UserMaskAt<MaskFn>(a, st.b, st.h));
            }
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt) softmax[mt].step(s[mt], o[mt]);

            // O += P V, with P as the A operand straight from the score registers. float32 and float64
            // (Ops::kSplitSums): per 16 (float64: 8) columns of O, the tile's products summed from zero in
            // z (float32: Ops::mma's two sums in one, the small products of each k-step first), then added
            // to O (sm80/operands.cuh).
            if constexpr (Ops::kSmallSum) {
                constexpr int kKSteps = kBlockN / Ops::kK;
                typename Ops::A p[kMTiles][kKSteps];
#pragma unroll
                for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
                    for (int kk = 0; kk < kKSteps; ++kk) Ops::pack_p(p[mt][kk], s[mt], kk);
                }
#pragma unroll
                for (int cp = 0; cp < kOTiles / 2; ++cp) {
                    Acc z[kMTiles][2][4];
#pragma unroll
                    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
                        for (int i = 0; i < 8; ++i) z[mt][i / 4][i % 4] = 0.0f;
                    }
#pragma unroll
                    for (int kk = 0; kk < kKSteps; ++kk) {
                        typename Ops::B2 bv;
                        Ops::template load_v<kLdV, Tr::kVPlane>(bv, sVj, Ops::kK * kk, 16 * cp);
#pragma unroll
                        for (int mt = 0; mt < kMTiles; ++mt) {
                            Ops::mma(z[mt][0], z[mt][0], p[mt][kk], bv, 0);
                            Ops::mma(z[mt][1], z[mt][1], p[mt][kk], bv, 1);
                        }
                    }
#pragma unroll
                    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
                        for (int i = 0; i < 8; ++i) o[mt][2 * cp + i / 4][i % 4] += z[mt][i / 4][i % 4];
                    }
                }
            } else if constexpr (Ops::kSplitSums) {
                // float64: one 8-column n-tile of O at a time (a z of four doubles: two n-tiles' eight
                // spilled 540 bytes at head dim 128), its half of each V fragment (the other's loads are
                // dead and not issued).
                constexpr int kKSteps = kBlockN / Ops::kK;
#pragma unroll
                for (int c = 0; c < kOTiles; ++c) {
                    Acc z[kMTiles][4];
#pragma unroll
                    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
                        for (int i = 0; i < 4; ++i) z[mt][i] = 0.0;
                    }
#pragma unroll
                    for (int kk = 0; kk < kKSteps; ++kk) {
                        typename Ops::B2 bv;
                        Ops::template load_v<kLdV, Tr::kVPlane>(bv, sVj, Ops::kK * kk, 8 * c);
#pragma unroll
                        for (int mt = 0; mt < kMTiles; ++mt) {
                            typename Ops::A pa;
                            Ops::pack_p(pa, s[mt], kk);
                            Ops::mma(z[mt], pa, bv, 0);
                        }
                    }
#pragma unroll
                    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
                        for (int i = 0; i < 4; ++i) o[mt][c][i] += z[mt][i];
                    }
                    asm volatile("" ::: "memory");
                }
            } else {
#pragma unroll
                for (int kk = 0; kk < kBlockN / Ops::kK; ++kk) {
                    typename Ops::A p[kMTiles];
#pragma unroll
                    for (int mt = 0; mt < kMTiles; ++mt) Ops::pack_p(p[mt], s[mt], kk);
#pragma unroll
                    for (int cp = 0; cp < kOTiles / 2; ++cp) {
                        typename Ops::B2 bv;
                        Ops::template load_v<kLdV, Tr::kVPlane>(bv, sVj, Ops::kK * kk, 16 * cp);
#pragma unroll
                        for (int mt = 0; mt < kMTiles; ++mt) {
                            Ops::mma(o[mt][2 * cp], p[mt], bv, 0);
                            Ops::mma(o[mt][2 * cp + 1], p[mt], bv, 1);
                        }
                    }
                }
            }
            if constexpr (Tr::kStages == 2) {
                __syncthreads();  // every warp is done with stage it before tile it + 2 overwrites it
            } else if constexpr (Tr::kStages == 1) {
                __syncthreads();  // every warp is done with V tile it
                if (next) load_v(st.tiles.entry_at(it + 1), 0);
                cp_async_commit();
                cp_async_wait<1>();  // K tile it + 1 has landed (V tile it + 1 may be in flight)
                __syncthreads();
            }
        }
    }
};

template <typename T, int kHeadDim, int kBlockN, int kMTiles, bool kScoreMod, bool kTf32, bool kMaxScore,
          typename ScoreFn = NoUserScore, typename MaskFn = NoUserMask>
__device__ __forceinline__ void sm80_fwd_body(const FwdArgs& args) {
    using Tr = Sm80FwdTraits<T, kHeadDim, kBlockN, kMTiles>;
    using Mainloop = Sm80FwdMainloop<T, kHeadDim, kBlockN, kMTiles, kScoreMod, kTf32, kMaxScore, ScoreFn, MaskFn>;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    require_dynamic_smem<Tr::kSmemBytes>();
    const AttnArgs& a = args.attn;
    require_sparse_tiles(a, Tr::kBlockM, kBlockN);
    typename Mainloop::State& st =
        *reinterpret_cast<typename Mainloop::State*>(smem_raw + Tr::kSmemBytes - Tr::kStateBytes);

    // Scheduler.
    const TileWork work = schedule_tile(ceil_div(a.seqlen_q, Tr::kBlockM), a.heads, true);
    const int m0 = work.tile * Tr::kBlockM;
    {
        const Sequence seq(a, work.b);
        if (m0 >= seq.seqlen_q) return;
        // The CTA's Q tile (its planes: head p * heads + h) loads while warp 0 builds the state.
        using Stored = typename Mainloop::Stored;
#pragma unroll
        for (int p = 0; p < Tr::kPlanes; ++p) {
            load_tile_async<Tr::kBlockM, kHeadDim, Tr::kLd, Tr::kThreads>(
                reinterpret_cast<Stored*>(smem_raw) + p * Tr::kQPlane,
                head_rows<const Stored>(a.q, work.b, seq.q_start, work.h + p * a.heads), a.q.row_stride, m0, seq.seqlen_q,
                a.headdim, a.vec_loads != 0);
        }
        if (threadIdx.x < 32) Mainloop::init_state(a, seq, work.b, work.h, work.tile, st);
    }
    __syncthreads();

    typename Mainloop::Acc o[kMTiles][Mainloop::kOTiles][4];
    typename Mainloop::Softmax softmax[kMTiles];
    Mainloop::run(a, st, m0, smem_raw, o, softmax);
    fwd_epilogue<T>(args, st.seq, st.b, st.h, m0 + 16 * kMTiles * (threadIdx.x / 32), o, softmax);
}

template <typename T, int kHeadDim, int kBlockN, int kMTiles, bool kScoreMod, bool kMaxScore,
          typename ScoreFn = NoUserScore, typename MaskFn = NoUserMask>
__global__ void __launch_bounds__(Sm80FwdTraits<T, kHeadDim, kBlockN, kMTiles>::kThreads,
                                  Sm80FwdTraits<T, kHeadDim, kBlockN, kMTiles>::kMinCtasPerSm)
sm80_fwd(const CUPYFLASH_GRID_CONSTANT FwdArgs args) {
    sm80_fwd_body<T, kHeadDim, kBlockN, kMTiles, kScoreMod, false, kMaxScore, ScoreFn, MaskFn>(args);
}

// float32 on the bfloat16 tensor cores (three-part split, sm80/operands.cuh): a template of its own for
// its own tile table (cupyflash/_families/sm80.py); kTf32 for precision="tf32" (two parts).
template <typename T, int kHeadDim, int kBlockN, int kMTiles, bool kScoreMod, bool kTf32, bool kMaxScore,
          typename ScoreFn = NoUserScore, typename MaskFn = NoUserMask>
__global__ void __launch_bounds__(Sm80FwdTraits<T, kHeadDim, kBlockN, kMTiles>::kThreads,
                                  Sm80FwdTraits<T, kHeadDim, kBlockN, kMTiles>::kMinCtasPerSm)
sm80_fwd_parts(const CUPYFLASH_GRID_CONSTANT FwdArgs args) {
    static_assert(sizeof(T) == 4, "float32 only");
    sm80_fwd_body<T, kHeadDim, kBlockN, kMTiles, kScoreMod, kTf32, kMaxScore, ScoreFn, MaskFn>(args);
}

// float64 on the float64 tensor cores (sm80/operands.cuh; m16n8k8 on sm_90, m8n8k4 before): a template of
// its own for its own tile table (cupyflash/_families/sm80.py).
template <typename T, int kHeadDim, int kBlockN, int kMTiles, bool kScoreMod, bool kMaxScore,
          typename ScoreFn = NoUserScore, typename MaskFn = NoUserMask>
__global__ void __launch_bounds__(Sm80FwdTraits<T, kHeadDim, kBlockN, kMTiles>::kThreads,
                                  Sm80FwdTraits<T, kHeadDim, kBlockN, kMTiles>::kMinCtasPerSm)
sm80_fwd_dmma(const CUPYFLASH_GRID_CONSTANT FwdArgs args) {
    static_assert(sizeof(T) == 8, "float64 only");
    sm80_fwd_body<T, kHeadDim, kBlockN, kMTiles, kScoreMod, false, kMaxScore, ScoreFn, MaskFn>(args);
}

}  // namespace cupyflash
