// Hopper forwards whose operands wgmma reads K-major only (sm_90a only): the kernel body of sm90/fwd.cu
// (sm90/fwd_kernel.cuh) with the main loop of sm90/fwd_kmajor_mainloop.cuh, which reads q and k as given
// and v as the V^T a pre-pass writes first (sm90/kmajor_values.cu).
//   sm90_fwd_fp8<TOut, ...>: e4m3 inputs; out (TOut: bfloat16 or float16) = O v_descale / l, lse float32.
//   sm90_fwd_tf32<float, ...>: float32 inputs at precision="tf32", read from the pre-passes' copies of q
//       and k rounded to tf32 (to nearest even); out float32, lse float64 (as every float32 forward's, which
//       the backward reads).
// The epilogue writes from the registers and with kMaxScore raises the heads' largest scores.
//
// Grid: x = min(work tiles, SMs). Dynamic shared memory: Sm90FwdKMajorTraits::kSmemBytes.
#include "fragment/epilogue.cuh"
#include "sm90/fwd_kernel.cuh"
#include "sm90/fwd_kmajor_mainloop.cuh"
#include "sm90/scheduler.cuh"

namespace cupyflash {

// out = O v_descale / l and the log-sum-exp (lse_t<TOut>: float32 beside 16-bit outputs, float64 beside
// float32 ones) of a consumer warpgroup's 64 rows, from the registers.
template <typename TOut>
struct Sm90FwdKMajorEpilogue {
    template <int kOTiles, typename Softmax>
    __device__ __forceinline__ static void store(const FwdArgs& args, const Sm90FwdMaps&, unsigned char*,
                                                 const Sm90FwdTile& tile, int wg, const float (&o)[1][kOTiles][4],
                                                 Softmax (&softmax)[1]) {
        const AttnArgs& a = args.attn;
        const int row_w = tile.m0 + 64 * wg + 16 * ((threadIdx.x / 32) % 4);  // this warp's first row
        float inv_l[1][2];
        lse_t<TOut> row_lse[1][2];
        softmax[0].finish(inv_l[0], row_lse[0], Consts<float>::neg_inf());
        if (a.v_descale != nullptr) {  // (one that is not positive and finite: NaN rows, as for q's and k's)
            const float x = a.v_descale[tile.b * a.heads_k + kv_head(tile.h, a.heads, a.heads_k)];
            const float v_descale = x > 0.0f && x < Consts<float>::inf() ? x : Consts<float>::nan();
            inv_l[0][0] *= v_descale;
            inv_l[0][1] *= v_descale;
        }
        if constexpr (Softmax::kTracksTop) {
            record_row_max_scores(args, tile.seq, tile.b, tile.h, row_w, softmax, raw_score_scale(a, tile.b, tile.h));
        }
        store_out<TOut>(args, tile.seq, tile.b, tile.h, row_w, o, inv_l);
        store_lse(args, tile.seq, tile.b, tile.h, row_w, row_lse);
    }
    __device__ __forceinline__ static void finish() {}
};

template <typename Op, typename TOut, int kHeadDim, int kHeadDimV, int kBlockN, int kStages, bool kMaxScore>
__device__ __forceinline__ void sm90_fwd_kmajor(const FwdArgs& args, const Sm90FwdMaps& maps, const Sm90Schedule& schedule) {
    using Mainloop = Sm90FwdKMajorMainloop<Op, kHeadDim, kHeadDimV, kBlockN, kStages, kMaxScore>;
    using Kernel = Sm90FwdKernel<Mainloop, Sm90FwdKMajorEpilogue<TOut>, Sm90QueryTileScheduler<Mainloop::kBlockM>>;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Kernel::run(args, maps, schedule, smem_raw);
}

template <typename TOut, int kHeadDim, int kHeadDimV, int kBlockN, int kStages, bool kMaxScore>
__global__ void __launch_bounds__(Sm90FwdKMajorTraits<E4m3Operands, kHeadDim, kHeadDimV, kBlockN, kStages>::kThreads, 1)
sm90_fwd_fp8(const CUPYFLASH_GRID_CONSTANT FwdArgs args, const CUPYFLASH_GRID_CONSTANT Sm90FwdMaps maps,
             const Sm90Schedule schedule) {
    sm90_fwd_kmajor<E4m3Operands, TOut, kHeadDim, kHeadDimV, kBlockN, kStages, kMaxScore>(args, maps, schedule);
}

template <typename T, int kHeadDim, int kHeadDimV, int kBlockN, int kStages, bool kMaxScore>
__global__ void __launch_bounds__(Sm90FwdKMajorTraits<Tf32Operands, kHeadDim, kHeadDimV, kBlockN, kStages>::kThreads, 1)
sm90_fwd_tf32(const CUPYFLASH_GRID_CONSTANT FwdArgs args, const CUPYFLASH_GRID_CONSTANT Sm90FwdMaps maps,
              const Sm90Schedule schedule) {
    static_assert(sizeof(T) == 4, "float32 only");
    sm90_fwd_kmajor<Tf32Operands, T, kHeadDim, kHeadDimV, kBlockN, kStages, kMaxScore>(args, maps, schedule);
}

}  // namespace cupyflash
