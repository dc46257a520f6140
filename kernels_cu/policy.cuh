// Sequences and masks, for every kernel: where a batch entry's rows are, which tiles a CTA visits and
// which of those need the element mask, the element mask itself, and the score modifications (softcap,
// ALiBi). cupyflash/_policy.py states the same rules for the NumPy twin and the host.
//
// The mask. Rows i and keys j count from the start of their sequence. Query i sees key j iff
//     i < seqlen_q, j < seqlen_k, lo <= j - i <= hi, and the block layout (if any) sets block (i, j),
// where the window (left, right) of FlashAttention-2 is aligned to the bottom-right corner:
//     lo = seqlen_k - seqlen_q - left,  hi = seqlen_k - seqlen_q + right,
// an unbounded side (-1) excluding nothing, and causal being right = 0. For seqlen_q = 3, seqlen_k = 5
// and window (1, 0) (x = visible):
//     query 0: . x x . .      query 1: . . x x .      query 2: . . . x x
// A tile of rows x keys is "full" when every pair of its real rows and keys passes the window and
// bound tests; only tiles that are not full, or that a block-sparse list marks partial, evaluate the
// element mask. Tiles that no pair can see are never visited.
#pragma once
#include "mma.cuh"
#include "params.cuh"
#include "softmax.cuh"

namespace cupyflash {

__device__ __forceinline__ int clamp_int(int x, int lo, int hi) { return min(max(x, lo), hi); }
__device__ __forceinline__ int ceil_div(int a, int b) { return (a + b - 1) / b; }

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
            // A KV cache's entries use a prefix of its capacity (clamped into it, so no access leaves it).
            seqlen_k = a.seqused_k != nullptr ? clamp_int(a.seqused_k[b], 0, a.seqlen_k) : a.seqlen_k;
        }
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

// The window and sequence bounds of one batch entry (the same for all its heads).
struct Mask {
    int seqlen_q, seqlen_k;
    int lo, hi;  // visible iff lo <= j - i <= hi

    Mask() = default;
    __device__ __forceinline__ Mask(const AttnArgs& a, const Sequence& s) : seqlen_q(s.seqlen_q), seqlen_k(s.seqlen_k) {
        const long long offset = static_cast<long long>(seqlen_k) - seqlen_q;
        // Real pairs have -seqlen_q < j - i < seqlen_k, so clamping into [-seqlen_q, seqlen_k] keeps
        // every visible pair visible, makes an unbounded side an ordinary bound, and keeps lo and hi
        // in 32 bits. For left, right >= 0 (or -1) this gives lo <= hi.
        lo = a.window_left < 0 ? -seqlen_q : static_cast<int>(max(offset - a.window_left, -static_cast<long long>(seqlen_q)));
        hi = a.window_right < 0 ? seqlen_k : static_cast<int>(min(offset + a.window_right, static_cast<long long>(seqlen_k)));
    }

    // Window and bounds test of one pair (the block layout is BlockLayout's).
    __device__ __forceinline__ bool visible(int i, int j) const {
        const int d = j - i;
        return i < seqlen_q && j < seqlen_k && d >= lo && d <= hi;
    }

    // The keys query i sees, as offsets from n0: [*begin, *end). Masked tiles test each element against
    // its row's interval: two compares instead of the four of visible(). Rows past seqlen_q get their
    // window too: the forward never stores them. (i + hi + 1 could pass 2^31, so the bound is compared
    // in its place.)
    __device__ __forceinline__ void keys_of(int i, int n0, int* begin, int* end) const {
        *begin = max(i + lo, 0) - n0;
        *end = (hi >= seqlen_k - i ? seqlen_k : i + hi + 1) - n0;
    }

    // The queries that see key j, as offsets from m0: [*begin, *end) (empty past the last key).
    __device__ __forceinline__ void queries_of(int j, int m0, int* begin, int* end) const {
        *begin = max(j - hi, 0) - m0;
        *end = j >= seqlen_k ? *begin : (lo <= j + 1 - seqlen_q ? seqlen_q : j - lo + 1) - m0;
    }

