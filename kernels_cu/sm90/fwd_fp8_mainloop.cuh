// The Hopper forward's main loop for FP8 inputs (e4m3, sm_90a): Sm90FwdFp8Mainloop, which sm90/fwd_fp8.cu
// assembles with the kernel body of sm90/fwd_kernel.cuh (producer, two consumer warpgroups, persistent
// grid) and a register epilogue.
//
// 8-bit wgmma (m64nNk32) reads both operands K-major. S = Q K^T is as in the 16-bit loop, with 128-byte
// atoms of 128 columns. For O += P V, V must be stored with the keys contiguous: the pre-pass
// fp8_transpose_values (sm90/fp8_values.cu) writes V^T, (batch, heads_k, headdim_v, keys rounded up to
// 32), whose tiles are headdim_v rows of kBlockN keys. P is the A operand, from registers: a thread's
// accumulators of S hold, in row g, keys 2t, 2t + 1 of each 8-key n-tile, where the A fragment of a
// 32-key step wants keys 4t .. 4t + 3 and 16 + 4t .. 19 + 4t. Instead of moving bytes between the quad's
// threads, the k-step's keys are taken in another order: A's key 4t + j (j < 4) is key 8 (j / 2) + 2t +
// j % 2 of the step, and A's key 16 + 4t + j is 16 more; V^T stores each 32-key block in that order (the
// pre-pass does), so the products pair each probability with its own value row.
//
// Scores: raw products s = q_stored . k_stored; the softmax folds softmax_scale * q_descale * k_descale
// (one factor per work tile, positive) into its exponent, as the plain 16-bit kernels fold softmax_scale.
// P, scaled by 2^8, is rounded to e4m3 for the product (the softmax's sums keep float32); the epilogue
// multiplies out by
// v_descale with 1 / l. Masks, windows, GQA, block masks and the maximum score as in the 16-bit loop;
// no score modifications, sinks, dropout, or packed sequences yet (cupyflash/_problem.py refuses those
// calls with CuPy arrays).
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
#include "sm90/pipeline.cuh"
#include "sm90/primitives.cuh"

namespace cupyflash {

template <int kHeadDim_, int kHeadDimV_, int kBlockN_, int kStages_>
struct Sm90FwdFp8Traits {
    static constexpr int kHeadDim = kHeadDim_;    // q.k columns, a multiple of 32
    static constexpr int kHeadDimV = kHeadDimV_;  // v and output columns, a multiple of 16
    static constexpr int kBlockM = 128;           // two consumer warpgroups
    static constexpr int kBlockN = kBlockN_;      // keys per tile: 128
    static constexpr int kStages = kStages_;
    static constexpr int kConsumers = 2;
    static constexpr int kThreads = 128 * (1 + kConsumers);
    static constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
    static constexpr int kProducerRegs = 24;
    static constexpr int kConsumerRegs = (kLaunchRegs * (1 + kConsumers) - kProducerRegs) / kConsumers / 8 * 8;
    // Q and K tiles in 128-byte atoms of 128 columns (a head dim of 64 fills half of one; TMA zeroes the
    // rest, which no product reads). The V^T tile: kHeadDimV rows of kBlockN keys, one atom.
    static constexpr int kAtomsQK = (kHeadDim + 127) / 128;
    static constexpr int kQBytes = kBlockM * 128 * kAtomsQK;
    static constexpr int kKBytes = kBlockN * 128 * kAtomsQK;
    static constexpr int kVBytes = kHeadDimV * kBlockN;
    static constexpr int kKOffset = kQBytes;
    static constexpr int kVOffset = kKOffset + kStages * kKBytes;
    static constexpr int kFixedBytes = 1024 + kCtaStateBytes;
    static constexpr int kStateOffset = kVOffset + kStages * kVBytes;
    static constexpr int kSmemBytes = kFixedBytes + kStateOffset;
    static constexpr int kDSteps = kHeadDim / 32;   // k-steps of S = Q K^T
    static constexpr int kKeySteps = kBlockN / 32;  // k-steps of O += P V
    static constexpr int kNTiles = kBlockN / 8;
    static constexpr int kOTiles = kHeadDimV / 8;
    // Of every 4 n-tiles of probabilities, those computed on the FMA pipe (fragment/softmax.cuh's
    // kPolyShare): at head dim 128 one warpgroup's ex2s of a tile take about as many clocks on the
    // special-function unit (16 a clock) as its two QGMMA products on the tensor cores, so a quarter moves;
    // a first choice, to be measured (bench/NOTES.md, session 27).
    static constexpr int kPolyExp2Share = 1;
    static_assert(kHeadDim % 32 == 0 && kHeadDim <= 256 && kHeadDimV % 16 == 0 && kHeadDimV <= 256,
                  "head dims: q.k a multiple of 32, v of 16, up to 256");
    static_assert(kBlockN == 128, "a V^T tile is one 128-byte atom of keys");
    static_assert(kStages >= 2 && kStages <= 4, "2 to 4 stages");
};

// e4m3 A fragments of O += P V from the scores' accumulators: k-step kk's register 0 holds row g's
// probabilities of keys 2t, 2t + 1 of n-tiles 4 kk and 4 kk + 1, register 2 those of n-tiles 4 kk + 2 and
// 4 kk + 3, registers 1 and 3 row g + 8's (the key order V^T is stored in; see the header).
template <int kSteps>
__device__ __forceinline__ void to_e4m3_operand(unsigned (&a)[kSteps][4], const float (&x)[4 * kSteps][4]) {
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) {
        const float(&n0)[4] = x[4 * kk], (&n1)[4] = x[4 * kk + 1], (&n2)[4] = x[4 * kk + 2], (&n3)[4] = x[4 * kk + 3];
        a[kk][0] = pack4_e4m3(n0[0], n0[1], n1[0], n1[1]);
        a[kk][1] = pack4_e4m3(n0[2], n0[3], n1[2], n1[3]);
        a[kk][2] = pack4_e4m3(n2[0], n2[1], n3[0], n3[1]);
        a[kk][3] = pack4_e4m3(n2[2], n2[3], n3[2], n3[3]);
    }
}

