// The Hopper forward's main loop (float16/bfloat16, sm_90a): for one work tile (kBlockM = 128 or 192 query
// rows of one batch entry and head), the producer's TMA loads of Q and of the K and V tiles of its walk, and
// the consumers' products and online softmax. sm90/fwd.cu assembles it with a scheduler and an epilogue.
//
// Loads: Q with TMA into its own buffer; K and V of each key tile into a ring of kStages stages, each
// completing on its own mbarrier (k_full, v_full). The producer refills a stage's K once the consumers
// have computed S with it (empty_k) and its V once O += P V has read it (empty_v), and publishes each
// stage's tile-list entry (common/mask.cuh) beside the data, so the consumers follow any walk (a key
// range or a block-sparse list) without computing it.
//
// Products: kBlockM / 64 consumer warpgroups of 64 rows each compute S = Q K^T (wgmma, both operands in shared
// memory), the score modifications and the mask (fragment/scores.cuh) and the online softmax in
// registers, then O += P V (wgmma with P from registers, V read transposed from shared memory). Inside a
// consumer, S = Q K_j^T is issued before O += P_{j-1} V_{j-1}, and the softmax of S_j runs while that
// second product is in flight; O is rescaled after it completes. The consumers issue their products in
// turns (Pingpong), so one's products run while the others compute their softmax. Three consumers (192
// rows, 160 registers each) give each scheduler three softmax warps to interleave where two leave its
// exponentials' dependency chains exposed (head dim 64: the loop's warps stalled on fixed-latency
// dependencies 37% of the time with two).
#pragma once
#include "common/dtypes.cuh"
#include "common/launch.cuh"
#include "common/mask.cuh"
#include "common/params.cuh"
#include "common/score_mod.cuh"
#include "common/sequence.cuh"
#include "fragment/dropout.cuh"
#include "fragment/operand.cuh"
#include "fragment/scores.cuh"
#include "fragment/softmax.cuh"
#include "generated/wgmma_ops.cuh"
#include "sm90/pipeline.cuh"
#include "sm90/primitives.cuh"

