// The Hopper backward's main loop for float32 (sm_90a): q and dout arrive as bfloat16 planes (x = hi + mid
// + lo exactly, split once by sm80/planes.cu; precision="tf32": hi + mid), the CTA's K and V rows are split
// into the same planes by its consumers (split_keys, sm90/planes_split.cuh), and every product
// is Sm80Operands<float>'s six bfloat16 products (three for tf32) on wgmma (sm90/planes_products.cuh),
// in the order and with the split sums of the sm80 float32 backward (sm80/bwd.cu), so that S^T is the
// forward's S bitwise (P^T recomputed from a few ulps' different scores broke the large-logit
// gradients, bench/NOTES.md, session 20). sm90/bwd_planes.cu assembles it with the kernel body of
// sm90/bwd_kernel.cuh.
//
// Each operand takes three times a 16-bit tile's shared memory, so a CTA takes 64 keys and 64-query tiles
// and its two consumer warpgroups take roles over the whole 64 x 64 tile, as the 16-bit kernel does above
// head dim 128 (sm90/bwd_mainloop.cuh, kSplitCols):
//   - warpgroup 0: S^T = K Q^T (the scores' split sums), P^T from the float64 lse as a float pair
//     (natural-log units, as the sm80 float32 kernels), P' (P^T, times the softcap's derivative with
//     kScoreMod) to shared memory for warpgroup 1 as float32, dV += P^T dO (P^T's planes from
//     registers), and dQ's first kDqCols0 columns;
//   - warpgroup 1: dP^T = V dO^T, dS^T = P' (dP^T - delta), dS^T's planes to shared memory, dK += dS^T Q
//     (from registers), and dQ's other columns.
// dV, dK and each dQ share are summed per tile from zero and then added (dV and dK with a FADD, dQ by
// the TMA reduction), so that their truncations are of the tile's share, as sm80's are. P' and dS^T's
// planes take one buffer (X) in turn: warpgroup 1 writes dS^T_i once all its threads have read P'_i (a
// named barrier). With one Q/dO stage (head dim 128: K and V 48 KB each, the stage 96 KB, X 32 KB fill
// 227 KB; Tr::kDqInX) the tile's dQ takes X too: each warpgroup stages its share there once both dQ
// products have read dS^T_i (ds_free), warpgroup 0 writes P'_{i+1} once the reductions have read dQ_i
// (dq_empty[0]), and every consumer frees the stage (empty) as soon as its dV or dK product is done, so
// the next tile's loads run under the dQ products. With two stages (head dim 64) each warpgroup stages
// its dQ share over the operand its own dV or dK product read (warpgroup 0 over dO, 1 over Q), which the
// reducing thread frees as it reads them, and warpgroup 0 writes P'_{i+1} once dS^T_i is read.
//
// The producer, the rows, the ordered sum and the packed batches are as in the 16-bit kernel
// (sm90/bwd_mainloop.cuh), with three TMA loads per tile of Q and dO (one per plane) and lse as a float
// pair (split_lse, common/lse_pair.cuh: P = exp(s - (hi + lo)), the difference rounded once, takes no
// float64 operation); the reductions
// read X (reduce_queries).
#pragma once
#include "common/dtypes.cuh"
#include "common/launch.cuh"
#include "common/mask.cuh"
#include "common/ordered_sum.cuh"
#include "common/params.cuh"
#include "common/scheduler.cuh"
#include "common/score_mod.cuh"
#include "common/sequence.cuh"
#include "common/softmax.cuh"
#include "fragment/scores.cuh"
#include "sm90/bwd_mainloop.cuh"
#include "sm90/planes_products.cuh"
#include "sm90/planes_split.cuh"
#include "sm90/primitives.cuh"

