// The Hopper forward's main loop for operands that wgmma reads K-major only (sm_90a):
// Sm90FwdKMajorMainloop<Op, ...>, Op one of sm90/kmajor_operands.cuh's formats: e4m3 (FP8 inputs) or tf32
// (float32 inputs at precision="tf32"). sm90/fwd_kmajor.cu assembles it with the kernel body of
// sm90/fwd_kernel.cuh (producer, two consumer warpgroups or three for e4m3 at head dim 64, persistent
// grid) and a register epilogue.
//
// S = Q K^T is as in the 16-bit loop, with K-major 128-byte atoms (Op::kAtomCols columns each). For
// O += P V, V must be stored with the keys contiguous: a pre-pass (sm90/kmajor_values.cu) writes V^T,
// (batch, heads_k, headdim_v, keys rounded up to a k-step), whose tiles are headdim_v rows of kBlockN keys
// in atoms of Op::kAtomCols keys, each k-step's keys in the order Op::key_at gives: the order in which a
// thread's accumulators of S are the A fragment of P V as they are (Op::to_operand).
//
// Scores: raw products s = q_stored . k_stored; the softmax folds softmax_scale (times q_descale and
// k_descale for FP8: one factor per work tile, positive) into its exponent, as the plain 16-bit kernels
// fold softmax_scale. P is converted to Op's format for the product (the softmax's sums keep float32); the
// epilogue multiplies out by 1 / l (and v_descale). Masks, windows, GQA, block masks and the maximum score
// as in the 16-bit loop; no score modifications, dropout, or packed sequences (cupyflash/_families/
// sm90.py's kmajor_missing lists what dispatch and the checks keep from it).
#pragma once
#include "common/dtypes.cuh"
#include "common/mask.cuh"
#include "common/params.cuh"
#include "common/sequence.cuh"
#include "common/tile_queue.cuh"
#include "fragment/scores.cuh"
#include "fragment/softmax.cuh"
#include "generated/wgmma_ops.cuh"
#include "sm90/fwd_mainloop.cuh"
#include "sm90/kmajor_operands.cuh"
#include "sm90/pipeline.cuh"
#include "sm90/primitives.cuh"

