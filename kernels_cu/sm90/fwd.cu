// Hopper forward (float16/bfloat16, sm_90a only): TMA loads, wgmma products, warp specialization and a
// persistent grid.
//
// One CTA per SM walks work tiles (kBlockM = 128 query rows of one batch entry and head) and runs three
// warpgroups:
//   - the producer (warpgroup 0, two threads issuing) publishes each work tile's state (sequence, mask,
//     its key tiles) beside its Q tile, loaded with TMA, then the K and V tiles of those key tiles
//     into a ring of kStages stages, each completing on its own mbarrier (k_full, v_full); it refills a
//     stage's K once the consumers have computed S with it (empty_k) and its V once O += P V has read it
//     (empty_v), and loads the next work tile's Q as soon as the last S of the current one is done, so
//     the next tile's loads run under the current tile's last products and epilogue;
//   - two consumer warpgroups of 64 rows each compute S = Q K^T (wgmma, both operands in shared memory),
//     the score modifications, the mask where the tile needs it and the online softmax in registers,
//     then O += P V (wgmma with P from registers, V read transposed from shared memory).
// Inside a consumer, S = Q K_j^T is issued before O += P_{j-1} V_{j-1}, and the softmax of S_j runs while
// that second product is in flight; O is rescaled after it completes. The two consumers issue their
// products in turns, so one's products run while the other computes its softmax. setmaxnreg gives the
// consumers 240 registers and the producer 24.
//
// The producer publishes each stage's tile-list entry (common/mask.cuh) beside the data, so the consumers
// follow any walk (a key range or a block-sparse list) without computing it. Work order: Sm90Schedule.
// Epilogue: fwd_epilogue (epilogue.cuh), straight from the accumulators.
//
// Grid: x = min(work tiles, SMs). Dynamic shared memory: Sm90FwdTraits::kSmemBytes.
#include "common/dtypes.cuh"
#include "common/launch.cuh"
#include "common/mask.cuh"
#include "common/params.cuh"
#include "common/score_mod.cuh"
#include "common/sequence.cuh"
#include "fragment/epilogue.cuh"
#include "fragment/softmax.cuh"
#include "generated/wgmma_ops.cuh"
#include "sm90/primitives.cuh"

