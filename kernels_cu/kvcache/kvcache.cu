// Attention of queries to a KV cache (cupyflash.flash_attention_with_kvcache): the inference kernels.
//
//   kvc_append   writes the new keys and values of every batch entry into its cache at cache_seqlens[b]
//                (dense or paged), with the rotary embedding applied to them and, into q_rot, to the
//                queries; every dtype. Without rotary the decode kernel appends itself.
//   kvc_fwd      the decode kernel (float16/bfloat16, sm_80+): one CTA per (16 query rows, split of the
//                keys, kv head, batch entry). Its rows are the (query, query head) pairs of the kv
//                head's GQA group, so each K/V byte is read once for the whole group. Its four warps
//                take 16 keys each of every 64-key tile, each with its own online softmax, and merge
//                their states at the end; the tiles stream through cp.async stages, one page lookup per
//                cached row, so a paged cache of any page size is the same loop. Given k_new, the
//                tiles read the new keys from it and the CTAs write them into the cache. With
//                num_splits > 1 each CTA writes a float32 partial output and its lse, and the last
//                split of a row tile to finish merges them: out = sum_s exp(lse_s - lse) out_s,
//                lse = ln sum_s exp(lse_s).
//   kvc_fwd_fp8  the same kernel over e4m3 caches (sm_90a): q, the caches and the new tokens e4m3; each
//                stage's bytes converted into a float16 K/V tile for the products, the scores times
//                q_descale * k_descale, the output times v_descale, written in out_dtype.
//   kvc_lengths  the general path's per-entry key counts (seqused_k) and bad flags; kvc_poison turns
//                the rows of bad entries into NaN afterwards.
//
// Out-of-range values never take an access outside the caches: a batch entry whose cache_seqlens is
// negative or leaves no room for its new keys, or whose cache_batch_idx is not an entry of the cache,
// reads and writes none of it; a page index outside the cache, among the pages an entry uses, is read
// as page 0 and not written. Such an entry's output rows and lse are NaN (cupyflash/_api.py).
#include "common/dtypes.cuh"
#include "kvcache/cache.cuh"
#include "kvcache/split_merge.cuh"
#include "common/launch.cuh"
#include "common/mask.cuh"
#include "common/max_score.cuh"
#include "common/params.cuh"
#include "common/reduce.cuh"
#include "common/score_mod.cuh"
#include "common/sequence.cuh"
#include "fragment/operand.cuh"
#include "fragment/scores.cuh"
#include "fragment/softmax.cuh"
#include "sm80/mma.cuh"
#include "sm80/tile.cuh"