namespace cupyflash {

template <typename Op, int kHeadDim_, int kHeadDimV_, int kBlockN_, int kStages_>
struct Sm90FwdKMajorTraits {
    static constexpr int kHeadDim = kHeadDim_;    // q.k columns, a multiple of Op::kStep
    static constexpr int kHeadDimV = kHeadDimV_;  // v and output columns, a multiple of 16
    // Query rows per CTA: two consumer warpgroups; three for e4m3 at head dim 64 (FlashAttention-3's
    // 192-row FP8 tiles there: the products are short beside the exponentials, and a third warpgroup's
    // softmax keeps the special-function unit busy while another waits on its products).
    static constexpr int kBlockM = Op::kAtomCols == 128 && kHeadDim_ <= 64 ? 192 : 128;
    static constexpr int kBlockN = kBlockN_;      // keys per tile: whole atoms of V^T
    static constexpr int kStages = kStages_;
    static constexpr int kConsumers = kBlockM / 64;
    static constexpr int kThreads = 128 * (1 + kConsumers);
    static constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
    static constexpr int kProducerRegs = 24;
    static constexpr int kConsumerRegs = (kLaunchRegs * (1 + kConsumers) - kProducerRegs) / kConsumers / 8 * 8;
    // Q and K tiles in 128-byte atoms of Op::kAtomCols columns (an e4m3 head dim of 64 fills half of one;
    // TMA zeroes the rest, which no product reads). The V^T tile: kVAtoms atoms of kHeadDimV rows.
    static constexpr int kAtomsQK = (kHeadDim + Op::kAtomCols - 1) / Op::kAtomCols;
    static constexpr int kVAtoms = kBlockN / Op::kAtomCols;
    static constexpr int kQBytes = kBlockM * 128 * kAtomsQK;
    static constexpr int kKBytes = kBlockN * 128 * kAtomsQK;
    static constexpr int kVBytes = kHeadDimV * 128 * kVAtoms;
    static constexpr int kKOffset = kQBytes;
    static constexpr int kVOffset = kKOffset + kStages * kKBytes;
    static constexpr int kFixedBytes = 1024 + kCtaStateBytes;
    static constexpr int kStateOffset = kVOffset + kStages * kVBytes;
    static constexpr int kSmemBytes = kFixedBytes + kStateOffset;
    static constexpr int kDSteps = kHeadDim / Op::kStep;   // k-steps of S = Q K^T
    static constexpr int kKeySteps = kBlockN / Op::kStep;  // k-steps of O += P V
    static constexpr int kNTiles = kBlockN / 8;
    static constexpr int kOTiles = kHeadDimV / 8;
    static_assert(kHeadDim % Op::kStep == 0 && kHeadDim <= 256 && kHeadDimV % 16 == 0 && kHeadDimV <= 256,
                  "head dims: q.k a multiple of the k-step, v of 16, up to 256");
    static_assert(kBlockN % Op::kAtomCols == 0, "a V^T tile is whole 128-byte atoms of keys");
    static_assert(kStages >= 2 && kStages <= 4, "2 to 4 stages");
};

// softmax_scale * q_descale * k_descale of work tile (b, h): the factor of a raw product (the plain
// kernels' softmax_scale; float32 inputs have no descales).
__device__ __forceinline__ float raw_score_scale(const AttnArgs& a, int b, int h) {
    const int kvh = kv_head(h, a.heads, a.heads_k);
    float scale = static_cast<float>(a.softmax_scale);
    if (a.q_descale != nullptr) scale *= a.q_descale[b * a.q_descale_heads + (a.q_descale_heads == a.heads ? h : kvh)];
    if (a.k_descale != nullptr) scale *= a.k_descale[b * a.heads_k + kvh];
    return scale;
}

// kMaxScore (return_max_score): the softmax keeps each row's largest raw product for the epilogue.
template <typename Op, int kHeadDim, int kHeadDimV, int kBlockN, int kStages, bool kMaxScore>
struct Sm90FwdKMajorMainloop {
    using Tr = Sm90FwdKMajorTraits<Op, kHeadDim, kHeadDimV, kBlockN, kStages>;
    using Softmax = FragmentSoftmax<Tr::kNTiles, false, float, kMaxScore, Op::kOffset, Op::kPolyExp2Share>;
    static constexpr int kBlockM = Tr::kBlockM;
    using Turns = Pingpong<1, Tr::kConsumers>;

    // Producer: the Q tile of work tile (b, h, m0) of sequence seq (dense batches), counted on q_full.
    __device__ __forceinline__ static void load_queries(const AttnArgs&, const Sm90FwdMaps& maps, Sm90FwdState& st,
                                                        unsigned char* smem, const Sequence& seq, int b, int h,
                                                        int m0) {
#pragma unroll
        for (int atom = 0; atom < Tr::kAtomsQK; ++atom) {
            tma_load_4d(smem + atom * kBlockM * 128, maps.q, &st.q_full, Op::kAtomCols * atom, seq.q_start + m0, h, b);
        }
    }

