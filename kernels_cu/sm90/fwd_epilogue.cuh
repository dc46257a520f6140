// The Hopper forward's epilogue: what a consumer warpgroup writes once its accumulators are complete.
// It stages its O tile in shared memory and writes it with TMA stores where the tile fits
// (Sm90FwdTraits::kStoreO), else straight from the registers (fragment/epilogue.cuh). The K-major
// (FP8, tf32) and float32 forwards have register epilogues of their own, beside their main loops.
#pragma once
#include "common/params.cuh"
#include "common/sequence.cuh"
#include "fragment/epilogue.cuh"
#include "fragment/softmax.cuh"
#include "sm90/fwd_mainloop.cuh"
#include "sm90/primitives.cuh"
#include "sm90/staged_rows.cuh"

namespace cupyflash {

// The forward: out = O / l and the log-sum-exp of a consumer warpgroup's 64 rows of a work tile.
//
// Staged: the warpgroup writes O, rounded to T, into its 64 rows of the O tile (64-column atoms of
// kBlockM rows, 128-byte swizzle: the TMA box's layout) and its first thread writes them with one TMA
// store per atom, which runs while the warpgroup goes on to its next work tile; that thread waits for
// the store to have read the tile before the warpgroup's next epilogue writes it. The stores drop the
// rows past a dense sequence's end (the map's rows are the sequence's); a packed sequence's last tile
// would write the next sequence's rows, so it takes the register path, as do rows before a sequence's
// start (Sm90Schedule::align_end).
// kDropout: the output takes the kept probabilities' 1 / (1 - p) with 1 / l. A softmax that tracks the
// rows' largest scores (return_max_score) raises the head's maximum: kRawScores, the plain kernels',
// holds raw products (the scale applied here), else log2 units.
template <typename T, typename Tr, bool kDropout = false, bool kRawScores = false>
struct Sm90FwdEpilogue {
    // Named barriers kBarrier + wg, after the main loop's (Sm90FwdMainloop): a warpgroup's rows of the O tile.
    static constexpr int kBarrier = 1 + 2 * Tr::kConsumers;
    static_assert(kBarrier + Tr::kConsumers - 1 <= 15, "named barriers 1-15");

    template <int kOTiles, typename Softmax>
    __device__ __forceinline__ static void store(const FwdArgs& args, const Sm90FwdMaps& maps, unsigned char* smem,
                                                 const Sm90FwdTile& tile, int wg, const float (&o)[1][kOTiles][4],
                                                 Softmax (&softmax)[1]) {
        const int row_w = tile.m0 + 64 * wg + 16 * ((threadIdx.x / 32) % 4);  // this warp's first row
        float inv_l[1][2];
        float row_lse[1][2];
        softmax[0].finish(inv_l[0], row_lse[0], attention_sink(args.attn, tile.h));
        if constexpr (Softmax::kTracksTop) {
            const float unit = kRawScores ? static_cast<float>(args.attn.softmax_scale) : kLn2F;
            record_row_max_scores(args, tile.seq, tile.b, tile.h, row_w, softmax, unit);
        }
        if constexpr (kDropout) {
            const float keep_scale = static_cast<float>(args.attn.dropout.scale);
            inv_l[0][0] *= keep_scale;
            inv_l[0][1] *= keep_scale;
        }
        bool staged = false;
        if constexpr (Tr::kStoreO) {
            const int w0 = tile.m0 + 64 * wg;
            staged = maps.store_o && w0 >= 0 && (args.attn.cu_seqlens_q == nullptr || w0 + 64 <= tile.seq.seqlen_q);
        }
        if (staged) {
            if constexpr (Tr::kStoreO) store_staged(args.attn, maps, smem, tile, wg, o, inv_l);
        } else {
            store_out<T>(args, tile.seq, tile.b, tile.h, row_w, o, inv_l);
        }
        store_lse(args, tile.seq, tile.b, tile.h, row_w, row_lse);
    }

    // At the kernel's end: the last TMA stores are done before the CTA's shared memory goes away.
    __device__ __forceinline__ static void finish() {
        if (Tr::kStoreO && threadIdx.x % 128 == 0) bulk_wait();
    }

  private:
    template <int kOTiles>
    __device__ __forceinline__ static void store_staged(const AttnArgs& a, const Sm90FwdMaps& maps, unsigned char* smem,
                                                        const Sm90FwdTile& tile, int wg, const float (&o)[1][kOTiles][4],
                                                        const float (&inv_l)[1][2]) {
        const bool issuer = threadIdx.x % 128 == 0;
        if (issuer) bulk_wait_read();  // the previous work tile's stores have read the rows
        named_barrier_sync(kBarrier + wg, 128);
        unsigned char* rows = smem + Tr::kOOffset + 64 * wg * 128;  // the warpgroup's rows of atom 0
        stage_swizzled_rows<T>(rows, Tr::kBlockM * 128, o[0], inv_l[0]);
        fence_proxy_async();  // the writes, visible to the TMA unit
        named_barrier_sync(kBarrier + wg, 128);
        if (issuer) {
            const int row0 = tile.seq.q_start + tile.m0 + 64 * wg;
            const int batch = a.cu_seqlens_q != nullptr ? 0 : tile.b;
#pragma unroll
            for (int atom = 0; atom < Tr::kAtomsV; ++atom) {
                if (64 * atom < a.headdim_v) tma_store_4d(maps.o, rows + atom * Tr::kBlockM * 128, 64 * atom, row0, tile.h, batch);
            }
            bulk_commit();
        }
    }
};

}  // namespace cupyflash