namespace cupyflash {

// ------------------------------------------------------------------------------------------------
// Append (and rotary).

// A double rounded once to T (to nearest even).
template <typename T> __device__ __forceinline__ T round_double(double x) { return static_cast<T>(x); }
template <> __device__ __forceinline__ __half round_double<__half>(double x) { return __double2half(x); }
template <> __device__ __forceinline__ __nv_bfloat16 round_double<__nv_bfloat16>(double x) { return __double2bfloat16(x); }

// Element c of row x (headdim columns) rotated at angle row cs/sn (rotary_dim / 2 entries): pairs
// (2i, 2i + 1) when interleaved, else (i, i + rotary_dim / 2); (a, b) -> (a cos - b sin, a sin + b cos).
// Columns from rotary_dim on are copied. Computed in double and rounded once to T, as the float64
// reference does (float32 arithmetic would round twice and miss float32 results by up to an ulp); the
// kernel is a small share of a call.
template <typename T>
__device__ __forceinline__ T rotated(const T* x, int c, const T* cs, const T* sn, int rotary_dim, bool interleaved) {
    if (c >= rotary_dim) return x[c];
    const int half = rotary_dim / 2;
    const int i = interleaved ? c / 2 : c % half;
    const bool first = interleaved ? c % 2 == 0 : c < half;
    const int partner = interleaved ? c ^ 1 : (first ? c + half : c - half);
    const double cos_i = to_acc(cs[i]), sin_i = to_acc(sn[i]);
    const double self = to_acc(x[c]), other = to_acc(x[partner]);
    const double value = first ? __dsub_rn(__dmul_rn(self, cos_i), __dmul_rn(other, sin_i))
                               : __dadd_rn(__dmul_rn(other, sin_i), __dmul_rn(self, cos_i));
    return round_double<T>(value);
}

// One CTA per (token i, batch entry b): i < seqlen_new appends new token i of b (all kv heads);
// with rotary, i < seqlen_q also writes query row i of b rotated into q_rot.
template <typename T>
__global__ void __launch_bounds__(128) kvc_append(const CUPYFLASH_GRID_CONSTANT KvCacheArgs c) {
    const AttnArgs& a = c.attn;
    const int i = blockIdx.x, b = blockIdx.y;
    const CacheEntry e(c, b);
    const T* cos_table = static_cast<const T*>(c.rotary_cos);
    const T* sin_table = static_cast<const T*>(c.rotary_sin);
    const int half = c.rotary_dim / 2;
    // Positions past the table belong to bad entries (the host checks the table covers the cache).
    auto angle_row = [&](int pos) { return static_cast<long long>(clamp_int(pos, 0, c.rotary_rows - 1)) * half; };
    if (i < c.seqlen_new && !e.bad) {
        const int pos = e.cached + i;
        bool bad_page = false;
        const long long k_at = e.row_offset(c, a.k, b, pos, 0, &bad_page);
        const long long v_at = e.row_offset(c, a.v, b, pos, 0, &bad_page);
        if (!bad_page) {  // kvc_fwd or kvc_lengths poisons the entry's rows
            const long long angles = angle_row(pos);
            for (int idx = threadIdx.x; idx < a.heads_k * a.headdim; idx += blockDim.x) {
                const int hk = idx / a.headdim, col = idx % a.headdim;
                const T* src = head_rows<const T>(c.k_new, b, i, hk);
                static_cast<T*>(a.k.ptr)[k_at + hk * a.k.head_stride + col] =
                    c.rotary_dim > 0 ? rotated(src, col, cos_table + angles, sin_table + angles, c.rotary_dim,
                                               c.rotary_interleaved != 0)
                                     : src[col];
            }
            for (int idx = threadIdx.x; idx < a.heads_k * a.headdim_v; idx += blockDim.x) {
                const int hk = idx / a.headdim_v, col = idx % a.headdim_v;
                static_cast<T*>(a.v.ptr)[v_at + hk * a.v.head_stride + col] = head_rows<const T>(c.v_new, b, i, hk)[col];
            }
        }
    }
    if (c.rotary_dim > 0 && i < a.seqlen_q) {
        const long long angles = angle_row(e.cached + (c.rotary_q_at_row ? i : 0));
        for (int idx = threadIdx.x; idx < a.heads * a.headdim; idx += blockDim.x) {
            const int h = idx / a.headdim, col = idx % a.headdim;
            head_rows<T>(c.q_rot, b, i, h)[col] = rotated(head_rows<const T>(c.attn.q, b, i, h), col, cos_table + angles,
                                                          sin_table + angles, c.rotary_dim, c.rotary_interleaved != 0);
        }
    }
}

// ------------------------------------------------------------------------------------------------
// The decode kernel.

// C: the storage type of q, the caches and the new tokens: T (float16/bfloat16), or E4m3, whose tiles
// land as bytes in stages of their own and are converted into one float16 K/V tile for the products
// (e4m3 values are exact in float16), T being the output's type.
template <typename T, int kHeadDim_, typename C = T>
struct KvcTraits {
    static constexpr int kHeadDim = kHeadDim_;  // bucket covering headdim and headdim_v
    static constexpr int kPartCols = kHeadDim;  // floats between two partial output rows (merge_splits)
    static constexpr bool kFp8 = sizeof(C) == 1;
    static constexpr int kWarps = 4;
    static constexpr int kThreads = 32 * kWarps;
    static constexpr int kRows = 16;            // (query, head) rows per CTA: one mma.sync m-tile
    static constexpr int kBlockN = 16 * kWarps; // keys per stage, 16 per warp
    static constexpr int kLd = kHeadDim + 8;    // padded shared row of 16-bit elements (sm80/tile.cuh)
    static constexpr int kLd8 = kHeadDim + 16;  // padded row of an e4m3 stage (bytes)
    static constexpr int kTileBytes = 2 * kBlockN * kLd * 2;  // K and V of 16-bit elements
    static constexpr int kStageBytes = kFp8 ? 2 * kBlockN * kLd8 : kTileBytes;
    // Stages in flight: decoding is bound by DRAM bandwidth, and with two CTAs per SM up to head dim
    // 128 (one at 256) these keep 100-200 KB of K/V requests in flight per SM, several times the
    // bandwidth-latency product (4.24 TB/s * ~1 us / 132 SMs = 32 KB). e4m3 stages hold half the bytes:
    // more of them keep as many in flight.
    static constexpr int kStages = kFp8 ? (kHeadDim <= 64 ? 6 : kHeadDim <= 128 ? 4 : 2)
                                        : (kHeadDim <= 64 ? 4 : kHeadDim <= 128 ? 3 : 2);
    static constexpr int kQBytes = kRows * kLd * 2;
    static constexpr int kSmemBytes = kQBytes + (kFp8 ? kTileBytes : 0) + kStages * kStageBytes;
    // After the loop the tiles (and stages) hold each warp's float32 output rows and row statistics
    // (the maximum, the sum and the largest score).
    static constexpr int kMergeBytes = kWarps * kRows * (kHeadDim + 3) * 4;
    static_assert(kMergeBytes <= kSmemBytes - kQBytes, "the warps' states must fit the tiles");
    static_assert(kHeadDim % 16 == 0 && kHeadDim <= 256, "head-dim buckets are multiples of 16 up to 256");
};

// Two e4m3 values (the low byte first) as a float16 pair, exactly.
__device__ __forceinline__ unsigned e4m3x2_to_half2(unsigned short x) {
    unsigned r;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(r) : "h"(x));
    return r;
}