namespace cupyflash {

// Tensor maps of q, k, v and out (cupyflash/_families/sm90.py builds them): 4-D views (headdim, rows,
// heads, batch) with a box of 64 columns, kBlockM rows for q, kBlockN rows for k and v and 64 rows (one
// consumer warpgroup's) for out, 128-byte swizzle. store_o: out has its map (the epilogue may store
// through shared memory, Sm90FwdTraits::kStoreO).
//
// Paged keys (block_table not null; a KV cache's prefill, 16-bit kernels only): k and v are page pools
// (pages, page_size, heads_k, dim) whose maps view them as (dim, page_size, heads_k, pages) with boxes of
// box_rows rows, a divisor of both page_size and kBlockN and a multiple of 8 (whole 1024-byte swizzle
// periods, so each box lands in the tile's layout at its own rows); key row r of batch entry b is row
// r % page_size of page block_table[b * table_stride + r / page_size].
//
// v_box_rows (paged keys with box_rows a power of two of at least 16 and headdim_v a multiple of 64
// above 64; else 0): v's map is the 5-D view (64 columns, page_size rows, 64-column atoms 128 bytes
// apart, heads_k, pages), so that one box of v_box_rows (= box_rows) rows spans every atom, and V's tiles
// are laid out box by box, [box][atom][v_box_rows][64], instead of [atom][kBlockN][64]. At pages of 16 a
// head dim 128 tile pair then takes 24 boxes instead of 32. (K cannot: S = Q K^T's one wgmma spans every
// key of the tile with one 8-row stride, while O += P V takes 16 keys a k-step, each step with its own
// descriptor.)
struct Sm90FwdMaps {
    TmaDesc q, k, v, o;
    int store_o;
    const int* block_table;
    long long table_stride;
    int page_size;
    int box_rows;
    int capacity;  // rows a table row covers: its pages times page_size
    int v_box_rows;
};

// Where a paged key tile's box starts: its page (-1 past the table's capacity: a coordinate outside the
// pool, so TMA fills the box with zeros) and its first row within that page.
struct PagedBox {
    int page;
    int row;
};

// The box of key row `row` (a multiple of box_rows) of the page table row `pages`: one division, whose
// remainder is the row within the page.
__device__ __forceinline__ PagedBox paged_box(const Sm90FwdMaps& maps, const int* pages, int row) {
    const int index = row / maps.page_size;
    return {row < maps.capacity ? pages[index] : -1, row - index * maps.page_size};
}

template <typename T, int kHeadDim_, int kHeadDimV_, int kBlockM_, int kBlockN_, int kStages_>
struct Sm90FwdTraits {
    static constexpr int kHeadDim = kHeadDim_;    // q.k columns, a multiple of 16
    static constexpr int kHeadDimV = kHeadDimV_;  // v and output columns, a multiple of 16
    static constexpr int kBlockM = kBlockM_;      // query rows per CTA: a consumer warpgroup per 64
    static constexpr int kBlockN = kBlockN_;      // keys per tile
    static constexpr int kStages = kStages_;      // K/V ring
    static constexpr int kConsumers = kBlockM / 64;
    static constexpr int kThreads = 128 * (1 + kConsumers);
    // Registers after setmaxnreg. Their sum over the CTA must not pass what it was launched with
    // (65536 / kThreads, rounded down to a multiple of 8: 168 for 384 threads, 128 for 512): a larger
    // request waits forever for registers. The consumers take what the producer's 24 leave: 240 of two,
    // 160 of three.
    static constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
    static constexpr int kProducerRegs = 24;
    static constexpr int kConsumerRegs = (kLaunchRegs * (1 + kConsumers) - kProducerRegs) / kConsumers / 8 * 8;
    static_assert(kBlockM == 128 || kBlockM == 192, "two or three consumer warpgroups");
    static_assert(128 * (kProducerRegs + kConsumers * kConsumerRegs) <= kThreads * kLaunchRegs, "registers over budget");
    // Tiles are stored in 64-column atoms (sm90/primitives.cuh); columns past the real head dims are zero (TMA).
    static constexpr int kAtomsQK = (kHeadDim + 63) / 64;
    static constexpr int kAtomsV = (kHeadDimV + 63) / 64;
    static constexpr int kQBytes = kBlockM * 128 * kAtomsQK;
    static constexpr int kKBytes = kBlockN * 128 * kAtomsQK;
    static constexpr int kVBytes = kBlockN * 128 * kAtomsV;
    static constexpr int kOBytes = kBlockM * 128 * kAtomsV;
    // One plane per K and V tile (the float32 main loop's tiles have three: sm90/fwd_planes_mainloop.cuh).
    static constexpr int kPlanes = 1;
    static constexpr int kKPlaneBytes = kKBytes;
    static constexpr int kVPlaneBytes = kVBytes;
    static constexpr int kKOffset = kQBytes;
    static constexpr int kVOffset = kKOffset + kStages * kKBytes;
    static constexpr int kOOffset = kVOffset + kStages * kVBytes;
    // 1024 bytes of slack: the swizzled tiles need a 1024-byte aligned base, the dynamic shared memory
    // only promises 16.
    static constexpr int kFixedBytes = 1024 + kCtaStateBytes;
    // The epilogue stages O in shared memory for a TMA store where the tile fits beside the ring (the
    // 227 KiB a CTA may opt into on sm_90); elsewhere it stores from the registers.
    static constexpr bool kStoreO = kFixedBytes + kOOffset + kOBytes <= 227 * 1024;
    static constexpr int kStateOffset = kOOffset + (kStoreO ? kOBytes : 0);
    static constexpr int kSmemBytes = kFixedBytes + kStateOffset;
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
    unsigned long long published[2];   // the state of work tile t in tile[t % 2], for the K/V loader
    unsigned long long tile_empty[2];  // tile[t % 2] read by the consumers' epilogue of t: one arrival per warp
    unsigned long long q_full;         // the state and the Q tile of work tile t, for the consumers
    unsigned long long q_empty;  // Q read by every S of the current work tile: one arrival per consumer warp
    unsigned long long k_full[kMaxStages];
    unsigned long long v_full[kMaxStages];
    unsigned long long empty_k[kMaxStages];  // one arrival per consumer warp
    unsigned long long empty_v[kMaxStages];
    int entry[kMaxStages];                   // the stage's tile-list entry
    int v_rows;  // rows of V's layout blocks (Sm90FwdMaps::v_box_rows, or kBlockN: one block per atom)
    Sm90FwdTile tile[2];                     // work tile t in tile[t % 2]
    // The paired kernel (sm90/fwd.cu's sm90_fwd_pairs): CTA 0 of a cluster takes the pair's work tiles from
    // the scheduler and writes work tile t's index into CTA 1's work[t % 2], arriving on its work_full;
    // CTA 1 arrives on CTA 0's work_empty once it has read it.
    int work[2];
    unsigned long long work_full[2];
    unsigned long long work_empty[2];
};

// tma_load_4d and tma_load_5d, into every CTA of a cluster of kCtas (multicast) where kCtas > 1.
template <int kCtas>
__device__ __forceinline__ void tma_load_4d_in(void* dst, const TmaDesc& map, unsigned long long* bar, int c0, int c1,
                                               int c2, int c3) {
    if constexpr (kCtas == 1) {
        tma_load_4d(dst, map, bar, c0, c1, c2, c3);
    } else {
        tma_load_4d_multicast(dst, map, bar, (1 << kCtas) - 1, c0, c1, c2, c3);
    }
}

template <int kCtas>
__device__ __forceinline__ void tma_load_5d_in(void* dst, const TmaDesc& map, unsigned long long* bar, int c0, int c1,
                                               int c2, int c3, int c4) {
    if constexpr (kCtas == 1) {
        tma_load_5d(dst, map, bar, c0, c1, c2, c3, c4);
    } else {
        tma_load_5d_multicast(dst, map, bar, (1 << kCtas) - 1, c0, c1, c2, c3, c4);
    }
}

// Producer, paged keys (Sm90FwdMaps::block_table; 16-bit kernels): the K and V tiles of a work tile's walk
// as sm90_load_key_tiles loads them, each in boxes of box_rows rows from their pages, by the whole second
// producer warp: lane x reads the table entry of box x (kBlockN / box_rows boxes, at most kBlockN / 8) and
// issues that box's loads, so a tile's entries are read together (one load latency, where one thread
// reading them box after box paid one per box, twice). Each lane finds the next tile's box (the table
// read and the division by page_size) before it waits for that tile's stage, so that between a stage's
// release and its loads stand only the arrivals and the TMA issues: the ring has two stages at head dim
// 128, and work after the wait delays every tile's data by as much. Lane 0 arrives on the barriers. (A
// walk of its own, not a branch inside the dense one, so the dense walk's registers stay as they were:
// the producer runs on 24.)
//
// kCtas > 1 (sm90_fwd_pairs): the cluster's CTAs walk the same key tiles (query heads of one kv head, the
// same rows) into rings at the same offsets; each issues every kCtas-th of a tile's loads (box x's atoms
// numbered x * atoms + atom) into all of them (multicast), announces the whole tile's bytes on its own
// full barriers, and refills a stage once every CTA's consumers have released it (release_stage_in): a
// tile's boxes an SM are 1 / kCtas of the unpaired kernel's.
template <typename Tr, int kCtas>
__device__ __forceinline__ void sm90_load_paged_key_tiles(const AttnArgs& a, const Sm90FwdMaps& maps, Sm90FwdState& st,
                                                          unsigned char* smem, const Sm90FwdTile& tile, int& i) {
    static_assert(Tr::kPlanes == 1, "paged keys: 16-bit tiles");
    constexpr int kStages = Tr::kStages, kBlockN = Tr::kBlockN;
    static_assert(kBlockN / 8 <= 32, "a lane per box of at least 8 rows");
    const int lane = threadIdx.x % 32;
    const int rank = kCtas > 1 ? cluster_rank() : 0;
    const int kvh = kv_head(tile.h, a.heads, a.heads_k);
    const int* pages = maps.block_table + tile.b * maps.table_stride;
    const int box = lane * maps.box_rows;  // this lane's box: its first row within a tile
    const bool loads = box < kBlockN;
    const int count = tile.keys.count;
    PagedBox at = {-1, 0};
    if (count > 0 && loads) at = paged_box(maps, pages, entry_tile(tile.keys.entry(0)) * kBlockN + box);
    for (int j = 0; j < count; ++j, ++i) {
        const int stage = i % kStages;
        const int round_parity = (i / kStages - 1) & 1;
        const int entry = tile.keys.entry(j);
        PagedBox next = {-1, 0};
        if (j + 1 < count && loads) next = paged_box(maps, pages, entry_tile(tile.keys.entry(j + 1)) * kBlockN + box);
        unsigned char* k_tile = smem + Tr::kKOffset + stage * Tr::kKBytes;
        unsigned char* v_tile = smem + Tr::kVOffset + stage * Tr::kVBytes;
        if (i >= kStages) mbarrier_wait(&st.empty_k[stage], round_parity);
        if (lane == 0) {
            st.entry[stage] = entry;
            mbarrier_arrive_expect_tx(&st.k_full[stage], Tr::kKBytes);
        }
        __syncwarp();
        if (loads) {
#pragma unroll
            for (int atom = 0; atom < Tr::kAtomsQK; ++atom) {
                if ((lane * Tr::kAtomsQK + atom) % kCtas == rank) {
                    tma_load_4d_in<kCtas>(k_tile + (atom * kBlockN + box) * 128, maps.k, &st.k_full[stage], 64 * atom,
                                          at.row, kvh, at.page);
                }
            }
        }
        if (i >= kStages) mbarrier_wait(&st.empty_v[stage], round_parity);
        if (lane == 0) mbarrier_arrive_expect_tx(&st.v_full[stage], Tr::kVBytes);
        __syncwarp();
        if (loads && maps.v_box_rows != 0) {
            if (lane % kCtas == rank) {
                tma_load_5d_in<kCtas>(v_tile + box * Tr::kAtomsV * 128, maps.v, &st.v_full[stage], 0, at.row, 0, kvh,
                                      at.page);
            }
        } else if (loads) {
#pragma unroll
            for (int atom = 0; atom < Tr::kAtomsV; ++atom) {
                if ((lane * Tr::kAtomsV + atom) % kCtas == rank) {
                    tma_load_4d_in<kCtas>(v_tile + (atom * kBlockN + box) * 128, maps.v, &st.v_full[stage], 64 * atom,
                                          at.row, kvh, at.page);
                }
            }
        }
        at = next;
    }
}

// Producer: the K and V tiles of a work tile's walk, through the ring of Tr::kStages stages (i: ring
// slots filled so far, over all work tiles). Each tile is Tr::kPlanes 16-bit tiles (plane p of kv head
// h is head p * heads_k + h), Tr::kKPlaneBytes and Tr::kVPlaneBytes apart.
template <typename Tr>
__device__ __forceinline__ void sm90_load_key_tiles(const AttnArgs& a, const Sm90FwdMaps& maps, Sm90FwdState& st,
                                                    unsigned char* smem, const Sm90FwdTile& tile, int& i) {
    constexpr int kStages = Tr::kStages, kBlockN = Tr::kBlockN;
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
        for (int p = 0; p < Tr::kPlanes; ++p) {
#pragma unroll
            for (int atom = 0; atom < Tr::kAtomsQK; ++atom) {
                tma_load_4d(k_tile + p * Tr::kKPlaneBytes + atom * kBlockN * 128, maps.k, &st.k_full[stage], 64 * atom,
                            row, kvh + p * a.heads_k, batch);
            }
        }
        if (i >= kStages) mbarrier_wait(&st.empty_v[stage], round_parity);
        mbarrier_arrive_expect_tx(&st.v_full[stage], Tr::kVBytes);
#pragma unroll
        for (int p = 0; p < Tr::kPlanes; ++p) {
#pragma unroll
            for (int atom = 0; atom < Tr::kAtomsV; ++atom) {
                tma_load_4d(v_tile + p * Tr::kVPlaneBytes + atom * kBlockN * 128, maps.v, &st.v_full[stage], 64 * atom,
                            row, kvh + p * a.heads_k, batch);
            }
        }
    }
}

