// The Hopper forward's kernel body, Sm90FwdKernel<Mainloop, Epilogue, Scheduler>: the warpgroups' roles
// and the pipeline's barriers, written once for every main loop (the 16-bit one, sm90/fwd_mainloop.cuh;
// float32's from bfloat16 planes, sm90/fwd_planes_mainloop.cuh). sm90/fwd.cu describes the design.
#pragma once
#include "common/launch.cuh"
#include "common/mask.cuh"
#include "common/params.cuh"
#include "common/sequence.cuh"
#include "sm90/fwd_mainloop.cuh"
#include "sm90/primitives.cuh"
#include "sm90/scheduler.cuh"

namespace cupyflash {

// Scheduler::kCtas > 1 (sm90_fwd_pairs, launched in clusters of that many CTAs; Mainloop::kCtas the same):
// the cluster's CTAs take the same rows of consecutive query heads of one kv head and fill their K/V rings
// together (sm90_load_paged_key_tiles).
template <typename Mainloop, typename Epilogue, typename Scheduler>
struct Sm90FwdKernel {
    using Tr = typename Mainloop::Tr;
    static constexpr int kBlockM = Tr::kBlockM;
    static constexpr int kCtas = Scheduler::kCtas;
    static_assert(Mainloop::kCtas == kCtas, "the main loop fills its ring with the scheduler's clusters");

    // Paired (kCtas = 2): CTA 0 of the cluster hands work tile t's index w to CTA 1 (Sm90FwdState::work,
    // two slots); returns the cluster's index. CTA 0 refills a slot once CTA 1 has read it.
    __device__ __forceinline__ static int share_work(Sm90FwdState& st, int t, int rank, int w) {
        static_assert(kCtas == 2, "a CTA hands its work to one other");
        const int slot = t % 2;
        if (rank == 0) {
            if (t >= 2) mbarrier_wait_cluster(&st.work_empty[slot], (t / 2 - 1) & 1);
            store_cluster(&st.work[slot], 1, w);
            mbarrier_arrive_cluster(&st.work_full[slot], 1);
            return w;
        }
        mbarrier_wait_cluster(&st.work_full[slot], (t / 2) & 1);
        const int shared = st.work[slot];
        mbarrier_arrive_cluster(&st.work_empty[slot], 0);
        return shared;
    }