// An element of q as the products' type M (e4m3 bytes converted exactly to float16).
template <typename M, typename C>
__device__ __forceinline__ M product_element(C x) {
    if constexpr (sizeof(C) == 1) {
        const unsigned h2 = e4m3x2_to_half2(x.bits);
        return *reinterpret_cast<const M*>(&h2);
    } else {
        return x;
    }
}

// ScoreFn: a score_mod's generated code (common/user_calls.cuh), or NoUserScore; per row, with the
// row's head (UserLog2ScoresByRow). Caches have no block mask, so no mask_mod (MaskFn is NoUserMask).
// kMaxScore (return_max_score): the warps also keep each row's largest score, and each row raises its
// (batch entry, head) maximum after the merge (a split's rows raise it with their keys' largest).
// C: T, or E4m3 for an e4m3 cache (kvc_fwd_fp8: q and the new tokens e4m3 too; the products on float16,
// the scores times q_descale * k_descale, the output times v_descale, T the output's type).
template <typename T, typename C, int kHeadDim, bool kScoreMod, bool kMaxScore, typename ScoreFn, typename MaskFn>
__device__ __forceinline__ void decode_attention(const KvCacheArgs& c, unsigned char* smem_raw) {
    static_assert(!MaskFn::kEnabled, "caches have no block mask");
    using Tr = KvcTraits<T, kHeadDim, C>;
    constexpr bool kFp8 = Tr::kFp8;
    using M = typename SelectType<kFp8, __half, T>::type;  // the products' type
    constexpr int kBlockN = Tr::kBlockN, kLd = Tr::kLd, kStages = Tr::kStages;
    constexpr int kDSteps = kHeadDim / 16, kOTiles = kHeadDim / 8;
    constexpr int kVec = 16 / static_cast<int>(sizeof(C));  // elements of a 16-byte copy
    constexpr int kChunks = kHeadDim / kVec;
    require_dynamic_smem<Tr::kSmemBytes>();
    const AttnArgs& a = c.attn;
    M* sQ = reinterpret_cast<M*>(smem_raw);
    // 16-bit caches: kStages K and V tiles of kBlockN rows, copied into directly. e4m3: one K and V tile
    // of float16, each stage's bytes (rows of Tr::kLd8) converted into it at the top of its iteration.
    M* sK = sQ + Tr::kRows * kLd;
    M* sV = sK + (kFp8 ? 1 : kStages) * kBlockN * kLd;
    unsigned char* const stages8 = reinterpret_cast<unsigned char*>(sV + kBlockN * kLd);

    const int split = blockIdx.x % c.num_splits;
    const int row_tile = blockIdx.x / c.num_splits;
    const int hk = blockIdx.y, b = blockIdx.z;
    const int group = a.heads / a.heads_k;
    const int rows = a.seqlen_q * group;           // row r: query r / group, head hk * group + r % group
    const int r0 = row_tile * Tr::kRows;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;

    const CacheEntry entry(c, b);
    // The entry's keys are positions entry.first .. entry.keys - 1 (first > 0 only in left-padded dense
    // caches): a sequence of their own, whose masks and ALiBi count from its start. Below, a key's
    // position is the sequence's (pos + entry.first in the cache), and the dense rows start at entry.first.
    const int keys = entry.keys - entry.first, cached = entry.cached - entry.first;
    Sequence seq;
    seq.q_start = seq.k_start = 0;
    seq.seqlen_q = a.seqlen_q;
    seq.seqlen_k = keys;
    const Mask mask(a, seq);

    // The queries of the CTA's rows, the keys they see, and this split's share of those key tiles.
    const int i0 = r0 / group, i1 = min(r0 + Tr::kRows, rows) - 1;
    const int i_last = i1 / group;
    int key_begin, key_end;
    mask.key_range(i0, i_last - i0 + 1, &key_begin, &key_end);
    int tile_begin = 0, tile_end = 0;
    if (key_end > key_begin) {
        const int t0 = key_begin / kBlockN, t1 = ceil_div(key_end, kBlockN);
        const int per_split = ceil_div(t1 - t0, c.num_splits);
        tile_begin = min(t0 + split * per_split, t1);
        tile_end = min(tile_begin + per_split, t1);
    }

    // The prologue and the epilogue give each thread one row and kSpan consecutive columns of the
    // CTA's 16 x kHeadDim block, so a row's query, head and addresses are worked out once.
    constexpr int kThreadsPerRow = Tr::kThreads / Tr::kRows, kSpan = kHeadDim / kThreadsPerRow;
    static_assert(Tr::kThreads % Tr::kRows == 0 && kHeadDim % kThreadsPerRow == 0, "whole spans");
    const int span_row = threadIdx.x / kThreadsPerRow, span_col = (threadIdx.x % kThreadsPerRow) * kSpan;
    const int span_r = r0 + span_row;
    const int span_i = span_r / group, span_h = hk * group + span_r % group;  // query and head of that row

    // Each warp copies the rows of its own 16 keys of every tile, the only rows its products read, so the
    // warps need no barrier between them in the loop: each lane the same kPasses rows (row = 16 * warp +
    // lane / kChunks + pass * kRowsPerPass). Their pages are looked up one iteration before the tile is
    // issued, so the lookup's latency hides behind a tile's compute instead of delaying its copies.
    constexpr int kRowsPerPass = 32 / kChunks;
    constexpr int kPasses = 16 / kRowsPerPass;
    constexpr int kRowBytes = kFp8 ? Tr::kLd8 : kLd * 2;  // bytes between two rows of a stage
    static_assert(32 % kChunks == 0 && 16 % kRowsPerPass == 0 && kBlockN == 16 * Tr::kWarps, "whole rows per pass");
    const int my_row = 16 * warp + lane / kChunks, my_col = (lane % kChunks) * kVec;
    bool bad_page = false;
    // New keys in k_new/v_new (no rotary, so no kvc_append ran): written into the cache below.
    const bool fresh_keys = c.k_new.ptr != nullptr;
    // The cache entry (page, or dense entry) and row within it of position pos < keys.
    const C* k_base = static_cast<const C*>(a.k.ptr) + hk * a.k.head_stride;
    const C* v_base = static_cast<const C*>(a.v.ptr) + hk * a.v.head_stride;
    const int k_bytes = clamp_int(a.headdim - my_col, 0, kVec) * static_cast<int>(sizeof(C));
    const int v_bytes = clamp_int(a.headdim_v - my_col, 0, kVec) * static_cast<int>(sizeof(C));
    // Decoding is bound by the instructions that issue the copies as much as by DRAM: a dense cache
    // walks this thread's rows with pointer increments; a paged one splits positions with a shift
    // where the page size is a power of two (a division otherwise).
    const PageTable pages(c, b);
    const C* k_rows = k_base + static_cast<long long>(entry.entry) * a.k.batch_stride +
                      static_cast<long long>(entry.first + my_row) * a.k.row_stride + my_col;
    const C* v_rows = v_base + static_cast<long long>(entry.entry) * a.v.batch_stride +
                      static_cast<long long>(entry.first + my_row) * a.v.row_stride + my_col;
    const long long k_pass_step = kRowsPerPass * a.k.row_stride, v_pass_step = kRowsPerPass * a.v.row_stride;
    // Paged: the pages of this thread's rows of tile `tile` (0 past the entry's keys).
    auto lookup = [&](int tile, int (&page)[kPasses]) {
        if (pages.row == nullptr) return;
#pragma unroll
        for (int pass = 0; pass < kPasses; ++pass) {
            const int pos = tile * kBlockN + my_row + pass * kRowsPerPass;
            page[pass] = pos < keys ? pages.page(pos) : 0;
        }
    };
    // Key tile `tile` into stage `stage`: rows past the entry's keys and columns past the head dims are
    // zero-filled, so no NaN of unused cache memory can reach a product.
    auto issue = [&](int tile, int stage, const int (&page)[kPasses]) {
        // Shared addresses of this thread's chunk of its first row in the stage (kRowBytes per row).
        unsigned dk, dv;
        if constexpr (kFp8) {
            dk = smem_addr(stages8 + stage * Tr::kStageBytes + my_row * Tr::kLd8 + my_col);
            dv = dk + kBlockN * Tr::kLd8;
        } else {
            dk = smem_addr(sK + stage * kBlockN * kLd + my_row * kLd + my_col);
            dv = smem_addr(sV + stage * kBlockN * kLd + my_row * kLd + my_col);
        }
        const int pos0 = tile * kBlockN + my_row;
        // Every row of the tile a key and every chunk inside the head dims: whole-chunk copies.
        const bool whole = (tile + 1) * kBlockN <= keys && k_bytes == 16 && v_bytes == 16;
        if (fresh_keys && (tile + 1) * kBlockN > cached) {
            // The tile holds new keys: their rows come from k_new/v_new (whose pages are still checked),
            // the others from the cache.
#pragma unroll
            for (int pass = 0; pass < kPasses; ++pass) {
                const int pos = pos0 + pass * kRowsPerPass;
                const bool valid = pos < keys;
                const C* k_src = k_base;
                const C* v_src = v_base;
                int at = 0;
                if (pages.row != nullptr) {
                    at = page[pass];
                    if (!pages.valid(at)) {
                        bad_page = bad_page || valid;
                        at = 0;
                    }
                }
                if (pos >= cached) {
                    const int j = valid ? pos - cached : 0;
                    k_src = head_rows<const C>(c.k_new, b, j, hk) + my_col;
                    v_src = head_rows<const C>(c.v_new, b, j, hk) + my_col;
                } else if (pages.row != nullptr) {
                    const int row = pages.row_in_page(pos);
                    k_src = k_base + at * a.k.batch_stride + row * a.k.row_stride + my_col;
                    v_src = v_base + at * a.v.batch_stride + row * a.v.row_stride + my_col;
                } else {
                    const long long row = tile * kBlockN + pass * kRowsPerPass;
                    k_src = k_rows + row * a.k.row_stride;
                    v_src = v_rows + row * a.v.row_stride;
                }
                cp_async_16(dk + pass * kRowsPerPass * kRowBytes, valid && k_bytes ? k_src : k_base,
                            valid ? k_bytes : 0);
                cp_async_16(dv + pass * kRowsPerPass * kRowBytes, valid && v_bytes ? v_src : v_base,
                            valid ? v_bytes : 0);
            }
        } else if (pages.row == nullptr && whole) {
            const C* k_src = k_rows + static_cast<long long>(tile) * kBlockN * a.k.row_stride;
            const C* v_src = v_rows + static_cast<long long>(tile) * kBlockN * a.v.row_stride;
#pragma unroll
            for (int pass = 0; pass < kPasses; ++pass) {
                cp_async_16(dk + pass * kRowsPerPass * kRowBytes, k_src + pass * k_pass_step);
                cp_async_16(dv + pass * kRowsPerPass * kRowBytes, v_src + pass * v_pass_step);
            }
        } else if (pages.row == nullptr) {
            const C* k_src = k_rows + static_cast<long long>(tile) * kBlockN * a.k.row_stride;
            const C* v_src = v_rows + static_cast<long long>(tile) * kBlockN * a.v.row_stride;
#pragma unroll
            for (int pass = 0; pass < kPasses; ++pass) {
                const bool valid = pos0 + pass * kRowsPerPass < keys;
                cp_async_16(dk + pass * kRowsPerPass * kRowBytes, valid && k_bytes ? k_src : k_base,
                            valid ? k_bytes : 0);
                cp_async_16(dv + pass * kRowsPerPass * kRowBytes, valid && v_bytes ? v_src : v_base,
                            valid ? v_bytes : 0);
                k_src += k_pass_step;
                v_src += v_pass_step;
            }
        } else if (whole) {
#pragma unroll
            for (int pass = 0; pass < kPasses; ++pass) {
                const int pos = pos0 + pass * kRowsPerPass;
                int at = page[pass];
                if (!pages.valid(at)) {
                    bad_page = true;
                    at = 0;
                }
                const int row = pages.row_in_page(pos);
                cp_async_16(dk + pass * kRowsPerPass * kRowBytes,
                            k_base + at * a.k.batch_stride + row * a.k.row_stride + my_col);
                cp_async_16(dv + pass * kRowsPerPass * kRowBytes,
                            v_base + at * a.v.batch_stride + row * a.v.row_stride + my_col);
            }
        } else {
#pragma unroll
            for (int pass = 0; pass < kPasses; ++pass) {
                const int pos = pos0 + pass * kRowsPerPass;
                const bool valid = pos < keys;
                int at = page[pass];
                if (!pages.valid(at)) {
                    bad_page = bad_page || valid;
                    at = 0;
                }
                const int row = pages.row_in_page(pos);
                const C* k_src = k_base + at * a.k.batch_stride + row * a.k.row_stride + my_col;
                const C* v_src = v_base + at * a.v.batch_stride + row * a.v.row_stride + my_col;
                cp_async_16(dk + pass * kRowsPerPass * kRowBytes, valid && k_bytes ? k_src : k_base,
                            valid ? k_bytes : 0);
                cp_async_16(dv + pass * kRowsPerPass * kRowBytes, valid && v_bytes ? v_src : v_base,
                            valid ? v_bytes : 0);
            }
        }
    };

    // The prologue's page lookups all go out before its first copy (one round trip for them, not one per
    // stage), and the Q rows are loaded while the first tiles are in flight.
    int next_page[kPasses];
    {
        int first_pages[kStages - 1][kPasses];
#pragma unroll
        for (int s = 0; s < kStages - 1; ++s) {
            if (tile_begin + s < tile_end) lookup(tile_begin + s, first_pages[s]);
        }
#pragma unroll
        for (int s = 0; s < kStages - 1; ++s) {
            if (tile_begin + s < tile_end) issue(tile_begin + s, s, first_pages[s]);
            cp_async_commit();
        }
    }
    if (tile_begin + kStages - 1 < tile_end) lookup(tile_begin + kStages - 1, next_page);
    // Q rows (zero past the last row), staged through shared memory into A fragments.
    {
        const C* src = span_r < rows ? head_rows<const C>(a.q, b, span_i, span_h) : nullptr;
#pragma unroll
        for (int k = 0; k < kSpan; ++k) {
            const int col = span_col + k;
            sQ[span_row * kLd + col] = src != nullptr && col < a.headdim ? product_element<M>(src[col]) : from_acc<M>(0.0f);
        }
    }

    __syncthreads();  // sQ

    // Q's A fragments stay in registers up to head dim 128; at 256 their 64 registers beside the 128 of
    // the output would spill, so each tile re-reads them from shared memory (sQ is never overwritten).
    constexpr bool kQInRegs = kHeadDim <= 128;
    unsigned q_frag[kQInRegs ? kDSteps : 1][4];
    if constexpr (kQInRegs) {
#pragma unroll
        for (int kk = 0; kk < kDSteps; ++kk) load_a_frag<kLd>(q_frag[kk], sQ, 0, 16 * kk);
    }

    // Per-row score modifications: a row's query and head.
    float bias_log2[2] = {0.0f, 0.0f};
    int query[2];
    int head[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int r = r0 + g + 8 * half;
        query[half] = r / group;
        const int h = hk * group + r % group;
        head[half] = h;
        if (kScoreMod && a.alibi_slopes != nullptr) {
            bias_log2[half] = -alibi_slope(a, b, min(h, a.heads - 1)) * kLog2eF;
        }
    }
    const auto query_of = [&](int, int r) { return query[r]; };
    const BlockLayout no_layout{};  // caches have no block mask
    // e4m3: each row's q_descale * k_descale, by which its raw products are multiplied before the scale
    // (NaN where the factor with softmax_scale is not positive and finite: CuPy's descales are not read on
    // the host, and such a head's rows come out NaN, as in the Hopper FP8 forward), and v_descale, by
    // which the output is (NaN likewise where it is not positive and finite).
    float qk_descale[2] = {1.0f, 1.0f};
    float v_descale = 1.0f;
    if constexpr (kFp8) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            float x = 1.0f;
            const int h = min(head[half], a.heads - 1);
            if (a.q_descale != nullptr) x *= a.q_descale[b * a.q_descale_heads + (a.q_descale_heads == a.heads ? h : hk)];
            if (a.k_descale != nullptr) x *= a.k_descale[b * a.heads_k + hk];
            const float factor = x * static_cast<float>(a.softmax_scale) * kLog2eF;
            qk_descale[half] = factor > 0.0f && factor < Consts<float>::inf() ? x : Consts<float>::nan();
        }
        if (a.v_descale != nullptr) {
            const float x = a.v_descale[b * a.heads_k + hk];
            v_descale = x > 0.0f && x < Consts<float>::inf() ? x : Consts<float>::nan();
        }
    }

    float o[kOTiles][4];
