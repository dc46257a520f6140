// The split merge of the decode kernels (kvcache/kvcache.cu's kvc_fwd, kvcache/mla.cu's kvc_mla and
// kvcache/mla_sm90.cu's kvc_mla_sm90), and the MLA kernels' row stores: with num_splits > 1 each CTA
// writes a float32 partial output and its lse, and the last split of a row tile to finish merges them. Tr
// names the kernel's kRows, kWarps, kThreads, kSmemBytes and kPartCols.
#pragma once
#include "common/dtypes.cuh"
#include "common/math.cuh"
#include "common/params.cuh"
#include "common/reduce.cuh"
#include "common/sequence.cuh"

namespace cupyflash {

// Largest num_splits (cupyflash/_kvcache/call.py MAX_SPLITS): the merge keeps a row tile's weights, one
// per split and row, in shared memory.
constexpr int kMaxSplits = 256;

// A finished row of an MLA decode kernel (kvcache/mla.cu, mla_sm90.cu): row r of batch entry b (query
// r / heads, head r % heads; one kv head), this thread's pairs of columns col0 + 8 n, col0 + 8 n + 1 of
// its kTiles accumulator n-tiles (o[n][2 half], o[n][2 half + 1]) times inv, into out, or with
// num_splits > 1 into the split's partial row; and its lse, by the one thread that writes_lse.
template <typename T, typename Tr, int kTiles>
__device__ __forceinline__ void store_row_pairs(const KvCacheArgs& c, int b, int split, int r, const float (&o)[kTiles][4],
                                                int half, int col0, float inv, float lse, bool writes_lse) {
    const AttnArgs& a = c.attn;
    const int i = r / a.heads, h = r % a.heads;
    const long long part_row = ((static_cast<long long>(split) * a.batch + b) * a.seqlen_q + i) * a.heads + h;
    T* out_row = head_rows<T>(c.out, b, i, h);
#pragma unroll
    for (int n = 0; n < kTiles; ++n) {
        const int col = col0 + 8 * n;
        const float x0 = o[n][2 * half] * inv, x1 = o[n][2 * half + 1] * inv;
        if (c.num_splits == 1) {
            *reinterpret_cast<unsigned*>(out_row + col) = pack2<T>(x0, x1);
        } else {
            *reinterpret_cast<float2*>(c.part_out + part_row * Tr::kPartCols + col) = make_float2(x0, x1);
        }
    }
    if (writes_lse) {
        if (c.num_splits == 1) {
            static_cast<float*>(c.lse.ptr)[rows_index(c.lse, b, h, i)] = lse;
        } else {
            c.part_lse[((static_cast<long long>(split) * a.batch + b) * a.heads + h) * a.seqlen_q + i] = lse;
        }
    }
}

// The split merge, run by the CTAs of a decode kernel after they wrote their partial rows: the last of a row
// tile's num_splits CTAs to count itself merges the tile's rows. Row (b, i, h) gets lse = ln sum_s
// exp(lse_s) and out = sum_s exp(lse_s - lse) out_s, shifted by the largest lse_s, summed in a fixed
// order (deterministic). Splits that saw no key (lse_s = -inf) weigh 0; a row no split saw is 0 with lse
// -inf; a NaN lse_s makes the row NaN. Each CTA's writes are fenced before it counts, and the merging
// CTA reads the partials through L2 (ld.cg), where the other SMs' writes are. The counter of the row
// tile is zero before the launch, and the merging CTA sets it back to zero: the plan zeroes its
// counters once (cupyflash/_plan.py PlanBuilder.counters).
template <typename T, typename Tr>
__device__ __forceinline__ void merge_splits(const KvCacheArgs& c, unsigned char* smem_raw) {
    constexpr int kWeightsLd = kMaxSplits + 1;  // a row's weights, padded: the rows' threads read other banks
    static_assert(Tr::kRows * (kWeightsLd + 1) * 4 <= Tr::kSmemBytes, "the merge's weights fit the shared memory");
    const AttnArgs& a = c.attn;
    const int splits = c.num_splits;
    // The CTA's row tile, from the grid (the kernel's own values are not kept across its loop for this).
    const int row_tile = blockIdx.x / splits, hk = blockIdx.y, b = blockIdx.z;
    const int group = a.heads / a.heads_k, rows = a.seqlen_q * group, r0 = row_tile * Tr::kRows;
    __shared__ int is_last;
    __threadfence();
    __syncthreads();  // also: every thread is done with the warps' states in shared memory
    if (threadIdx.x == 0) {
        int* counter = c.split_counters + (static_cast<long long>(b) * a.heads_k + hk) * (gridDim.x / splits) + row_tile;
        is_last = atomicAdd(counter, 1) == splits - 1;
        if (is_last) atomicExch(counter, 0);
        __threadfence();  // the count before the reads of the partials it stands for
    }
    __syncthreads();
    if (!is_last) return;
    __threadfence();

    const int tile_rows = min(Tr::kRows, rows - r0);
    const long long all_rows = static_cast<long long>(a.batch) * a.seqlen_q * a.heads;  // per split
    float* weights = reinterpret_cast<float*>(smem_raw);  // [row][split]: exp(lse_s - base)
    float* row_inv = weights + Tr::kRows * kWeightsLd;     // [row]: 1 / sum of the weights, NaN for a NaN row
    // A warp per row: its lanes read the row's split lse values (one L2 round trip for up to 32 splits),
    // and the row's maximum, NaN flag and sum are butterflies across the warp (a fixed order).
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int r = warp; r < tile_rows; r += Tr::kWarps) {
        const int i = (r0 + r) / group, h = hk * group + (r0 + r) % group;
        const long long lse_row = (static_cast<long long>(b) * a.heads + h) * a.seqlen_q + i;
        float* w = weights + r * kWeightsLd;
        float m = Consts<float>::neg_inf();
        bool nan = false;
        for (int s = lane; s < splits; s += 32) {
            const float x = __ldcg(c.part_lse + s * all_rows + lse_row);
            w[s] = x;
            nan = nan || x != x;
            m = fmaxf(m, x);
        }
        m = group_max<32>(m);
        nan = __any_sync(0xffffffffu, nan);
        const float base = m == Consts<float>::neg_inf() ? 0.0f : m;
        float total = 0.0f;
        for (int s = lane; s < splits; s += 32) {
            w[s] = __expf(w[s] - base);
            total += w[s];
        }
        total = group_sum<32>(total);
        if (lane == 0) {
            const float qnan = __int_as_float(0x7fc00000);
            row_inv[r] = nan ? qnan : (total != 0.0f ? 1.0f / total : 0.0f);
            static_cast<float*>(c.lse.ptr)[rows_index(c.lse, b, h, i)] =
                nan ? qnan : (total != 0.0f ? base + __logf(total) : Consts<float>::neg_inf());
        }
    }
    __syncthreads();
    // A thread per four columns of a row (partial rows are Tr::kPartCols floats apart, 16-byte aligned;
    // the columns past headdim_v are read and dropped): sixteen splits' loads in flight at once, so a
    // merge of up to 32 splits is two L2 round trips.
    constexpr int kVec = 4;
    const int vecs = ceil_div(a.headdim_v, kVec);
    const long long split_stride = all_rows * (Tr::kPartCols / kVec);  // float4s between two splits' rows
    for (int idx = threadIdx.x; idx < tile_rows * vecs; idx += Tr::kThreads) {
        const int r = idx / vecs, col = (idx % vecs) * kVec;
        const int i = (r0 + r) / group, h = hk * group + (r0 + r) % group;
        const float4* part = reinterpret_cast<const float4*>(
            c.part_out + ((static_cast<long long>(b) * a.seqlen_q + i) * a.heads + h) * Tr::kPartCols + col);
        const float* w = weights + r * kWeightsLd;
        float acc[kVec] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 16
        for (int s = 0; s < splits; ++s) {
            const float4 x = __ldcg(part + s * split_stride);
            acc[0] += w[s] * x.x;
            acc[1] += w[s] * x.y;
            acc[2] += w[s] * x.z;
            acc[3] += w[s] * x.w;
        }
        T* out_row = head_rows<T>(c.out, b, i, h);
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
            if (col + k < a.headdim_v) out_row[col + k] = from_acc<T>(acc[k] * row_inv[r]);
        }
    }
}

}  // namespace cupyflash
