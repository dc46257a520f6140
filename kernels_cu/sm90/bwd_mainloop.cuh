// The Hopper backward's main loop (float16/bfloat16, sm_90a): for one CTA's 128 keys, the producer's
// TMA loads, the consumers' products and the dQ reductions. sm90/bwd.cu assembles it with an epilogue.
//
// After bwd_delta (common/bwd_rows.cu: delta = rowsum(dO * O)), one CTA per kBlockN = 128 keys of one
// (batch entry, kv head) keeps K and V in shared memory and walks the query tiles (kBlockM rows) of every
// query head of its GQA group, as sm80_bwd does; bwd_dq_convert finishes dQ. Three warpgroups:
//   - the producer (warpgroup 0): thread 0 loads K and V once, then each query tile's Q and dO with TMA
//     into a ring of kStages stages (q_full), publishing the tile's head and list entry beside them;
//     warp 1 copies the tile's lse (as lse * LOG2E, +inf for rows without probability) and delta into
//     the same stage (rows_full). Both refill a stage once the consumers release it (empty);
//   - two consumer warpgroups, one per 64 keys. Per query tile each computes
//         S^T = K Q^T and dP^T = V dO^T               (wgmma, both operands in shared memory),
//         P^T = exp2(S^T * scale * LOG2E - lse * LOG2E),  dS^T = P^T * (dP^T - delta)   (registers),
//         dV += P^T dO and dK += dS^T Q                (wgmma, P^T and dS^T from registers),
//     and writes dS^T to shared memory (two buffers, ds_full / ds_free). In the next tile's iteration,
//     once both halves of this tile's dS^T are stored,
//         dQ_part = dS K                               (wgmma, dS^T and K read transposed)
//     for its 64 query rows when kBlockM = 128; with 64-query tiles warpgroup j % 2 takes all of tile
//     j's (kDqAlternate), into a float32 tile of its own in shared memory. A producer thread of warp 2
//     adds those tiles into the float32 buffer with TMA reductions (cp.reduce.async.bulk.tensor, done in
//     L2), so the consumers never wait on device memory.
// Issuing dQ one tile late means a warpgroup never waits for the other's dS^T of the tile it is on, so
// the two can take turns issuing their product blocks (pingpong, as the forward does): one's products
// run on the tensor cores while the other computes P^T and dS^T. With kDqAlternate only the S^T and dP^T
// blocks take turns: the dV, dK and dQ blocks issue as soon as they are ready, since there the warpgroup
// computing dQ waits for its dV and dK products first, and holding the turn through that wait made the
// other warpgroup wait for it (bench/NOTES.md, session 11: +5-6% at head dim 128). P^T is also computed
// while its own dP^T is still in flight. P^T and dS^T never leave the CTA; dK and dV live in the
// consumers' registers for the CTA's whole life (dK = softmax_scale * dS^T Q, scaled once in the
// epilogue). setmaxnreg gives the consumers 240 registers and the producer 24. Every product completes
// within its loop iteration: ptxas serializes wgmma whose accumulators stay in flight across a loop's
// back edge.
//
// Above head dim 128 (kSplitCols) dK and dV of 64 keys at 256 columns are 128 floats per thread of one
// warpgroup, and K, V and two stages of Q and dO fill 192 KiB: the CTA takes 64 keys and the consumers
// take roles (Mainloop::mma_roles), each over the whole 64 x 64 tile:
//   - warpgroup 0: S^T = K Q^T, P^T (and the softcap's derivative folded into it, P'), P' to shared
//     memory for warpgroup 1 (rounded to T as the dV product's operand; float32 with the softcap),
//     dV += P^T dO with P^T from registers, and dQ_part = dS K for dQ's first 128 columns once
//     warpgroup 1 has stored dS^T;
//   - warpgroup 1: dP^T = V dO^T, dS^T = P' (dP^T - delta) with P' from shared memory, dS^T to shared
//     memory, dK += dS^T Q with dS^T from registers, and dQ_part for the other columns (128 at head dim
//     256, 64 at 192).
// So each product reads K, V, Q and dO once (m64n64 and m64n(head dim) shapes; the m64n32 halves of a split
// by queries read K and V twice), and warpgroup 1 waits for warpgroup 0 (P') but not the reverse until
// dQ: its exponentials run under warpgroup 1's dP^T, and its dV under warpgroup 1's dS^T. No room is
// left for a float32 dQ tile: each consumer's dQ_part (64 rows x 128 columns at head dim 256) goes into the
// tile's stage, over the operand its own dV or dK product read (warpgroup 0 over dO, 1 over Q), once
// its products are done, and the reducing producer thread adds each share into the buffer with TMA
// reductions and frees its atoms for the next loads as soon as they are read (empty for dO, q_empty for
// Q), so one half's loads overlap the other half's reductions. Head dim 192 (and 160, and (192, 128))
// runs with three atoms: warpgroup 0's dQ share keeps 128 columns, one atom more than dO holds, which
// goes over the P' buffer, and warpgroup 1's has 64.
//
// Packed (varlen) batches: a TMA box that runs past a sequence's end holds the next sequence's rows. The
// consumers zero those rows of K and V (once) and of Q and dO (per tile) before any product reads them,
// so no inf or NaN of another sequence reaches this one through a 0 * inf. Dense batches get zeros from
// the TMA past the tensor's end.
//
// With deterministic != 0 the CTAs of a (batch entry, kv head) add into each query tile of the buffer
// in a fixed key-tile order (ordered_sum.cuh): that of sm80_bwd, or, when the host knows the CTAs of a
// (batch entry, kv head) run at once (kOrderedByWalk), the order in which their walks reach the tile,
// with the walks of an unmasked problem rotated so that they reach it at different steps. Producer
// thread 96 polls the turns up to two tiles ahead (wait_turns) and passes each to the reducing thread
// through shared memory; the reducing thread releases the shared tile as soon as its reductions have
// read it, and hands the turn on once they are written. The host picks the number of dQ buffers: one,
// or two for the rotated walks above head dim 128, whose 64-key tiles make chains twice as long.
#pragma once
#include "common/dtypes.cuh"
#include "common/launch.cuh"
#include "common/mask.cuh"
#include "common/ordered_sum.cuh"
#include "common/params.cuh"
#include "common/scheduler.cuh"
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

// Tensor maps of q, k, v and dout (cupyflash/_families/sm90.py builds them): 4-D views (headdim, rows,
// heads, batch) with a box of 64 columns, kBlockM rows for q and dout and kBlockN rows for k and v.
// dq_accum: the float32 dQ buffers (or, for float32 with BwdArgs::dq_in_place, dq itself) as a 5-D view
// (dq_ld, rows, heads, batch, buffer) with a box of 32
// columns by kBlockM rows, 128-byte swizzle (the layout of the shared dQ tile).
struct Sm90BwdMaps {
    TmaDesc q, k, v, dout, dq_accum;
    TmaDesc dk, dv;  // with store_dkv: boxes of 64 columns by kBlockN rows, as k's and v's
    int store_dkv;   // whether dk and dv are set (Sm90BwdEpilogue::store_staged)
};

