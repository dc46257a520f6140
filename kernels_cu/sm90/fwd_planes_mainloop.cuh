// The Hopper forward's main loop for float32 (sm_90a): k and v arrive as three bfloat16 planes each
// (x = hi + mid + lo exactly, split once by sm80/planes.cu; the consumers split q's rows themselves,
// below), and every product is the six bfloat16 wgmma
// products of Sm80Operands<float> (sm80/operands.cuh), in the same order and with the same split sums, so
// that the scores are bitwise those of the sm80 float32 forward and backward (the backward recomputes P
// from them: scores a few ulps apart at large logits broke its gradients, bench/NOTES.md, session 20).
// sm90/fwd_planes.cu assembles it with the kernel body of sm90/fwd_kernel.cuh.
//
// Loads: the producer's TMA copies each plane of each K and V tile as a 16-bit tile (64-column atoms,
// 128-byte swizzle: sm90/primitives.cuh), the planes of a tile one after another; each consumer
// warpgroup reads its rows of q (float32) and writes their planes into the Q tile in the same layout.
// precision="tf32" (kTf32) keeps two planes and runs three products.
//
// Sums: wgmma, like mma.sync, truncates each product's float32 result toward zero, so
//   S: the five small products of every k-step chain in `small`, and each k-step's leading product
//      hi x hi is summed from zero (the wgmma's scale-d off) into one of two buffers z and added to S
//      with a FADD once its group completes, while the next k-step's group runs;
//   O: each 32 keys' P V (all six products of every k-step, the small ones first) is summed from zero in
//      z and added to O, so its truncations are of that share (sm80's float32 tiles are 32 keys).
// Registers per consumer thread at head dim 128 and 64-key tiles: O 64, S 32, small 32, z 2 x 32 while S
// is formed; O 64, z 64 and P's planes 48 while P V is.
//
// Schedule: two consumer warpgroups of 64 rows take turns (Pingpong) to issue S, then P V, of each key
// tile; the six products make the tensor cores' share six times the 16-bit kernel's, so one warpgroup's
// products cover the other's softmax without the 16-bit kernel's overlap of S_{j+1} with P_j V_j inside
// a warpgroup (its registers are not there).
#pragma once
#include "common/dtypes.cuh"
#include "common/launch.cuh"
#include "common/mask.cuh"
#include "common/params.cuh"
#include "common/score_mod.cuh"
#include "common/sequence.cuh"
#include "fragment/scores.cuh"
#include "fragment/softmax.cuh"
#include "sm80/operands.cuh"
#include "sm90/fwd_mainloop.cuh"
#include "sm90/pipeline.cuh"
#include "sm90/planes_products.cuh"
#include "sm90/planes_split.cuh"
#include "sm90/primitives.cuh"

