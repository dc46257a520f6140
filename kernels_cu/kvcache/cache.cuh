// KV caches (cupyflash.flash_attention_with_kvcache): where a batch entry's keys are, dense or paged, and
// whether its values are in range. The one place that maps a position of an entry to a cache row, for
// the append, decode and lengths kernels (kvcache/kvcache.cu) and the MLA decode kernels (mla.cu,
// mla_sm90.cu).
#pragma once
#include "common/params.cuh"

namespace cupyflash {

// The pages of batch entry b of a paged cache: position pos is row row_in_page(pos) of page page(pos) =
// block_table[b][index(pos)]. Page sizes that are powers of two split a position with a shift and a
// mask, others with a division.
struct PageTable {
    const int* row;  // the entry's row of block_table; null: a dense cache
    int page_size;
    int shift;       // log2(page_size) for a power of two, else -1
    int pages;       // pages in the cache

    __device__ __forceinline__ PageTable(const KvCacheArgs& c, int b)
        : row(c.block_table != nullptr ? c.block_table + b * c.block_table_stride : nullptr),
          page_size(c.page_size),
          shift(row != nullptr && (c.page_size & (c.page_size - 1)) == 0 ? __ffs(c.page_size) - 1 : -1),
          pages(c.cache_entries) {}

    __device__ __forceinline__ int index(int pos) const { return shift >= 0 ? pos >> shift : pos / page_size; }
    __device__ __forceinline__ int row_in_page(int pos) const {
        return shift >= 0 ? pos & (page_size - 1) : pos % page_size;
    }
    __device__ __forceinline__ int page(int pos) const { return row[index(pos)]; }
    // A page the table names is in the cache. Out-of-range pages are read as page 0 and never written,
    // and make the entry's results NaN.
    __device__ __forceinline__ bool valid(int page) const {
        return static_cast<unsigned>(page) < static_cast<unsigned>(pages);
    }
};

// Where batch entry b's keys are, and whether its values are in range.
struct CacheEntry {
    int keys;      // cache_seqlens[b] + seqlen_new when in range, else 0: the end of the entry's keys
    int cached;    // cache_seqlens[b]
    int first;     // cache_leftpad[b] when in range (left-padded dense caches), else 0: their start
    int entry;     // dense: the cache entry of b
    bool bad;

    __device__ __forceinline__ CacheEntry(const KvCacheArgs& c, int b) {
        cached = c.cache_seqlens != nullptr ? c.cache_seqlens[b] : c.cache_seqlens_value;
        const long long total = static_cast<long long>(cached) + c.seqlen_new;
        bad = cached < 0 || total > c.attn.seqlen_k;
        entry = b;
        if (c.block_table == nullptr && c.cache_batch_idx != nullptr) {
            entry = c.cache_batch_idx[b];
            bad = bad || entry < 0 || entry >= c.cache_entries;
        }
        first = c.cache_leftpad != nullptr && c.block_table == nullptr ? c.cache_leftpad[b] : 0;  // (dense caches only)
        bad = bad || first < 0 || first > cached;
        keys = bad ? 0 : static_cast<int>(total);
        first = bad ? 0 : first;
    }

    // Element offset of cached row `pos` (< keys) of kv head hk in a cache tensor; *bad_page is set
    // (and page 0 read) when the block table names a page outside the cache.
    __device__ __forceinline__ long long row_offset(const KvCacheArgs& c, const TensorArg& t, int b, int pos, int hk,
                                                    bool* bad_page) const {
        long long page, row;
        const PageTable pages(c, b);
        if (pages.row != nullptr) {
            page = pages.page(pos);
            row = pages.row_in_page(pos);
            if (!pages.valid(static_cast<int>(page))) {
                *bad_page = true;
                page = 0;
            }
        } else {
            page = entry;
            row = pos;
        }
        return page * t.batch_stride + row * t.row_stride + hk * t.head_stride;
    }
};

}  // namespace cupyflash