    // Producer: the K and V^T tiles of a work tile's walk, through the ring (i: slots filled so far).
    static constexpr bool kPagedKeys = false;  // (Sm90FwdKernel::produce_keys)
    static constexpr int kCtas = 1;            // (Sm90FwdKernel: one CTA fills its ring)
    __device__ __forceinline__ static void load_keys(const AttnArgs& a, const Sm90FwdMaps& maps, Sm90FwdState& st,
                                                     unsigned char* smem, const Sm90FwdTile& tile, int& i) {
        const int kvh = kv_head(tile.h, a.heads, a.heads_k);
        for (int j = 0; j < tile.keys.count; ++j, ++i) {
            const int stage = i % kStages;
            const int round_parity = (i / kStages - 1) & 1;
            if (i >= kStages) mbarrier_wait(&st.empty_k[stage], round_parity);
            const int entry = tile.keys.entry(j);
            st.entry[stage] = entry;
            const int row = entry_tile(entry) * kBlockN;
            mbarrier_arrive_expect_tx(&st.k_full[stage], Tr::kKBytes);
#pragma unroll
            for (int atom = 0; atom < Tr::kAtomsQK; ++atom) {
                tma_load_4d(smem + Tr::kKOffset + stage * Tr::kKBytes + atom * kBlockN * 128, maps.k, &st.k_full[stage],
                            Op::kAtomCols * atom, row, kvh, tile.b);
            }
            if (i >= kStages) mbarrier_wait(&st.empty_v[stage], round_parity);
            mbarrier_arrive_expect_tx(&st.v_full[stage], Tr::kVBytes);
            // V^T's 4-D view: (keys, headdim_v, heads_k, batch); the box is an atom's keys by kHeadDimV rows.
#pragma unroll
            for (int atom = 0; atom < Tr::kVAtoms; ++atom) {
                tma_load_4d(smem + Tr::kVOffset + stage * Tr::kVBytes + atom * kHeadDimV * 128, maps.v, &st.v_full[stage],
                            row + Op::kAtomCols * atom, 0, kvh, tile.b);
            }
        }
    }

    __device__ __forceinline__ static void issue_scores(float (&s)[Tr::kNTiles][4], unsigned q_tile, int q_row,
                                                        unsigned k_tile) {
        const unsigned long long q_desc = kmajor_desc(q_tile, q_row);
        const unsigned long long k_desc = kmajor_desc(k_tile, 0);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < Tr::kDSteps; ++kk) {
            WgmmaSS<typename Op::Tag, kBlockN>::mma(s, desc_advance(q_desc, kmajor_step<kBlockM>(kk)),
                                        desc_advance(k_desc, kmajor_step<kBlockN>(kk)), kk > 0);
        }
        wgmma_commit();
    }