namespace cupyflash {

template <int kHeadDim_, int kBlockN_, int kStages_, bool kTf32>
struct Sm90FwdPlanesTraits {
    static constexpr int kHeadDim = kHeadDim_;   // q.k and v columns (one bucket covers both)
    static constexpr int kHeadDimV = kHeadDim_;
    static constexpr int kBlockM = 128;          // two consumer warpgroups
    static constexpr int kBlockN = kBlockN_;
    static constexpr int kStages = kStages_;
    static constexpr int kConsumers = kBlockM / 64;
    static constexpr int kThreads = 128 * (1 + kConsumers);
    static constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
    static constexpr int kProducerRegs = 24;
    static constexpr int kConsumerRegs = (kLaunchRegs * (1 + kConsumers) - kProducerRegs) / kConsumers / 8 * 8;
    static constexpr int kPlanes = kTf32 ? 2 : 3;  // hi, mid (and lo)
    static constexpr int kAtomsQK = (kHeadDim + 63) / 64;
    static constexpr int kAtomsV = kAtomsQK;
    static constexpr int kQPlaneBytes = kBlockM * 128 * kAtomsQK;
    static constexpr int kKPlaneBytes = kBlockN * 128 * kAtomsQK;
    static constexpr int kVPlaneBytes = kBlockN * 128 * kAtomsV;
    // Q's planes are written by the consumers (Sm90FwdPlanesMainloop::split_queries): its TMA copies
    // count nothing. K's and V's by TMA.
    static constexpr int kQBytes = 0;
    static constexpr int kKBytes = kPlanes * kKPlaneBytes;
    static constexpr int kVBytes = kPlanes * kVPlaneBytes;
    static constexpr int kKOffset = kPlanes * kQPlaneBytes;
    static constexpr int kVOffset = kKOffset + kStages * kKBytes;
    static constexpr int kFixedBytes = 1024 + kCtaStateBytes;
    static constexpr bool kStoreO = false;  // the epilogue writes from the registers
    static constexpr int kStateOffset = kVOffset + kStages * kVBytes;
    static constexpr int kSmemBytes = kFixedBytes + kStateOffset;
    static constexpr int kDSteps = kHeadDim / 16;
    static constexpr int kKeySteps = kBlockN / 16;
    static constexpr int kNTiles = kBlockN / 8;
    static constexpr int kOTiles = kHeadDimV / 8;
    static_assert(kHeadDim % 16 == 0 && kHeadDim <= 128, "head dims are multiples of 16 up to 128");
    static_assert(kBlockN % 16 == 0 && kBlockN <= 128, "key tiles are multiples of 16 up to 128");
    static_assert(kStages >= 1 && kStages <= Sm90FwdState::kMaxStages, "1 to 4 stages");
    static_assert(kSmemBytes <= 227 * 1024, "the tiles must fit sm_90's 227 KB");
};

// ScoreFn and MaskFn: a score_mod's and a mask_mod's generated code (common/user_calls.cuh), or
// NoUserScore and NoUserMask. kMaxScore (return_max_score): the softmax also keeps each row's largest
// score for the epilogue.
template <int kHeadDim, int kBlockN, int kStages, bool kScoreMod, bool kTf32, bool kMaxScore,
          typename ScoreFn = NoUserScore, typename MaskFn = NoUserMask>
struct Sm90FwdPlanesMainloop {
    using Tr = Sm90FwdPlanesTraits<kHeadDim, kBlockN, kStages, kTf32>;
    static constexpr bool kModified = kScoreMod || ScoreFn::kEnabled;
    using Scores = typename ScoresOf<ScoreFn, NaturalScores<float>>::type;
    using Products = Sm90PlaneProducts<kTf32>;
    using Ops = typename Products::Ops;  // split2 and the P fragments
    using Softmax = FragmentSoftmax<Tr::kNTiles, true, float, kMaxScore>;  // natural-log units, as sm80's float32
    using Bf16 = __nv_bfloat16;
    static constexpr int kBlockM = Tr::kBlockM;
    static constexpr int kNTiles = Tr::kNTiles;
    static constexpr int kOTiles = Tr::kOTiles;
    // Named barriers: the turns 1 .. 2, then one per consumer for split_queries and
    // sm90_clear_foreign_values.
    using Turns = Pingpong<1, Tr::kConsumers>;
    static constexpr int kClearBarrier = 1 + Tr::kConsumers;
    // O += P V in parts of 32 keys, each summed from zero (issue_values).
    static constexpr int kPartSteps = 2;
    static constexpr int kParts = Tr::kKeySteps / kPartSteps;
    static_assert(Tr::kKeySteps % kPartSteps == 0, "key tiles of whole 32-key parts");

    // Producer: nothing; the consumers split their Q rows themselves (split_queries).
    __device__ __forceinline__ static void load_queries(const AttnArgs&, const Sm90FwdMaps&, Sm90FwdState&,
                                                        unsigned char*, const Sequence&, int, int, int) {}

