// Kernel arguments: one struct per direction, passed by value. cupyflash/_params.py builds the same
// layout as a NumPy structured scalar (CuPy copies its bytes into the launch), and tests/test_compile.py
// checks every sizeof and offsetof against that dtype, so a field added on one side only fails in CI.
#pragma once

// Kernels take their argument struct as `const CUPYFLASH_GRID_CONSTANT FwdArgs args`: __grid_constant__
// (sm_70+) lets the body bind references to its fields without a local copy of the struct.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
#define CUPYFLASH_GRID_CONSTANT __grid_constant__
#else
#define CUPYFLASH_GRID_CONSTANT
#endif

#include "common/dropout.cuh"
#include "common/user_mod.cuh"

namespace cupyflash {

// A (batch, rows, heads, dim) tensor with a contiguous last axis: element (b, row, h, c) is at
// ptr[b * batch_stride + row * row_stride + h * head_stride + c], strides in elements. A packed
// variable-length tensor (total_rows, heads, dim) has batch_stride 0; its rows are counted from the
// start of the tensor, sequence starts included.
struct TensorArg {
    void* ptr;
    long long batch_stride;
    long long row_stride;
    long long head_stride;
};

// Per-row values of each (batch, head): element (b, h, row) is at
// ptr[b * batch_stride + h * head_stride + row]. lse and delta are (batch, heads, seqlen_q) for dense
// batches and (heads, total_q) for packed ones (batch_stride 0); the float32 dQ accumulator uses the
// same row index times its row length.
struct RowsArg {
    void* ptr;
    long long batch_stride;
    long long head_stride;
};

// Block-sparse attention (cupyflash.BlockMask) at one kernel's tile shape. A slice is the mask of one
// (batch, head): slice(b, h) = b * slice_batch_stride + h * slice_head_stride (0 strides broadcast a
// layout given for one batch entry or one head). Lists hold entries tile * 2 + partial, ascending,
// where partial = 1 marks a kernel tile that covers both set and clear cells of the layout and so needs
// the element mask; tiles whose cells are all clear are absent and never read.
struct BlockSparseArg {
    const int* kv_count;          // [slice][q_tile]: key tiles listed for each query tile
    const int* kv_index;          // [slice][q_tile][k_tiles]
    const int* q_count;           // [slice][k_tile]: query tiles listed for each key tile
    const int* q_index;           // [slice][k_tile][q_tiles]
    const unsigned char* layout;  // [slice][layout_rows][layout_cols]: 1 = block visible
    long long slice_batch_stride;
    long long slice_head_stride;
    int tile_q, tile_k;           // the kernel tile the lists were built for (checked by the kernel)
    int q_tiles, k_tiles;
    int block_q, block_k;         // the layout's block size
    int layout_rows, layout_cols;
    // A BlockMask.from_mask_mod's pairs in its partial blocks as bits (common/user_calls.cuh's
    // UserMaskAt::bits reads them in place of the function; null: none): elem_slot [slice][layout_rows]
    // [layout_cols] the block's slot (-1: the function), elem_bits block_q * block_k / 16 words a slot
    // (common/mask_mod_blocks.cu's mask_mod_bits gives their order).
    const int* elem_slot;
    const unsigned* elem_bits;
};

// The attention problem, shared by every kernel of both directions.
struct AttnArgs {
    TensorArg q, k, v;
    const int* cu_seqlens_q;     // batch + 1 row offsets of packed sequences; null for dense batches
    const int* cu_seqlens_k;
    const int* seqused_k;        // keys batch entry (or packed sequence) b uses, clamped to its keys; null: all
    const float* alibi_slopes;   // slope of (b, h) at [b * alibi_batch_stride + h]; null: no ALiBi
    long long alibi_batch_stride;
    double softmax_scale;
    double softcap;              // 0: none
    int batch, heads, heads_k, headdim, headdim_v;
    int seqlen_q, seqlen_k;      // dense: the lengths; packed: the longest sequence (sizes the grid)
    int total_q, total_k;        // packed: rows of q and of k/v; every sequence is clamped to them
    int window_left, window_right;  // -1: unbounded; causal is window_right = 0
    int vec_loads;               // 1: every base and stride is 16-byte aligned (cp.async paths)
    BlockSparseArg sparse;       // sparse.kv_index null: no block mask
    DropoutArg dropout;          // common/dropout.cuh; read by the kernels built with dropout
    const float* sinks;          // (heads,) attention sinks, joined to each row's sum by the forwards; null: none
    ModBuffers score_buffers;    // a score_mod's buffers (common/user_calls.cuh; kernels built with one read them)
    ModBuffers mask_buffers;     // a BlockMask.from_mask_mod's buffers
    // FP8 inputs (real value = stored value x descale): q's at [b * q_descale_heads + h] (q_descale_heads
    // heads or heads_k: a query head's, or its kv head's), k's and v's at [b * heads_k + kv head]; null: 1.
    const float* q_descale;
    const float* k_descale;
    const float* v_descale;
    int q_descale_heads;
};

// The attention sink of query head h (natural-log units), -inf without sinks.
__device__ __forceinline__ float attention_sink(const AttnArgs& a, int h) {
    return a.sinks != nullptr ? a.sinks[h] : __int_as_float(0xff800000);
}

struct FwdArgs {
    AttnArgs attn;
    TensorArg out;
    RowsArg lse;                 // float for 16-bit inputs, double for float32/float64 (lse_t)
    unsigned* max_score;         // (batch, heads) images of the largest scores (common/max_score.cuh); null: none
};

struct BwdArgs {
    AttnArgs attn;
    TensorArg out, dout, dq, dk, dv;
    RowsArg lse, delta;
    RowsArg dq_accum;            // float32, rows of dq_ld floats, dq_splits buffers dq_split_stride apart
    int* dq_turns;               // [split][b][h][q_tile] counters of the ordered sum (deterministic)
    long long dq_split_stride;
    long long turns_split_stride;
    int dq_ld, dq_splits;
    int deterministic;
    int tile_group;              // sm90: (batch entry, kv head) pairs whose key tiles launch in turn (scheduler.cuh)
    int tail_pairs;              // sm90: the last pairs, whose key tiles launch in turn after the others' (0: tile_group)
    ModGrads score_grads;        // accumulators of the score_mod buffers' gradients (zeroed before the launch)
    void* sink_terms;            // sinks: bwd_delta's exp(sink - lse) * delta per row (lse_t, delta's layout); null: none
    int dq_in_place;             // 1 (the sm90 float32 backward): dQ's reductions add softmax_scale * dS K into dq
                                 // itself, which bwd_delta zeroes; no dQ buffers, no conversion
    int* key_order;              // sm90 under a block mask: [b][kv head][rank] the key tile launched at that rank of
                                 // the pair's tiles, written by sm90/bwd_key_order.cu; null: scheduler.cuh's order
    int2* walk_ranges;           // sm90 under a block mask: [b][kv head][key tile][head of the GQA group] the walk's
                                 // (first, count) entries of the block mask's query list (query_tiles' range),
                                 // written by sm90/bwd_key_order.cu; null: no block mask
    int* dq_claims;              // sm90 16-bit, no ordered sum, not packed: [b][h][query tile of dq_claim_rows rows] the
                                 // pair {claims, written} of common/ordered_sum.cuh's dq_claim: a tile's first
                                 // claimant stores its share into the dQ buffer, so bwd_delta does not zero the
                                 // buffers but these pairs; null: zeroed buffers, every share added
    int dq_claim_rows;
};

// The K-major forwards' pre-passes (sm90/kmajor_values.cu): v as V^T.
struct TransposeValuesArgs {
    TensorArg v;          // (batch, seqlen_k, heads_k, headdim_v), e4m3 or float32 elements
    unsigned char* vt;    // (batch, heads_k, headdim_v, keys): keys = seqlen_k rounded up to a k-step
    int batch, seqlen_k, heads_k, headdim_v, keys;
};

// ... and q or k rounded to tf32 into a contiguous copy.
struct RoundRowsArgs {
    TensorArg x;  // (batch, rows, heads, dim) float32
    float* out;   // (batch, rows, heads, dim_out), dim_out = dim rounded up to 4
    int batch, rows, heads, dim, dim_out;
};

// Attention of queries to a KV cache (kvcache/kvcache.cu). attn.q holds the queries: kvc_append reads them
// there and writes them rotated to q_rot (rotary_dim > 0), which the attention is then given as attn.q.
// attn.k and attn.v are the caches: dense (batch_cache,
// cache_len, heads_k, dim), or paged (num_pages, page_size, heads_k, dim) with batch_stride the page
// stride; attn.seqlen_k is the capacity of one batch entry (cache_len, or max_pages * page_size).
// Batch entry b attends to its first cache_seqlens[b] + seqlen_new keys.
struct KvCacheArgs {
    AttnArgs attn;
    TensorArg out;
    RowsArg lse;                 // float for 16-bit inputs, double for float32/float64
    TensorArg k_new, v_new;      // (batch, seqlen_new, heads_k, dim) appended at cache_seqlens[b]; ptr null: none
                                 // (kvc_fwd: the cache holds them already, or there are none)
    TensorArg q_rot;             // (batch, seqlen_q, heads, headdim): where the append kernel writes rotated q
    const void* rotary_cos;      // (rotary_rows, rotary_dim / 2) contiguous, of the inputs' dtype
    const void* rotary_sin;
    const int* cache_seqlens;    // (batch,); null: cache_seqlens_value for every entry
    const int* cache_batch_idx;  // dense caches: (batch,) cache entry of each batch entry; null: b
    const int* block_table;      // paged caches: (batch, max_pages) rows block_table_stride apart; null: dense
    const int* cache_leftpad;    // dense caches: (batch,) position of each entry's first key; null: 0
    float* part_out;             // num_splits > 1: [split][b][i][h][kHeadDim] partial outputs (normalized; rows of the head-dim bucket)
    float* part_lse;             // num_splits > 1: [split][b][h][i] their natural-log lse
    int* seqused_k;              // kvc_lengths: keys each batch entry uses (0 when bad)
    int* bad;                    // kvc_lengths: 1 for a batch entry whose cache_seqlens, cache_batch_idx or pages are out of range
    int* split_counters;         // num_splits > 1: [b][hk][row tile] splits done; zero before and after a launch
    unsigned* max_score;         // (batch, heads) images of the largest scores (common/max_score.cuh); null: none
    long long block_table_stride;
    int cache_seqlens_value;
    int seqlen_new;
    int page_size;               // paged: rows per page; dense: 0
    int cache_entries;           // paged: num_pages; dense: batch_cache
    int num_splits;
    int rotary_dim;              // 0: no rotary embedding
    int rotary_rows;
    int rotary_interleaved;      // 1: pairs (2c, 2c + 1); 0: pairs (c, c + rotary_dim / 2)
    int rotary_q_at_row;         // 1 (causal or local): query i rotates at cache_seqlens + i; 0: at cache_seqlens
};

}  // namespace cupyflash