namespace cupyflash {

template <int kHeadDim_, int kStages_, bool kTf32>
struct Sm90BwdPlanesTraits {
    static constexpr int kHeadDim = kHeadDim_;  // q.k and v columns (one bucket covers both)
    static constexpr int kHeadDimV = kHeadDim_;
    static constexpr int kBlockM = 64;          // queries per tile
    static constexpr int kBlockN = 64;          // keys per CTA
    static constexpr int kStages = kStages_;    // Q/dO ring
    // The roles of sm90/bwd_mainloop.cuh's kSplitCols (Sm90BwdKernel reads these three).
    static constexpr bool kSplitCols = true;
    static constexpr bool kDqAlternate = false;
    static constexpr int kConsumers = 2;
    static constexpr int kThreads = 128 * (1 + kConsumers);
    // setmaxnreg: at head dim 128 the consumers need 240 (at 232 they spill: 26 local accesses), and the
    // producer's threads keep some values in local memory at 24; at 64, 232 leave the producer 40.
    static constexpr int kProducerRegs = kHeadDim > 64 ? 24 : 40;
    static constexpr int kConsumerRegs = kHeadDim > 64 ? 240 : 232;
    static_assert(128 * (kProducerRegs + kConsumers * kConsumerRegs) <= kThreads * 168, "registers over budget");
    static constexpr int kPlanes = kTf32 ? 2 : 3;
    static constexpr int kAtoms = (kHeadDim + 63) / 64;  // 64-column atoms of every operand
    static constexpr int kKPlaneBytes = kBlockN * 128 * kAtoms;  // K and V
    static constexpr int kQPlaneBytes = kBlockM * 128 * kAtoms;  // Q and dO
    static constexpr int kKBytes = kPlanes * kKPlaneBytes;
    static constexpr int kQBytes = kPlanes * kQPlaneBytes;
    // kDqInX: with one Q/dO stage (head dim 128) the tile's dQ is staged in X, so the stage is freed as soon
    // as its products are done and the next tile's Q and dO load under the dQ products; with two (head
    // dim 64) the next tile's stage is already loaded, and dQ goes over the stage's Q and dO, which lets
    // P'_{i+1} go into X without waiting for dQ_i's reductions (staged in X at head dim 64, the backward
    // lost 5-8% at 4k on an H100, bench/NOTES.md, session 35).
    static constexpr bool kDqInX = kStages == 1;
    // X, in turn: P' (64 x 64 float32, 16 bytes per thread and n-tile), dS^T's planes ([key][query], one
    // 64-query atom a plane) and, with kDqInX, the tile's dQ for the reductions (64 x kHeadDim float32 in
    // 32-column atoms).
    static constexpr int kDsPlaneBytes = kBlockN * kBlockM * 2;
    static constexpr int kDqBytes = kDqInX ? kBlockM * kHeadDim * 4 : 0;
    static constexpr int larger(int x, int y) { return x > y ? x : y; }
    static constexpr int kXBytes = larger(larger(kBlockN * kBlockM * 4, kPlanes * kDsPlaneBytes), kDqBytes);
    // Per stage: lse (split_lse's two floats), then delta (float32), kBlockM each.
    static constexpr int kRowsBytes = kBlockM * 12;
    static constexpr int kKOffset = 0;
    static constexpr int kVOffset = kKOffset + kKBytes;
    static constexpr int kQOffset = kVOffset + kKBytes;
    static constexpr int kDoOffset = kQOffset + kStages * kQBytes;
    static constexpr int kXOffset = kDoOffset + kStages * kQBytes;
    static constexpr int kRowsOffset = kXOffset + kXBytes;
    static constexpr int kStateOffset = kRowsOffset + kStages * kRowsBytes;
    static constexpr int kSmemBytes = 1024 + kStateOffset + kCtaStateBytes;  // 1024: alignment slack
    // dQ's columns: warpgroup 0 takes kDqCols0 (whole 64-column atoms of K, which its B operand reads;
    // none at head dim 64), warpgroup 1 the rest.
    static constexpr int kDqCols0 = kHeadDim > 64 ? (kHeadDim / 2 + 63) / 64 * 64 : 0;
    static constexpr int kDqCols1 = kHeadDim - kDqCols0;
    static constexpr int kDqAtoms = kHeadDim / 32;    // 32-column float32 atoms of a tile's dQ
    static constexpr int kDqAtoms0 = kDqCols0 / 32;
    static constexpr int kDkTiles = kHeadDim / 8;     // dV (warpgroup 0) or dK (1): every column
    static constexpr int kSTiles = kBlockM / 8;
    static constexpr int kOpSteps = kBlockM / 16;
    static_assert(kHeadDim % 32 == 0 && kHeadDim <= 128, "head dims are whole 32-column dQ atoms up to 128");
    static_assert(kStages >= 1 && kStages <= Sm90BwdState::kMaxStages, "1 to 4 stages");
    // kDqInX: a stage's Q and dO are free once every consumer thread's last product reading them is done;
    // else the reducing thread frees dO (`empty`) and then Q (q_empty) once it has read the dQ shares over them.
    static constexpr int kEmptyArrivals = kDqInX ? 128 * kConsumers : 1;
    static_assert(kDqInX || (kDqAtoms0 * kBlockM * 128 <= kQBytes && (kDqAtoms - kDqAtoms0) * kBlockM * 128 <= kQBytes),
                  "each dQ share fits the stage's operand it goes over");
    static_assert(kSmemBytes <= 227 * 1024, "the tiles must fit sm_90's 227 KB");
};

// ScoreFn and MaskFn: a score_mod's (whose buffers take no gradients) and a mask_mod's generated code
// (common/user_calls.cuh), or NoUserScore and NoUserMask.
template <int kHeadDim, int kStages, bool kScoreMod, bool kTf32, typename ScoreFn = NoUserScore,
          typename MaskFn = NoUserMask>
struct Sm90BwdPlanesMainloop : Sm90BwdShared<64, 64, false> {
    using Tr = Sm90BwdPlanesTraits<kHeadDim, kStages, kTf32>;
    static constexpr bool kModified = kScoreMod || ScoreFn::kEnabled;
    using Scores = typename ScoresOf<ScoreFn, NaturalScores<float>>::type;
    using Base = Sm90BwdShared<64, 64, false>;
    using Products = Sm90PlaneProducts<kTf32>;
    using Ops = typename Products::Ops;
    static constexpr int kBlockM = Tr::kBlockM;
    static constexpr int kBlockN = Tr::kBlockN;
    static constexpr int kPlanes = Tr::kPlanes;
    // Named barriers (id 0 is __syncthreads): the 256 consumers; warpgroup 1's 128 threads.
    static constexpr int kConsumerBarrier = 1;
    static constexpr int kReadBarrier = 2;