// softmax_scale * q_descale * k_descale of work tile (b, h): the factor of a raw product (the plain
// kernels' softmax_scale).
__device__ __forceinline__ float fp8_scale(const AttnArgs& a, int b, int h) {
    const int kvh = kv_head(h, a.heads, a.heads_k);
    float scale = static_cast<float>(a.softmax_scale);
    if (a.q_descale != nullptr) scale *= a.q_descale[b * a.q_descale_heads + (a.q_descale_heads == a.heads ? h : kvh)];
    if (a.k_descale != nullptr) scale *= a.k_descale[b * a.heads_k + kvh];
    return scale;
}

// kMaxScore (return_max_score): the softmax keeps each row's largest raw product for the epilogue.
template <int kHeadDim, int kHeadDimV, int kBlockN, int kStages, bool kMaxScore>
struct Sm90FwdFp8Mainloop {
    using Tr = Sm90FwdFp8Traits<kHeadDim, kHeadDimV, kBlockN, kStages>;
    // Probabilities up to 2^8 (fragment/softmax.cuh's kOffset): e4m3 keeps those down to 2^-17 of a row's
    // largest, where a largest of 1 would lose all below 2^-10.
    using Softmax = FragmentSoftmax<Tr::kNTiles, false, float, kMaxScore, 8, Tr::kPolyExp2Share>;
    static constexpr int kBlockM = Tr::kBlockM;
    using Turns = Pingpong<1, Tr::kConsumers>;

    // Producer: the Q tile of work tile (b, h, m0) of sequence seq (dense batches), counted on q_full.
    __device__ __forceinline__ static void load_queries(const AttnArgs&, const Sm90FwdMaps& maps, Sm90FwdState& st,
                                                        unsigned char* smem, const Sequence& seq, int b, int h,
                                                        int m0) {
#pragma unroll
        for (int atom = 0; atom < Tr::kAtomsQK; ++atom) {
            tma_load_4d(smem + atom * kBlockM * 128, maps.q, &st.q_full, 128 * atom, seq.q_start + m0, h, b);
        }
    }

    // Producer: the K and V^T tiles of a work tile's walk, through the ring (i: slots filled so far).
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
                            128 * atom, row, kvh, tile.b);
            }
            if (i >= kStages) mbarrier_wait(&st.empty_v[stage], round_parity);
            mbarrier_arrive_expect_tx(&st.v_full[stage], Tr::kVBytes);
            // V^T's 4-D view: (keys, headdim_v, heads_k, batch); the box is kBlockN keys by kHeadDimV rows.
            tma_load_4d(smem + Tr::kVOffset + stage * Tr::kVBytes, maps.v, &st.v_full[stage], row, 0, kvh, tile.b);
        }
    }

    __device__ __forceinline__ static void issue_scores(float (&s)[Tr::kNTiles][4], unsigned q_tile, int q_row,
                                                        unsigned k_tile) {
        const unsigned long long q_desc = kmajor_desc(q_tile, q_row);
        const unsigned long long k_desc = kmajor_desc(k_tile, 0);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < Tr::kDSteps; ++kk) {
            WgmmaSS<E4m3, kBlockN>::mma(s, desc_advance(q_desc, kmajor_step<kBlockM>(kk)),
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
            WgmmaRS<E4m3, kHeadDimV>::mma(o, p[kk], desc_advance(v_desc, kmajor_step<kHeadDimV>(kk)), 1);
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
    // of a work tile, as Sm90FwdMainloop::mma (two consumers: every key tile is computed).
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
        const float factor = fp8_scale(a, tile.b, tile.h) * kLog2eF;
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
        to_e4m3_operand(p, s);
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
            to_e4m3_operand(p, s);
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
