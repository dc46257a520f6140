// Epilogues of the tensor-core kernels: accumulator fragments of the mma.sync C layout (mma.cuh: a
// thread holds rows g and g + 8 of each 16-row m-tile and columns 2t, 2t + 1 of each 8-column n-tile)
// scaled per row, rounded to T and written to a tensor within the sequence's rows and the real columns.
// A warpgroup's wgmma accumulators have the same layout per warp, so later kernels reuse these.
#pragma once
#include "common/dtypes.cuh"
#include "common/max_score.cuh"
#include "common/params.cuh"
#include "common/sequence.cuh"
#include "fragment/softmax.cuh"

namespace cupyflash {

// dst[row * row_stride + col] = T(acc * scale[mt][r]) for 0 <= row = row0 + 16 mt + g + 8 r < row_end and
// col = col0 + 8 nt + 2 t + e < cols; dst points at row 0 of one (batch entry, head). A thread's two
// columns 2t, 2t + 1 go out as one 32-bit store (float32: one 64-bit store, float64 one 128-bit store)
// where every pair is aligned (even cols and row stride, aligned dst: the outputs cupyflash allocates),
// else element by element; the rounding is the same either way. Acc: float, or double for float64.
template <typename T, int kMTiles, int kNTiles, typename Acc>
__device__ __forceinline__ void store_fragments(T* dst, long long row_stride, int row0, int row_end, int col0, int cols,
                                                const Acc (&acc)[kMTiles][kNTiles][4],
                                                const Acc (&scale)[kMTiles][2]) {
    const int lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const bool paired = cols % 2 == 0 && col0 % 2 == 0 && row_stride % 2 == 0 && reinterpret_cast<size_t>(dst) % 4 == 0;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = row0 + 16 * mt + g + 8 * r;
            if (static_cast<unsigned>(row) >= static_cast<unsigned>(row_end)) continue;  // also row < 0
            T* dst_row = dst + static_cast<long long>(row) * row_stride;
#pragma unroll
            for (int nt = 0; nt < kNTiles; ++nt) {
                const int col = col0 + 8 * nt + 2 * t;
                const Acc v0 = acc[mt][nt][2 * r] * scale[mt][r];
                const Acc v1 = acc[mt][nt][2 * r + 1] * scale[mt][r];
                if constexpr (sizeof(T) == 8) {
                    if (paired && col < cols && reinterpret_cast<size_t>(dst_row + col) % 16 == 0) {
                        *reinterpret_cast<double2*>(dst_row + col) = make_double2(v0, v1);
                    } else {
                        if (col < cols) dst_row[col] = v0;
                        if (col + 1 < cols) dst_row[col + 1] = v1;
                    }
                } else if constexpr (sizeof(T) == 4) {
                    if (paired && col < cols && reinterpret_cast<size_t>(dst_row + col) % 8 == 0) {
                        *reinterpret_cast<float2*>(dst_row + col) = make_float2(v0, v1);
                    } else {
                        if (col < cols) dst_row[col] = v0;
                        if (col + 1 < cols) dst_row[col + 1] = v1;
                    }
                } else if (paired) {
                    if (col < cols) *reinterpret_cast<unsigned*>(dst_row + col) = pack2<T>(v0, v1);
                } else {
                    if (col < cols) dst_row[col] = from_acc<T>(v0);
                    if (col + 1 < cols) dst_row[col + 1] = from_acc<T>(v1);
                }
            }
        }
    }
}

// A quad's four 32-bit values x[0..3] transposed (4 x 4 over the quad's lanes t = lane % 4): on return
// x[j] of lane t holds what x[t] of lane j held. Two butterfly steps, two shuffles each.
__device__ __forceinline__ void transpose_quad(unsigned (&x)[4]) {
    const int t = threadIdx.x % 4;
#pragma unroll
    for (int bit = 1; bit <= 2; bit *= 2) {
        const bool upper = (t & bit) != 0;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            if (j & bit) continue;
            // The lane keeps the slot of the pair whose bit matches its own and trades the other.
            const unsigned got = __shfl_xor_sync(0xffffffffu, upper ? x[j] : x[j + bit], bit);
            if (upper) {
                x[j] = got;
            } else {
                x[j + bit] = got;
            }
        }
    }
}