template <typename T, int kHeadDim_, int kHeadDimV_, int kBlockM_, int kStages_>
struct Sm90BwdTraits {
    static constexpr int kHeadDim = kHeadDim_;    // q.k columns, a multiple of 32
    static constexpr int kHeadDimV = kHeadDimV_;  // v and dout columns, a multiple of 32
    static constexpr int kBlockM = kBlockM_;      // queries per tile: 64 or 128
    // Above head dim 128 dK and dV of 64 keys fill a warpgroup's registers, and K and V of 128 keys
    // half of shared memory: the CTA takes 64 keys, and the consumers take roles, one holding dV and the
    // other dK, and split dQ by columns (kSplitCols, see the top of the file). Otherwise each consumer
    // takes 64 of the CTA's 128 keys.
    static constexpr bool kSplitCols = kHeadDim > 128 || kHeadDimV > 128;
    static constexpr int kBlockN = kSplitCols ? 64 : 128;  // keys per CTA
    static constexpr int kStages = kStages_;      // Q/dO ring
    static constexpr int kConsumers = 2;
    // Arrivals that free a stage: with kSplitCols the reducing thread frees the stage's dO and Q atoms
    // (a dQ share is staged over each), else each consumer warp releases the stage.
    static constexpr int kEmptyArrivals = kSplitCols ? 1 : 4 * kConsumers;
    static constexpr int kThreads = 128 * (1 + kConsumers);
    // As in the forward: the registers asked for across the CTA must fit 65536 / 384 = 168 per thread.
    static constexpr int kProducerRegs = 24;
    static constexpr int kConsumerRegs = 240;
    static_assert(128 * (kProducerRegs + kConsumers * kConsumerRegs) <= kThreads * 168, "registers over budget");
    // 64-column atoms of K and Q, V and dO; head dim 96 fills one and a half (the TMA writes zeros past
    // the tensor's columns, and no product reads them: k-steps and widths follow the head dims).
    static constexpr int kAtomsQK = (kHeadDim + 63) / 64;
    static constexpr int kAtomsV = (kHeadDimV + 63) / 64;
    static constexpr int kKBytes = kBlockN * 128 * kAtomsQK;
    static constexpr int kVBytes = kBlockN * 128 * kAtomsV;
    static constexpr int kQBytes = kBlockM * 128 * kAtomsQK;
    static constexpr int kDoBytes = kBlockM * 128 * kAtomsV;
    // dS^T [kBlockN keys][kBlockM queries] in atoms of 64 queries, two buffers (see consume); with
    // kSplitCols the P' of one tile beside them (float32 at most: as many bytes as two bf16 buffers), which at head
    // dim 192 also takes one atom of warpgroup 0's dQ share once P' is read (staged_dq_atom).
    static constexpr int kDsBytes = kBlockN * kBlockM * 2;
    static constexpr int kKOffset = 0;
    static constexpr int kVOffset = kKOffset + kKBytes;
    static constexpr int kQOffset = kVOffset + kVBytes;
    static constexpr int kDoOffset = kQOffset + kStages * kQBytes;
    static constexpr int kDsOffset = kDoOffset + kStages * kDoBytes;
    static constexpr int kPOffset = kDsOffset + 2 * kDsBytes;
    // dQ_part = dS K (kBlockM x kHeadDim) of a tile: with kBlockM = 128 each consumer takes its 64 queries
    // (kDqByRows); with 64-query tiles one consumer takes all of it, warpgroup j % 2 for tile j
    // (kDqAlternate): an m64 n(kHeadDim) product reads dS once per 16 keys where two halves of n(kHeadDim
    // / 2) read it twice (48 KiB of shared-memory reads per tile at head dim 128 instead of 64). With
    // kSplitCols the consumers split the columns in whole atoms of K: warpgroup 0 takes kDqCols, half
    // the head dim rounded up to an atom, and warpgroup 1 the kDqCols1 left (128 + 128 at head dim 256,
    // 128 + 64 at 192).
    static constexpr bool kDqByRows = kBlockM == 128;
    static constexpr bool kDqAlternate = !kDqByRows && !kSplitCols;
    static constexpr int kDqCols = kSplitCols ? (kHeadDim / 2 + 63) / 64 * 64 : kHeadDim;
    static constexpr int kDqCols1 = kSplitCols ? kHeadDim - kDqCols : 0;
    // The float32 dQ share of one tile (kBlockM rows of kHeadDim) in atoms of 32 columns (128 bytes per
    // row) with the 128-byte swizzle, as the dq_accum map's boxes are: one TMA reduction per atom adds it
    // into the buffer. With kDqAlternate each warpgroup has a tile of its own (buffer wg), so a store waits
    // only for the reductions of that warpgroup's previous tile, two tiles back. With kSplitCols there is
    // no room for it: the dQ shares go through the stage.
    static constexpr int kDqAtoms = kHeadDim / 32;
    static constexpr int kDqBuffers = kSplitCols ? 0 : kDqAlternate ? 2 : 1;
    // Whether the dV, dK and dQ blocks take turns as the S^T and dP^T blocks do (see the top of the file).
    static constexpr bool kKeyGradientTurns = !kDqAlternate;
    static constexpr int kDqBytes = kBlockM * kHeadDim * 4;
    static constexpr int kDqOffset = kPOffset + (kSplitCols ? 2 * kDsBytes : 0);
    static constexpr int kRowsOffset = kDqOffset + kDqBuffers * kDqBytes;  // per stage: lse * LOG2E, delta
    static constexpr int kStateOffset = kRowsOffset + kStages * 2 * kBlockM * 4;
    static constexpr int kSmemBytes = 1024 + kStateOffset + kCtaStateBytes;  // 1024: alignment slack
    // A consumer's S^T and dP^T: 64 keys by all the tile's queries.
    static constexpr int kWgQueries = kBlockM;
    static constexpr int kSTiles = kWgQueries / 8;   // 8-query n-tiles of S^T and dP^T
    static constexpr int kOpSteps = kWgQueries / 16;  // 16-query k-steps of P^T and dS^T as operands
    static constexpr int kQSteps = kBlockM / 16;      // k-steps of dV += P^T dO and dK += dS^T Q
    // dK and dV columns per consumer: all (with kSplitCols warpgroup 0 holds only dV, 1 only dK).
    static constexpr int kDkCols = kHeadDim;
    static constexpr int kDvCols = kHeadDimV;
    static constexpr int kDkTiles = kDkCols / 8;
    static constexpr int kDvTiles = kDvCols / 8;
    static constexpr int kDqTiles = kDqCols / 8;
    static constexpr int kDqTiles1 = kDqCols1 / 8;
    static_assert(kBlockM == 64 || kBlockM == 128, "query tiles of 64 or 128 rows");
    static_assert(kHeadDim % 32 == 0 && kHeadDimV % 32 == 0 && kHeadDim <= 256 && kHeadDimV <= 256,
                  "head dims are whole 32-column dQ atoms up to 256");
    static_assert(kDqCols % 64 == 0 || !kSplitCols, "warpgroup 0's dQ columns are whole atoms of K");
    static_assert(!kSplitCols || (kBlockM == 64 && kHeadDim == kHeadDimV),
                  "split columns: 64-query tiles, equal head dims (dQ_part fills the stage)");
    static_assert(kStages >= 2 && kStages <= 4, "2 to 4 stages");
};

// The pipeline's barriers and the published values, in shared memory.
struct Sm90BwdState {
    static constexpr int kMaxStages = 4;
    unsigned long long kv_full;
    unsigned long long q_full[kMaxStages];     // Q and dO of the stage, and its head and entry
    unsigned long long rows_full[kMaxStages];  // lse and delta of the stage: one arrival per lane of warp 1
    unsigned long long empty[kMaxStages];      // the stage is free: Tr::kEmptyArrivals (kSplitCols: see q_empty)
    unsigned long long ds_full[2];             // dS^T buffer stored: one arrival per thread that stores it
    unsigned long long ds_free[2];             // its dQ product is done: one arrival per consumer thread
    unsigned long long dq_full[2];             // dQ tile b is stored: one arrival per thread that stores it
    unsigned long long dq_empty[2];            // its reductions have read it (float32: dq_empty[0], X's dQ)
    unsigned long long q_empty[kMaxStages];    // kSplitCols: the stage's Q atoms are free (`empty`: its dO atoms)
    unsigned long long dq_staged[2][kMaxStages];  // kSplitCols: warpgroup w's dQ share is in the stage (float32: X)
    unsigned long long p_full;                 // kSplitCols: warpgroup 0 has stored the tile's P'
    unsigned long long p_free;                 // warpgroup 1 has read it
    unsigned long long turn_ready[2];          // the ordered sum: the turn of the reducing thread's tile i % 2 has come
    unsigned long long turn_free[2];           // the reducing thread has taken it
    int* first_share[2];                       // dq_claims: where the reducing thread's tile i % 2 takes its first
                                               // share, the tile's written flag; null: it adds its share
    int head[kMaxStages];                      // query head of the stage's tile; -1: the walk is over
    int entry[kMaxStages];                     // its tile-list entry (common/mask.cuh)
};

// What every Hopper backward main loop of kBlockN-key CTAs and kBlockM-query tiles shares: the CTA's
// walk, under the ordered sum the producer thread that polls the turns, and the bank order of the
// consumers' dQ stores (a dQ share of whole 32-column atoms). kClaims: the main loop may run with
// unzeroed dQ buffers (BwdArgs::dq_claims; the 16-bit one: float32's adds into dq itself).
template <int kBlockM, int kBlockN, bool kClaims>
struct Sm90BwdShared {
    // The CTA's walk: f(query head, entry) for the query tiles of each head of the GQA group, heads in
    // order, each head's tiles ascending from its entry `rotation` and round (the ordered sum's rotated
    // walks, common/ordered_sum.cuh; 0 otherwise, and below every head's tile count when not 0). Every
    // producer thread walks it alike. Under a block mask each head's range in the list is the one
    // sm90/bwd_key_order.cu left in args.walk_ranges (one load, no search of the list).
    template <typename F>
    __device__ __forceinline__ static void walk(const BwdArgs& args, const Mask& mask, const TileWork& work, int rotation,
                                                F&& f) {
        const AttnArgs& a = args.attn;
        const int group = a.heads / a.heads_k;
        for (int g = 0; g < group; ++g) {
            const int h = work.h * group + g;
            const BlockLayout layout(a, work.b, h);
            TileRange tiles;
            if (layout.cells != nullptr) {
                int listed;  // (the range's end is in walk_ranges)
                // (an int: b * h * key tiles * 128 query rows of q's elements would not fit memory
                // long before 2^31; a 64-bit index here raised the producers' spills)
                const int walk = ((work.b * a.heads_k + work.h) * ceil_div(a.seqlen_k, kBlockN) + work.tile) * group + g;
                const int2 range = __ldg(args.walk_ranges + walk);
                tiles = {layout.q_list(a, work.tile, &listed), range.x, range.y};
            } else {
                tiles = query_tiles<kBlockM, kBlockN>(a, mask, layout, work.tile);
            }
            for (int j = rotation; j < rotation + tiles.count; ++j) f(h, tiles.entry(j < tiles.count ? j : j - tiles.count));
        }
    }