// Packed batches and KV caches (seqused_k): the V tile of a key tile that runs past its sequence's
// end holds the next sequence's rows or unused cache rows (a TMA box reads whatever the tensor has
// there). Their probabilities are 0, but 0 * inf or NaN would still reach this sequence's output, so a
// consumer warpgroup zeroes those rows of every plane before its O += P V reads them, then meets at
// named barrier `barrier` (its own). Every consumer zeroes the same rows; the later ones write zeros
// over zeros.
// v_rows: the rows of the tile's layout blocks (Sm90FwdState::v_rows).
template <typename Tr>
__device__ __forceinline__ void sm90_clear_foreign_values(unsigned char* v_tile, const AttnArgs& a,
                                                          const Sm90FwdTile& tile, int entry, int barrier,
                                                          int v_rows = Tr::kBlockN) {
    if (a.cu_seqlens_k == nullptr && a.seqused_k == nullptr) return;
    const int first = tile.seq.seqlen_k - entry_tile(entry) * Tr::kBlockN;  // first row past the sequence
    if (first >= Tr::kBlockN) return;
#pragma unroll
    for (int p = 0; p < Tr::kPlanes; ++p) {
        if (v_rows == Tr::kBlockN) {
            zero_tile_rows(v_tile + p * Tr::kVPlaneBytes, Tr::kBlockN, first, Tr::kAtomsV, threadIdx.x % 128, 128);
        } else {
            zero_blocked_rows(v_tile + p * Tr::kVPlaneBytes, Tr::kBlockN, first, Tr::kAtomsV, v_rows, threadIdx.x % 128,
                              128);
        }
    }
    fence_proxy_async();
    named_barrier_sync(barrier, 128);
}

