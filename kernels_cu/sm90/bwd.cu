// Hopper backward (float16/bfloat16, sm_90a only): TMA loads, wgmma products and warp specialization,
// assembled as Sm90BwdKernel<Mainloop, Epilogue> (sm90/bwd_mainloop.cuh describes the design). One CTA
// per kBlockN = 128 keys (64 above head dim 128) of one (batch entry, kv head): the producer
// warpgroup's thread 0 loads K, V and each query tile's Q and dO (Mainloop::load_tiles), its warp 1
// the tiles' lse and delta (Mainloop::load_rows) and its thread 64 adds each tile's dQ share into the
// float32 buffer (Mainloop::reduce_queries); the two consumer warpgroups run the products
// (Mainloop::mma, or above head dim 128 Mainloop::mma_roles, which leaves dQ in the tile's stage) and
// write dK and dV (Epilogue::store_staged through K's and V's tiles and TMA stores, or from the
// registers Epilogue::store, or above head dim 128 Epilogue::store_one, one per warpgroup).
// setmaxnreg gives the consumers 240 registers and the producer 24.
//
// Grid: x = ceil(seqlen_k / kBlockN) * batch * heads_k (common/scheduler.cuh). Dynamic shared memory:
// Sm90BwdTraits::kSmemBytes.
#include "sm90/bwd_epilogue.cuh"
#include "sm90/bwd_kernel.cuh"
#include "sm90/bwd_mainloop.cuh"

namespace cupyflash {

// kDropout (head dims up to 128, the per-consumer path; the host sends dropout with larger head dims to
// the general kernels): the consumers draw the forward's decisions for their S^T fragments while S^T and
// dP^T are computed (fragment/dropout.cuh), then dS^T = P^T (dP^T Z - delta) and dV takes P^T Z.
// ScoreFn, MaskFn: a score_mod's (whose buffers take no gradients) and a mask_mod's generated code, or
// none (sm90/bwd_mainloop.cuh).
template <typename T, int kHeadDim, int kHeadDimV, int kBlockM, int kStages, bool kScoreMod, bool kDropout,
          typename ScoreFn = NoUserScore, typename MaskFn = NoUserMask>
__global__ void __launch_bounds__(Sm90BwdTraits<T, kHeadDim, kHeadDimV, kBlockM, kStages>::kThreads, 1)
sm90_bwd(const CUPYFLASH_GRID_CONSTANT BwdArgs args, const CUPYFLASH_GRID_CONSTANT Sm90BwdMaps maps) {
    using Mainloop = Sm90BwdMainloop<T, kHeadDim, kHeadDimV, kBlockM, kStages, kScoreMod, kDropout, ScoreFn, MaskFn>;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Sm90BwdKernel<Mainloop, Sm90BwdEpilogue<T>>::run(args, maps, smem_raw);
}

}  // namespace cupyflash