// store_fragments for 16-bit T over whole 32-column groups, each row in 16-byte stores: a quad's
// lanes hold two columns of each of four n-tiles, and after transpose_quad lane t holds the eight
// columns of the group's n-tile t. The caller checks that every column is real and that dst, row_stride
// and col0 keep 16-byte alignment. A quarter of the store instructions, each writing whole sectors.
template <typename T, int kMTiles, int kNTiles>
__device__ __forceinline__ void store_fragments_16B(T* dst, long long row_stride, int row0, int row_end, int col0,
                                                    const float (&acc)[kMTiles][kNTiles][4],
                                                    const float (&scale)[kMTiles][2]) {
    static_assert(sizeof(T) == 2 && kNTiles % 4 == 0, "16-bit values in groups of four n-tiles");
    const int lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = row0 + 16 * mt + g + 8 * r;
            T* dst_row = dst + static_cast<long long>(row) * row_stride + col0 + 8 * t;
#pragma unroll
            for (int group = 0; group < kNTiles / 4; ++group) {
                unsigned x[4];
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const float* pair = &acc[mt][4 * group + j][2 * r];
                    x[j] = pack2<T>(pair[0] * scale[mt][r], pair[1] * scale[mt][r]);
                }
                transpose_quad(x);  // every lane shuffles, also those of rows past row_end
                if (static_cast<unsigned>(row) < static_cast<unsigned>(row_end)) {
                    *reinterpret_cast<uint4*>(dst_row + 32 * group) = make_uint4(x[0], x[1], x[2], x[3]);
                }
            }
        }
    }
}

// store_fragments in 16-byte stores (store_fragments_16B) where T is 16-bit and the columns col0 ..
// col0 + 8 kNTiles are whole 32-column groups, all of them real (below cols), with dst, row_stride and
// col0 keeping 16-byte alignment; else store_fragments' 32-bit stores. The 32-bit stores write half of
// each 32-byte sector a warp instruction touches, and four times the instructions.
template <typename T, int kMTiles, int kNTiles, typename Acc>
__device__ __forceinline__ void store_fragments_wide(T* dst, long long row_stride, int row0, int row_end, int col0,
                                                     int cols, const Acc (&acc)[kMTiles][kNTiles][4],
                                                     const Acc (&scale)[kMTiles][2]) {
    if constexpr (sizeof(T) == 2 && kNTiles % 4 == 0) {
        if (col0 % 8 == 0 && col0 + 8 * kNTiles <= cols && row_stride % 8 == 0 && reinterpret_cast<size_t>(dst) % 16 == 0) {
            store_fragments_16B<T>(dst, row_stride, row0, row_end, col0, acc, scale);
            return;
        }
    }
    store_fragments<T>(dst, row_stride, row0, row_end, col0, cols, acc, scale);
}

// store_fragments_wide with one scale for every row.
template <typename T, int kMTiles, int kNTiles, typename Acc>
__device__ __forceinline__ void store_fragments_wide(T* dst, long long row_stride, int row0, int row_end, int col0,
                                                     int cols, const Acc (&acc)[kMTiles][kNTiles][4], Acc scale) {
    Acc scales[kMTiles][2];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) scales[mt][0] = scales[mt][1] = scale;
    store_fragments_wide<T>(dst, row_stride, row0, row_end, col0, cols, acc, scales);
}

