// Where a batch entry's rows are: dense batches, packed (varlen) batches and KV caches whose entries use
// a prefix of their capacity, and the addressing of tensors and per-row values.
#pragma once
#include "common/math.cuh"
#include "common/params.cuh"

namespace cupyflash {

// Where batch entry b's rows are: offsets into packed tensors (0 for dense batches) and lengths.
struct Sequence {
    int q_start, k_start;
    int seqlen_q, seqlen_k;

    Sequence() = default;
    __device__ __forceinline__ Sequence(const AttnArgs& a, int b) {
        if (a.cu_seqlens_q != nullptr) {
            // Clamped into the packed tensors and the longest length, so a malformed cu_seqlens cannot
            // reach outside them (the host checks it, or poisons the outputs when it was not asked to).
            q_start = clamp_int(a.cu_seqlens_q[b], 0, a.total_q);
            seqlen_q = min(clamp_int(a.cu_seqlens_q[b + 1], q_start, a.total_q) - q_start, a.seqlen_q);
            k_start = clamp_int(a.cu_seqlens_k[b], 0, a.total_k);
            seqlen_k = min(clamp_int(a.cu_seqlens_k[b + 1], k_start, a.total_k) - k_start, a.seqlen_k);
        } else {
            q_start = k_start = 0;
            seqlen_q = a.seqlen_q;
            seqlen_k = a.seqlen_k;
        }
        // seqused_k: a KV cache's entries use a prefix of its capacity, and flash_attention_varlen's
        // sequences their first keys (clamped into them, so no access leaves them).
        if (a.seqused_k != nullptr) seqlen_k = clamp_int(a.seqused_k[b], 0, seqlen_k);
    }
};

// Row 0 of sequence `start` (the first row of a batch entry), batch entry b, head h of a tensor.
template <typename T>
__device__ __forceinline__ T* head_rows(const TensorArg& t, long long b, int start, long long h) {
    return static_cast<T*>(t.ptr) + b * t.batch_stride + start * t.row_stride + h * t.head_stride;
}

// Index of row 0 of (b, h) in per-row values (lse, delta) or accumulator rows.
__device__ __forceinline__ long long rows_index(const RowsArg& r, long long b, long long h, int start) {
    return b * r.batch_stride + h * r.head_stride + start;
}

// The kv head that query head h reads under GQA/MQA.
__device__ __forceinline__ int kv_head(int h, int heads, int heads_k) { return h / (heads / heads_k); }

}  // namespace cupyflash
