// Hopper backward for float32 (sm_90a only): sm90_bwd_planes, the kernel body of sm90/bwd.cu
// (sm90/bwd_kernel.cuh: TMA loads and the dQ reductions by a producer warpgroup, two consumer
// warpgroups in roles) with the main loop of sm90/bwd_planes_mainloop.cuh, which reads q and dout as the
// bfloat16 planes that split_planes (sm80/planes.cu) writes, splits its CTA's k and v rows into the same
// planes itself, and forms each product from six bfloat16 wgmma products (three for precision="tf32").
// One CTA per 64 keys of one (batch entry, kv
// head); the epilogue writes dK and dV (float32) from the registers, one per warpgroup.
//
// Grid: x = ceil(seqlen_k / 64) * batch * heads_k (common/scheduler.cuh). Dynamic shared memory:
// Sm90BwdPlanesTraits::kSmemBytes.
#include "sm90/bwd_epilogue.cuh"
#include "sm90/bwd_kernel.cuh"
#include "sm90/bwd_planes_mainloop.cuh"

namespace cupyflash {

template <typename T, int kHeadDim, int kStages, bool kScoreMod, bool kTf32, typename ScoreFn = NoUserScore,
          typename MaskFn = NoUserMask>
__global__ void __launch_bounds__(Sm90BwdPlanesTraits<kHeadDim, kStages, kTf32>::kThreads, 1)
sm90_bwd_planes(const CUPYFLASH_GRID_CONSTANT BwdArgs args, const CUPYFLASH_GRID_CONSTANT Sm90BwdMaps maps) {
    static_assert(sizeof(T) == 4, "float32 only");
    using Mainloop = Sm90BwdPlanesMainloop<kHeadDim, kStages, kScoreMod, kTf32, ScoreFn, MaskFn>;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Sm90BwdKernel<Mainloop, Sm90BwdEpilogue<float>>::run(args, maps, smem_raw);
}

}  // namespace cupyflash