// The walk's key tiles [*first, *last) that some real row of [w0, w0 + 64) sees: a contiguous part of a
// dense walk; a block-sparse list whole.
template <int kBlockN>
__device__ __forceinline__ void sm90_seen_key_tiles(const Sm90FwdTile& tile, int w0, int* first, int* last) {
    const int count = tile.keys.count;
    *first = 0;
    *last = count;
    if (tile.keys.list != nullptr) return;
    const int r0 = max(w0, 0), r1 = min(w0 + 64, tile.seq.seqlen_q);
    int begin = 0, end = 0;
    if (r1 > r0) tile.mask.key_range(r0, r1 - r0, &begin, &end);
    if (end <= begin) {
        *last = 0;
        return;
    }
    *first = min(max(begin / kBlockN - tile.keys.first, 0), count);
    *last = min(max(ceil_div(end, kBlockN) - tile.keys.first, *first), count);
}

// ScoreFn and MaskFn: a score_mod's and a mask_mod's generated code (common/user_calls.cuh), or
// NoUserScore and NoUserMask. A score_mod takes the modified kernels' path (kModified: the scores in
// log2 units before the softmax); a mask_mod runs on the tiles the lists mark partial. kMaxScore: the
// softmax also keeps each row's largest score (raw products in the plain kernels) for the epilogue.
// kCtas: CTAs of a cluster that fill their rings together (sm90_load_paged_key_tiles; sm90_fwd_pairs: 2, paged
// keys only), 1 otherwise.
template <typename T, int kHeadDim, int kHeadDimV, int kBlockM_, int kBlockN, int kStages, bool kScoreMod,
          bool kDropout = false, bool kMaxScore = false, typename ScoreFn = NoUserScore, typename MaskFn = NoUserMask,
          int kCtas_ = 1>
