// Hopper forward for float32 (sm_90a only): sm90_fwd_planes, the kernel body of sm90/fwd.cu
// (sm90/fwd_kernel.cuh: TMA loads by a producer warpgroup, two consumer warpgroups, a persistent grid)
// with the main loop of sm90/fwd_planes_mainloop.cuh, which reads k and v as the bfloat16 planes that
// split_planes (sm80/planes.cu) writes, splits q itself, and forms each product from six bfloat16 wgmma
// products (three for precision="tf32"). Its scores are bitwise those of the sm80 float32 kernels, whose backward it
// pairs with. The epilogue writes out (float32) and lse (float64) from the registers, and with kMaxScore
// raises the heads' largest scores (return_max_score).
//
// Grid: x = min(work tiles, SMs). Dynamic shared memory: Sm90FwdPlanesTraits::kSmemBytes.
#include "fragment/epilogue.cuh"
#include "sm90/fwd_kernel.cuh"
#include "sm90/fwd_planes_mainloop.cuh"
#include "sm90/scheduler.cuh"

namespace cupyflash {

// out = O / l and the log-sum-exp of a consumer warpgroup's 64 rows, from the registers.
template <typename Tr>
struct Sm90FwdPlanesEpilogue {
    template <int kOTiles, typename Softmax>
    __device__ __forceinline__ static void store(const FwdArgs& args, const Sm90FwdMaps&, unsigned char*,
                                                 const Sm90FwdTile& tile, int wg, const float (&o)[1][kOTiles][4],
                                                 Softmax (&softmax)[1]) {
        const int row_w = tile.m0 + 64 * wg + 16 * ((threadIdx.x / 32) % 4);  // this warp's first row
        fwd_epilogue<float>(args, tile.seq, tile.b, tile.h, row_w, o, softmax);
    }
    __device__ __forceinline__ static void finish() {}
};

template <typename T, int kHeadDim, int kBlockN, int kStages, bool kScoreMod, bool kTf32, bool kMaxScore,
          typename ScoreFn = NoUserScore, typename MaskFn = NoUserMask>
__global__ void __launch_bounds__(Sm90FwdPlanesTraits<kHeadDim, kBlockN, kStages, kTf32>::kThreads, 1)
sm90_fwd_planes(const CUPYFLASH_GRID_CONSTANT FwdArgs args, const CUPYFLASH_GRID_CONSTANT Sm90FwdMaps maps,
                const Sm90Schedule schedule) {
    static_assert(sizeof(T) == 4, "float32 only");
    using Mainloop = Sm90FwdPlanesMainloop<kHeadDim, kBlockN, kStages, kScoreMod, kTf32, kMaxScore, ScoreFn, MaskFn>;
    using Kernel = Sm90FwdKernel<Mainloop, Sm90FwdPlanesEpilogue<typename Mainloop::Tr>,
                                 Sm90QueryTileScheduler<Mainloop::kBlockM>>;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Kernel::run(args, maps, schedule, smem_raw);
}

}  // namespace cupyflash
