// The Hopper backward's epilogue: what a consumer warpgroup writes once its accumulators are complete,
// through shared memory and TMA stores where the key tile allows (store_staged), else straight from the
// registers (fragment/epilogue.cuh). The forward's is sm90/fwd_epilogue.cuh.
#pragma once
#include "common/params.cuh"
#include "common/scheduler.cuh"
#include "common/sequence.cuh"
#include "fragment/epilogue.cuh"
#include "sm90/bwd_mainloop.cuh"
#include "sm90/primitives.cuh"
#include "sm90/staged_rows.cuh"

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

    // store's work through shared memory, for a CTA of 128 keys (not kSplitCols) whose maps.dk and maps.dv
    // are set and whose key tile a TMA store may write whole: a dense sequence's map drops the rows past
    // its end, but a packed sequence's last tile would write the next sequence's rows (the caller sends
    // it to store). Once both consumer warpgroups are past their products (the walk's last dQ reads all
    // of K), each writes its 64 rows of dK and dV over K's and V's tiles, whose layout is the TMA box's,
    // and thread 128 stores both tiles with one TMA store per 64-column atom, then waits until they have
    // read shared memory, which the CTA's end hands on. `barrier`: a named barrier of the 256 consumers.
    template <typename Tr, int kDkTiles, int kDvTiles>
    __device__ __forceinline__ static void store_staged(const BwdArgs& args, const Sm90BwdMaps& maps, unsigned char* smem,
                                                        const Sequence& seq, const TileWork& work, int wg, int barrier,
                                                        const float (&dk)[kDkTiles][4], const float (&dv)[kDvTiles][4]) {
        static_assert(!Tr::kSplitCols, "a consumer warpgroup's 64 of the CTA's 128 keys");
        const AttnArgs& a = args.attn;
        const float dk_scale = static_cast<float>(a.softmax_scale);
        const float dk_scales[2] = {dk_scale, dk_scale};
        const float ones[2] = {1.0f, 1.0f};
        named_barrier_sync(barrier, 256);
        stage_swizzled_rows<T>(smem + Tr::kKOffset + 64 * wg * 128, Tr::kBlockN * 128, dk, dk_scales);
        stage_swizzled_rows<T>(smem + Tr::kVOffset + 64 * wg * 128, Tr::kBlockN * 128, dv, ones);
        fence_proxy_async();  // the writes, visible to the TMA unit
        named_barrier_sync(barrier, 256);
        if (threadIdx.x == 128) {
            const int row0 = seq.k_start + work.tile * Tr::kBlockN;
            const int batch = a.cu_seqlens_k != nullptr ? 0 : work.b;
#pragma unroll
            for (int atom = 0; atom < Tr::kAtomsQK; ++atom) {
                if (64 * atom < a.headdim) {
                    tma_store_4d(maps.dk, smem + Tr::kKOffset + atom * Tr::kBlockN * 128, 64 * atom, row0, work.h, batch);
                }
            }
#pragma unroll
            for (int atom = 0; atom < Tr::kAtomsV; ++atom) {
                if (64 * atom < a.headdim_v) {
                    tma_store_4d(maps.dv, smem + Tr::kVOffset + atom * Tr::kBlockN * 128, 64 * atom, row0, work.h, batch);
                }
            }
            bulk_commit();
            bulk_wait_read();
        }
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