    // Producer thread 0: the planes of Q and dO of every tile of the walk, then the end marker (K's and
    // V's the consumers split, split_keys). Plane p of head h is head p * heads + h (sm80/planes.cu).
    __device__ __forceinline__ static void load_tiles(const BwdArgs& args, const Sm90BwdMaps& maps, Sm90BwdState& st,
                                                      unsigned char* smem, const Sequence& seq, const TileWork& work) {
        const AttnArgs& a = args.attn;
        tma_prefetch_desc(maps.q);
        tma_prefetch_desc(maps.dout);
        const int q_batch = a.cu_seqlens_q != nullptr ? 0 : work.b;
        const auto load_planes = [&](unsigned char* tile, const TmaDesc& map, unsigned long long* bar, int rows, int row,
                                     int h, int heads, int batch) {
#pragma unroll
            for (int p = 0; p < kPlanes; ++p) {
#pragma unroll
                for (int atom = 0; atom < Tr::kAtoms; ++atom) {
                    tma_load_4d(tile + (p * Tr::kAtoms + atom) * rows * 128, map, bar, 64 * atom, row, h + p * heads, batch);
                }
            }
        };
        int i = 0;  // stages filled
        const auto next_stage = [&]() {
            const int stage = i % kStages;
            // Round r of a stage (with kDqInX its Q and dO, else its dO) is free in phase r of `empty`.
            if (i >= kStages) mbarrier_wait(&st.empty[stage], (i / kStages - 1) & 1);
            return stage;
        };
        const Mask mask(a, seq);
        walk(args, mask, work, walk_rotation<kBlockM, kBlockN>(args, mask, work.tile), [&](int h, int entry) {
            const int stage = next_stage();
            st.head[stage] = h;  // released to the consumers by the arrival below
            st.entry[stage] = entry;
            const int row = seq.q_start + entry_tile(entry) * kBlockM;
            mbarrier_arrive_expect_tx(&st.q_full[stage], 2 * Tr::kQBytes);
            load_planes(smem + Tr::kDoOffset + stage * Tr::kQBytes, maps.dout, &st.q_full[stage], kBlockM, row, h, a.heads,
                        q_batch);
            if (!Tr::kDqInX && i >= kStages) mbarrier_wait(&st.q_empty[stage], (i / kStages - 1) & 1);
            load_planes(smem + Tr::kQOffset + stage * Tr::kQBytes, maps.q, &st.q_full[stage], kBlockM, row, h, a.heads,
                        q_batch);
            ++i;
        });
        const int stage = next_stage();
        st.head[stage] = -1;
        mbarrier_arrive(&st.q_full[stage]);
    }