    // The producer's first thread: for each work tile of this CTA its state and Q tile, then the end
    // marker.
    __device__ __forceinline__ static void produce_queries(const AttnArgs& a, const Sm90FwdMaps& maps,
                                                           const Sm90Schedule& schedule, Sm90FwdState& st,
                                                           unsigned char* smem) {
        if constexpr (Tr::kQBytes > 0) tma_prefetch_desc(maps.q);  // (main loops whose consumers write Q: none)
        const Scheduler scheduler(a);
        const int rank = kCtas > 1 ? cluster_rank() : 0;
        for (int t = 0, w = Scheduler::first();; ++t) {  // t: work tiles published
            Sm90FwdTile& tile = st.tile[t % 2];
            // tile[t % 2] is free once the consumers' epilogue of work tile t - 2 is over: the K/V loader
            // read it before issuing the loads of t - 2, which that epilogue waited for.
            if (t >= 2) mbarrier_wait(&st.tile_empty[t % 2], (t / 2 - 1) & 1);
            int b = 0, h = 0, m0 = 0;
            Sequence seq;
            bool finished = false;
            if (rank == 0) {
                // The CTA takes its next work tile only now, while t - 1 runs: handed out dynamically, the
                // tiles go to the CTAs in the order they finish their work, as a tile ahead and no more.
                if (t > 0) w = scheduler.next(schedule, w);
                while (!(finished = scheduler.finished(w))) {
                    scheduler.decode(schedule, a, w, 0, &b, &h, &m0);
                    seq = Sequence(a, b);
                    m0 = scheduler.first_row(schedule, seq.seqlen_q, m0);
                    if (m0 < seq.seqlen_q && m0 + kBlockM > 0) break;
                    w = scheduler.next(schedule, w);  // outside a shorter packed sequence: nothing to do
                }
            }
            if constexpr (kCtas > 1) {
                w = share_work(st, t, rank, w);
                finished = scheduler.finished(w);
                if (rank != 0 && !finished) {  // the same rows of the next query head
                    scheduler.decode(schedule, a, w, rank, &b, &h, &m0);
                    seq = Sequence(a, b);
                    m0 = scheduler.first_row(schedule, seq.seqlen_q, m0);
                }
            }
            tile.done = finished;
            if (!finished) {
                tile.seq = seq;
                tile.mask = Mask(a, seq);
                tile.layout = BlockLayout(a, b, h);
                // Block masks keep the tiles from row 0 (align_end = 0): their lists are per query tile.
                tile.keys = schedule.align_end ? key_tiles_of_rows<Tr::kBlockN>(tile.mask, m0, kBlockM)
                                               : key_tiles<kBlockM, Tr::kBlockN>(a, tile.mask, tile.layout, m0 / kBlockM);
                tile.b = b;
                tile.h = h;
                tile.m0 = m0;
            }
            // Releases tile[t % 2] to the K/V loader, which streams its keys into the ring as stages free
            // up, under the last products of t - 1.
            mbarrier_arrive(&st.published[t % 2]);
            // The Q buffer is free once every S of work tile t - 1 is done (then q_full is at most one
            // phase ahead of the consumers' waits, also for the end marker).
            if (t > 0) mbarrier_wait(&st.q_empty, (t - 1) & 1);
            if (finished) {
                mbarrier_arrive(&st.q_full);
                break;
            }
            mbarrier_arrive_expect_tx(&st.q_full, Tr::kQBytes);  // releases tile[t % 2] to the consumers
            Mainloop::load_queries(a, maps, st, smem, seq, b, h, m0);
        }
    }

    // The producer's second warp: the K and V tiles of every published work tile's walk, by its first
    // lane; paged keys (Mainloop::kPagedKeys and a block table) by all its lanes, in a loop of their own
    // (sm90_load_paged_key_tiles), so that the dense loop's registers (the producer runs on 24) stay as
    // they were.
    __device__ __forceinline__ static void produce_keys(const AttnArgs& a, const Sm90FwdMaps& maps, Sm90FwdState& st,
                                                        unsigned char* smem) {
        const bool first = threadIdx.x % 32 == 0;
        if (first) {
            tma_prefetch_desc(maps.k);
            tma_prefetch_desc(maps.v);
        }
        if constexpr (kCtas > 1) {
            walk_keys<true>(a, maps, st, smem);  // (the host pairs paged problems only)
        } else {
            if constexpr (Mainloop::kPagedKeys) {
                if (maps.block_table != nullptr) {
                    walk_keys<true>(a, maps, st, smem);
                    return;
                }
            }
            if (first) walk_keys<false>(a, maps, st, smem);
        }
    }

    template <bool kPaged>
    __device__ __forceinline__ static void walk_keys(const AttnArgs& a, const Sm90FwdMaps& maps, Sm90FwdState& st,
                                                     unsigned char* smem) {
        int i = 0;  // ring slots filled, over all work tiles
        for (int t = 0;; ++t) {
            mbarrier_wait(&st.published[t % 2], (t / 2) & 1);
            const Sm90FwdTile& tile = st.tile[t % 2];
            if (tile.done) break;
            if constexpr (kPaged) {
                Mainloop::load_paged_keys(a, maps, st, smem, tile, i);
                __syncwarp();  // the lanes read the next published tile together
            } else {
                Mainloop::load_keys(a, maps, st, smem, tile, i);
            }
        }
    }