struct Sm90FwdMainloop {
    using Tr = Sm90FwdTraits<T, kHeadDim, kHeadDimV, kBlockM_, kBlockN, kStages>;
    static constexpr int kCtas = kCtas_;
    static constexpr bool kModified = kScoreMod || ScoreFn::kEnabled;
    using Scores = typename ScoresOf<ScoreFn, Log2Scores, true>::type;
    using Softmax = FragmentSoftmax<Tr::kNTiles, false, float, kMaxScore>;
    static constexpr int kBlockM = Tr::kBlockM;
    // Named barriers: the turns 1 .. kConsumers, then one per consumer for sm90_clear_foreign_values; the
    // epilogue takes the kConsumers after those (Sm90FwdEpilogue::kBarrier).
    using Turns = Pingpong<1, Tr::kConsumers>;
    static constexpr int kClearBarrier = 1 + Tr::kConsumers;

    // Producer: the Q tile of work tile (b, h, m0) of sequence seq, counted on q_full. Packed (varlen)
    // tensors are one batch entry whose rows start at the sequence's offset.
    __device__ __forceinline__ static void load_queries(const AttnArgs& a, const Sm90FwdMaps& maps, Sm90FwdState& st,
                                                        unsigned char* smem, const Sequence& seq, int b, int h,
                                                        int m0) {
#pragma unroll
        for (int atom = 0; atom < Tr::kAtomsQK; ++atom) {
            tma_load_4d(smem + atom * kBlockM * 128, maps.q, &st.q_full, 64 * atom, seq.q_start + m0, h,
                        a.cu_seqlens_q != nullptr ? 0 : b);
        }
    }