    // Producer warp 1: each tile's lse (split_lse's float pair of the float64 lse; -inf past the sequence:
    // no probability) and delta.
    __device__ __forceinline__ static void load_rows(const BwdArgs& args, Sm90BwdState& st, unsigned char* smem,
                                                     const Sequence& seq, const TileWork& work) {
        const AttnArgs& a = args.attn;
        const int lane = threadIdx.x % 32;
        const Mask mask(a, seq);
        int i = 0;
        walk(args, mask, work, walk_rotation<kBlockM, kBlockN>(args, mask, work.tile), [&](int h, int entry) {
            const int stage = i % kStages;
            if (i >= kStages) mbarrier_wait(&st.empty[stage], (i / kStages - 1) & 1);
            const int m0 = entry_tile(entry) * kBlockM;
            const double* lse = static_cast<const double*>(args.lse.ptr) + rows_index(args.lse, work.b, h, seq.q_start) + m0;
            const float* delta =
                static_cast<const float*>(args.delta.ptr) + rows_index(args.delta, work.b, h, seq.q_start) + m0;
            unsigned char* rows = smem + Tr::kRowsOffset + stage * Tr::kRowsBytes;
#pragma unroll
            for (int r = lane; r < kBlockM; r += 32) {
                const bool in_range = m0 + r < seq.seqlen_q;
                reinterpret_cast<float2*>(rows)[r] = split_lse(in_range ? lse[r] : Consts<double>::neg_inf());
                reinterpret_cast<float*>(rows + kBlockM * 8)[r] = in_range ? delta[r] : 0.0f;
            }
            mbarrier_arrive(&st.rows_full[stage]);
            ++i;
        });
    }

    // The shared-memory offset of float32 dQ atom `atom` (32 columns x 64 rows) of a tile in `stage`: with
    // kDqInX in X, warpgroup 0's kDqAtoms0 then warpgroup 1's; else warpgroup 0's over the stage's dO tile,
    // warpgroup 1's over its Q tile.
    __device__ __forceinline__ static int staged_dq_atom(int stage, int atom) {
        if constexpr (Tr::kDqInX) return Tr::kXOffset + atom * kBlockM * 128;
        return atom < Tr::kDqAtoms0 ? Tr::kDoOffset + stage * Tr::kQBytes + atom * kBlockM * 128
                                    : Tr::kQOffset + stage * Tr::kQBytes + (atom - Tr::kDqAtoms0) * kBlockM * 128;
    }

    // Producer thread 64 (warp 2): adds each tile's dQ shares, as each warpgroup stages its own in X
    // (dq_staged[w][0]), into the float32 accumulator or, with BwdArgs::dq_in_place, into dq itself
    // (Sm90BwdShared::reduce_walk), and frees X for the
    // next tile's P' (dq_empty[0]) once the reductions have read it. The stage's Q and dO are not held
    // for the reductions: the consumers free them (empty) as their last products reading them complete,
    // so the next tile's loads run under this tile's dQ products (with them staged over Q and dO, the
    // next loads waited for the reductions: the consumers' longest wait at head dim 128's one stage,
    // bench/NOTES.md, session 32).
    __device__ __forceinline__ static void reduce_queries(const BwdArgs& args, const Sm90BwdMaps& maps, Sm90BwdState& st,
                                                          unsigned char* smem, const Sequence& seq, const TileWork& work) {
        Base::reduce_walk(args, maps, st, smem, seq, work, [&](int i, const auto& reduce) {
            if constexpr (Tr::kDqInX) {
#pragma unroll
                for (int w = 0; w < 2; ++w) {
                    mbarrier_wait(&st.dq_staged[w][0], i & 1);
#pragma unroll
                    for (int atom = w ? Tr::kDqAtoms0 : 0; atom < (w ? Tr::kDqAtoms : Tr::kDqAtoms0); ++atom) {
                        reduce(atom, staged_dq_atom(0, atom));
                    }
                    bulk_commit();
                }
                bulk_wait_read();
                mbarrier_arrive(&st.dq_empty[0]);
            } else {
                Base::template reduce_staged<kStages, Tr::kDqAtoms0, Tr::kDqAtoms>(
                    st, i, reduce, [](int stage, int atom) { return staged_dq_atom(stage, atom); });
            }
        });
    }