    // The dQ stores' bank order. A lane holds 8 bytes of each n-tile's row g (lanes 4g .. 4g + 3: its 8
    // columns, two 16-byte chunks {c, c + 1} with c even); the swizzle puts them at chunks {c, c + 1} ^ g,
    // so rows g and g ^ 1 of a half-warp would share their two chunks and each store take two wavefronts.
    // In store j the lanes of odd rows write n-tile j ^ 2 instead (chunks c ^ 4), which lands where
    // n-tile j would under the key g ^ 4: the 16 lanes of a half-warp then cover the 8 chunks once.
    // n-tile j's chunk is then lane_chunk ^ 2 (j % 4), lane_chunk that of n-tile 0 (the lane's column
    // pair in it, under the key): four offsets per lane, whatever the number of stores.
    __device__ __forceinline__ static int dq_lane_offset(int lane) {
        const int g = lane / 4;
        const int key = g % 2 ? g ^ 4 : g;
        return (((lane % 4) / 2) ^ key) * 16 + (lane % 2) * 8;
    }
    template <int kTiles>
    __device__ __forceinline__ static float2 dq_pair(const float (&dq)[kTiles][4], int j, int r, bool odd) {
        return odd ? make_float2(dq[j ^ 2][2 * r], dq[j ^ 2][2 * r + 1]) : make_float2(dq[j][2 * r], dq[j][2 * r + 1]);
    }

    // A consumer warpgroup's dQ share (kTiles n-tiles: columns 8 nt + 2 t) into 32-column float32 atoms,
    // n-tile j into the atom at shared offset atom_offset(j / 4), rows 16 warp + g + 8 r at 16-byte chunk
    // ((column % 32) / 4) ^ (row % 8), in the bank order above.
    template <int kTiles, typename AtomOffset>
    __device__ __forceinline__ static void store_dq_atoms(unsigned char* smem, const float (&dq)[kTiles][4], int warp,
                                                          int lane, const AtomOffset& atom_offset) {
        static_assert(kTiles % 4 == 0, "the odd rows' n-tile j ^ 2 stays in the 32-column atom");
        const int row0 = 16 * warp + lane / 4;
        const bool odd = (lane / 4) % 2;
        const int offset = dq_lane_offset(lane);
#pragma unroll
        for (int j = 0; j < kTiles; ++j) {
            unsigned char* atom = smem + atom_offset(j / 4) + row0 * 128;
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                *reinterpret_cast<float2*>(atom + r * 8 * 128 + (offset ^ (32 * (j % 4)))) = dq_pair(dq, j, r, odd);
            }
        }
    }

    // Producer thread 96 (warp 3), under the ordered sum: polls the turn counters of the reducing thread's
    // tiles, up to two tiles ahead of it, and tells it through turn_ready, so the poll's round trip to
    // L2 (about a microsecond a tile) is off the reducing thread's path. With unzeroed dQ buffers
    // (dq_claims) it claims those tiles instead and, where another CTA claimed first, waits until that
    // CTA's share is written (common/ordered_sum.cuh); first_share tells the reducing thread which
    // shares to store. Claims two tiles ahead cannot deadlock: this CTA's stores of the tiles it claimed
    // first wait only for its own consumers.
    __device__ __forceinline__ static void wait_turns(const BwdArgs& args, Sm90BwdState& st, const Sequence& seq,
                                                      const TileWork& work) {
        const bool claims = kClaims && args.dq_claims != nullptr;
        if (!args.deterministic && !claims) return;
        const AttnArgs& a = args.attn;
        const int split = work.tile % args.dq_splits;
        const Mask mask(a, seq);
        const bool rotated = rotated_walks(args, mask);
        int i = 0;
        walk(args, mask, work, walk_rotation<kBlockM, kBlockN>(args, mask, work.tile), [&](int h, int entry) {
            const int q_tile = entry_tile(entry);
            if (i >= 2) mbarrier_wait(&st.turn_free[i % 2], ((i - 2) / 2) & 1);
            if (args.deterministic) {
                wait_for_turn(dq_turn_counter<kBlockM>(args, work.b, h, q_tile, split),
                              key_tile_turn<kBlockM, kBlockN>(args, mask, BlockLayout(a, work.b, h), q_tile, work.tile, rotated));
            } else if constexpr (kClaims) {
                int* claim = dq_claim(args, work.b, h, q_tile);
                const bool first = atomicAdd(claim, 1) == 0;
                if (!first) wait_for_turn(claim + 1, 1);
                st.first_share[i % 2] = first ? claim + 1 : nullptr;
            }
            mbarrier_arrive(&st.turn_ready[i % 2]);
            ++i;
        });
    }

    // Producer thread 64 (warp 2): each tile's dQ share into buffer `split` of the float32
    // accumulator. Per tile of the walk (i-th), under the ordered sum after its turn, share(i, reduce)
    // adds the share's 32-column atoms with reduce(atom, shared offset), one TMA reduction each, and
    // frees their shared memory once read; the turn is handed on once the additions are written. With
    // unzeroed buffers (dq_claims) reduce stores the tile's first share instead. The
    // rows of a tile past its sequence's end hold exact zeros (their probabilities are 0 and their Q
    // and dO rows zero), so in a packed batch adding them to the next sequence's rows changes nothing;
    // past the tensor the TMA drops them.
    template <typename Share>
    __device__ __forceinline__ static void reduce_walk(const BwdArgs& args, const Sm90BwdMaps& maps, Sm90BwdState& st,
                                                       unsigned char* smem, const Sequence& seq, const TileWork& work,
                                                       Share&& share) {
        const AttnArgs& a = args.attn;
        tma_prefetch_desc(maps.dq_accum);
        const int split = work.tile % args.dq_splits;
        const int batch = a.cu_seqlens_q != nullptr ? 0 : work.b;
        const Mask mask(a, seq);
        int i = 0;
        walk(args, mask, work, walk_rotation<kBlockM, kBlockN>(args, mask, work.tile), [&](int h, int entry) {
            const int m0 = entry_tile(entry) * kBlockM;
            // Under the ordered sum after the tile's turn; with unzeroed buffers (dq_claims) once
            // wait_turns has claimed the tile: the first claimant stores its share, the others add theirs
            // once that store is written.
            // (A first share's slot is freed once its written flag is handed on, below.)
            int* turn = nullptr;
            bool store = false;
            if (args.deterministic || (kClaims && args.dq_claims != nullptr)) {
                mbarrier_wait(&st.turn_ready[i % 2], (i / 2) & 1);
                store = kClaims && !args.deterministic && st.first_share[i % 2] != nullptr;
                if (!store) mbarrier_arrive(&st.turn_free[i % 2]);
                fence_proxy_async_global();  // the earlier CTAs' writes before this one's
                if (args.deterministic) turn = dq_turn_counter<kBlockM>(args, work.b, h, m0 / kBlockM, split);
            }
            const auto reduce = [&](int atom, int offset) {
                if (32 * atom < args.dq_ld) {
                    if (store) {
                        tma_store_5d(maps.dq_accum, smem + offset, 32 * atom, seq.q_start + m0, h, batch, split);
                    } else {
                        tma_reduce_add_5d(maps.dq_accum, smem + offset, 32 * atom, seq.q_start + m0, h, batch, split);
                    }
                }
            };
            share(i, reduce);
            if (turn != nullptr) {
                bulk_wait();
                fence_proxy_async_global();
                hand_on_turn(turn);
            }
            if (store) {
                bulk_wait();
                fence_proxy_async_global();
                hand_on_turn(st.first_share[i % 2]);
                mbarrier_arrive(&st.turn_free[i % 2]);
            }
            ++i;
        });
        // Before the CTA ends its shared memory must have been read; the additions themselves land before
        // the kernel completes, as every write does (what reads them is a later launch). Waiting for
        // them here (bulk_wait) kept this thread 2.9 us past the consumers' epilogue (bench/NOTES.md,
        // session 12). Under the ordered sum each turn has already waited for its writes.
        bulk_wait_read();
    }

    // A share staged over tile i's stage by the two consumer warpgroups in roles (split columns): each
    // warpgroup's atoms as it stages them (dq_staged[w]; warpgroup 0's atoms [0, kAtoms0) over dO,
    // warpgroup 1's [kAtoms0, kAtoms) over Q, at atom_offset(stage, atom)), the dO tile freed for the
    // loads (empty) once warpgroup 0's are read, so the next dO loads while Q's atoms are still read,
    // and the Q tile (q_empty) once all are.
    template <int kStages, int kAtoms0, int kAtoms, typename Reduce, typename AtomOffset>
    __device__ __forceinline__ static void reduce_staged(Sm90BwdState& st, int i, const Reduce& reduce,
                                                         const AtomOffset& atom_offset) {
        const int stage = i % kStages;
#pragma unroll
        for (int w = 0; w < 2; ++w) {
            mbarrier_wait(&st.dq_staged[w][stage], (i / kStages) & 1);
#pragma unroll
            for (int atom = w ? kAtoms0 : 0; atom < (w ? kAtoms : kAtoms0); ++atom) reduce(atom, atom_offset(stage, atom));
            bulk_commit();
        }
        bulk_wait_read<1>();
        mbarrier_arrive(&st.empty[stage]);
        bulk_wait_read();
        mbarrier_arrive(&st.q_empty[stage]);
    }
};