    // Producer: the K and V tiles of a work tile's walk (sm90_load_key_tiles), and with paged keys
    // (Sm90FwdMaps::block_table) sm90_load_paged_key_tiles.
    static constexpr bool kPagedKeys = true;
    __device__ __forceinline__ static void load_keys(const AttnArgs& a, const Sm90FwdMaps& maps, Sm90FwdState& st,
                                                     unsigned char* smem, const Sm90FwdTile& tile, int& i) {
        static_assert(kCtas == 1, "the paired kernel reads paged keys only");
        sm90_load_key_tiles<Tr>(a, maps, st, smem, tile, i);
    }
    __device__ __forceinline__ static void load_paged_keys(const AttnArgs& a, const Sm90FwdMaps& maps,
                                                           Sm90FwdState& st, unsigned char* smem,
                                                           const Sm90FwdTile& tile, int& i) {
        sm90_load_paged_key_tiles<Tr, kCtas>(a, maps, st, smem, tile, i);
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

    // O += P V with P (probabilities rounded to T) as the register operand, issued. V's tile is laid out
    // in blocks of v_rows rows, [block][atom][v_rows][64] (Sm90FwdMaps::v_box_rows, a power of two; one
    // block, the plain [atom][kBlockN][64], where v_rows = kBlockN, which may be 96 or 80): the atoms of a
    // block are v_rows * 128 bytes apart (the descriptor's leading offset), and k-step kk's 16 keys, in
    // block kk * 16 / v_rows, start the (kAtomsV - 1) atoms of the earlier blocks past the 2048 bytes a
    // step of 16 rows takes: (kk * 16) & -v_rows rows of them, none in one block. (One loop for both
    // layouts: the same products under a branch made ptxas serialize the wgmmas.)
    __device__ __forceinline__ static void issue_values(float (&o)[Tr::kOTiles][4],
                                                        const unsigned (&p)[Tr::kKeySteps][4], unsigned v_tile,
                                                        int v_rows) {
        const unsigned long long v_desc = smem_desc(v_tile, v_rows * 128);
        const int blocks = v_rows < kBlockN ? -v_rows : 0;
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < Tr::kKeySteps; ++kk) {
            const unsigned earlier_atoms = ((kk * 16) & blocks) * 128 * (Tr::kAtomsV - 1);
            WgmmaRS<T, kHeadDimV>::mma(o, p[kk], desc_advance(v_desc, mnmajor_step(kk) + earlier_atoms), 1);
        }
        wgmma_commit();
    }

    // Scores of key tile `entry` (fragment/scores.cuh): with kModified in log2 units with the
    // modifications, else raw products (the softmax applies the scale). Rows row_g and row_g + 8 of this
    // thread, rows [w0, w0 + 64) of its warpgroup; a uniform branch per warpgroup skips the element mask
    // on tiles inside the window and tests only the sides of the window that cut into the tile.
    __device__ __forceinline__ static void modify_and_mask(float (&s)[Tr::kNTiles][4], const AttnArgs& a,
                                                           const Sm90FwdTile& st, const Scores& scores,
                                                           int entry, int row_g, int w0, int col_t) {
        const int n0 = entry_tile(entry) * kBlockN;
        auto& rows = reinterpret_cast<float(&)[1][Tr::kNTiles][4]>(s);
        const auto row_of = [&](int, int r) { return row_g + 8 * r; };
        const auto bias_of = [&](int, int) { return scores.bias_log2; };
        if constexpr (FreezesScores<ScoreFn>::value) {
            // The warp's 16 rows: a tile over which the score_mod's parts that read the positions hold one
            // value takes them once (FrozenScores).
            const int r0 = row_g - (threadIdx.x % 32) / 4;
            if (scores.uniform(r0, r0 + 15, n0, n0 + kBlockN - 1)) {
                modify_rows<kModified, true>(rows, FrozenScores<Scores>(scores, r0, n0), row_of, bias_of, n0, col_t);
            } else {
                modify_rows<kModified, true>(rows, scores, row_of, bias_of, n0, col_t);
            }
        } else {
            modify_rows<kModified, true>(rows, scores, row_of, bias_of, n0, col_t);
        }
        const bool partial = entry_partial(entry);
        const int cuts = st.mask.key_cuts(w0, 64, n0, kBlockN);
        // The score_mod kernels keep one mask for both sides: their registers are spoken for.
        if (partial || cuts != 0) {
            mask_tile_rows<true>(rows, st.mask, st.layout, a, row_of, n0, col_t, partial,
                                 kModified ? Mask::kCutsBoth : cuts, UserMaskAt<MaskFn>(a, st.b, st.h));
        }
    }