    // Keys [*begin, *end) seen by some real row of [m0, m0 + rows) (*end <= *begin: none). Each row's
    // window is an interval sliding by one per row, so their union is one interval.
    __device__ __forceinline__ void key_range(int m0, int rows, int* begin, int* end) const {
        const int m1 = min(m0 + rows, seqlen_q);
        *begin = max(0, m0 + lo);
        *end = static_cast<int>(min(static_cast<long long>(seqlen_k), static_cast<long long>(m1) + hi));
    }

    // Rows [*begin, *end) that see some real key of [n0, n0 + cols).
    __device__ __forceinline__ void query_range(int n0, int cols, int* begin, int* end) const {
        const int n1 = min(n0 + cols, seqlen_k);
        *begin = max(0, n0 - hi);
        *end = static_cast<int>(min(static_cast<long long>(seqlen_q), static_cast<long long>(n1) - lo));
    }

    // Every real row of [m0, m0 + rows) sees every key of [n0, n0 + cols), all of them real. Rows past
    // seqlen_q are never stored (forward) or carry no probability (backward), so they need no mask.
    __device__ __forceinline__ bool tile_is_full(int m0, int rows, int n0, int cols) const {
        const int m1 = min(m0 + rows, seqlen_q);
        return n0 + cols <= seqlen_k && n0 + cols - 1 - m0 <= hi && n0 - (m1 - 1) >= lo;
    }
};

// The block layout of one (batch, head) of a block-sparse problem, and its tile lists. Methods take the
// arguments again rather than keeping a pointer into the kernel's parameter space.
struct BlockLayout {
    const unsigned char* cells;  // null: no block mask
    long long slice;

    BlockLayout() = default;
    __device__ __forceinline__ BlockLayout(const AttnArgs& a, long long b, long long h) {
        const BlockSparseArg& s = a.sparse;
        slice = b * s.slice_batch_stride + h * s.slice_head_stride;
        cells = s.kv_index != nullptr ? s.layout + slice * s.layout_rows * s.layout_cols : nullptr;
    }

    // Block (i / block_q, j / block_k) is set; for pairs that pass Mask::visible (so i < seqlen_q and
    // j < seqlen_k, inside the layout).
    __device__ __forceinline__ bool allows(const AttnArgs& a, int i, int j) const {
        return cells[static_cast<long long>(i / a.sparse.block_q) * a.sparse.layout_cols + j / a.sparse.block_k] != 0;
    }

    // Bits c < width (<= 64) set iff the layout sets the cell of query `query` and key n0 + c; 0 for a
    // query past the layout. The tile's keys span few blocks, so this reads few cells and divides once.
    __device__ __forceinline__ unsigned long long key_bits(const AttnArgs& a, int query, int n0, int width) const {
        const BlockSparseArg& sp = a.sparse;
        const int row = query / sp.block_q;
        if (row >= sp.layout_rows) return 0;
        return span_bits(cells + static_cast<long long>(row) * sp.layout_cols, 1, sp.layout_cols, n0, width, sp.block_k);
    }

    // Bits c < width (<= 64) set iff the layout sets the cell of query m0 + c and key `key`; 0 for a key
    // past the layout.
    __device__ __forceinline__ unsigned long long query_bits(const AttnArgs& a, int key, int m0, int width) const {
        const BlockSparseArg& sp = a.sparse;
        const int col = key / sp.block_k;
        if (col >= sp.layout_cols) return 0;
        return span_bits(cells + col, sp.layout_cols, sp.layout_rows, m0, width, sp.block_q);
    }

    // Bits c < width of positions start + c along one axis of the layout, whose block b has its cell at
    // cells[b * stride] (b < blocks).
    __device__ __forceinline__ static unsigned long long span_bits(const unsigned char* cells, int stride, int blocks,
                                                                   int start, int width, int block) {
        unsigned long long bits = 0;
        const long long end = static_cast<long long>(start) + width;
        for (int b = start / block; b < blocks && static_cast<long long>(b) * block < end; ++b) {
            if (cells[static_cast<long long>(b) * stride] == 0) continue;
            const int c0 = static_cast<int>(max(static_cast<long long>(b) * block, static_cast<long long>(start)) - start);
            const int c1 = static_cast<int>(min(static_cast<long long>(b + 1) * block, end) - start);
            bits |= (c1 - c0 >= 64 ? ~0ull : (1ull << (c1 - c0)) - 1) << c0;
        }
        return bits;
    }