namespace cupyflash {

// Tensor maps of q, k and v (cupyflash/_families/sm90.py builds them): 4-D views (headdim, rows, heads,
// batch) with a box of 64 columns, kBlockM rows for q and kBlockN rows for k and v, 128-byte swizzle.
struct Sm90FwdMaps {
    TmaDesc q, k, v;
};

// The order in which the persistent CTAs take work tiles (cupyflash/_families/sm90.py chooses it).
struct Sm90Schedule {
    // 0: the tiles of one (batch entry, head) together, CTA c taking tiles c, c + gridDim.x, ... (equal
    // tiles: the CTAs running at once share one head's K and V in L2). 1: the tiles with the most keys
    // of every head first, handed out as CTAs become free (causal and other masks, packed batches).
    int longest_first;
    int* next_work;  // zeroed before the launch: tiles handed out after each CTA's first (longest_first)
};

template <typename T, int kHeadDim_, int kHeadDimV_, int kBlockN_, int kStages_>
struct Sm90FwdTraits {
    static constexpr int kHeadDim = kHeadDim_;    // q.k columns, a multiple of 16
    static constexpr int kHeadDimV = kHeadDimV_;  // v and output columns, a multiple of 16
    static constexpr int kBlockN = kBlockN_;      // keys per tile
    static constexpr int kStages = kStages_;      // K/V ring
    static constexpr int kBlockM = 128;           // query rows per CTA: two consumer warpgroups of 64
    static constexpr int kConsumers = 2;
    static constexpr int kThreads = 128 * (1 + kConsumers);
    // Registers after setmaxnreg. Their sum over the CTA must not pass what it was launched with
    // (65536 / 384 threads = 168 each): a larger request waits forever for registers.
    static constexpr int kProducerRegs = 24;
    static constexpr int kConsumerRegs = 240;
    static_assert(128 * (kProducerRegs + kConsumers * kConsumerRegs) <= kThreads * 168, "registers over budget");
    // Tiles are stored in 64-column atoms (sm90/primitives.cuh); columns past the real head dims are zero (TMA).
    static constexpr int kAtomsQK = (kHeadDim + 63) / 64;
    static constexpr int kAtomsV = (kHeadDimV + 63) / 64;
    static constexpr int kQBytes = kBlockM * 128 * kAtomsQK;
    static constexpr int kKBytes = kBlockN * 128 * kAtomsQK;
    static constexpr int kVBytes = kBlockN * 128 * kAtomsV;
    static constexpr int kKOffset = kQBytes;
    static constexpr int kVOffset = kKOffset + kStages * kKBytes;
    static constexpr int kStateOffset = kVOffset + kStages * kVBytes;
    // 1024 bytes of slack: the swizzled tiles need a 1024-byte aligned base, the dynamic shared memory
    // only promises 16.
    static constexpr int kSmemBytes = 1024 + kStateOffset + kCtaStateBytes;
    static constexpr int kDSteps = kHeadDim / 16;   // k-steps of S = Q K^T
    static constexpr int kKeySteps = kBlockN / 16;  // k-steps of O += P V
    static constexpr int kNTiles = kBlockN / 8;     // 8-column n-tiles of S per warp
    static constexpr int kOTiles = kHeadDimV / 8;   // of O
    static_assert(kHeadDim % 16 == 0 && kHeadDimV % 16 == 0 && kHeadDim <= 256 && kHeadDimV <= 256,
                  "head dims are multiples of 16 up to 256 (one wgmma width)");
    static_assert(kBlockN % 16 == 0 && kBlockN <= 256 && kBlockN % 8 == 0, "key tiles are multiples of 16 up to 256");
    static_assert(kStages >= 2 && kStages <= 4, "2 to 4 stages");
};

// One work tile as the producer publishes it.
struct Sm90FwdTile {
    Sequence seq;
    Mask mask;
    BlockLayout layout;
    TileRange keys;  // the key tiles the walk visits
    int b, h, m0;
    int done;        // 1: no work is left (the other fields are unset)
};

// The pipeline's barriers and the published values, in shared memory.
struct Sm90FwdState {
    static constexpr int kMaxStages = 4;
    unsigned long long published;  // the state of work tile t, t = 0, 1, ..., for the K/V loader
    unsigned long long q_full;     // the state and the Q tile of work tile t, for the consumers
    unsigned long long q_empty;  // Q read by every S of the current work tile: one arrival per consumer warp
    unsigned long long k_full[kMaxStages];
    unsigned long long v_full[kMaxStages];
    unsigned long long empty_k[kMaxStages];  // one arrival per consumer warp
    unsigned long long empty_v[kMaxStages];
    int entry[kMaxStages];                   // the stage's tile-list entry
    Sm90FwdTile tile[2];                     // work tile t in tile[t % 2]
};

// s = -inf where the mask hides the pair (row_g + 8 (e / 2), n0 + 2 t + 8 nt + e % 2) of fragment element
// [nt][e]; with kLayout also where the block layout does, read as one word of bits per row and 64 keys.
template <bool kLayout, int kNTiles>
__device__ __forceinline__ void mask_scores(float (&s)[kNTiles][4], const Mask& mask, const BlockLayout& layout,
                                            const AttnArgs& a, int row_g, int n0, int col_t) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = row_g + 8 * r;
        int begin, end;
        mask.keys_of(row, n0, &begin, &end);
#pragma unroll
        for (int chunk = 0; chunk < (kNTiles + 7) / 8; ++chunk) {
            const unsigned long long bits = kLayout ? layout.key_bits(a, row, n0 + 64 * chunk, 64) : 0;
#pragma unroll
            for (int nt = 8 * chunk; nt < kNTiles && nt < 8 * chunk + 8; ++nt) {
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    const int offset = col_t + 8 * nt + c;
                    bool visible = offset >= begin && offset < end;
                    if constexpr (kLayout) visible &= ((bits >> (offset - 64 * chunk)) & 1) != 0;
                    float& x = s[nt][2 * r + c];
                    x = visible ? x : Consts<float>::neg_inf();
                }
            }
        }
    }
}