    // The online softmax of one block (fragment/softmax.cuh); the scale is folded into the exponent
    // unless the modifications already applied it. The host takes the kScoreMod kernels (or a score_mod's)
    // for softmax_scale <= 0.
    __device__ __forceinline__ static bool fold(Softmax& softmax, float (&s)[Tr::kNTiles][4], float (&rescale)[2],
                                                float scale_log2) {
        bool moved;
        if constexpr (kModified) {
            moved = softmax.update_max(s, rescale);
            softmax.exponentiate(s);
        } else {
            moved = softmax.update_max(s, rescale, scale_log2);
            softmax.exponentiate(s, scale_log2);
        }
        return moved;
    }

    // Dropout (kDropout) of key tile `entry`'s probabilities as the A operand p (fragment/dropout.cuh),
    // after the softmax has summed them: the lse is the softmax's before dropout, and the epilogue applies
    // the kept ones' 1 / (1 - p).
    __device__ __forceinline__ static void drop(unsigned (&p)[Tr::kKeySteps][4], const AttnArgs& a,
                                                const Sm90FwdTile& tile, int entry, int row_g, int col_t) {
        if constexpr (kDropout) {
            drop_operand(p, a.dropout, static_cast<unsigned>(tile.b * a.heads + tile.h), row_g,
                         entry_tile(entry) * kBlockN, col_t);
        }
    }

    // Three consumer warpgroups: each computes only the key tiles of the walk that some row of its own
    // sees (a contiguous part of a dense walk), so a 192-row tile does no more products and
    // exponentials under a causal mask or a window than 64-row tiles would. Block-sparse walks are
    // computed whole (the host keeps them on 128-row tiles).
    static constexpr bool kSkipTiles = Tr::kConsumers == 3;

    // The walk's key tiles [*first, *last) this warpgroup computes.
    __device__ __forceinline__ static void own_tiles(const Sm90FwdTile& tile, int w0, int* first, int* last) {
        if constexpr (kSkipTiles) {
            sm90_seen_key_tiles<kBlockN>(tile, w0, first, last);
        } else {
            *first = 0;
            *last = tile.keys.count;
        }
    }

    // A key tile the warpgroup does not compute: its turn, passed at once, and its stage released once
    // loaded (an arrival before the load could count toward the stage's previous round).
    __device__ __forceinline__ static void skip_tile(Sm90FwdState& st, int wg, int& i) {
        const int stage = i % kStages;
        const int parity = (i / kStages) & 1;
        Turns::take_turn(wg);
        Turns::pass_turn(wg);
        mbarrier_wait(&st.k_full[stage], parity);
        release_stage_in<kCtas>(&st.empty_k[stage]);
        mbarrier_wait(&st.v_full[stage], parity);
        release_stage_in<kCtas>(&st.empty_v[stage]);
        ++i;
    }

