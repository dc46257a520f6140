// The mask, for every kernel: which pairs of a batch entry are visible, which tiles a CTA visits and
// which of those need the element mask. cupyflash/_policy.py states the same rules for the NumPy twin
// and the host; the score modifications are score_mod.cuh's, and the loops that apply both to a tile
// of scores live with each accumulator layout (fragment/scores.cuh; the general kernels' inline, through
// pair_visible below).
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
#include "common/math.cuh"
#include "common/params.cuh"
#include "common/sequence.cuh"

namespace cupyflash {

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

    // No causal mask or window: every query sees every key (lo and hi are the clamps of unbounded sides).
    __device__ __forceinline__ bool unbounded() const { return lo == -seqlen_q && hi == seqlen_k; }

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

    // Which ends of the rows' key intervals (keys_of) fall inside keys [n0, n0 + cols) for some real row
    // of [m0, m0 + rows): kCutsStart (a row's first key is past n0: a window's left side), kCutsEnd (a
    // row's last key is before the tile's last, or the sequence ends inside the tile: the causal
    // diagonal, a window's right side). Starts and ends grow with the row, so the last real row has the
    // latest start and the first row the earliest end. 0: the tile is full (tile_is_full).
    static constexpr int kCutsStart = 1, kCutsEnd = 2, kCutsBoth = 3;
    __device__ __forceinline__ int key_cuts(int m0, int rows, int n0, int cols) const {
        const int m1 = min(m0 + rows, seqlen_q);
        const bool start = n0 - (m1 - 1) < lo;
        const bool end = n0 + cols > seqlen_k || n0 + cols - 1 - m0 > hi;
        return (start ? kCutsStart : 0) | (end ? kCutsEnd : 0);
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

    // Whether every kernel tile lies inside one block (block sides multiples of the tile's, and tiles
    // start at multiples of theirs): a tile the lists visit then has its one block set, so its layout
    // bits are all ones, and its partial tiles are a mask_mod's partial blocks, masked pair by pair by
    // the function (or its bits). The forwards' mask_rows then skips key_bits, whose byte loads, a loop
    // of them per row and 64 keys, cost each partial tile four dependent trips to memory.
    __device__ __forceinline__ static bool tiles_in_blocks(const AttnArgs& a) {
        const BlockSparseArg& s = a.sparse;
        return s.block_q % s.tile_q == 0 && s.block_k % s.tile_k == 0;
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

// Whether pair (query i, key j) of a tile is visible, one element at a time (the SIMT kernels of
// general/): every pair of a full tile is (full: not partial and Mask::tile_is_full); otherwise the
// window and bounds test and, where a block-sparse list marks the tile partial, the block layout.
__device__ __forceinline__ bool pair_visible(const AttnArgs& a, const Mask& mask, const BlockLayout& layout, int i,
                                             int j, bool full, bool partial) {
    return full || (mask.visible(i, j) && (!partial || layout.allows(a, i, j)));
}

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

// Key tiles of kTileK keys that rows [m0, m0 + rows) visit (m0 may be negative: rows before the
// sequence see nothing), with no block mask.
template <int kTileK>
__device__ __forceinline__ TileRange key_tiles_of_rows(const Mask& mask, int m0, int rows) {
    int begin, end;
    mask.key_range(m0, rows, &begin, &end);
    return tile_range(begin, end, kTileK, nullptr, 0);
}

// Query tiles of tile_q rows that key tile kt (keys kt * tile_k ...) visits.
__device__ __forceinline__ TileRange query_tiles(const AttnArgs& a, const Mask& mask, const BlockLayout& layout, int kt,
                                                 int tile_q, int tile_k) {
    int begin, end;
    mask.query_range(kt * tile_k, tile_k, &begin, &end);
    int n = 0;
    const int* list = layout.cells != nullptr ? layout.q_list(a, kt, &n) : nullptr;
    return tile_range(begin, end, tile_q, list, n);
}

// The same for the kernels' compile-time tiles.
template <int kTileQ, int kTileK>
__device__ __forceinline__ TileRange query_tiles(const AttnArgs& a, const Mask& mask, const BlockLayout& layout, int kt) {
    return query_tiles(a, mask, layout, kt, kTileQ, kTileK);
}

}  // namespace cupyflash