template <typename T, int kHeadDim, int kHeadDimV, int kBlockN, int kStages, bool kScoreMod>
struct Sm90FwdKernel {
    using Tr = Sm90FwdTraits<T, kHeadDim, kHeadDimV, kBlockN, kStages>;
    static constexpr int kBlockM = Tr::kBlockM;

    // The producer warpgroup's Q loader (lane 0 of warp 0): for each work tile of this CTA its state and
    // Q tile, then the end marker. The K/V loader (lane 0 of warp 1) follows the published states; two
    // threads, each with half of the values to keep, fit the producer's 24 registers.
    __device__ __forceinline__ static void load_queries(const AttnArgs& a, const Sm90FwdMaps& maps,
                                                        const Sm90Schedule& schedule, Sm90FwdState& st,
                                                        unsigned char* smem) {
        tma_prefetch_desc(maps.q);
        const int num_tiles = ceil_div(a.seqlen_q, kBlockM);
        const int heads = a.batch * a.heads;
        const int work_count = num_tiles * heads;  // below 2^31: the host limits the grid of every kernel
        int t = 0;  // work tiles published
        for (int w = blockIdx.x, next;; w = next) {
            // The next work tile is asked for now, so the atomic's latency passes during this one.
            next = static_cast<int>(gridDim.x) + (schedule.longest_first ? atomicAdd(schedule.next_work, 1) : w);
            const bool finished = w >= work_count;
            int b = 0, h = 0, m0 = 0;
            Sequence seq;
            if (!finished) {
                // Query tiles count from the last: under a causal mask it sees the most keys.
                const int rank = schedule.longest_first ? w / heads : w % num_tiles;
                const int bh = schedule.longest_first ? w % heads : w / num_tiles;
                b = bh / a.heads;
                h = bh % a.heads;
                m0 = (num_tiles - 1 - rank) * kBlockM;
                seq = Sequence(a, b);
                if (m0 >= seq.seqlen_q) continue;  // past the end of a packed sequence: nothing to do
            }
            Sm90FwdTile& tile = st.tile[t % 2];
            // Q and tile[t % 2] are free once every S of work tile t - 1 is done: by then the K/V loader
            // has read tile[t % 2] for work tile t - 2, and the consumers' epilogue of t - 2 is over.
            if (t > 0) mbarrier_wait(&st.q_empty, (t - 1) & 1);
            tile.done = finished;
            if (!finished) {
                tile.seq = seq;
                tile.mask = Mask(a, seq);
                tile.layout = BlockLayout(a, b, h);
                tile.keys = key_tiles<kBlockM, kBlockN>(a, tile.mask, tile.layout, m0 / kBlockM);
                tile.b = b;
                tile.h = h;
                tile.m0 = m0;
            }
            mbarrier_arrive(&st.published);  // releases tile[t % 2] to the K/V loader
            if (finished) {
                mbarrier_arrive(&st.q_full);
                break;
            }
            // Packed (varlen) tensors are one batch entry whose rows start at the sequence's offset.
            mbarrier_arrive_expect_tx(&st.q_full, Tr::kQBytes);  // releases tile[t % 2] to the consumers
#pragma unroll
            for (int atom = 0; atom < Tr::kAtomsQK; ++atom) {
                tma_load_4d(smem + atom * kBlockM * 128, maps.q, &st.q_full, 64 * atom, seq.q_start + m0, h,
                            a.cu_seqlens_q != nullptr ? 0 : b);
            }
            ++t;
        }
    }