    // Consumer warpgroup wg (0 .. kConsumers - 1): O (unnormalized) and the row statistics of its 64 rows of a work tile,
    // through the tile's walk (i: ring slots consumed so far, over all work tiles). Releases the Q tile
    // after its last S. Every warpgroup takes count + 1 turns per work tile, computed or not.
    __device__ __forceinline__ static void mma(const AttnArgs& a, Sm90FwdState& st, unsigned char* smem,
                                               const Sm90FwdTile& tile, int wg, int& i, float (&o)[1][Tr::kOTiles][4],
                                               Softmax (&softmax)[1]) {
        const int warp = (threadIdx.x / 32) % 4;
        const int lane = threadIdx.x % 32;
        const int col_t = 2 * (lane % 4);
        const unsigned q_tile = shared_addr(smem);
        const unsigned k_tiles = q_tile + Tr::kKOffset;
        const unsigned v_tiles = q_tile + Tr::kVOffset;
        const float scale_log2 = static_cast<float>(a.softmax_scale) * kLog2eF;
        const int w0 = tile.m0 + 64 * wg;             // the warpgroup's first row
        const int row_g = w0 + 16 * warp + lane / 4;  // this thread's rows: row_g and row_g + 8
        int first, last;
        own_tiles(tile, w0, &first, &last);
        const int count = last - first;  // the key tiles this warpgroup computes
        // The score modifications of this (batch entry, head); the plain kernels need only the scale.
        const Scores scores = kModified ? Scores(a, tile.seq, tile.b, tile.h) : Scores();

#pragma unroll
        for (int c = 0; c < Tr::kOTiles; ++c) o[0][c][0] = o[0][c][1] = o[0][c][2] = o[0][c][3] = 0.0f;
        if (count == 0) {
            release_stage(&st.q_empty);
            if constexpr (kSkipTiles) {
                for (int j = 0; j < tile.keys.count; ++j) skip_tile(st, wg, i);
                if (tile.keys.count > 0) {  // the turn of the last O += P V
                    Turns::take_turn(wg);
                    Turns::pass_turn(wg);
                }
            }
            return;
        }
        if constexpr (kSkipTiles) {
            for (int j = 0; j < first; ++j) skip_tile(st, wg, i);
        }
        float s[Tr::kNTiles][4];
        unsigned p[Tr::kKeySteps][4];
        float rescale[2];
        // Key tile 0: S only.
        int stage = i % kStages;
        mbarrier_wait(&st.k_full[stage], (i / kStages) & 1);
        int entry = st.entry[stage];
        Turns::take_turn(wg);
        issue_scores(s, q_tile, 64 * wg, k_tiles + stage * Tr::kKBytes);
        Turns::pass_turn(wg);
        wgmma_wait<0>();
        fence_fragments(s);
        release_stage_in<kCtas>(&st.empty_k[stage]);
        if (count == 1) release_stage(&st.q_empty);
        modify_and_mask(s, a, tile, scores, entry, row_g, w0, col_t);
        fold(softmax[0], s, rescale, scale_log2);  // O is still 0: nothing to rescale
        to_operand<T>(p, s);
        drop(p, a, tile, entry, row_g, col_t);
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
            Turns::take_turn(wg);
            issue_scores(s, q_tile, 64 * wg, k_tiles + stage * Tr::kKBytes);
            mbarrier_wait(&st.v_full[prev], prev_parity);
            sm90_clear_foreign_values<Tr>(smem + Tr::kVOffset + prev * Tr::kVBytes, a, tile, v_entry, kClearBarrier + wg,
                                          st.v_rows);
            issue_values(o[0], p, v_tiles + prev * Tr::kVBytes, st.v_rows);
            Turns::pass_turn(wg);
            wgmma_wait<1>();
            fence_fragments(s);
            release_stage_in<kCtas>(&st.empty_k[stage]);
            if (j == count - 1) release_stage(&st.q_empty);  // the next work tile's Q may load
            modify_and_mask(s, a, tile, scores, entry, row_g, w0, col_t);
            const bool moved = fold(softmax[0], s, rescale, scale_log2);
            wgmma_wait<0>();
            fence_fragments(o[0]);
            release_stage_in<kCtas>(&st.empty_v[prev]);
            if (__any_sync(0xffffffffu, moved)) Softmax::rescale_rows(o[0], rescale);
            to_operand<T>(p, s);
            drop(p, a, tile, entry, row_g, col_t);
            v_entry = entry;
        }
        mbarrier_wait(&st.v_full[stage], (i / kStages) & 1);
        Turns::take_turn(wg);
        sm90_clear_foreign_values<Tr>(smem + Tr::kVOffset + stage * Tr::kVBytes, a, tile, entry, kClearBarrier + wg,
                                      st.v_rows);
        issue_values(o[0], p, v_tiles + stage * Tr::kVBytes, st.v_rows);
        Turns::pass_turn(wg);
        wgmma_wait<0>();
        fence_fragments(o[0]);
        release_stage_in<kCtas>(&st.empty_v[stage]);
        ++i;
        if constexpr (kSkipTiles) {
            for (int j = last; j < tile.keys.count; ++j) skip_tile(st, wg, i);
        }
    }
};

}  // namespace cupyflash