#pragma unroll
    for (int n = 0; n < kOTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    FragmentSoftmax<2, false, float, kMaxScore> softmax;

    for (int tile = tile_begin, it = 0; tile < tile_end; ++tile, ++it) {
        cp_async_wait<kStages - 2>();
        __syncwarp();  // the warp's rows of tile `tile` have landed for every lane; its rows of stage (it - 1) are free
        if (tile + kStages - 1 < tile_end) issue(tile + kStages - 1, (it + kStages - 1) % kStages, next_page);
        cp_async_commit();
        if (tile + kStages < tile_end) lookup(tile + kStages, next_page);
        if constexpr (kFp8) {
            // The warp's e4m3 K and V rows of the stage (its 16 of K's kBlockN, then of V's) into its rows
            // of the float16 tiles, 8 elements a step (sV follows sK), before its products read them.
            const unsigned char* stage = stages8 + (it % kStages) * Tr::kStageBytes;
            constexpr int kPieces = kHeadDim / 8;
            for (int u = lane; u < 2 * 16 * kPieces; u += 32) {
                const int r = u / kPieces, row = (r / 16) * kBlockN + 16 * warp + r % 16, col = 8 * (u % kPieces);
                const uint2 x = *reinterpret_cast<const uint2*>(stage + row * Tr::kLd8 + col);
                *reinterpret_cast<uint4*>(sK + row * kLd + col) =
                    make_uint4(e4m3x2_to_half2(static_cast<unsigned short>(x.x)), e4m3x2_to_half2(static_cast<unsigned short>(x.x >> 16)),
                               e4m3x2_to_half2(static_cast<unsigned short>(x.y)), e4m3x2_to_half2(static_cast<unsigned short>(x.y >> 16)));
            }
            __syncwarp();
        }
        const M* sKj = sK + (kFp8 ? 0 : it % kStages) * kBlockN * kLd;
        const M* sVj = sV + (kFp8 ? 0 : it % kStages) * kBlockN * kLd;
        const int n0 = tile * kBlockN + 16 * warp;  // this warp's 16 keys

        float s[2][4] = {};
#pragma unroll
        for (int kk = 0; kk < kDSteps; ++kk) {
            unsigned bk[4];
            load_bt_frags<kLd>(bk, sKj, 16 * warp, 16 * kk);
            unsigned qa[4];
            if constexpr (kQInRegs) {
#pragma unroll
                for (int e = 0; e < 4; ++e) qa[e] = q_frag[kk][e];
            } else {
                load_a_frag<kLd>(qa, sQ, 0, 16 * kk);
            }
            mma_16816<M>(s[0], qa, bk);
            mma_16816<M>(s[1], qa, bk + 2);
        }
        if constexpr (kFp8) {
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
                for (int e = 0; e < 4; ++e) s[nt][e] *= qk_descale[e / 2];
            }
        }
        auto& rows = reinterpret_cast<float(&)[1][2][4]>(s);
        // Made per tile from the kernel parameters: at head dim 256 the registers it would hold across
        // the loop are the ones the output needs.
        if constexpr (ScoreFn::kEnabled) {
            const UserLog2ScoresByRow<ScoreFn> scores(a, seq, b);
            modify_rows<true, false>(rows, scores, query_of, [&](int, int r) { return head[r]; }, n0, 2 * t);
        } else {
            const Log2Scores scores(a, seq, b, hk * group);
            modify_rows<kScoreMod, false>(rows, scores, query_of, [&](int, int r) { return bias_log2[r]; }, n0, 2 * t);
        }
        // The element mask only where the warp's keys are not all visible to all the CTA's queries.
        if (!mask.tile_is_full(i0, i_last - i0 + 1, n0, 16)) {
            mask_tile_rows<false>(rows, mask, no_layout, a, query_of, n0, 2 * t, false, Mask::kCutsBoth);
        }
        softmax.step(s, o);

        unsigned p[4];
        pack_a_fragment<M>(p, s[0], s[1]);
#pragma unroll
        for (int cp = 0; cp < kOTiles / 2; ++cp) {
            unsigned bv[4];
            load_b_frags_trans<kLd>(bv, sVj, 16 * warp, 16 * cp);
            mma_16816<M>(o[2 * cp], p, bv);
            mma_16816<M>(o[2 * cp + 1], p, bv + 2);
        }
    }
    cp_async_wait<0>();
    const bool bad = entry.bad || __syncthreads_or(bad_page);  // also: every warp is done with the stages

    // Merge the warps' states: each writes its rows' maximum (log2 units), sum and unnormalized output,
    // and with kMaxScore their largest scores (log2 units).
    float* merge_o = reinterpret_cast<float*>(sK);                  // [warp][row][kHeadDim]
    float* merge_m = merge_o + Tr::kWarps * Tr::kRows * kHeadDim;   // [warp][row]
    float* merge_l = merge_m + Tr::kWarps * Tr::kRows;
    float* merge_top = merge_l + Tr::kWarps * Tr::kRows;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const float l = group_sum<4>(softmax.l[half]);
        const int row = g + 8 * half;
        if (t == 0) {
            merge_m[warp * Tr::kRows + row] = softmax.m2[half];
            merge_l[warp * Tr::kRows + row] = l;
            if constexpr (kMaxScore) merge_top[warp * Tr::kRows + row] = softmax.top[half];
        }