    // Key tiles listed for query tile qt, and their count.
    __device__ __forceinline__ const int* kv_list(const AttnArgs& a, int qt, int* count) const {
        const long long row = slice * a.sparse.q_tiles + qt;
        *count = a.sparse.kv_count[row];
        return a.sparse.kv_index + row * a.sparse.k_tiles;
    }

    // Query tiles listed for key tile kt, and their count.
    __device__ __forceinline__ const int* q_list(const AttnArgs& a, int kt, int* count) const {
        const long long row = slice * a.sparse.k_tiles + kt;
        *count = a.sparse.q_count[row];
        return a.sparse.q_index + row * a.sparse.q_tiles;
    }
};

// Traps when a kernel is given block-sparse lists built for another tile shape.
__device__ __forceinline__ void require_sparse_tiles(const AttnArgs& a, int tile_q, int tile_k) {
    if (a.sparse.kv_index != nullptr && (a.sparse.tile_q != tile_q || a.sparse.tile_k != tile_k)) __trap();
}

// A tile-list entry is tile * 2 + partial.
__device__ __forceinline__ int entry_tile(int entry) { return entry >> 1; }
__device__ __forceinline__ bool entry_partial(int entry) { return (entry & 1) != 0; }

// First index of the ascending list[0, n) whose entry is >= value. All threads of a CTA search the same
// list, so every load is a broadcast.
__device__ __forceinline__ int lower_bound(const int* list, int n, int value) {
    int first = 0;
    while (n > 0) {
        const int half = n / 2;
        if (__ldg(list + first + half) < value) {
            first += half + 1;
            n -= half + 1;
        } else {
            n = half;
        }
    }
    return first;
}

// The tiles a CTA visits along one axis, ascending: tiles [first, first + count) of a dense problem, or
// entries [first, first + count) of a block-sparse list.
struct TileRange {
    const int* list;  // null: dense
    int first;
    int count;

    __device__ __forceinline__ int entry(int it) const { return list != nullptr ? __ldg(list + first + it) : 2 * (first + it); }
};

// The tiles of `tile` rows or keys that meet [begin, end), restricted to `list` (of length n) when given.
__device__ __forceinline__ TileRange tile_range(int begin, int end, int tile, const int* list, int n) {
    const int t0 = begin / tile;
    const int t1 = end > begin ? ceil_div(end, tile) : t0;
    if (list == nullptr) return {nullptr, t0, t1 - t0};
    const int a = lower_bound(list, n, 2 * t0);
    return {list, a, lower_bound(list, n, 2 * t1) - a};
}

// Key tiles of kTileK keys that query tile qt (rows qt * kTileQ ...) visits.
template <int kTileQ, int kTileK>
__device__ __forceinline__ TileRange key_tiles(const AttnArgs& a, const Mask& mask, const BlockLayout& layout, int qt) {
    int begin, end;
    mask.key_range(qt * kTileQ, kTileQ, &begin, &end);
    int n = 0;
    const int* list = layout.cells != nullptr ? layout.kv_list(a, qt, &n) : nullptr;
    return tile_range(begin, end, kTileK, list, n);
}

// Query tiles of kTileQ rows that key tile kt (keys kt * kTileK ...) visits.
template <int kTileQ, int kTileK>
__device__ __forceinline__ TileRange query_tiles(const AttnArgs& a, const Mask& mask, const BlockLayout& layout, int kt) {
    int begin, end;
    mask.query_range(kt * kTileK, kTileK, &begin, &end);
    int n = 0;
    const int* list = layout.cells != nullptr ? layout.q_list(a, kt, &n) : nullptr;
    return tile_range(begin, end, kTileQ, list, n);
}

// Score modifications of FlashAttention-2, in its order: the scaled score s = softmax_scale * q . k
// becomes softcap * tanh(s / softcap) (Gemma 2), then gets the ALiBi bias -slope * |i + seqlen_k -
// seqlen_q - j| added, then the mask. The backward needs ds_mod/ds = 1 - tanh^2 of the softcap.
struct ScoreModArgs {
    float slope;  // ALiBi slope of this (batch, head)
    int offset;   // seqlen_k - seqlen_q
    bool softcap;
    bool alibi;