    // The K/V loader: the K and V tiles of every published work tile's walk, through the ring.
    __device__ __forceinline__ static void load_keys(const AttnArgs& a, const Sm90FwdMaps& maps, Sm90FwdState& st,
                                                     unsigned char* smem) {
        tma_prefetch_desc(maps.k);
        tma_prefetch_desc(maps.v);
        int i = 0;  // ring slots filled, over all work tiles
        for (int t = 0;; ++t) {
            mbarrier_wait(&st.published, t & 1);
            const Sm90FwdTile& tile = st.tile[t % 2];
            if (tile.done) break;
            const TileRange keys = tile.keys;
            const int k_start = tile.seq.k_start;
            const int kvh = kv_head(tile.h, a.heads, a.heads_k);
            const int batch = a.cu_seqlens_k != nullptr ? 0 : tile.b;
            for (int j = 0; j < keys.count; ++j, ++i) {
                const int stage = i % kStages;
                // The consumers release a stage's K after S = Q K^T and its V after O += P V (round
                // i / kStages - 1); K of the next tile loads while the last V is still being read.
                const int round_parity = (i / kStages - 1) & 1;
                if (i >= kStages) mbarrier_wait(&st.empty_k[stage], round_parity);
                const int entry = keys.entry(j);
                st.entry[stage] = entry;  // released to the consumers by the arrival below
                const int row = k_start + entry_tile(entry) * kBlockN;
                unsigned char* k_tile = smem + Tr::kKOffset + stage * Tr::kKBytes;
                unsigned char* v_tile = smem + Tr::kVOffset + stage * Tr::kVBytes;
                mbarrier_arrive_expect_tx(&st.k_full[stage], Tr::kKBytes);
#pragma unroll
                for (int atom = 0; atom < Tr::kAtomsQK; ++atom) {
                    tma_load_4d(k_tile + atom * kBlockN * 128, maps.k, &st.k_full[stage], 64 * atom, row, kvh, batch);
                }
                if (i >= kStages) mbarrier_wait(&st.empty_v[stage], round_parity);
                mbarrier_arrive_expect_tx(&st.v_full[stage], Tr::kVBytes);
#pragma unroll
                for (int atom = 0; atom < Tr::kAtomsV; ++atom) {
                    tma_load_4d(v_tile + atom * kBlockN * 128, maps.v, &st.v_full[stage], 64 * atom, row, kvh, batch);
                }
            }
        }
    }