    // A consumer warpgroup (wg = 0 .. kConsumers - 1): for each published work tile, its 64 rows through
    // the main loop, then the epilogue.
    __device__ __forceinline__ static void consume(const FwdArgs& args, const Sm90FwdMaps& maps, Sm90FwdState& st,
                                                   unsigned char* smem, int wg) {
        Mainloop::Turns::start(wg);  // warpgroup 0 issues first
        int i = 0;  // ring slots consumed, over all work tiles
        for (int t = 0;; ++t) {
            mbarrier_wait(&st.q_full, t & 1);
            const Sm90FwdTile& tile = st.tile[t % 2];
            if (tile.done) break;
            float o[1][Tr::kOTiles][4];
            typename Mainloop::Softmax softmax[1];
            Mainloop::mma(args.attn, st, smem, tile, wg, i, o, softmax);
            Epilogue::store(args, maps, smem, tile, wg, o, softmax);
            release_stage(&st.tile_empty[t % 2]);  // tile[t % 2] may take work tile t + 2
        }
        Epilogue::finish();
        Mainloop::Turns::finish(wg);
    }

    __device__ __forceinline__ static void run(const FwdArgs& args, const Sm90FwdMaps& maps,
                                               const Sm90Schedule& schedule, unsigned char* smem_raw) {
        require_dynamic_smem<Tr::kSmemBytes>();
        require_sparse_tiles(args.attn, Tr::kBlockM, Tr::kBlockN);
        unsigned char* smem = smem_raw + ((1024 - shared_addr(smem_raw) % 1024) % 1024);
        static_assert(sizeof(Sm90FwdState) <= kCtaStateBytes, "the per-CTA state must fit its reserve");
        Sm90FwdState& st = *reinterpret_cast<Sm90FwdState*>(smem + Tr::kStateOffset);
        if (threadIdx.x == 0) {
            for (int b = 0; b < 2; ++b) {
                mbarrier_init(&st.published[b], 1);
                mbarrier_init(&st.tile_empty[b], 4 * Tr::kConsumers);
            }
            mbarrier_init(&st.q_full, 1);
            mbarrier_init(&st.q_empty, 4 * Tr::kConsumers);
            for (int s = 0; s < Tr::kStages; ++s) {
                mbarrier_init(&st.k_full[s], 1);
                mbarrier_init(&st.v_full[s], 1);
                mbarrier_init(&st.empty_k[s], 4 * Tr::kConsumers * kCtas);  // every CTA's consumer warps
                mbarrier_init(&st.empty_v[s], 4 * Tr::kConsumers * kCtas);
            }
            if constexpr (kCtas > 1) {
                for (int b = 0; b < 2; ++b) {
                    mbarrier_init(&st.work_full[b], 1);
                    mbarrier_init(&st.work_empty[b], 1);
                }
            }
            st.v_rows = maps.v_box_rows != 0 ? maps.v_box_rows : Tr::kBlockN;
            mbarrier_init_fence();
        }
        // Paired: the other CTAs' barriers are initialized before any arrival on them or load into them.
        if constexpr (kCtas > 1) {
            cluster_sync();
        } else {
            __syncthreads();
        }

        // Through a shuffle the compiler knows the warpgroup index is warp-uniform, so the addresses and
        // descriptors derived from it live in uniform registers (in vector registers they spilled).
        const int wg = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0);
        if (wg == 0) {
            warpgroup_set_registers<Tr::kProducerRegs>();
            if (threadIdx.x == 0) produce_queries(args.attn, maps, schedule, st, smem);
            if (threadIdx.x / 32 == 1) produce_keys(args.attn, maps, st, smem);
        } else {
            warpgroup_set_registers<Tr::kConsumerRegs>();
            consume(args, maps, st, smem, wg - 1);
        }
        // Paired: no CTA leaves while the others may still arrive on its barriers (their consumers'
        // releases, the work hand-off) or load into its ring.
        if constexpr (kCtas > 1) cluster_sync();
    }
};

}  // namespace cupyflash