    ScoreModArgs() = default;
    __device__ __forceinline__ ScoreModArgs(const AttnArgs& a, const Sequence& s, long long b, long long h)
        : slope(a.alibi_slopes != nullptr ? a.alibi_slopes[b * a.alibi_batch_stride + h] : 0.0f),
          offset(s.seqlen_k - s.seqlen_q), softcap(a.softcap != 0.0), alibi(a.alibi_slopes != nullptr) {}

    // |i + seqlen_k - seqlen_q - j|, exact in float up to 2^24.
    __device__ __forceinline__ int distance(int i, int j) const { return abs(i + offset - j); }
};

// The tensor-core path works in base 2 with the scale folded in (tc_softmax.cuh): from the raw product
// x = q . k it computes s2 = LOG2E * (modified score).
struct Log2Scores {
    float scale_log2;  // softmax_scale * LOG2E
    float cap_in;      // softmax_scale / softcap
    float cap_out;     // softcap * LOG2E
    float bias_log2;   // -slope * LOG2E
    ScoreModArgs mod;

    Log2Scores() = default;
    __device__ __forceinline__ Log2Scores(const AttnArgs& a, const Sequence& s, long long b, long long h)
        : mod(a, s, b, h) {
        constexpr float kLog2e = 1.4426950408889634f;
        scale_log2 = static_cast<float>(a.softmax_scale) * kLog2e;
        cap_in = mod.softcap ? static_cast<float>(a.softmax_scale / a.softcap) : 0.0f;
        cap_out = static_cast<float>(a.softcap) * kLog2e;
        bias_log2 = -mod.slope * kLog2e;
    }

    // tanh(y) = 1 - 2 / (2^(2 LOG2E y) + 1): one ex2 and one fast division, about 1e-7 absolute error,
    // so the score softcap * tanh is off by about 1e-7 * softcap, far below its rounding to 16 bits
    // (tanh.approx's 2^-11 relative error, times the softcap, would not be). Saturates to +-1 through
    // ex2 = inf (the division gives 0) and ex2 = 0.
    __device__ __forceinline__ static float fast_tanh(float y) {
        return 1.0f - __fdividef(2.0f, fast_exp2(y * (2.0f * 1.4426950408889634f)) + 1.0f);
    }

    // s2 of pair (i, j); *tanh_out receives tanh(s / softcap) (0 without a softcap) for the backward's
    // 1 - tanh^2.
    __device__ __forceinline__ float modified(float x, int i, int j, float* tanh_out) const {
        float s2;
        float t = 0.0f;
        if (mod.softcap) {
            t = fast_tanh(x * cap_in);
            s2 = t * cap_out;
        } else {
            s2 = x * scale_log2;
        }
        if (mod.alibi) s2 += bias_log2 * static_cast<float>(mod.distance(i, j));
        *tanh_out = t;
        return s2;
    }
};

// The general path works in natural-log units with the scaled score rounded once (softmax.cuh). Every
// step is rounded on its own (the _rn operations), so the forward and backward kernels, compiled
// separately, compute bitwise the same modified score.
template <typename Acc>
struct NaturalScores {
    Acc scale;
    Acc softcap;
    Acc slope;
    ScoreModArgs mod;

    __device__ __forceinline__ NaturalScores(const AttnArgs& a, const Sequence& s, long long b, long long h)
        : scale(static_cast<Acc>(a.softmax_scale)), softcap(static_cast<Acc>(a.softcap)), mod(a, s, b, h) {
        slope = static_cast<Acc>(mod.slope);
    }

    // The modified score of pair (i, j) from the raw product x; *grad receives its derivative with
    // respect to the scaled score (1 - tanh^2 under a softcap, else 1).
    __device__ __forceinline__ Acc modified(Acc x, int i, int j, Acc* grad) const {
        Acc s = scale_score(x, scale);
        Acc g = Acc(1);
        if (mod.softcap) {
            const Acc t = tanh_acc(div_rn(s, softcap));
            s = mul_rn(softcap, t);
            g = Acc(1) - t * t;
        }
        if (mod.alibi) s = sub_rn(s, mul_rn(slope, static_cast<Acc>(mod.distance(i, j))));
        *grad = g;
        return s;
    }
};

}  // namespace cupyflash
