// Hopper forward (float16/bfloat16, sm_90a only): TMA loads, wgmma products, warp specialization and a
// persistent grid, assembled as Sm90FwdKernel<Mainloop, Epilogue, Scheduler> (FlashAttention-3's shape,
// so a new variant replaces one piece and keeps the others).
//
// One CTA per SM walks work tiles (kBlockM = 128 or 192 query rows of one batch entry and head, in the
// order of the Scheduler) and runs 1 + kBlockM / 64 warpgroups:
//   - the producer (warpgroup 0, two threads issuing; with a block table, the second one's whole warp:
//     fwd_kernel.cuh's produce_keys): its first thread takes the CTA's work tiles from
//     the scheduler and publishes each one's state (sequence, mask, its key tiles) a work tile ahead
//     (two state buffers), and loads its Q tile (Mainloop::load_queries) as soon as the last S of the
//     previous one is done; its second thread follows the published states and streams their K and V
//     tiles (Mainloop::load_keys), so the next work tile's first key tiles load under the current one's
//     last products and its Q under the current one's epilogue. Two threads, each with half of the
//     values to keep, fit the producer's 24 registers;
//   - the consumer warpgroups, 64 rows each, run the products and the softmax of each published tile
//     (Mainloop::mma) and write its rows (Epilogue::store: through shared memory and TMA stores where
//     the O tile fits, else from the accumulators).
// setmaxnreg gives the producer 24 registers and the consumers the rest: 240 each of two, 160 of three.
// kDropout: the consumers drop probabilities after their row sums (fragment/dropout.cuh), the epilogue
// scales the output by 1 / (1 - p); the host starts work tiles at multiples of their rows then (no
// Sm90Schedule::align_end), so each generator call serves a thread's two rows.
// ScoreFn, MaskFn: a score_mod's and a mask_mod's generated code, or none (sm90/fwd_mainloop.cuh).
// sm90_fwd_pairs (below): the same kernel in clusters of two CTAs for paged prefill.
// kMaxScore (return_max_score): the consumers keep each row's largest score beside the softmax's
// maximum (which may lag it) and the epilogue raises the (batch entry, head) maxima.
//
// Grid: x = min(work tiles, SMs). Dynamic shared memory: Sm90FwdTraits::kSmemBytes.
#include "sm90/fwd_epilogue.cuh"
#include "sm90/fwd_kernel.cuh"
#include "sm90/fwd_mainloop.cuh"
#include "sm90/scheduler.cuh"

namespace cupyflash {

template <typename T, int kHeadDim, int kHeadDimV, int kBlockM, int kBlockN, int kStages, bool kScoreMod, bool kDropout,
          bool kMaxScore, typename ScoreFn = NoUserScore, typename MaskFn = NoUserMask>
__global__ void __launch_bounds__(Sm90FwdTraits<T, kHeadDim, kHeadDimV, kBlockM, kBlockN, kStages>::kThreads, 1)
sm90_fwd(const CUPYFLASH_GRID_CONSTANT FwdArgs args, const CUPYFLASH_GRID_CONSTANT Sm90FwdMaps maps,
         const Sm90Schedule schedule) {
    using Mainloop = Sm90FwdMainloop<T, kHeadDim, kHeadDimV, kBlockM, kBlockN, kStages, kScoreMod, kDropout, kMaxScore,
                                     ScoreFn, MaskFn>;
    using Kernel = Sm90FwdKernel<Mainloop, Sm90FwdEpilogue<T, typename Mainloop::Tr, kDropout, !Mainloop::kModified>,
                                 Sm90QueryTileScheduler<Mainloop::kBlockM>>;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Kernel::run(args, maps, schedule, smem_raw);
}

// The paired forward: a paged KV cache's prefill whose query heads come in pairs of one kv head (the host's
// choice, cupyflash/_families/sm90.py's FWD_PAIRS), in clusters of two CTAs that take the same rows of the
// pair's two heads and fill their K/V rings together, each CTA issuing half of every tile's TMA boxes into
// both (sm90_load_paged_key_tiles): at pages of 16 a box serves 16 rows of 256 queries instead of 128.
// No score functions, dropout or maximum score. Grid: x = 2 x min(work tile pairs, clusters that fit).
template <typename T, int kHeadDim, int kHeadDimV, int kBlockM, int kBlockN, int kStages>
__global__ void __cluster_dims__(2, 1, 1)
    __launch_bounds__(Sm90FwdTraits<T, kHeadDim, kHeadDimV, kBlockM, kBlockN, kStages>::kThreads, 1)
        sm90_fwd_pairs(const CUPYFLASH_GRID_CONSTANT FwdArgs args, const CUPYFLASH_GRID_CONSTANT Sm90FwdMaps maps,
                       const Sm90Schedule schedule) {
    using Mainloop = Sm90FwdMainloop<T, kHeadDim, kHeadDimV, kBlockM, kBlockN, kStages, false, false, false,
                                     NoUserScore, NoUserMask, 2>;
    using Kernel = Sm90FwdKernel<Mainloop, Sm90FwdEpilogue<T, typename Mainloop::Tr, false, true>,
                                 Sm90QueryTileScheduler<Mainloop::kBlockM, 2>>;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Kernel::run(args, maps, schedule, smem_raw);
}

}  // namespace cupyflash