#pragma unroll
        for (int n = 0; n < kOTiles; ++n) {
            *reinterpret_cast<float2*>(merge_o + (warp * Tr::kRows + row) * kHeadDim + 8 * n + 2 * t) =
                make_float2(o[n][2 * half], o[n][2 * half + 1]);
        }
    }
    __syncthreads();

    const bool has_row = span_r < rows;
    if (has_row) {
        // The row's maximum over the warps, each warp's weight 2^(m_w - m), and the merged sum.
        float m = Consts<float>::neg_inf();
#pragma unroll
        for (int w = 0; w < Tr::kWarps; ++w) m = fmaxf(m, merge_m[w * Tr::kRows + span_row]);
        const float base = m == Consts<float>::neg_inf() ? 0.0f : m;  // no key seen: every weight is 0
        float weight[Tr::kWarps];
        float l = 0.0f;
#pragma unroll
        for (int w = 0; w < Tr::kWarps; ++w) {
            weight[w] = fast_exp2(merge_m[w * Tr::kRows + span_row] - base);
            l += weight[w] * merge_l[w * Tr::kRows + span_row];
        }
        // A row that saw no key is 0 with lse -inf; a NaN score makes l NaN, and NaN != 0.
        const float nan = __int_as_float(0x7fc00000);
        const float inv_l = bad ? nan : (l != 0.0f ? (kFp8 ? v_descale / l : 1.0f / l) : 0.0f);
        const float lse = bad ? nan : (l != 0.0f ? kLn2F * (m + __log2f(l)) : Consts<float>::neg_inf());
        T* out_row = head_rows<T>(c.out, b, span_i, span_h);
        const long long part_row =
            ((static_cast<long long>(split) * a.batch + b) * a.seqlen_q + span_i) * a.heads + span_h;
#pragma unroll
        for (int k = 0; k < kSpan; ++k) {
            const int col = span_col + k;
            if (col >= a.headdim_v) break;
            float acc = 0.0f;
#pragma unroll
            for (int w = 0; w < Tr::kWarps; ++w) acc += weight[w] * merge_o[(w * Tr::kRows + span_row) * kHeadDim + col];
            if (c.num_splits == 1) {
                out_row[col] = from_acc<T>(acc * inv_l);
            } else {
                c.part_out[part_row * kHeadDim + col] = acc * inv_l;
            }
        }
        if (span_col == 0) {
            if (c.num_splits == 1) {
                static_cast<float*>(c.lse.ptr)[rows_index(c.lse, b, span_h, span_i)] = lse;
            } else {
                c.part_lse[((static_cast<long long>(split) * a.batch + b) * a.heads + span_h) * a.seqlen_q + span_i] = lse;
            }
            if constexpr (kMaxScore) {
                // The row's largest score over the warps, in natural-log units; NaN for a bad entry and
                // where l is (a NaN score, as FragmentSoftmax::row_max_score says), but for +inf.
                float top = Consts<float>::neg_inf();
#pragma unroll
                for (int w = 0; w < Tr::kWarps; ++w) top = fmaxf(top, merge_top[w * Tr::kRows + span_row]);
                top *= kLn2F;
                if (bad || l != l && top != Consts<float>::inf()) top = nan;
                if (c.max_score != nullptr) record_max_score(c.max_score + static_cast<long long>(b) * a.heads + span_h, top);
            }
        }
    }
    // The new keys (fresh_keys): the CTAs of this (kv head, batch entry) write tokens blockIdx.x,
    // blockIdx.x + gridDim.x, ... into the cache after their attention, off the path of its loads. No
    // CTA of this (kv head, batch entry) reads those rows from the cache (the tiles holding them read
    // k_new, see `issue`), so the writes need no ordering; a row on a page outside the cache is not
    // written (its readers flag the page). Batch entries that share cache rows race, as in
    // FlashAttention's own kernel (the docstring of flash_attention_with_kvcache says so).
    // The entry's values are read again here (a few loads once per CTA) rather than kept in registers
    // through the loop.
    const CacheEntry at(c, b);
    if (fresh_keys && !at.bad) {
        for (int j = blockIdx.x; j < c.seqlen_new; j += gridDim.x) {
            bool bad_row = false;
            const int pos = at.cached + j;
            const long long k_at = at.row_offset(c, a.k, b, pos, hk, &bad_row);
            const long long v_at = at.row_offset(c, a.v, b, pos, hk, &bad_row);
            if (bad_row) continue;
            const C* k_src = head_rows<const C>(c.k_new, b, j, hk);
            const C* v_src = head_rows<const C>(c.v_new, b, j, hk);
            for (int col = threadIdx.x; col < a.headdim; col += Tr::kThreads) static_cast<C*>(a.k.ptr)[k_at + col] = k_src[col];
            for (int col = threadIdx.x; col < a.headdim_v; col += Tr::kThreads) static_cast<C*>(a.v.ptr)[v_at + col] = v_src[col];
        }
    }

    if (c.num_splits > 1) merge_splits<T, Tr>(c, smem_raw);
}