    // O += P V: B is the V^T tile, K-major (kHeadDimV rows of kBlockN keys).
    __device__ __forceinline__ static void issue_values(float (&o)[Tr::kOTiles][4],
                                                        const unsigned (&p)[Tr::kKeySteps][4], unsigned v_tile) {
        const unsigned long long v_desc = kmajor_desc(v_tile, 0);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < Tr::kKeySteps; ++kk) {
            WgmmaRS<typename Op::Tag, kHeadDimV>::mma(o, p[kk], desc_advance(v_desc, kmajor_step<kHeadDimV>(kk)), 1);
        }
        wgmma_commit();
    }

    // The mask of key tile `entry` on the raw scores (rows row_g and row_g + 8 of this thread).
    __device__ __forceinline__ static void mask(float (&s)[Tr::kNTiles][4], const AttnArgs& a, const Sm90FwdTile& st,
                                                int entry, int row_g, int w0, int col_t) {
        const int n0 = entry_tile(entry) * kBlockN;
        auto& rows = reinterpret_cast<float(&)[1][Tr::kNTiles][4]>(s);
        const auto row_of = [&](int, int r) { return row_g + 8 * r; };
        const bool partial = entry_partial(entry);
        const int cuts = st.mask.key_cuts(w0, 64, n0, kBlockN);
        if (partial || cuts != 0) mask_tile_rows<true>(rows, st.mask, st.layout, a, row_of, n0, col_t, partial, cuts);
    }

    // Consumer warpgroup wg: O (unnormalized, in units of v_stored) and the row statistics of its 64 rows
    // of a work tile, as Sm90FwdMainloop::mma with two consumers: every consumer computes every key tile
    // of the walk, also with three (no skipped tiles, unlike the 16-bit 192-row loop's own_tiles).
    __device__ __forceinline__ static void mma(const AttnArgs& a, Sm90FwdState& st, unsigned char* smem,
                                               const Sm90FwdTile& tile, int wg, int& i, float (&o)[1][Tr::kOTiles][4],
                                               Softmax (&softmax)[1]) {
        const int warp = (threadIdx.x / 32) % 4;
        const int lane = threadIdx.x % 32;
        const int col_t = 2 * (lane % 4);
        const unsigned q_tile = shared_addr(smem);
        const unsigned k_tiles = q_tile + Tr::kKOffset;
        const unsigned v_tiles = q_tile + Tr::kVOffset;
        // The raw path needs a positive factor (it orders raw and scaled scores alike); a descale that is
        // not positive and finite (CuPy's are not read on the host) makes the head's rows NaN.
        const float factor = raw_score_scale(a, tile.b, tile.h) * kLog2eF;
        const float scale_log2 = factor > 0.0f && factor < Consts<float>::inf() ? factor : Consts<float>::nan();
        const int w0 = tile.m0 + 64 * wg;
        const int row_g = w0 + 16 * warp + lane / 4;
        const int count = tile.keys.count;

#pragma unroll
        for (int c = 0; c < Tr::kOTiles; ++c) o[0][c][0] = o[0][c][1] = o[0][c][2] = o[0][c][3] = 0.0f;
        if (count == 0) {
            release_stage(&st.q_empty);
            return;
        }
        float s[Tr::kNTiles][4];
        unsigned p[Tr::kKeySteps][4];
        float rescale[2];
        int stage = i % kStages;
        mbarrier_wait(&st.k_full[stage], (i / kStages) & 1);
        int entry = st.entry[stage];
        Turns::take_turn(wg);
        issue_scores(s, q_tile, 64 * wg, k_tiles + stage * Tr::kKBytes);
        Turns::pass_turn(wg);
        wgmma_wait<0>();
        fence_fragments(s);
        release_stage(&st.empty_k[stage]);
        if (count == 1) release_stage(&st.q_empty);
        mask(s, a, tile, entry, row_g, w0, col_t);
        softmax[0].update_max(s, rescale, scale_log2);  // O is still 0: nothing to rescale
        softmax[0].exponentiate(s, scale_log2);
        Op::to_operand(p, s);
        for (int j = 1; j < count; ++j) {
            const int prev = stage;
            const int prev_parity = (i / kStages) & 1;
            ++i;
            stage = i % kStages;
            mbarrier_wait(&st.k_full[stage], (i / kStages) & 1);
            entry = st.entry[stage];
            Turns::take_turn(wg);
            issue_scores(s, q_tile, 64 * wg, k_tiles + stage * Tr::kKBytes);
            mbarrier_wait(&st.v_full[prev], prev_parity);
            issue_values(o[0], p, v_tiles + prev * Tr::kVBytes);
            Turns::pass_turn(wg);
            wgmma_wait<1>();
            fence_fragments(s);
            release_stage(&st.empty_k[stage]);
            if (j == count - 1) release_stage(&st.q_empty);
            mask(s, a, tile, entry, row_g, w0, col_t);
            // The softmax of S_j overlaps O += P_{j-1} V_{j-1}, as in the 16-bit loop.
            const bool moved = softmax[0].update_max(s, rescale, scale_log2);
            softmax[0].exponentiate(s, scale_log2);
            wgmma_wait<0>();
            fence_fragments(o[0]);
            release_stage(&st.empty_v[prev]);
            if (__any_sync(0xffffffffu, moved)) Softmax::rescale_rows(o[0], rescale);
            Op::to_operand(p, s);
        }
        mbarrier_wait(&st.v_full[stage], (i / kStages) & 1);
        Turns::take_turn(wg);
        issue_values(o[0], p, v_tiles + stage * Tr::kVBytes);
        Turns::pass_turn(wg);
        wgmma_wait<0>();
        fence_fragments(o[0]);
        release_stage(&st.empty_v[stage]);
        ++i;
    }
};

}  // namespace cupyflash