// ScoreFn and MaskFn: a score_mod's and a mask_mod's generated code (common/user_calls.cuh), or
// NoUserScore and NoUserMask. A score_mod takes the modified kernels' path (kModified), its derivative
// in place of the softcap's. Its buffers' gradients (kScatter) are taken here for additive functions
// (ScoreFn::kAdditive: dS^T is the gradient the buffers' terms take) at head dims up to 128; the host
// sends the others to the sm80 or general kernels. A mask_mod runs on the tiles the lists mark partial.
template <typename T, int kHeadDim, int kHeadDimV, int kBlockM, int kStages, bool kScoreMod, bool kDropout = false,
          typename ScoreFn = NoUserScore, typename MaskFn = NoUserMask>
struct Sm90BwdMainloop : Sm90BwdShared<kBlockM, Sm90BwdTraits<T, kHeadDim, kHeadDimV, kBlockM, kStages>::kBlockN, true> {
    using Tr = Sm90BwdTraits<T, kHeadDim, kHeadDimV, kBlockM, kStages>;
    static constexpr bool kModified = kScoreMod || ScoreFn::kEnabled;
    static constexpr bool kScatter = ScoreFn::kBufferGradients;
    static_assert(!kScatter || (ScoreFn::kAdditive && !Tr::kSplitCols && Tr::kSTiles <= 8),
                  "buffer gradients: additive, 64-query tiles up to head dim 128");
    // The frozen branch (FrozenScores), with position-free additive functions too (their tiles sum their
    // buffer gradients), on the 64-query tiles: beside the 128-query tile's fragments its second copy of
    // the probabilities took the consumers' local accesses from 48 to 127.
    static constexpr bool kFreeze =
        ScoreFn::kEnabled && (ScoreFn::kFreezable || (kScatter && !ScoreFn::kReadsPositions)) && Tr::kSTiles <= 8;
    using Scores = typename IfType<kScatter, UserLog2ScoresLate<ScoreFn>,
                                   typename ScoresOf<ScoreFn, Log2Scores>::type>::type;
    using Base = Sm90BwdShared<kBlockM, Tr::kBlockN, true>;
    using Base::walk;
    using Base::dq_lane_offset;
    using Base::dq_pair;
    static constexpr int kBlockN = Tr::kBlockN;
    // Named barrier of the 256 consumer threads (id 0 is __syncthreads); the turns take 2 and 3.
    static constexpr int kConsumerBarrier = 1;
    using Turns = Pingpong<2>;

    // Producer thread 0: K and V, then Q and dO of every tile of the walk, then the end marker.
    __device__ __forceinline__ static void load_tiles(const BwdArgs& args, const Sm90BwdMaps& maps, Sm90BwdState& st,
                                                      unsigned char* smem, const Sequence& seq, const TileWork& work) {
        const AttnArgs& a = args.attn;
        tma_prefetch_desc(maps.q);
        tma_prefetch_desc(maps.dout);
        // Packed (varlen) tensors are one batch entry whose rows start at the sequence's offset.
        const int k_batch = a.cu_seqlens_k != nullptr ? 0 : work.b;
        const int q_batch = a.cu_seqlens_q != nullptr ? 0 : work.b;
        const int key_row = seq.k_start + work.tile * kBlockN;
        mbarrier_arrive_expect_tx(&st.kv_full, Tr::kKBytes + Tr::kVBytes);
#pragma unroll
        for (int atom = 0; atom < Tr::kAtomsQK; ++atom) {
            tma_load_4d(smem + Tr::kKOffset + atom * kBlockN * 128, maps.k, &st.kv_full, 64 * atom, key_row, work.h, k_batch);
        }
#pragma unroll
        for (int atom = 0; atom < Tr::kAtomsV; ++atom) {
            tma_load_4d(smem + Tr::kVOffset + atom * kBlockN * 128, maps.v, &st.kv_full, 64 * atom, key_row, work.h, k_batch);
        }
        int i = 0;  // stages filled
        auto next_stage = [&]() {
            const int stage = i % kStages;
            // The consumers release round r of a stage in phase r; the first round needs no wait.
            if (i >= kStages) mbarrier_wait(&st.empty[stage], (i / kStages - 1) & 1);
            return stage;
        };
        const Mask mask(a, seq);
        walk(args, mask, work, walk_rotation<kBlockM, kBlockN>(args, mask, work.tile), [&](int h, int entry) {
            const int stage = next_stage();
            st.head[stage] = h;  // released to the consumers by the arrival below
            st.entry[stage] = entry;
            const int row = seq.q_start + entry_tile(entry) * kBlockM;
            mbarrier_arrive_expect_tx(&st.q_full[stage], Tr::kQBytes + Tr::kDoBytes);
            unsigned char* q_tile = smem + Tr::kQOffset + stage * Tr::kQBytes;
            unsigned char* do_tile = smem + Tr::kDoOffset + stage * Tr::kDoBytes;
            const auto load_q = [&]() {
#pragma unroll
                for (int atom = 0; atom < Tr::kAtomsQK; ++atom) {
                    tma_load_4d(q_tile + atom * kBlockM * 128, maps.q, &st.q_full[stage], 64 * atom, row, h, q_batch);
                }
            };
            const auto load_do = [&]() {
#pragma unroll
                for (int atom = 0; atom < Tr::kAtomsV; ++atom) {
                    tma_load_4d(do_tile + atom * kBlockM * 128, maps.dout, &st.q_full[stage], 64 * atom, row, h, q_batch);
                }
            };
            if constexpr (Tr::kSplitCols) {
                // `empty` freed the dO atoms; the Q atoms hold warpgroup 1's dQ share until q_empty.
                load_do();
                if (i >= kStages) mbarrier_wait(&st.q_empty[stage], (i / kStages - 1) & 1);
                load_q();
            } else {
                load_q();
                load_do();
            }
            ++i;
        });
        const int stage = next_stage();
        st.head[stage] = -1;
        mbarrier_arrive(&st.q_full[stage]);
    }

