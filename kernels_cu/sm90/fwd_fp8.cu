// Hopper forward for FP8 inputs (e4m3, sm_90a only): sm90_fwd_fp8<TOut, ...>, the kernel body of
// sm90/fwd.cu (sm90/fwd_kernel.cuh) with the main loop of sm90/fwd_fp8_mainloop.cuh, which reads q and k
// as they are and v as the V^T that fp8_transpose_values (sm90/fp8_values.cu) writes first. The epilogue
// writes out (TOut: bfloat16 or float16) = O v_descale / l and lse (float32) from the registers, and with
// kMaxScore raises the heads' largest scores.
//
// Grid: x = min(work tiles, SMs). Dynamic shared memory: Sm90FwdFp8Traits::kSmemBytes.
#include "fragment/epilogue.cuh"
#include "sm90/fwd_fp8_mainloop.cuh"
#include "sm90/fwd_kernel.cuh"
#include "sm90/scheduler.cuh"

namespace cupyflash {

// out = O v_descale / l and the log-sum-exp of a consumer warpgroup's 64 rows, from the registers.
template <typename TOut>
struct Sm90FwdFp8Epilogue {
    template <int kOTiles, typename Softmax>
    __device__ __forceinline__ static void store(const FwdArgs& args, const Sm90FwdMaps&, unsigned char*,
                                                 const Sm90FwdTile& tile, int wg, const float (&o)[1][kOTiles][4],
                                                 Softmax (&softmax)[1]) {
        const AttnArgs& a = args.attn;
        const int row_w = tile.m0 + 64 * wg + 16 * ((threadIdx.x / 32) % 4);  // this warp's first row
        float inv_l[1][2];
        float row_lse[1][2];
        softmax[0].finish(inv_l[0], row_lse[0], Consts<float>::neg_inf());
        if (a.v_descale != nullptr) {
            const float v_descale = a.v_descale[tile.b * a.heads_k + kv_head(tile.h, a.heads, a.heads_k)];
            inv_l[0][0] *= v_descale;
            inv_l[0][1] *= v_descale;
        }
        if constexpr (Softmax::kTracksTop) {
            record_row_max_scores(args, tile.seq, tile.b, tile.h, row_w, softmax, fp8_scale(a, tile.b, tile.h));
        }
        store_out<TOut>(args, tile.seq, tile.b, tile.h, row_w, o, inv_l);
        store_lse(args, tile.seq, tile.b, tile.h, row_w, row_lse);
    }
    __device__ __forceinline__ static void finish() {}
};

template <typename TOut, int kHeadDim, int kHeadDimV, int kBlockN, int kStages, bool kMaxScore>
__global__ void __launch_bounds__(Sm90FwdFp8Traits<kHeadDim, kHeadDimV, kBlockN, kStages>::kThreads, 1)
sm90_fwd_fp8(const CUPYFLASH_GRID_CONSTANT FwdArgs args, const CUPYFLASH_GRID_CONSTANT Sm90FwdMaps maps,
             const Sm90Schedule schedule) {
    using Mainloop = Sm90FwdFp8Mainloop<kHeadDim, kHeadDimV, kBlockN, kStages, kMaxScore>;
    using Kernel = Sm90FwdKernel<Mainloop, Sm90FwdFp8Epilogue<TOut>, Sm90QueryTileScheduler<Mainloop::kBlockM>>;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Kernel::run(args, maps, schedule, smem_raw);
}

}  // namespace cupyflash
