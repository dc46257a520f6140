// The Hopper backward's epilogue: what a consumer warpgroup writes once its accumulators are complete,
// straight from the registers (fragment/epilogue.cuh). The forward's is sm90/fwd_epilogue.cuh.
#pragma once
#include "common/params.cuh"
#include "common/sequence.cuh"
#include "fragment/epilogue.cuh"

namespace cupyflash {

// The backward: dK = softmax_scale * dS^T Q (the scale of S = scale * Q K^T, applied once here) and dV
// of the warpgroup's 64 keys, from row0 = its warp's first key, and of its columns from dk_col0 and
// dv_col0 on, in 16-byte stores where the columns and row addresses allow (store_fragments_wide).
template <typename T>
struct Sm90BwdEpilogue {
    template <int kDkTiles, int kDvTiles>
    __device__ __forceinline__ static void store(const BwdArgs& args, const Sequence& seq, int b, int hk, int row0,
                                                 int dk_col0, int dv_col0, const float (&dk)[kDkTiles][4],
                                                 const float (&dv)[kDvTiles][4]) {
        const AttnArgs& a = args.attn;
        store_fragments_wide<T>(head_rows<T>(args.dk, b, seq.k_start, hk), args.dk.row_stride, row0, seq.seqlen_k, dk_col0,
                                a.headdim, reinterpret_cast<const float(&)[1][kDkTiles][4]>(dk),
                                static_cast<float>(a.softmax_scale));
        store_fragments_wide<T>(head_rows<T>(args.dv, b, seq.k_start, hk), args.dv.row_stride, row0, seq.seqlen_k, dv_col0,
                                a.headdim_v, reinterpret_cast<const float(&)[1][kDvTiles][4]>(dv), 1.0f);
    }

    // kSplitCols: dK (dk, scaled as above) or dV of the CTA's keys, every column, from one warpgroup.
    template <int kTiles>
    __device__ __forceinline__ static void store_one(const BwdArgs& args, const Sequence& seq, int b, int hk, int row0,
                                                     bool dk, const float (&acc)[kTiles][4]) {
        const AttnArgs& a = args.attn;
        const auto& fragment = reinterpret_cast<const float(&)[1][kTiles][4]>(acc);
        if (dk) {
            store_fragments_wide<T>(head_rows<T>(args.dk, b, seq.k_start, hk), args.dk.row_stride, row0, seq.seqlen_k, 0,
                                    a.headdim, fragment, static_cast<float>(a.softmax_scale));
        } else {
            store_fragments_wide<T>(head_rows<T>(args.dv, b, seq.k_start, hk), args.dv.row_stride, row0, seq.seqlen_k, 0,
                                    a.headdim_v, fragment, 1.0f);
        }
    }
};

}  // namespace cupyflash