    // Producer warp 1: each tile's lse and delta rows. A row with no probability mass (past the
    // sequence, or lse = -inf: a row that saw no key) gets +inf, so every exp2(s - lse) of it is 0
    // without a test per element; NaN stays NaN.
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
            const float* lse = static_cast<const float*>(args.lse.ptr) + rows_index(args.lse, work.b, h, seq.q_start) + m0;
            const float* delta =
                static_cast<const float*>(args.delta.ptr) + rows_index(args.delta, work.b, h, seq.q_start) + m0;
            float* lse2 = reinterpret_cast<float*>(smem + Tr::kRowsOffset) + stage * 2 * kBlockM;
#pragma unroll
            for (int r = lane; r < kBlockM; r += 32) {
                const bool in_range = m0 + r < seq.seqlen_q;
                const float l = in_range ? lse[r] : Consts<float>::neg_inf();
                lse2[r] = l == Consts<float>::neg_inf() ? -Consts<float>::neg_inf() : l * kLog2eF;
                lse2[kBlockM + r] = in_range ? delta[r] : 0.0f;
            }
            mbarrier_arrive(&st.rows_full[stage]);
            ++i;
        });
    }

    // d = A B^T over `steps` k-steps, A (kBlockN rows, this warpgroup's 64 from row a_row) and B (kBlockM
    // rows, this warpgroup's kWgQueries from row b_row) both K-major in shared memory: S^T = K Q^T and
    // dP^T = V dO^T. Issued and committed.
    __device__ __forceinline__ static void issue_transposed_scores(float (&d)[Tr::kSTiles][4], unsigned a_tile, int a_row,
                                                                   unsigned b_tile, int b_row, int steps) {
        const unsigned long long a_desc = kmajor_desc(a_tile, a_row);
        const unsigned long long b_desc = kmajor_desc(b_tile, b_row);
        wgmma_fence();
        WgmmaSS<T, Tr::kWgQueries>::overwrite(d, a_desc, b_desc);
#pragma unroll
        for (int kk = 1; kk < steps; ++kk) {
            WgmmaSS<T, Tr::kWgQueries>::mma(d, desc_advance(a_desc, kmajor_step<kBlockN>(kk)),
                                            desc_advance(b_desc, kmajor_step<kBlockM>(kk)), 1);
        }
        wgmma_commit();
    }

    // d += A B with A (64 keys x kBlockM queries: P^T or dS^T) from registers and B (kBlockM rows of a Q
    // or dO tile) read transposed from shared memory. Issued, not committed.
    template <int kN>
    __device__ __forceinline__ static void issue_key_gradient(float (&d)[kN / 8][4], const unsigned (&a)[Tr::kQSteps][4],
                                                              unsigned b_tile) {
        const unsigned long long b_desc = mnmajor_desc<kBlockM>(b_tile);
#pragma unroll
        for (int kk = 0; kk < Tr::kQSteps; ++kk) WgmmaRS<T, kN>::mma(d, a[kk], desc_advance(b_desc, mnmajor_step(kk)), 1);
    }

    // dQ_part = dS K for this warpgroup's share (kTiles n-tiles): A = dS from the dS^T buffer (queries
    // contiguous) and B = K (head-dim columns contiguous, from warpgroup 1's first column with kSplitCols),
    // both read transposed, over the CTA's kBlockN keys.
    template <int kTiles>
    __device__ __forceinline__ static void issue_query_gradient(float (&dq)[kTiles][4], unsigned ds_tile, unsigned k_tile,
                                                                int wg) {
        const unsigned long long a_desc = mnmajor_desc<kBlockN>(ds_tile + (Tr::kDqByRows ? wg * kBlockN * 128 : 0));
        const unsigned long long b_desc =
            mnmajor_desc<kBlockN>(k_tile + (Tr::kSplitCols ? wg * (Tr::kDqCols / 64) * kBlockN * 128 : 0));
        wgmma_fence();
        WgmmaSSMn<T, 8 * kTiles>::overwrite(dq, a_desc, b_desc);
#pragma unroll
        for (int kk = 1; kk < kBlockN / 16; ++kk) {
            WgmmaSSMn<T, 8 * kTiles>::mma(dq, desc_advance(a_desc, mnmajor_step(kk)), desc_advance(b_desc, mnmajor_step(kk)), 1);
        }
        wgmma_commit();
    }

    // This thread's queries' values of a stage row (lse * LOG2E or delta): queries 8 nt + col_t and + 1.
    __device__ __forceinline__ static void read_row_pairs(float2 (&v)[Tr::kSTiles], const float* row, int col_t) {
#pragma unroll
        for (int nt = 0; nt < Tr::kSTiles; ++nt) v[nt] = *reinterpret_cast<const float2*>(row + 8 * nt + col_t);
    }

    // Reading the rows ahead of the product waits holds kSTiles float2 per row in registers while S^T and
    // dP^T are in flight: room that the 64-query tiles have for one row at a time (lse, then delta), but
    // not the 128-query tiles or the head-dim-128 softcap kernel (measured: their consumers' local
    // accesses 119 -> 169 and 7 -> 59), which read each value where it is used.
    static constexpr bool kRowsAhead = Tr::kSTiles * (kModified ? 2 : 1) <= 8;

    // P^T in place of S^T and dS^T in place of dP^T, for S^T and dP^T issued as two groups (S^T first).
    // P^T = exp2(S^T * scale * LOG2E - lse * LOG2E) and, with kModified, (dP^T - delta) * (1 - tanh^2)
    // (fragment/scores.cuh) for this thread's keys key_g, key_g + 8 and queries m0 + 8 nt + col_t + e % 2,
    // then the mask (a uniform branch per warpgroup: tiles that every pair sees skip the element mask),
    // then dS^T = P^T * (dP^T - delta). rows: the stage's lse * LOG2E, then delta (kBlockM each). With
    // kRowsAhead each row is read before the wait for the product that needs it, while the products run:
    // read after it, its latency sits on the path to the exponentials.
    //
    // kDropout: the tile's keep decisions are drawn first, while S^T and dP^T are in flight; dP^T takes Z =
    // keep / (1 - p) before it meets delta (and the softcap's derivative), so dS^T = P^T (dP^T Z - delta),
    // and P^T takes Z after dS^T, for dV += (P^T Z) dO.
    //
    // frozen: the score_mod's parts that read the positions hold one value over the warp's 16 keys from
    // key_w and the tile's queries (FrozenScores).
    __device__ __forceinline__ static void score_gradients_of(float (&s)[Tr::kSTiles][4], float (&dp)[Tr::kSTiles][4],
                                                              const AttnArgs& a, const Mask& mask, const Scores& scores,
                                                              const float* rows, const UserMaskAt<MaskFn, !kModified>& user,
                                                              int h, int b, int entry, int m0, int key_g, int key0,
                                                              int col_t, bool frozen, int key_w) {
        unsigned long long kept = 0;
        if constexpr (kDropout) {
            // The draws need m0 % 16 == 0: the walk's query tiles start at multiples of kBlockM.
            static_assert(kBlockM % 16 == 0 && !Tr::kSplitCols, "dropout: 16-aligned query tiles, per-consumer keys");
            kept = dropout_bits_transposed<Tr::kSTiles>(a.dropout, static_cast<unsigned>(b * a.heads + h), key_g, m0,
                                                        col_t, LaneXor4{});
        }
        const float keep_scale = static_cast<float>(a.dropout.scale);
        float2 lse2[Tr::kSTiles];
        float2 delta[Tr::kSTiles];
        const auto lse2_pair = [&](int nt) {
            return kRowsAhead ? lse2[nt] : *reinterpret_cast<const float2*>(rows + 8 * nt + col_t);
        };
        const auto delta_pair = [&](int nt) {
            return kRowsAhead ? delta[nt] : *reinterpret_cast<const float2*>(rows + kBlockM + 8 * nt + col_t);
        };
        if constexpr (kRowsAhead) read_row_pairs(lse2, rows, col_t);
        if constexpr (kModified) {  // the softcap's derivative needs dP^T with the exponentials
            if constexpr (kRowsAhead) read_row_pairs(delta, rows + kBlockM, col_t);
            wgmma_wait<0>();
            fence_fragments(dp);
            if constexpr (kDropout) apply_dropout_transposed(dp, kept, keep_scale);
        } else {
            wgmma_wait<1>();  // dP^T still in flight
        }
        fence_fragments(s);
        auto& p = reinterpret_cast<float(&)[1][Tr::kSTiles][4]>(s);
        auto& ds = reinterpret_cast<float(&)[1][Tr::kSTiles][4]>(dp);
        if constexpr (kFreeze) {
            if (frozen) {
                probabilities_cols<kModified>(p, ds, FrozenScores<Scores>(scores, m0, key_w), lse2_pair, delta_pair,
                                              key_g, m0, col_t);
            } else {
                probabilities_cols<kModified>(p, ds, scores, lse2_pair, delta_pair, key_g, m0, col_t);
            }
        } else {
            probabilities_cols<kModified>(p, ds, scores, lse2_pair, delta_pair, key_g, m0, col_t);
        }
        const bool partial = entry_partial(entry);
        if (partial || !mask.tile_is_full(m0, Tr::kWgQueries, key0, 64)) {
            mask_tile_cols(p, mask, BlockLayout(a, b, h), a, key_g, m0, col_t, partial, user);
        }
        if constexpr (kRowsAhead && !kModified) read_row_pairs(delta, rows + kBlockM, col_t);
        wgmma_wait<0>();
        fence_fragments(dp);
        if constexpr (kDropout && !kModified) apply_dropout_transposed(dp, kept, keep_scale);
        score_gradients<kModified>(ds, p, delta_pair);
        if constexpr (kDropout) apply_dropout_transposed(s, kept, keep_scale);
    }

    // This thread's dS^T (or P^T) fragments into a [kBlockN keys][kBlockM queries] buffer: key row kr =
    // key_row + 8 (reg % 2) and query column col0 + 16 kk + 8 (reg / 2) + col_t, stored at atom
    // (column / 64), row kr, 16-byte chunk ((column % 64) / 8) ^ (kr % 8) (the 128-byte swizzle). The 8
    // rows of a warp's store hit 8 chunks.
    __device__ __forceinline__ static void store_ds(unsigned char* ds_tile, const unsigned (&f)[Tr::kOpSteps][4],
                                                    int key_row, int col0, int col_t) {
        const int g = key_row % 8;
#pragma unroll
        for (int kk = 0; kk < Tr::kOpSteps; ++kk) {
#pragma unroll
            for (int reg = 0; reg < 4; ++reg) {
                const int row = key_row + 8 * (reg % 2);
                const int col = col0 + 16 * kk + 8 * (reg / 2);  // + col_t
                const int chunk = ((col % 64) / 8) ^ g;
                *reinterpret_cast<unsigned*>(ds_tile + (col / 64) * kBlockN * 128 + row * 128 + chunk * 16 + col_t * 2) =
                    f[kk][reg];
            }
        }
    }

    // kScatter: the buffer gradients of this thread's dS^T (additive: ds_mod itself) in a tile where the
    // function varies, read back from the buffer store_ds put them in (key rows n0 + key_row + 8 (reg % 2),
    // query columns m0 + 16 kk + 8 (reg / 2) + col_t and + 1), a pair at a time in a loop that is not
    // unrolled: by then the registers hold the key products' operands. Each term is the dS^T that dQ and
    // dK take, rounded to T.
    template <typename Sink>
    __device__ __forceinline__ static void scatter_stored(const unsigned char* ds_tile, const Scores& scores, Sink& sink,
                                                          int key_row, int n0, int m0, int col_t) {
        const int g = key_row % 8;
#pragma unroll 1
        for (int x = 0; x < Tr::kOpSteps * 4; ++x) {
            const int kk = x / 4, reg = x % 4;
            const int row = key_row + 8 * (reg % 2);
            const int col = 16 * kk + 8 * (reg / 2);  // + col_t
            const int chunk = ((col % 64) / 8) ^ g;
            const float2 v = unpack2<T>(*reinterpret_cast<const unsigned*>(
                ds_tile + (col / 64) * kBlockN * 128 + row * 128 + chunk * 16 + col_t * 2));
            scores.scatter(v.x, m0 + col + col_t, n0 + row, sink);
            scores.scatter(v.y, m0 + col + col_t + 1, n0 + row, sink);
        }
    }

    // Zeroes the rows of a Q and dO stage past a packed sequence's end (see the top of the file); all
    // 256 consumer threads call it for every tile, and they meet at a barrier when there is work.
    __device__ __forceinline__ static void clear_foreign_queries(unsigned char* smem, const Sequence& seq, int stage,
                                                                 int m0, int thread) {
        if (seq.seqlen_q - m0 >= kBlockM) return;
        zero_tile_rows(smem + Tr::kQOffset + stage * Tr::kQBytes, kBlockM, seq.seqlen_q - m0, Tr::kAtomsQK, thread, 256);
        zero_tile_rows(smem + Tr::kDoOffset + stage * Tr::kDoBytes, kBlockM, seq.seqlen_q - m0, Tr::kAtomsV, thread, 256);
        fence_proxy_async();
        named_barrier_sync(kConsumerBarrier, 256);
    }

    static_assert(Tr::kDqTiles % 4 == 0 && Tr::kDqTiles1 % 4 == 0,
                  "the odd rows' n-tile j ^ 2 stays in the 32-column atom (dq_lane_offset)");

    // This warpgroup's dQ share into a shared float32 tile: rows (64 wg when kDqByRows) + 16 warp + g
    // + 8 r, columns 8 nt + 2 t, at atom column / 32, row, 16-byte chunk ((column % 32) / 4) ^ (row % 8),
    // in the bank order above.
    __device__ __forceinline__ static void store_query_gradient(unsigned char* tile, const float (&dq)[Tr::kDqTiles][4],
                                                                int wg, int warp, int lane) {
        static_assert(!Tr::kSplitCols, "split columns stage dQ (store_query_gradient_staged)");
        const int row0 = (Tr::kDqByRows ? 64 * wg : 0) + 16 * warp + lane / 4;
        const bool odd = (lane / 4) % 2;
        unsigned char* lane_tile = tile + row0 * 128;
        const int offset = dq_lane_offset(lane);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
#pragma unroll
            for (int j = 0; j < Tr::kDqTiles; ++j) {
                *reinterpret_cast<float2*>(lane_tile + (j / 4) * kBlockM * 128 + r * 8 * 128 + (offset ^ (32 * (j % 4)))) =
                    dq_pair(dq, j, r, odd);
            }
        }
    }

    // kSplitCols: the shared-memory offset of float32 dQ atom `atom` (32 columns x kBlockM rows, the
    // dq_accum map's box, as many bytes as a 64-column atom of Q or dO) of a stage. Warpgroup 0's atoms
    // (its kDqCols columns) lie over the dO atoms, which only its own dV product and warpgroup 1's dP^T
    // read, and past them (head dim 192: 4 dQ atoms, 3 of dO) over the P' buffer, which warpgroup 1 has
    // read by then; warpgroup 1's atoms over the Q atoms, read only by its own dK product and warpgroup
    // 0's S^T. So each warpgroup may stage its share once its own products are done: the other's product
    // of that operand finished before the P' (p_full) or dS^T (ds_full) that this warpgroup has waited
    // for. (The next P' waits for the reducing thread to have read the atom: kShareP.)
    static constexpr int kPerWg0 = Tr::kDqCols / 32;  // dQ atoms of warpgroup 0
    static constexpr bool kShareP = kPerWg0 > Tr::kAtomsV;
    __device__ __forceinline__ static int staged_dq_atom(int stage, int atom) {
        static_assert(kPerWg0 <= Tr::kAtomsV + 2 && Tr::kDqCols1 / 32 <= Tr::kAtomsQK, "the shares fit their operands");
        if (atom >= kPerWg0) return Tr::kQOffset + stage * Tr::kQBytes + (atom - kPerWg0) * kBlockM * 128;
        return atom < Tr::kAtomsV ? Tr::kDoOffset + stage * Tr::kDoBytes + atom * kBlockM * 128
                                  : Tr::kPOffset + (atom - Tr::kAtomsV) * kBlockM * 128;
    }

    // kSplitCols: this warpgroup's dQ share into its atoms of the stage, rows 16 warp + g + 8 r and its
    // columns 8 nt + 2 t at atom column / 32, 16-byte chunk ((column % 32) / 4) ^ (row % 8), in the bank
    // order of store_query_gradient.
    template <int kTiles>
    __device__ __forceinline__ static void store_query_gradient_staged(unsigned char* smem, int stage,
                                                                       const float (&dq)[kTiles][4], int wg, int warp,
                                                                       int lane) {
        Base::store_dq_atoms(smem, dq, warp, lane, [&](int atom) { return staged_dq_atom(stage, wg * kPerWg0 + atom); });
    }

    // dQ_part of tile j = dS_j K once both warpgroups have stored their halves of dS^T_j (buffer j % 2),
    // then to the shared float32 tile once the reducing thread has read that tile's previous contents
    // (tile j - 1, or with kDqAlternate tile j - 2 of the same warpgroup). Called right after the dV and
    // dK products of tile j + 1 (or last) are issued, holding the turn when kKeyGradientTurns: passes it
    // once dQ is issued. Those products complete first; after_key_gradients runs then (the caller
    // releases that tile's stage). With kDqAlternate (no turn held) warpgroup j % 2 takes tile j and the
    // other only waits for its products.
    template <typename AfterKeyGradients>
    __device__ __forceinline__ static void finish_query_gradient(Sm90BwdState& st, unsigned char* smem, int j, int wg,
                                                                 int warp, int lane,
                                                                 const AfterKeyGradients& after_key_gradients) {
        const unsigned base = shared_addr(smem);
        float dq[Tr::kDqTiles][4];
        if constexpr (Tr::kDqAlternate) {
            if (j % 2 != wg) {
                wgmma_wait<0>();
                after_key_gradients();
                return;
            }
            // The whole tile's dQ (kHeadDim / 2 floats per thread) does not fit beside P^T and dS^T,
            // which the dV and dK products read from registers: they complete first, then dQ is issued.
            wgmma_wait<0>();
            after_key_gradients();
            mbarrier_wait(&st.ds_full[j % 2], (j / 2) & 1);
            issue_query_gradient(dq, base + Tr::kDsOffset + (j % 2) * Tr::kDsBytes, base + Tr::kKOffset, wg);
        } else {
            mbarrier_wait(&st.ds_full[j % 2], (j / 2) & 1);
            issue_query_gradient(dq, base + Tr::kDsOffset + (j % 2) * Tr::kDsBytes, base + Tr::kKOffset, wg);
            Turns::pass_turn(wg);
            wgmma_wait<1>();
            after_key_gradients();
        }
        wgmma_wait<0>();
        fence_fragments(dq);
        mbarrier_arrive(&st.ds_free[j % 2]);
        const int buffer = Tr::kDqAlternate ? wg : 0;
        const int previous = j - Tr::kDqBuffers;  // the tile last stored in that buffer
        if (previous >= 0) mbarrier_wait(&st.dq_empty[buffer], (previous / Tr::kDqBuffers) & 1);
        store_query_gradient(smem + Tr::kDqOffset + buffer * Tr::kDqBytes, dq, wg, warp, lane);
        fence_proxy_async();
        mbarrier_arrive(&st.dq_full[buffer]);
    }

    // A consumer warpgroup (wg = 0, 1): dK (without the softmax scale) and dV of keys [n0 + 64 wg,
    // n0 + 64 wg + 64) through the walk.
    __device__ __forceinline__ static void mma(const BwdArgs& args, Sm90BwdState& st, unsigned char* smem,
                                               const Sequence& seq, const TileWork& work, int wg,
                                               float (&dk)[Tr::kDkTiles][4], float (&dv)[Tr::kDvTiles][4]) {
        const AttnArgs& a = args.attn;
        const int thread = threadIdx.x - 128;  // among the 256 consumers
        const int warp = (threadIdx.x / 32) % 4;
        const int lane = threadIdx.x % 32;
        const int col_t = 2 * (lane % 4);
        const int n0 = work.tile * kBlockN;
        const int key0 = n0 + 64 * wg;                   // the warpgroup's first key
        const int key_g = key0 + 16 * warp + lane / 4;   // this thread's keys: key_g and key_g + 8
        const unsigned base = shared_addr(smem);
        const unsigned k_tile = base + Tr::kKOffset;
        const unsigned v_tile = base + Tr::kVOffset;
        const Mask mask(a, seq);
        const bool packed_q = a.cu_seqlens_q != nullptr;
        // The plain kernels need only the scale; the score modifications are per (batch entry, head).
        Scores scores;
        scores.scale_log2 = static_cast<float>(a.softmax_scale) * kLog2eF;
        // kScatter: the buffers' gradients by global atomics, a thread's consecutive terms for one element
        // summed first (common/user_calls.cuh; no shared memory is free here).
        LocalBufferGrads buffer_grads{nullptr, &args.score_grads};

        mbarrier_wait(&st.kv_full, 0);
        if (a.cu_seqlens_k != nullptr && seq.seqlen_k - n0 < kBlockN) {
            zero_tile_rows(smem + Tr::kKOffset, kBlockN, seq.seqlen_k - n0, Tr::kAtomsQK, thread, 256);
            zero_tile_rows(smem + Tr::kVOffset, kBlockN, seq.seqlen_k - n0, Tr::kAtomsV, thread, 256);
            fence_proxy_async();
            named_barrier_sync(kConsumerBarrier, 256);
        }

        Turns::start(wg);  // warpgroup 0 issues first
#pragma unroll
        for (int c = 0; c < Tr::kDkTiles; ++c) dk[c][0] = dk[c][1] = dk[c][2] = dk[c][3] = 0.0f;
#pragma unroll
        for (int c = 0; c < Tr::kDvTiles; ++c) dv[c][0] = dv[c][1] = dv[c][2] = dv[c][3] = 0.0f;

        int tiles = 0;  // tiles whose dS^T is stored
        for (int i = 0;; ++i) {
            const int stage = i % kStages;
            const int parity = (i / kStages) & 1;
            mbarrier_wait(&st.q_full[stage], parity);
            const int h = st.head[stage];
            if (h < 0) break;
            const int entry = st.entry[stage];
            const int m0 = entry_tile(entry) * kBlockM;
            const unsigned q_tile = base + Tr::kQOffset + stage * Tr::kQBytes;
            const unsigned do_tile = base + Tr::kDoOffset + stage * Tr::kDoBytes;
            if (packed_q) clear_foreign_queries(smem, seq, stage, m0, thread);
            if constexpr (kModified) scores = Scores(a, seq, work.b, h);
            // A partial tile's mask bits fetched in two steps around its products (UserMaskAt::fetch_slot).
            UserMaskAt<MaskFn, !kModified> user(a, work.b, h);
            const int keys[2] = {key_g, key_g + 8};
            const bool fetch = MaskFn::kEnabled && !kModified && entry_partial(entry);
            if constexpr (MaskFn::kEnabled && !kModified) {
                if (fetch) user.template fetch_slot<true, Tr::kSTiles>(keys, m0 + col_t);
            }

            // S^T and dP^T; P^T while dP^T is still in flight (with kModified both are needed at once),
            // then dS^T.
            float s[Tr::kSTiles][4];
            float dp[Tr::kSTiles][4];
            Turns::take_turn(wg);
            issue_transposed_scores(s, k_tile, 64 * wg, q_tile, 0, kHeadDim / 16);
            issue_transposed_scores(dp, v_tile, 64 * wg, do_tile, 0, kHeadDimV / 16);
            Turns::pass_turn(wg);
            if constexpr (MaskFn::kEnabled && !kModified) {
                if (fetch) user.template fetch_words<true, Tr::kSTiles>(keys, m0 + col_t);
            }
            const float* rows = reinterpret_cast<const float*>(smem + Tr::kRowsOffset) + stage * 2 * kBlockM;
            mbarrier_wait(&st.rows_full[stage], parity);
            // A warp-uniform branch: the score_mod's parts that read the positions taken once per tile where
            // they hold one value over the warp's keys and the tile's queries (FrozenScores).
            const int key_w = key0 + 16 * warp;
            bool frozen = false;
            if constexpr (kFreeze) {
                frozen = scores.uniform(m0, m0 + 8 * Tr::kSTiles - 1, key_w, key_w + 15);
            }
            score_gradients_of(s, dp, a, mask, scores, rows, user, h, work.b, entry, m0, key_g, key0, col_t, frozen, key_w);
            if constexpr (kScatter) {
                // Every pair's terms go to the same elements: the thread's dS^T summed, scattered once.
                if (frozen) {
                    float sum = 0.0f;
#pragma unroll
                    for (int nt = 0; nt < Tr::kSTiles; ++nt) sum += (dp[nt][0] + dp[nt][1]) + (dp[nt][2] + dp[nt][3]);
                    FrozenScores<Scores>(scores, m0, key_w).scatter(sum, m0, key_w, buffer_grads);
                }
            }
            unsigned p_op[Tr::kOpSteps][4];
            unsigned ds_op[Tr::kOpSteps][4];
            to_operand<T>(p_op, s);
            to_operand<T>(ds_op, dp);

            // dS^T_i into buffer i % 2 once both warpgroups' dQ_{i-2} (issued in iteration i - 1) has
            // read it.
            unsigned char* ds_tile = smem + Tr::kDsOffset + (i % 2) * Tr::kDsBytes;
            if (i >= 2) mbarrier_wait(&st.ds_free[i % 2], ((i - 2) / 2) & 1);
            store_ds(ds_tile, ds_op, 64 * wg + 16 * warp + lane / 4, 0, col_t);
            fence_proxy_async();
            mbarrier_arrive(&st.ds_full[i % 2]);

            // dV += P^T dO, dK += dS^T Q, then the previous tile's dQ.
            if constexpr (Tr::kKeyGradientTurns) Turns::take_turn(wg);
            wgmma_fence();
            issue_key_gradient<kHeadDimV>(dv, p_op, do_tile);
            issue_key_gradient<kHeadDim>(dk, ds_op, q_tile);
            wgmma_commit();
            // While the products run: the buffer gradients of a tile where the function varies.
            if constexpr (kScatter) {
                if (!frozen) scatter_stored(ds_tile, scores, buffer_grads, 64 * wg + 16 * warp + lane / 4, n0, m0, col_t);
            }
            if (i > 0) {
                finish_query_gradient(st, smem, i - 1, wg, warp, lane, [&]() { release_stage(&st.empty[stage]); });
            } else {
                if constexpr (Tr::kKeyGradientTurns) Turns::pass_turn(wg);
                wgmma_wait<0>();
                release_stage(&st.empty[stage]);
            }
            ++tiles;
        }
        if (tiles > 0) {
            if constexpr (Tr::kKeyGradientTurns) Turns::take_turn(wg);
            finish_query_gradient(st, smem, tiles - 1, wg, warp, lane, []() {});
        }
        if constexpr (kScatter) buffer_grads.commit();
        Turns::finish(wg);
        fence_fragments(dk);
        fence_fragments(dv);
    }

    // kSplitCols: a consumer warpgroup in its role (see the top of the file) with the CTA's 64 keys:
    // warpgroup 0 accumulates dV, warpgroup 1 dK (without the softmax scale), over all columns.
    // Per tile i (stage i % kStages, dS^T buffer i % 2):
    //   wg 0: S^T; P^T; wait p_free(i - 1) (and with kShareP the reductions' read of tile i - 1's dQ
    //         atom over P', that stage's `empty`); P' -> shared; p_full; dV += P^T dO (issued);
    //         wait ds_full; dQ_part[:, :128] (issued);
    //   wg 1: dP^T; wait p_full; dS^T = P' (dP^T - delta); p_free; wait ds_free(i - 2); dS^T -> shared;
    //         ds_full; dK += dS^T Q (issued); dQ_part[:, 128:] (issued);
    // then each, its products done, arrives on ds_free and stages its dQ share over the dO (wg 0) or Q
    // (wg 1) atoms of the stage for the reducing thread (dq_staged[wg]), which frees them for the loads
    // (empty, q_empty) as soon as its reductions have read them.
    __device__ __forceinline__ static void mma_roles(const BwdArgs& args, Sm90BwdState& st, unsigned char* smem,
                                                     const Sequence& seq, const TileWork& work, int wg,
                                                     float (&acc)[Tr::kDkTiles][4]) {
        static_assert(Tr::kDkTiles == Tr::kDvTiles && Tr::kSTiles == 8, "one accumulator shape for dK and dV");
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
        // P' of the tile, 16 bytes of thread t at [128 j + t], so the 32 lanes of a warp store and load 512
        // contiguous bytes (both warpgroups' thread t hold the same keys and queries): in the plain
        // kernels P' = P^T rounded to T, the dV product's own operand (thread t's A fragment of k-step j,
        // n-tiles 2 j and 2 j + 1, fragment/operand.cuh), which halves the buffer's shared-memory
        // traffic (+0-4% at head dim 256, bench/NOTES.md, session 17) and rounds dS^T's factor as a plain
        // T implementation does; with kModified float32 (n-tile j: packing P times the softcap's
        // derivative made ptxas spill in the masked path).
        uint4* p_share = reinterpret_cast<uint4*>(smem + Tr::kPOffset) + thread % 128;
        const Mask mask(a, seq);
        const bool packed_q = a.cu_seqlens_q != nullptr;
        Scores scores;
        scores.scale_log2 = static_cast<float>(a.softmax_scale) * kLog2eF;

        mbarrier_wait(&st.kv_full, 0);
        if (a.cu_seqlens_k != nullptr && seq.seqlen_k - key0 < kBlockN) {
            zero_tile_rows(smem + Tr::kKOffset, kBlockN, seq.seqlen_k - key0, Tr::kAtomsQK, thread, 256);
            zero_tile_rows(smem + Tr::kVOffset, kBlockN, seq.seqlen_k - key0, Tr::kAtomsV, thread, 256);
            fence_proxy_async();
            named_barrier_sync(kConsumerBarrier, 256);
        }
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
            const unsigned do_tile = base + Tr::kDoOffset + stage * Tr::kDoBytes;
            if (packed_q) clear_foreign_queries(smem, seq, stage, m0, thread);
            const float* rows = reinterpret_cast<const float*>(smem + Tr::kRowsOffset) + stage * 2 * kBlockM;
            const int buffer = i % 2;
            const unsigned ds_tile = base + Tr::kDsOffset + buffer * Tr::kDsBytes;
            float s[Tr::kSTiles][4];  // S^T, then P^T (warpgroup 0); dP^T, then dS^T (warpgroup 1)
            // dQ_part: warpgroup 0's in dq, warpgroup 1's in dq1, the same registers when the shares are
            // equal (head dim 256), else an array of its own (a narrower view of dq made ptxas
            // serialize the wgmma).
            constexpr bool kEqualShares = Tr::kDqTiles1 == Tr::kDqTiles;
            float dq[Tr::kDqTiles][4];
            float dq1_own[kEqualShares ? 1 : Tr::kDqTiles1][4];
            auto& dq1 = [&]() -> float(&)[Tr::kDqTiles1][4] {
                if constexpr (kEqualShares) {
                    return dq;
                } else {
                    return dq1_own;
                }
            }();
            if (wg == 0) {
                if constexpr (kModified) scores = Scores(a, seq, work.b, h);
                issue_transposed_scores(s, k_tile, 0, q_tile, 0, kHeadDim / 16);
                float2 lse2[Tr::kSTiles];
                mbarrier_wait(&st.rows_full[stage], parity);
                read_row_pairs(lse2, rows, col_t);
                wgmma_wait<0>();
                fence_fragments(s);
                auto& p = reinterpret_cast<float(&)[1][Tr::kSTiles][4]>(s);
                const auto lse2_pair = [&](int nt) { return lse2[nt]; };
                // With kModified, probabilities_cols turns its second fragment into (x - delta) *
                // (1 - tanh^2): from x = 1 and delta = 0 the softcap's derivative, which P' carries.
                float derivative[1][Tr::kSTiles][4];
                if constexpr (kModified) {
#pragma unroll
                    for (int nt = 0; nt < Tr::kSTiles; ++nt) {
                        derivative[0][nt][0] = derivative[0][nt][1] = derivative[0][nt][2] = derivative[0][nt][3] = 1.0f;
                    }
                }
                probabilities_cols<kModified>(p, kModified ? derivative : p, scores, lse2_pair,
                                              [](int) { return make_float2(0.0f, 0.0f); }, key_g, m0, col_t);
                const bool partial = entry_partial(entry);
                if (partial || !mask.tile_is_full(m0, kBlockM, key0, 64)) {
                    mask_tile_cols(p, mask, BlockLayout(a, work.b, h), a, key_g, m0, col_t, partial,
                                   UserMaskAt<MaskFn, !kModified>(a, work.b, h));
                }
                if (i >= 1) {
                    mbarrier_wait(&st.p_free, (i - 1) & 1);
                    // kShareP: tile i - 1's dQ atom over P' has been read (its stage's `empty`).
                    if constexpr (kShareP) mbarrier_wait(&st.empty[(i - 1) % kStages], ((i - 1) / kStages) & 1);
                }
                if constexpr (kModified) {
#pragma unroll
                    for (int nt = 0; nt < Tr::kSTiles; ++nt) {
                        p_share[128 * nt] = make_uint4(__float_as_uint(s[nt][0] * derivative[0][nt][0]),
                                                       __float_as_uint(s[nt][1] * derivative[0][nt][1]),
                                                       __float_as_uint(s[nt][2] * derivative[0][nt][2]),
                                                       __float_as_uint(s[nt][3] * derivative[0][nt][3]));
                    }
                } else {
#pragma unroll
                    for (int kk = 0; kk < Tr::kOpSteps; ++kk) {
                        p_share[128 * kk] = make_uint4(pack2<T>(s[2 * kk][0], s[2 * kk][1]), pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                                                       pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                                       pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]));
                    }
                }
                mbarrier_arrive(&st.p_full);
                unsigned p_op[Tr::kOpSteps][4];
                to_operand<T>(p_op, s);
                wgmma_fence();
                issue_key_gradient<kHeadDimV>(acc, p_op, do_tile);
                wgmma_commit();
                mbarrier_wait(&st.ds_full[buffer], (i / 2) & 1);
                issue_query_gradient(dq, ds_tile, k_tile, 0);
                wgmma_wait<1>();
                fence_fragments(acc);
            } else {
                issue_transposed_scores(s, v_tile, 0, do_tile, 0, kHeadDimV / 16);
                float2 delta[Tr::kSTiles];
                mbarrier_wait(&st.rows_full[stage], parity);
                read_row_pairs(delta, rows + kBlockM, col_t);
                wgmma_wait<0>();
                fence_fragments(s);
                mbarrier_wait(&st.p_full, i & 1);
                // This thread's P' pairs: n-tile nt, rows key_g (half 0) and key_g + 8 (half 1).
                const auto p_pair = [&](int nt, int half) {
                    if constexpr (kModified) {
                        const uint4 u = p_share[128 * nt];
                        return half ? make_float2(__uint_as_float(u.z), __uint_as_float(u.w))
                                    : make_float2(__uint_as_float(u.x), __uint_as_float(u.y));
                    } else {
                        const uint4 u = p_share[128 * (nt / 2)];
                        return unpack2<T>(nt % 2 ? (half ? u.w : u.z) : (half ? u.y : u.x));
                    }
                };
#pragma unroll
                for (int nt = 0; nt < Tr::kSTiles; ++nt) {
#pragma unroll
                    for (int half = 0; half < 2; ++half) {
                        const float2 p = p_pair(nt, half);
                        s[nt][2 * half] = p.x * (s[nt][2 * half] - delta[nt].x);
                        s[nt][2 * half + 1] = p.y * (s[nt][2 * half + 1] - delta[nt].y);
                    }
                }
                mbarrier_arrive(&st.p_free);
                unsigned ds_op[Tr::kOpSteps][4];
                to_operand<T>(ds_op, s);
                // Buffer i % 2 is free once both warpgroups' dQ products of tile i - 2 have read it.
                if (i >= 2) mbarrier_wait(&st.ds_free[buffer], ((i - 2) / 2) & 1);
                store_ds(smem + Tr::kDsOffset + buffer * Tr::kDsBytes, ds_op, 16 * warp + lane / 4, 0, col_t);
                fence_proxy_async();
                mbarrier_arrive(&st.ds_full[buffer]);
                wgmma_fence();
                issue_key_gradient<kHeadDim>(acc, ds_op, q_tile);
                wgmma_commit();
                mbarrier_wait(&st.ds_full[buffer], (i / 2) & 1);  // every thread's dS^T is stored
                issue_query_gradient(dq1, ds_tile, k_tile, 1);
                wgmma_wait<1>();
                fence_fragments(acc);
            }
            wgmma_wait<0>();
            // Over the operand this warpgroup's dV or dK product read (staged_dq_atom); the reducing
            // thread frees those atoms for the next loads once its reductions have read them.
            if constexpr (kEqualShares) {
                fence_fragments(dq);
                mbarrier_arrive(&st.ds_free[buffer]);
                store_query_gradient_staged(smem, stage, dq, wg, warp, lane);
            } else if (wg == 0) {
                fence_fragments(dq);
                mbarrier_arrive(&st.ds_free[buffer]);
                store_query_gradient_staged(smem, stage, dq, 0, warp, lane);
            } else {
                fence_fragments(dq1);
                mbarrier_arrive(&st.ds_free[buffer]);
                store_query_gradient_staged(smem, stage, dq1, 1, warp, lane);
            }
            fence_proxy_async();
            mbarrier_arrive(&st.dq_staged[wg][stage]);
        }
    }

    // Producer thread 64 (warp 2): adds each tile's dQ share (stored by the consumers in the dQ tile, or
    // with kSplitCols in the tile's stage, which it then releases) into the float32 accumulator
    // (Sm90BwdShared::reduce_walk).
    __device__ __forceinline__ static void reduce_queries(const BwdArgs& args, const Sm90BwdMaps& maps, Sm90BwdState& st,
                                                          unsigned char* smem, const Sequence& seq, const TileWork& work) {
        Base::reduce_walk(args, maps, st, smem, seq, work, [&](int i, const auto& reduce) {
            if constexpr (Tr::kSplitCols) {
                Base::template reduce_staged<kStages, kPerWg0, Tr::kDqAtoms>(
                    st, i, reduce, [](int stage, int atom) { return staged_dq_atom(stage, atom); });
            } else {
                const int buffer = Tr::kDqAlternate ? i % 2 : 0;
                mbarrier_wait(&st.dq_full[buffer], (i / Tr::kDqBuffers) & 1);
#pragma unroll
                for (int atom = 0; atom < Tr::kDqAtoms; ++atom) {
                    reduce(atom, Tr::kDqOffset + buffer * Tr::kDqBytes + atom * kBlockM * 128);
                }
                bulk_commit();
                bulk_wait_read();
                mbarrier_arrive(&st.dq_empty[buffer]);
            }
        });
    }
};

}  // namespace cupyflash