// The forward's log-sum-exp (FragmentSoftmax::finish: LN2 * (m2 + log2 l), or m + ln l in natural-log
// units; L is lse_t), of the rows
// row0 + 16 mt + g + 8 r of (batch entry b, head h) that lie inside the sequence: one lane per row.
template <typename L, int kMTiles>
__device__ __forceinline__ void store_lse(const FwdArgs& args, const Sequence& seq, int b, int h, int row0,
                                          const L (&row_lse)[kMTiles][2]) {
    const int lane = threadIdx.x % 32;
    if (lane % 4 != 0) return;
    L* lse = static_cast<L*>(args.lse.ptr) + rows_index(args.lse, b, h, seq.q_start);
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = row0 + 16 * mt + lane / 4 + 8 * r;
            if (static_cast<unsigned>(row) < static_cast<unsigned>(seq.seqlen_q)) lse[row] = row_lse[mt][r];
        }
    }
}

// The forward's output rows from the registers: out = O * inv_l per row (0 for a row that saw no key).
template <typename T, int kMTiles, int kOTiles, typename Acc>
__device__ __forceinline__ void store_out(const FwdArgs& args, const Sequence& seq, int b, int h, int row0,
                                          const Acc (&o)[kMTiles][kOTiles][4], const Acc (&inv_l)[kMTiles][2]) {
    store_fragments_wide<T>(head_rows<T>(args.out, b, seq.q_start, h), args.out.row_stride, row0, seq.seqlen_q, 0,
                            args.attn.headdim_v, o, inv_l);
}

// return_max_score (Softmax::kTracksTop, after finish): raises the maximum of (batch entry b, head h) to
// the largest score of the warp's rows row0 + 16 mt + g + 8 r that lie inside the sequence (the others
// hold zero-filled queries, or a neighbouring sequence's); `unit` as FragmentSoftmax::row_max_score's.
// Every lane of the warp calls it; one atomic per warp.
template <int kMTiles, typename Softmax>
__device__ __forceinline__ void record_row_max_scores(const FwdArgs& args, const Sequence& seq, int b, int h, int row0,
                                                      const Softmax (&softmax)[kMTiles], float unit) {
    if (args.max_score == nullptr) return;
    const int g = (threadIdx.x % 32) / 4;
    unsigned image = 0u;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = row0 + 16 * mt + g + 8 * r;
            if (static_cast<unsigned>(row) < static_cast<unsigned>(seq.seqlen_q)) {
                image = max(image, max_score_image(softmax[mt].row_max_score(r, unit)));
            }
        }
    }
    // One atomic per warp (__reduce_max_sync: sm_80 on, as every kernel of this header; the general
    // kernels, built for older GPUs too, record per row).
    image = __reduce_max_sync(0xffffffffu, image);
    if (threadIdx.x % 32 == 0 && image != 0u) atomicMax(args.max_score + static_cast<long long>(b) * args.attn.heads + h, image);
}

// The forward's epilogue from the registers: out and lse of the rows row0 + 16 mt + g + 8 r, and their
// largest scores where the softmax tracks them (its units: natural-log, or log2).
template <typename T, int kMTiles, int kOTiles, typename Softmax, typename Acc>
__device__ __forceinline__ void fwd_epilogue(const FwdArgs& args, const Sequence& seq, int b, int h, int row0,
                                             const Acc (&o)[kMTiles][kOTiles][4], Softmax (&softmax)[kMTiles]) {
    Acc inv_l[kMTiles][2];
    lse_t<T> row_lse[kMTiles][2];
    const float sink = attention_sink(args.attn, h);
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) softmax[mt].finish(inv_l[mt], row_lse[mt], sink);
    if constexpr (Softmax::kTracksTop) {
        record_row_max_scores(args, seq, b, h, row0, softmax, Softmax::kNaturalUnits ? 1.0f : kLn2F);
    }
    store_out<T>(args, seq, b, h, row0, o, inv_l);
    store_lse(args, seq, b, h, row0, row_lse);
}

}  // namespace cupyflash