    // Consumer warpgroup wg: its 64 rows of the work tile's Q (float32, a.q) split into the planes of the
    // Q tile (sm90/planes_split.cuh). Split here rather than by split_planes, whose pass over q cost as
    // much as a tenth of the forward at 1k keys.
    __device__ __forceinline__ static void split_queries(const AttnArgs& a, const Sm90FwdTile& tile, unsigned char* smem,
                                                         int wg) {
        split_rows_into_planes<Ops, Tr::kPlanes, kHeadDim, 64, 128>(
            head_rows<const float>(a.q, tile.b, tile.seq.q_start, tile.h), a.q.row_stride, tile.m0 + 64 * wg,
            tile.seq.seqlen_q, a.headdim, smem, kBlockM, 64 * wg, Tr::kQPlaneBytes, threadIdx.x % 128);
        fence_proxy_async();  // the stores, visible to wgmma
        named_barrier_sync(kClearBarrier + wg, 128);
    }

    // Producer: the planes of the K and V tiles of a work tile's walk (sm90_load_key_tiles).
    static constexpr bool kPagedKeys = false;  // (Sm90FwdKernel::produce_keys)
    static constexpr int kCtas = 1;            // (Sm90FwdKernel: one CTA fills its ring)
    __device__ __forceinline__ static void load_keys(const AttnArgs& a, const Sm90FwdMaps& maps, Sm90FwdState& st,
                                                     unsigned char* smem, const Sm90FwdTile& tile, int& i) {
        sm90_load_key_tiles<Tr>(a, maps, st, smem, tile, i);
    }

    // S = Q K^T of this warpgroup's 64 rows (Q row offset q_row) and the key tile at k_tile, complete on
    // return, in the scores' split sums (Products::scores).
    __device__ __forceinline__ static void compute_scores(float (&s)[kNTiles][4], unsigned q_tile, int q_row,
                                                          unsigned k_tile) {
        Products::template scores<kBlockN, Tr::kDSteps, kBlockM, kBlockN, false>(s, q_tile, q_row, Tr::kQPlaneBytes,
                                                                                 k_tile, 0, Tr::kKPlaneBytes);
    }

    // z = P V of keys [32 part, 32 part + 32) of the key tile at v_tile from zero, issued: the partial
    // sums of sm80's 32-key tiles (summed over 64 keys, z's truncations took O to 1.3x the rule's
    // allowance at head dim 1).
    __device__ __forceinline__ static void issue_values(float (&z)[kOTiles][4], const typename Ops::A (&p)[Tr::kKeySteps],
                                                        unsigned v_tile, int part) {
        Products::template issue_rs<kHeadDim, kBlockN>(z, p, v_tile, Tr::kVPlaneBytes, kPartSteps * part,
                                                       kPartSteps * (part + 1));
    }

    // The scores of key tile `entry` in natural-log units with the modifications (modify_rows_natural, as
    // sm80's float32 forward and backward round them), then the mask where the tile needs one.
    __device__ __forceinline__ static void modify_and_mask(float (&s)[kNTiles][4], const AttnArgs& a,
                                                           const Sm90FwdTile& st, const Scores& scores,
                                                           int entry, int row_g, int w0, int col_t) {
        const int n0 = entry_tile(entry) * kBlockN;
        auto& rows = reinterpret_cast<float(&)[1][kNTiles][4]>(s);
        const auto row_of = [&](int, int r) { return row_g + 8 * r; };
        modify_rows_natural<kModified>(rows, scores, row_of, n0, col_t);
        const bool partial = entry_partial(entry);
        const int cuts = st.mask.key_cuts(w0, 64, n0, kBlockN);
        if (partial || cuts != 0) {
            mask_tile_rows<true>(rows, st.mask, st.layout, a, row_of, n0, col_t, partial, cuts,
                                 UserMaskAt<MaskFn>(a, st.b, st.h));
        }
    }

