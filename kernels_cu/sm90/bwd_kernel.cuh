// The Hopper backward's kernel body: Sm90BwdKernel<Mainloop, Epilogue> sets up the CTA's barriers, then
// runs the producer warpgroup's threads and the two consumer warpgroups of a main loop (the 16-bit one,
// sm90/bwd_mainloop.cuh, or float32's, sm90/bwd_planes_mainloop.cuh), and the epilogue. sm90/bwd.cu and
// sm90/bwd_planes.cu describe what each thread does.
#pragma once
#include "common/launch.cuh"
#include "common/mask.cuh"
#include "common/ordered_sum.cuh"
#include "common/params.cuh"
#include "common/scheduler.cuh"
#include "common/sequence.cuh"
#include "sm90/bwd_mainloop.cuh"
#include "sm90/primitives.cuh"

namespace cupyflash {

template <typename Mainloop, typename Epilogue>
struct Sm90BwdKernel {
    using Tr = typename Mainloop::Tr;

    __device__ __forceinline__ static void run(const BwdArgs& args, const Sm90BwdMaps& maps, unsigned char* smem_raw) {
        require_dynamic_smem<Tr::kSmemBytes>();
        require_sparse_tiles(args.attn, Tr::kBlockM, Tr::kBlockN);
        const AttnArgs& a = args.attn;
        // Key tiles launch last-first under the ordered sum by launch order (it needs each CTA's
        // predecessors launched before it, common/ordered_sum.cuh), otherwise first-first: under a
        // causal mask, whose walks shrink with the key tile, in turn across args.tile_group pairs, or
        // above head dim 128 and under a block mask across the last args.tail_pairs pairs only; under a
        // block mask each pair's tiles longest walk first (args.key_order, sm90/bwd_key_order.cu), and
        // every pair's longest walk before the rest (schedule_ranked_tail).
        const int num_key_tiles = ceil_div(a.seqlen_k, Tr::kBlockN);
        TileWork work = args.deterministic == kOrderedByLaunch ? schedule_tile(num_key_tiles, a.heads_k, true)
                        : args.tail_pairs == 0 ? schedule_tile_groups(num_key_tiles, a.heads_k, args.tile_group)
                        : args.key_order != nullptr ? schedule_ranked_tail(num_key_tiles, a.heads_k, args.tail_pairs)
                                                    : schedule_tile_tail(num_key_tiles, a.heads_k, args.tail_pairs);
        if (args.key_order != nullptr) {
            work.tile = args.key_order[(static_cast<long long>(work.b) * a.heads_k + work.h) * num_key_tiles + work.tile];
        }
        const Sequence seq(a, work.b);
        if (work.tile * Tr::kBlockN >= seq.seqlen_k) return;  // past the end of a packed sequence

        unsigned char* smem = smem_raw + ((1024 - shared_addr(smem_raw) % 1024) % 1024);
        static_assert(sizeof(Sm90BwdState) <= kCtaStateBytes, "the per-CTA state must fit its reserve");
        Sm90BwdState& st = *reinterpret_cast<Sm90BwdState*>(smem + Tr::kStateOffset);
        if (threadIdx.x == 0) {
            mbarrier_init(&st.kv_full, 1);
            for (int s = 0; s < Tr::kStages; ++s) {
                mbarrier_init(&st.q_full[s], 1);
                mbarrier_init(&st.rows_full[s], 32);
                mbarrier_init(&st.empty[s], Tr::kEmptyArrivals);
                mbarrier_init(&st.q_empty[s], 1);
                for (int w = 0; w < 2; ++w) mbarrier_init(&st.dq_staged[w][s], 128);
            }
            for (int b = 0; b < 2; ++b) {
                // With kSplitCols only warpgroup 1 stores dS^T.
                mbarrier_init(&st.ds_full[b], 128 * (Tr::kSplitCols ? 1 : Tr::kConsumers));
                // With kDqAlternate one warpgroup reads a dS^T buffer and stores a dQ tile.
                mbarrier_init(&st.ds_free[b], 128 * (Tr::kDqAlternate ? 1 : Tr::kConsumers));
                mbarrier_init(&st.dq_full[b], 128 * (Tr::kDqAlternate ? 1 : Tr::kConsumers));
                mbarrier_init(&st.dq_empty[b], 1);
                mbarrier_init(&st.turn_ready[b], 1);
                mbarrier_init(&st.turn_free[b], 1);
            }
            mbarrier_init(&st.p_full, 128);
            mbarrier_init(&st.p_free, 128);
            mbarrier_init_fence();
        }
        __syncthreads();

        // Through a shuffle the compiler knows the warpgroup index is warp-uniform (see the forward).
        const int wg = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0);
        if (wg == 0) {
            warpgroup_set_registers<Tr::kProducerRegs>();
            if (threadIdx.x == 0) Mainloop::load_tiles(args, maps, st, smem, seq, work);
            if (threadIdx.x / 32 == 1) Mainloop::load_rows(args, st, smem, seq, work);
            if (threadIdx.x == 64) Mainloop::reduce_queries(args, maps, st, smem, seq, work);
            if (threadIdx.x == 96) Mainloop::wait_turns(args, st, seq, work);
        } else {
            warpgroup_set_registers<Tr::kConsumerRegs>();
            // Each consumer's keys: 64 of the CTA's 128 with dK and dV, or (kSplitCols) the CTA's 64 with
            // dV (warpgroup 1) or dK (warpgroup 2).
            const int warp_row = 16 * ((threadIdx.x / 32) % 4);
            if constexpr (Tr::kSplitCols) {
                float acc[Tr::kDkTiles][4];
                Mainloop::mma_roles(args, st, smem, seq, work, wg - 1, acc);
                Epilogue::store_one(args, seq, work.b, work.h, work.tile * Tr::kBlockN + warp_row, wg == 2, acc);
            } else {
                float dk[Tr::kDkTiles][4];
                float dv[Tr::kDvTiles][4];
                Mainloop::mma(args, st, smem, seq, work, wg - 1, dk, dv);
                // Through shared memory where the maps are set and a TMA store may write the whole tile
                // (Sm90BwdEpilogue::store_staged); the same for both warpgroups.
                if (maps.store_dkv && (a.cu_seqlens_k == nullptr || (work.tile + 1) * Tr::kBlockN <= seq.seqlen_k)) {
                    Epilogue::template store_staged<Tr>(args, maps, smem, seq, work, wg - 1, Mainloop::kConsumerBarrier, dk, dv);
                } else {
                    Epilogue::store(args, seq, work.b, work.h, work.tile * Tr::kBlockN + 64 * (wg - 1) + warp_row, 0, 0, dk, dv);
                }
            }
        }
    }
};

}  // namespace cupyflash