    // The CTA's 64 keys of k (float32, warpgroup 0) and v (warpgroup 1) split into the planes of the K and V
    // tiles (sm90/planes_split.cuh), zeros past the sequence, once for the walk: a pass over k and v would
    // write and read 1.5 times their bytes again (at 1k keys each pass took 1.5% of a float32 backward,
    // bench/NOTES.md, session 35). Both warpgroups read both tiles: the 256 consumers meet after.
    __device__ __forceinline__ static void split_keys(const AttnArgs& a, const Sequence& seq, const TileWork& work,
                                                      unsigned char* smem, int wg) {
        const TensorArg& x = wg == 0 ? a.k : a.v;
        split_rows_into_planes<Ops, kPlanes, kHeadDim, kBlockN, 128>(
            head_rows<const float>(x, work.b, seq.k_start, work.h), x.row_stride, work.tile * kBlockN, seq.seqlen_k,
            wg == 0 ? a.headdim : a.headdim_v, smem + (wg == 0 ? Tr::kKOffset : Tr::kVOffset), kBlockN, 0,
            Tr::kKPlaneBytes, threadIdx.x % 128);
        fence_proxy_async();  // the stores, visible to wgmma
        named_barrier_sync(kConsumerBarrier, 256);
    }

    // Zeroes the rows of a tile's planes from row `first` on (packed batches, see sm90/bwd_mainloop.cuh);
    // the 256 consumer threads meet at a barrier after.
    __device__ __forceinline__ static void clear_rows(unsigned char* tile, int rows, int first, int thread) {
        zero_tile_rows(tile, rows, first, kPlanes * Tr::kAtoms, thread, 256);
    }

    // Plane pl of this thread's dS^T fragments (a[kk], Sm80Operands<float>::A) into its plane of X,
    // [key][query] with the 128-byte swizzle: key row key_row + 8 (reg % 2), query column 16 kk + 8 (reg
    // / 2) + col_t, at 16-byte chunk (column / 8) ^ (row % 8).
    __device__ __forceinline__ static void store_ds_planes(unsigned char* x, const typename Ops::A (&a)[Tr::kOpSteps],
                                                           int key_row, int col_t) {
#pragma unroll
        for (int pl = 0; pl < kPlanes; ++pl) {
#pragma unroll
            for (int kk = 0; kk < Tr::kOpSteps; ++kk) {
#pragma unroll
                for (int reg = 0; reg < 4; ++reg) {
                    const int row = key_row + 8 * (reg % 2);
                    const int chunk = (2 * kk + reg / 2) ^ (row % 8);
                    *reinterpret_cast<unsigned*>(x + pl * Tr::kDsPlaneBytes + row * 128 + chunk * 16 + col_t * 2) =
                        Products::plane(a[kk], pl)[reg];
                }
            }
        }
    }