    // A key tile the warpgroup does not compute: its two turns, passed at once, and its stage released
    // once loaded (an arrival before the load could count toward the stage's previous round).
    __device__ __forceinline__ static void skip_tile(Sm90FwdState& st, int wg, int& i) {
        const int stage = i % kStages;
        const int parity = (i / kStages) & 1;
#pragma unroll
        for (int turn = 0; turn < 2; ++turn) {
            Turns::take_turn(wg);
            Turns::pass_turn(wg);
        }
        mbarrier_wait(&st.k_full[stage], parity);
        release_stage(&st.empty_k[stage]);
        mbarrier_wait(&st.v_full[stage], parity);
        release_stage(&st.empty_v[stage]);
        ++i;
    }

    // Consumer warpgroup wg (0 or 1): O (unnormalized) and the row statistics of its 64 rows of a work
    // tile, through the tile's walk (i: ring slots consumed so far, over all work tiles). Releases the Q
    // tile after its last S. Two turns per key tile of the walk (S, then P V), computed or skipped, the
    // same count in both warpgroups.
    __device__ __forceinline__ static void mma(const AttnArgs& a, Sm90FwdState& st, unsigned char* smem,
                                               const Sm90FwdTile& tile, int wg, int& i, float (&o)[1][kOTiles][4],
                                               Softmax (&softmax)[1]) {
        const int warp = (threadIdx.x / 32) % 4;
        const int lane = threadIdx.x % 32;
        const int col_t = 2 * (lane % 4);
        const unsigned q_tile = shared_addr(smem);
        const unsigned k_tiles = q_tile + Tr::kKOffset;
        const unsigned v_tiles = q_tile + Tr::kVOffset;
        const int w0 = tile.m0 + 64 * wg;
        const int row_g = w0 + 16 * warp + lane / 4;
        int first, last;
        sm90_seen_key_tiles<kBlockN>(tile, w0, &first, &last);  // causal: the first warpgroup sees a tile fewer
        const Scores scores(a, tile.seq, tile.b, tile.h);
#pragma unroll
        for (int c = 0; c < kOTiles; ++c) o[0][c][0] = o[0][c][1] = o[0][c][2] = o[0][c][3] = 0.0f;
        if (last == first) release_stage(&st.q_empty);
        if (last > first) split_queries(a, tile, smem, wg);
        for (int j = 0; j < first; ++j) skip_tile(st, wg, i);
        for (int j = first; j < last; ++j, ++i) {
            const int stage = i % kStages;
            const int parity = (i / kStages) & 1;
            mbarrier_wait(&st.k_full[stage], parity);
            const int entry = st.entry[stage];
            float s[kNTiles][4];
            Turns::take_turn(wg);
            compute_scores(s, q_tile, 64 * wg, k_tiles + stage * Tr::kKBytes);
            Turns::pass_turn(wg);
            release_stage(&st.empty_k[stage]);
            if (j == last - 1) release_stage(&st.q_empty);  // the next work tile's Q may load
            modify_and_mask(s, a, tile, scores, entry, row_g, w0, col_t);
            softmax[0].step(s, o[0]);
            typename Ops::A p[Tr::kKeySteps];
#pragma unroll
            for (int kk = 0; kk < Tr::kKeySteps; ++kk) Ops::pack_p(p[kk], s, kk);
            mbarrier_wait(&st.v_full[stage], parity);
            sm90_clear_foreign_values<Tr>(smem + Tr::kVOffset + stage * Tr::kVBytes, a, tile, entry, kClearBarrier + wg);
            float z[kOTiles][4];
            Turns::take_turn(wg);
#pragma unroll
            for (int part = 0; part < kParts; ++part) {
                issue_values(z, p, v_tiles + stage * Tr::kVBytes, part);
                if (part == kParts - 1) Turns::pass_turn(wg);
                wgmma_wait<0>();
                fence_fragments(z);
                if (part == kParts - 1) release_stage(&st.empty_v[stage]);
                Products::add_to(o[0], z);
            }
        }
        for (int j = last; j < tile.keys.count; ++j) skip_tile(st, wg, i);
    }
};

}  // namespace cupyflash