template <typename T, int kHeadDim, bool kScoreMod, bool kMaxScore, typename ScoreFn = NoUserScore,
          typename MaskFn = NoUserMask>
__global__ void __launch_bounds__(KvcTraits<T, kHeadDim>::kThreads, 2)
kvc_fwd(const CUPYFLASH_GRID_CONSTANT KvCacheArgs c) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    decode_attention<T, T, kHeadDim, kScoreMod, kMaxScore, ScoreFn, MaskFn>(c, smem_raw);
}

// e4m3 caches (sm_90a: cvt.f16x2.e4m3x2): T is out_dtype's type.
template <typename T, int kHeadDim, bool kScoreMod, bool kMaxScore>
__global__ void __launch_bounds__(KvcTraits<T, kHeadDim, E4m3>::kThreads, 2)
kvc_fwd_fp8(const CUPYFLASH_GRID_CONSTANT KvCacheArgs c) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    decode_attention<T, E4m3, kHeadDim, kScoreMod, kMaxScore, NoUserScore, NoUserMask>(c, smem_raw);
}

// ------------------------------------------------------------------------------------------------
// The general path: the attention runs as a dense forward with per-entry key counts (seqused_k).

// One CTA per batch entry: seqused_k[b] = its key count (0 when bad) and bad[b], the pages it uses
// checked against the cache.
__global__ void __launch_bounds__(128) kvc_lengths(const CUPYFLASH_GRID_CONSTANT KvCacheArgs c) {
    const int b = blockIdx.x;
    const CacheEntry e(c, b);
    bool bad_page = false;
    if (c.block_table != nullptr && !e.bad) {
        const PageTable pages(c, b);
        for (int page = threadIdx.x; page * c.page_size < e.keys; page += blockDim.x) {
            bad_page = bad_page || !pages.valid(pages.row[page]);
        }
    }
    const bool bad = __syncthreads_or(bad_page) || e.bad;
    if (threadIdx.x == 0) {
        c.seqused_k[b] = bad ? 0 : e.keys;
        c.bad[b] = bad;
    }
}

// x[b * per_entry + k] = NaN for the batch entries with bad[b] set (x contiguous, batch-major).
template <typename T>
__global__ void __launch_bounds__(256) kvc_poison(const int* bad, T* x, long long per_entry, long long n) {
    for (long long k = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; k < n;
         k += static_cast<long long>(gridDim.x) * blockDim.x) {
        if (bad[k / per_entry]) x[k] = from_acc<T>(static_cast<acc_t<T>>(__longlong_as_double(0x7ff8000000000000ll)));
    }
}

}  // namespace cupyflash
