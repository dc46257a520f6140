// Epilogues of the Hopper kernels: what a consumer warpgroup writes once its accumulators are complete,
// straight from the registers (fragment/epilogue.cuh). A split-KV or FP8 variant of the kernels
// replaces these, keeping the main loops.
#pragma once
#include "common/params.cuh"
#include "common/sequence.cuh"
#include "fragment/epilogue.cuh"
#include "fragment/softmax.cuh"

namespace cupyflash {

// The forward: out = O / l and the log-sum-exp of the warpgroup's rows of a work tile.
template <typename T>
struct Sm90FwdEpilogue {
    // row_w: the first row of this thread's warp (the warpgroup's first row + 16 warp).
    template <int kOTiles, int kNTiles>
    __device__ __forceinline__ static void store(const FwdArgs& args, const Sequence& seq, int b, int h, int row_w,
                                                 const float (&o)[1][kOTiles][4],
                                                 FragmentSoftmax<kNTiles> (&softmax)[1]) {
        fwd_epilogue<T>(args, seq, b, h, row_w, o, softmax);
    }
};

// The backward: dK = softmax_scale * dS^T Q (the scale of S = scale * Q K^T, applied once here) and dV
// of the warpgroup's 64 keys, from row0 = its warp's first key.
template <typename T>
struct Sm90BwdEpilogue {
    template <int kDkTiles, int kDvTiles>
    __device__ __forceinline__ static void store(const BwdArgs& args, const Sequence& seq, int b, int hk, int row0,
                                                 const float (&dk)[kDkTiles][4], const float (&dv)[kDvTiles][4]) {
        const AttnArgs& a = args.attn;
        store_fragments<T>(head_rows<T>(args.dk, b, seq.k_start, hk), args.dk.row_stride, row0, seq.seqlen_k, 0,
                           a.headdim, reinterpret_cast<const float(&)[1][kDkTiles][4]>(dk),
                           static_cast<float>(a.softmax_scale));
        store_fragments<T>(head_rows<T>(args.dv, b, seq.k_start, hk), args.dv.row_stride, row0, seq.seqlen_k, 0,
                           a.headdim_v, reinterpret_cast<const float(&)[1][kDvTiles][4]>(dv), 1.0f);
    }
};

}  // namespace cupyflash