    // S = Q K^T of this warpgroup's 64 rows (Q row offset q_row) and the key tile in `stage`, issued.
    __device__ __forceinline__ static void issue_scores(float (&s)[Tr::kNTiles][4], unsigned q_tile, int q_row,
                                                        unsigned k_tile) {
        const unsigned long long q_desc = kmajor_desc(q_tile, q_row);
        const unsigned long long k_desc = kmajor_desc(k_tile, 0);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < Tr::kDSteps; ++kk) {
            WgmmaSS<T, kBlockN>::mma(s, desc_advance(q_desc, kmajor_step<kBlockM>(kk)),
                                     desc_advance(k_desc, kmajor_step<kBlockN>(kk)), kk > 0);
        }
        wgmma_commit();
    }

    // O += P V with P (probabilities rounded to T) as the register operand, issued.
    __device__ __forceinline__ static void issue_values(float (&o)[Tr::kOTiles][4],
                                                        const unsigned (&p)[Tr::kKeySteps][4], unsigned v_tile) {
        const unsigned long long v_desc = mnmajor_desc<kBlockN>(v_tile);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < Tr::kKeySteps; ++kk) {
            WgmmaRS<T, kHeadDimV>::mma(o, p[kk], desc_advance(v_desc, mnmajor_step(kk)), 1);
        }
        wgmma_commit();
    }

    // Scores of key tile `entry`, masked where the tile needs it: with kScoreMod in log2 units with the
    // modifications, else raw products (the softmax applies the scale). Rows row_g and row_g + 8 of this
    // thread, rows [w0, w0 + 64) of its warpgroup.
    __device__ __forceinline__ static void modify_and_mask(float (&s)[Tr::kNTiles][4], const AttnArgs& a,
                                                           const Sm90FwdTile& st, const Log2Scores& scores,
                                                           int entry, int row_g, int w0, int col_t) {
        const int n0 = entry_tile(entry) * kBlockN;
        if constexpr (kScoreMod) {
#pragma unroll
            for (int nt = 0; nt < Tr::kNTiles; ++nt) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    float unused_tanh;
                    s[nt][e] = scores.modified(s[nt][e], row_g + 8 * (e / 2), n0 + 8 * nt + col_t + e % 2,
                                                  &unused_tanh);
                }
            }
        }
        // A uniform branch per warpgroup: tiles inside the window skip the element mask.
        const bool partial = entry_partial(entry);
        if (partial || !st.mask.tile_is_full(w0, 64, n0, kBlockN)) {
            const Mask mask = st.mask;
            if (partial) {
                mask_scores<true>(s, mask, st.layout, a, row_g, n0, col_t);
            } else {
                mask_scores<false>(s, mask, st.layout, a, row_g, n0, col_t);
            }
        }
    }

    // The online softmax of one block (fragment/softmax.cuh); the scale is folded into the exponent unless the
    // modifications already applied it. The host takes the kScoreMod kernels for softmax_scale <= 0.
    __device__ __forceinline__ static bool fold(FragmentSoftmax<Tr::kNTiles>& softmax, float (&s)[Tr::kNTiles][4],
                                                float (&rescale)[2], float scale_log2) {
        bool moved;
        if constexpr (kScoreMod) {
            moved = softmax.update_max(s, rescale);
            softmax.exponentiate(s);
        } else {
            moved = softmax.update_max(s, rescale, scale_log2);
            softmax.exponentiate(s, scale_log2);
        }
        return moved;
    }

    __device__ __forceinline__ static void to_operand(unsigned (&p)[Tr::kKeySteps][4], const float (&s)[Tr::kNTiles][4]) {
#pragma unroll
        for (int kk = 0; kk < Tr::kKeySteps; ++kk) {
            p[kk][0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
            p[kk][1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
            p[kk][2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            p[kk][3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
        }
    }

    // Marks a stage's K or V tile free for the producer: one arrival per warp, after the warp's last
    // read of it (the wgmma_wait that covers the product reading it).
    __device__ __forceinline__ static void release(unsigned long long* empty) {
        __syncwarp();
        if (threadIdx.x % 32 == 0) mbarrier_arrive(empty);
    }

    // Packed batches and KV caches (seqused_k): the V tile of a key tile that runs past its sequence's
    // end holds the next sequence's rows or unused cache rows (a TMA box reads whatever the tensor has
    // there). Their probabilities are 0, but 0 * inf or NaN would still reach this sequence's output, so
    // the warpgroup zeroes those rows before its O += P V reads them. Both warpgroups zero the same rows;
    // the second writes zeros over zeros.
    __device__ __forceinline__ static void clear_foreign_values(unsigned char* v_tile, const AttnArgs& a,
                                                                const Sm90FwdTile& tile, int entry, int wg) {
        if (a.cu_seqlens_k == nullptr && a.seqused_k == nullptr) return;
        const int first = tile.seq.seqlen_k - entry_tile(entry) * kBlockN;  // first row past the sequence
        if (first >= kBlockN) return;
        zero_tile_rows(v_tile, kBlockN, first, Tr::kAtomsV, threadIdx.x % 128, 128);
        fence_proxy_async();
        named_barrier_sync(3 + wg, 128);
    }

    // The two consumer warpgroups issue their products in turns (named barriers 1 and 2, "pingpong"):
    // one's products run on the tensor cores while the other computes its softmax. Warpgroup wg waits
    // for barrier 1 + wg, which the other warpgroup arrives at after issuing.
    __device__ __forceinline__ static void take_turn(int wg) { named_barrier_sync(1 + wg, 256); }
    __device__ __forceinline__ static void pass_turn(int wg) { named_barrier_arrive(2 - wg, 256); }

    // A consumer warpgroup (wg = 0, 1): for each work tile, its 64 rows through the walk, then the
    // epilogue.
    __device__ __forceinline__ static void consume(const FwdArgs& args, Sm90FwdState& st, unsigned char* smem,
                                                   int wg) {
        const AttnArgs& a = args.attn;
        const int warp = (threadIdx.x / 32) % 4;
        const int lane = threadIdx.x % 32;
        const int col_t = 2 * (lane % 4);
        const unsigned q_tile = shared_addr(smem);
        const unsigned k_tiles = q_tile + Tr::kKOffset;
        const unsigned v_tiles = q_tile + Tr::kVOffset;
        const float scale_log2 = static_cast<float>(a.softmax_scale) * kLog2eF;
        if (wg == 1) pass_turn(1);  // warpgroup 0 issues first
        int i = 0;  // ring slots consumed, over all work tiles
        for (int t = 0;; ++t) {
            mbarrier_wait(&st.q_full, t & 1);
            const Sm90FwdTile& tile = st.tile[t % 2];
            if (tile.done) break;
            const int w0 = tile.m0 + 64 * wg;             // the warpgroup's first row
            const int row_g = w0 + 16 * warp + lane / 4;  // this thread's rows: row_g and row_g + 8
            const int count = tile.keys.count;
            // The score modifications of this (batch entry, head); the plain kernels need only the scale.
            const Log2Scores scores = kScoreMod ? Log2Scores(a, tile.seq, tile.b, tile.h) : Log2Scores();

            float o[1][Tr::kOTiles][4];
#pragma unroll
            for (int c = 0; c < Tr::kOTiles; ++c) o[0][c][0] = o[0][c][1] = o[0][c][2] = o[0][c][3] = 0.0f;
            FragmentSoftmax<Tr::kNTiles> softmax[1];
            if (count == 0) {
                release(&st.q_empty);
            } else {
                float s[Tr::kNTiles][4];
                unsigned p[Tr::kKeySteps][4];
                float rescale[2];
                // Key tile 0: S only.
                int stage = i % kStages;
                mbarrier_wait(&st.k_full[stage], (i / kStages) & 1);
                int entry = st.entry[stage];
                take_turn(wg);
                issue_scores(s, q_tile, 64 * wg, k_tiles + stage * Tr::kKBytes);
                pass_turn(wg);
                wgmma_wait<0>();
                fence_fragments(s);
                release(&st.empty_k[stage]);
                if (count == 1) release(&st.q_empty);
                modify_and_mask(s, a, tile, scores, entry, row_g, w0, col_t);
                fold(softmax[0], s, rescale, scale_log2);  // O is still 0: nothing to rescale
                to_operand(p, s);
                int v_entry = entry;  // the key tile whose probabilities p holds
                for (int j = 1; j < count; ++j) {
                    const int prev = stage;
                    const int prev_parity = (i / kStages) & 1;
                    ++i;
                    stage = i % kStages;
                    mbarrier_wait(&st.k_full[stage], (i / kStages) & 1);
                    entry = st.entry[stage];
                    // S_j = Q K_j^T, then O += P_{j-1} V_{j-1}; the softmax of S_j overlaps the second
                    // product, and the other warpgroup's products run during this one's softmax.
                    take_turn(wg);
                    issue_scores(s, q_tile, 64 * wg, k_tiles + stage * Tr::kKBytes);
                    mbarrier_wait(&st.v_full[prev], prev_parity);
                    clear_foreign_values(smem + Tr::kVOffset + prev * Tr::kVBytes, a, tile, v_entry, wg);
                    issue_values(o[0], p, v_tiles + prev * Tr::kVBytes);
                    pass_turn(wg);
                    wgmma_wait<1>();
                    fence_fragments(s);
                    release(&st.empty_k[stage]);
                    if (j == count - 1) release(&st.q_empty);  // the next work tile's Q may load
                    modify_and_mask(s, a, tile, scores, entry, row_g, w0, col_t);
                    const bool moved = fold(softmax[0], s, rescale, scale_log2);
                    wgmma_wait<0>();
                    fence_fragments(o[0]);
                    release(&st.empty_v[prev]);
                    if (__any_sync(0xffffffffu, moved)) FragmentSoftmax<Tr::kNTiles>::rescale_rows(o[0], rescale);
                    to_operand(p, s);
                    v_entry = entry;
                }
                mbarrier_wait(&st.v_full[stage], (i / kStages) & 1);
                take_turn(wg);
                clear_foreign_values(smem + Tr::kVOffset + stage * Tr::kVBytes, a, tile, entry, wg);
                issue_values(o[0], p, v_tiles + stage * Tr::kVBytes);
                pass_turn(wg);
                wgmma_wait<0>();
                fence_fragments(o[0]);
                release(&st.empty_v[stage]);
                ++i;
            }
            fwd_epilogue<T>(args, tile.seq, tile.b, tile.h, row_g - lane / 4, o, softmax);
        }
        // Warpgroup 1 passed the turn once more than warpgroup 0 took it (it started by passing).
        if (wg == 0) take_turn(0);
    }
};

template <typename T, int kHeadDim, int kHeadDimV, int kBlockN, int kStages, bool kScoreMod>
__global__ void __launch_bounds__(Sm90FwdTraits<T, kHeadDim, kHeadDimV, kBlockN, kStages>::kThreads, 1)
sm90_fwd(const CUPYFLASH_GRID_CONSTANT FwdArgs args, const CUPYFLASH_GRID_CONSTANT Sm90FwdMaps maps,
         const Sm90Schedule schedule) {
    using Tr = Sm90FwdTraits<T, kHeadDim, kHeadDimV, kBlockN, kStages>;
    using Kernel = Sm90FwdKernel<T, kHeadDim, kHeadDimV, kBlockN, kStages, kScoreMod>;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    require_dynamic_smem<Tr::kSmemBytes>();
    require_sparse_tiles(args.attn, Tr::kBlockM, kBlockN);
    unsigned char* smem = smem_raw + ((1024 - shared_addr(smem_raw) % 1024) % 1024);
    static_assert(sizeof(Sm90FwdState) <= kCtaStateBytes, "the per-CTA state must fit its reserve");
    Sm90FwdState& st = *reinterpret_cast<Sm90FwdState*>(smem + Tr::kStateOffset);
    if (threadIdx.x == 0) {
        mbarrier_init(&st.published, 1);
        mbarrier_init(&st.q_full, 1);
        mbarrier_init(&st.q_empty, 4 * Tr::kConsumers);
        for (int s = 0; s < kStages; ++s) {
            mbarrier_init(&st.k_full[s], 1);
            mbarrier_init(&st.v_full[s], 1);
            mbarrier_init(&st.empty_k[s], 4 * Tr::kConsumers);
            mbarrier_init(&st.empty_v[s], 4 * Tr::kConsumers);
        }
        mbarrier_init_fence();
    }
    __syncthreads();

    // Through a shuffle the compiler knows the warpgroup index is warp-uniform, so the addresses and
    // descriptors derived from it live in uniform registers (in vector registers they spilled).
    const int wg = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0);
    if (wg == 0) {
        warpgroup_set_registers<Tr::kProducerRegs>();
        if (threadIdx.x == 0) Kernel::load_queries(args.attn, maps, schedule, st, smem);
        if (threadIdx.x == 32) Kernel::load_keys(args.attn, maps, st, smem);
    } else {
        warpgroup_set_registers<Tr::kConsumerRegs>();
        Kernel::consume(args, st, smem, wg - 1);
    }
}

}  // namespace cupyflash