    // A consumer warpgroup in its role (see the top of the file) over the CTA's 64 keys: warpgroup 0
    // accumulates dV, warpgroup 1 dK (without the softmax scale), every column.
    __device__ __forceinline__ static void mma_roles(const BwdArgs& args, Sm90BwdState& st, unsigned char* smem,
                                                     const Sequence& seq, const TileWork& work, int wg,
                                                     float (&acc)[Tr::kDkTiles][4]) {
        constexpr int kSTiles = Tr::kSTiles;
        const AttnArgs& a = args.attn;
        const int thread = threadIdx.x - 128;  // among the 256 consumers
        const int warp = (threadIdx.x / 32) % 4;
        const int lane = threadIdx.x % 32;
        const int col_t = 2 * (lane % 4);
        const int key0 = work.tile * kBlockN;           // the CTA's first key
        const int key_g = key0 + 16 * warp + lane / 4;  // this thread's keys: key_g and key_g + 8
        const unsigned base = shared_addr(smem);
        const unsigned k_tile = base + Tr::kKOffset;
        const unsigned v_tile = base + Tr::kVOffset;
        const unsigned x_tile = base + Tr::kXOffset;
        // P' of thread t (both warpgroups' thread t hold the same keys and queries): n-tile nt at
        // [128 nt + t], so a warp's 32 lanes store and load 512 contiguous bytes.
        float4* p_share = reinterpret_cast<float4*>(smem + Tr::kXOffset) + thread % 128;
        const Mask mask(a, seq);
        const bool packed_q = a.cu_seqlens_q != nullptr;
        const float dq_scale = static_cast<float>(a.softmax_scale);

        split_keys(a, seq, work, smem, wg);
#pragma unroll
        for (int c = 0; c < Tr::kDkTiles; ++c) acc[c][0] = acc[c][1] = acc[c][2] = acc[c][3] = 0.0f;

        for (int i = 0;; ++i) {
            const int stage = i % kStages;
            const int parity = (i / kStages) & 1;
            mbarrier_wait(&st.q_full[stage], parity);
            const int h = st.head[stage];
            if (h < 0) break;
            const int entry = st.entry[stage];
            const int m0 = entry_tile(entry) * kBlockM;
            const unsigned q_tile = base + Tr::kQOffset + stage * Tr::kQBytes;
            const unsigned do_tile = base + Tr::kDoOffset + stage * Tr::kQBytes;
            if (packed_q && seq.seqlen_q - m0 < kBlockM) {
                clear_rows(smem + Tr::kQOffset + stage * Tr::kQBytes, kBlockM, seq.seqlen_q - m0, thread);
                clear_rows(smem + Tr::kDoOffset + stage * Tr::kQBytes, kBlockM, seq.seqlen_q - m0, thread);
                fence_proxy_async();
                named_barrier_sync(kConsumerBarrier, 256);
            }
            const unsigned char* rows = smem + Tr::kRowsOffset + stage * Tr::kRowsBytes;
            // dV or dK += z (this tile's share, issued: the warpgroup's last product reading the stage, which
            // with kDqInX it then frees) and, once every dS^T plane is stored, dQ's share of this warpgroup
            // (kTiles n-tiles from atom first_atom) staged: with kDqInX into X once both warpgroups' dQ
            // products have read dS^T, else over the stage's operand its own dV or dK product read.
            const auto finish = [&](auto& z, auto& dq, int first_atom) {
                constexpr int kCols = 8 * static_cast<int>(sizeof(dq) / sizeof(dq[0]));
                mbarrier_wait(&st.ds_full[0], i & 1);
                Products::template issue_ss_mn<kCols, kBlockN / 16, kBlockN, kBlockN>(
                    dq, x_tile, Tr::kDsPlaneBytes, k_tile + first_atom / 2 * kBlockN * 128, Tr::kKPlaneBytes);
                wgmma_wait<1>();
                fence_fragments(z);
                if constexpr (Tr::kDqInX) mbarrier_arrive(&st.empty[stage]);
                Products::add_to(acc, z);
                wgmma_wait<0>();
                fence_fragments(dq);
                mbarrier_arrive(&st.ds_free[0]);
                if (args.dq_in_place) {  // the reductions go into dq itself: the conversion's softmax_scale, here
#pragma unroll
                    for (int c = 0; c < kCols / 8; ++c) {
#pragma unroll
                        for (int e = 0; e < 4; ++e) dq[c][e] *= dq_scale;
                    }
                }
                if constexpr (Tr::kDqInX) mbarrier_wait(&st.ds_free[0], i & 1);
                store_dq_atoms(smem, dq, warp, lane, [&](int atom) { return staged_dq_atom(stage, first_atom + atom); });
            };
            float s[kSTiles][4];  // S^T, then P^T (warpgroup 0); dP^T, then dS^T (warpgroup 1)
            if (wg == 0) {
                const Scores scores(a, seq, work.b, h);
                Products::template scores<kBlockM, kHeadDim / 16, kBlockN, kBlockM, true>(s, k_tile, 0, Tr::kKPlaneBytes,
                                                                                          q_tile, 0, Tr::kQPlaneBytes);
                mbarrier_wait(&st.rows_full[stage], parity);
                const auto lse_pair = [&](int nt) {
                    const float4 l = reinterpret_cast<const float4*>(rows)[(8 * nt + col_t) / 2];
                    return SplitLsePair{make_float2(l.x, l.y), make_float2(l.z, l.w)};
                };
                auto& p = reinterpret_cast<float(&)[1][kSTiles][4]>(s);
                // With kModified, probabilities_cols_natural turns its second fragment into (x - delta) *
                // (1 - tanh^2): from x = 1 and delta = 0 the softcap's derivative, which P' carries.
                float derivative[1][kSTiles][4];
                if constexpr (kModified) {
#pragma unroll
                    for (int nt = 0; nt < kSTiles; ++nt) {
                        derivative[0][nt][0] = derivative[0][nt][1] = derivative[0][nt][2] = derivative[0][nt][3] = 1.0f;
                    }
                }
                probabilities_cols_natural<kModified, true>(p, kModified ? derivative : p, scores, lse_pair,
                                                      [](int) { return make_float2(0.0f, 0.0f); }, key_g, m0, col_t);
                const bool partial = entry_partial(entry);
                if (partial || !mask.tile_is_full(m0, kBlockM, key0, kBlockN)) {
                    mask_tile_cols(p, mask, BlockLayout(a, work.b, h), a, key_g, m0, col_t, partial,
                                   UserMaskAt<MaskFn>(a, work.b, h));
                }
                if (i >= 1) {  // X: with kDqInX, dQ_{i-1} read by the reductions, else dS^T_{i-1} by the dQ products
                    if constexpr (Tr::kDqInX) {
                        mbarrier_wait(&st.dq_empty[0], (i - 1) & 1);
                    } else {
                        mbarrier_wait(&st.ds_free[0], (i - 1) & 1);
                    }
                }
#pragma unroll
                for (int nt = 0; nt < kSTiles; ++nt) {
                    const float g0 = kModified ? derivative[0][nt][0] : 1.0f, g1 = kModified ? derivative[0][nt][1] : 1.0f;
                    const float g2 = kModified ? derivative[0][nt][2] : 1.0f, g3 = kModified ? derivative[0][nt][3] : 1.0f;
                    p_share[128 * nt] = make_float4(s[nt][0] * g0, s[nt][1] * g1, s[nt][2] * g2, s[nt][3] * g3);
                }
                mbarrier_arrive(&st.p_full);
                typename Ops::A op[Tr::kOpSteps];  // P^T's planes
#pragma unroll
                for (int kk = 0; kk < Tr::kOpSteps; ++kk) Ops::pack_p(op[kk], s, kk);
                float z[Tr::kDkTiles][4];
                Products::template issue_rs<kHeadDim, kBlockM>(z, op, do_tile, Tr::kQPlaneBytes, 0, Tr::kOpSteps);
                if constexpr (Tr::kDqCols0 > 0) {
                    float dq[Tr::kDqCols0 / 8][4];
                    finish(z, dq, 0);
                } else {
                    wgmma_wait<0>();
                    fence_fragments(z);
                    if constexpr (Tr::kDqInX) mbarrier_arrive(&st.empty[stage]);
                    Products::add_to(acc, z);
                    mbarrier_arrive(&st.ds_free[0]);
                }
            } else {
                Products::template scores<kBlockM, kHeadDim / 16, kBlockN, kBlockM, true>(s, v_tile, 0, Tr::kKPlaneBytes,
                                                                                          do_tile, 0, Tr::kQPlaneBytes);
                mbarrier_wait(&st.rows_full[stage], parity);
                const float* delta = reinterpret_cast<const float*>(rows + kBlockM * 8);
                mbarrier_wait(&st.p_full, i & 1);
#pragma unroll
                for (int nt = 0; nt < kSTiles; ++nt) {
                    const float4 p = p_share[128 * nt];
                    const float2 d = *reinterpret_cast<const float2*>(delta + 8 * nt + col_t);
                    s[nt][0] = p.x * (s[nt][0] - d.x);
                    s[nt][1] = p.y * (s[nt][1] - d.y);
                    s[nt][2] = p.z * (s[nt][2] - d.x);
                    s[nt][3] = p.w * (s[nt][3] - d.y);
                }
                typename Ops::A op[Tr::kOpSteps];  // dS^T's planes
#pragma unroll
                for (int kk = 0; kk < Tr::kOpSteps; ++kk) Ops::pack_p(op[kk], s, kk);
                named_barrier_sync(kReadBarrier, 128);  // every thread's P' read before dS^T goes over it
                store_ds_planes(smem + Tr::kXOffset, op, 16 * warp + lane / 4, col_t);
                fence_proxy_async();
                mbarrier_arrive(&st.ds_full[0]);
                float z[Tr::kDkTiles][4];
                Products::template issue_rs<kHeadDim, kBlockM>(z, op, q_tile, Tr::kQPlaneBytes, 0, Tr::kOpSteps);
                float dq[Tr::kDqCols1 / 8][4];
                finish(z, dq, Tr::kDqAtoms0);
            }
            fence_proxy_async();
            mbarrier_arrive(&st.dq_staged[wg][Tr::kDqInX ? 0 : stage]);
        }
        fence_fragments(acc);
    }
};

}  // namespace cupyflash
