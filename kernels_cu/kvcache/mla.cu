// MLA decoding (DeepSeek's multi-head latent attention) on a latent KV cache: one kv head of 576 columns
// (the latent 512 and the rotary 64) whose first 512 are the values (v_cache a view of k_cache), float16
// or bfloat16, dense or paged (cupyflash/_kvcache/device.py sends such calls here).
//
//   kvc_mla   one CTA per (16 query rows, split of the keys, batch entry): rows are the (query, head)
//             pairs, row r being query r / heads and head r % heads. Each 64-key tile of the cache is
//             copied once (cp.async, one page lookup per row, so any page size is the same loop) and
//             read as both K and V. Its four warps split the work by keys for S = Q K^T (16 keys each,
//             36 k-steps of the 576 columns) and by output columns for O += P V (128 each): so that no
//             warp holds more than a quarter of the 16 x 512 output, the row maximum and P go through
//             shared memory between the two products (two barriers a tile, and a third before the next
//             tile's copies, which go out before each tile's wait: two tiles in flight). With
//             num_splits > 1 each CTA writes a float32 partial output and its lse and the last split of a
//             row tile merges them (kvcache/split_merge.cuh).
//
// Scores are softmax_scale * q.k in log2 units, masked past each entry's keys and, with causal, past
// key keys - seqlen_q + i for query i (the queries are the last seqlen_q positions). Bad entries (an
// out-of-range cache_seqlens, cache_batch_idx or page) give NaN rows, as kvc_fwd's.
#include "common/dtypes.cuh"
#include "common/launch.cuh"
#include "common/math.cuh"
#include "common/params.cuh"
#include "common/reduce.cuh"
#include "common/sequence.cuh"
#include "fragment/operand.cuh"
#include "kvcache/cache.cuh"
#include "kvcache/split_merge.cuh"
#include "sm80/mma.cuh"
#include "sm80/tile.cuh"

namespace cupyflash {

template <typename T>
struct MlaTraits {
    static constexpr int kHeadDim = 576;        // q.k columns
    static constexpr int kHeadDimV = 512;       // v: the cache rows' first 512 columns
    static constexpr int kPartCols = kHeadDimV; // floats between two partial output rows (merge_splits)
    static constexpr int kWarps = 4;
    static constexpr int kThreads = 32 * kWarps;
    static constexpr int kRows = 16;            // (query, head) rows per CTA: one mma.sync m-tile
    static constexpr int kBlockN = 16 * kWarps; // keys per tile, 16 per warp in S
    static constexpr int kOCols = kHeadDimV / kWarps;  // output columns per warp in O
    static constexpr int kLd = kHeadDim + 8;    // padded shared row (sm80/tile.cuh)
    static constexpr int kPLd = kBlockN + 8;
    static constexpr int kStages = 2;           // two tiles, 146 KB of cache rows, in flight per CTA (one an SM)
    static constexpr int kQBytes = kRows * kLd * static_cast<int>(sizeof(T));
    static constexpr int kTileBytes = kBlockN * kLd * static_cast<int>(sizeof(T));
    static constexpr int kPBytes = kRows * kPLd * static_cast<int>(sizeof(T));
    static constexpr int kStatBytes = 2 * kWarps * kRows * 4;  // per warp and row: the maximum, then the sum
    static constexpr int kPOffset = kQBytes + kStages * kTileBytes;
    static constexpr int kStatOffset = kPOffset + kPBytes;
    static constexpr int kSmemBytes = kStatOffset + kStatBytes;
    static constexpr int kChunks = kHeadDim / 8;       // 16-byte chunks of a cache row
    static constexpr int kRowsPerWarp = kBlockN / kWarps;
    static_assert(kChunks <= 3 * 32, "a row's chunks in three copies a lane");
};

template <typename T>
__global__ void __launch_bounds__(MlaTraits<T>::kThreads, 1) kvc_mla(const CUPYFLASH_GRID_CONSTANT KvCacheArgs c) {
    using Tr = MlaTraits<T>;
    constexpr int kBlockN = Tr::kBlockN, kLd = Tr::kLd, kPLd = Tr::kPLd, kStages = Tr::kStages;
    constexpr int kDSteps = Tr::kHeadDim / 16, kOTiles = Tr::kOCols / 8, kRowsPerWarp = Tr::kRowsPerWarp;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    require_dynamic_smem<Tr::kSmemBytes>();
    const AttnArgs& a = c.attn;
    T* sQ = reinterpret_cast<T*>(smem_raw);
    T* sK = sQ + Tr::kRows * kLd;  // kStages tiles of kBlockN rows: K, and V in their first 512 columns
    T* sP = reinterpret_cast<T*>(smem_raw + Tr::kPOffset);
    float* stat_m = reinterpret_cast<float*>(smem_raw + Tr::kStatOffset);  // [warp][row]
    float* stat_l = stat_m + Tr::kWarps * Tr::kRows;

    const int split = blockIdx.x % c.num_splits;
    const int row_tile = blockIdx.x / c.num_splits;
    const int b = blockIdx.z;
    const int heads = a.heads;
    const int rows = a.seqlen_q * heads;
    const int r0 = row_tile * Tr::kRows;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;

    const CacheEntry entry(c, b);
    const int keys = entry.keys - entry.first;  // positions entry.first .. entry.keys - 1 of the cache
    // The keys row r sees: all, or with causal those up to its query's position.
    const auto visible = [&](int r) {
        if (a.window_right < 0) return keys;
        return clamp_int(keys - a.seqlen_q + r / heads + 1, 0, keys);
    };
    const int last_row = min(r0 + Tr::kRows, rows) - 1;
    const int key_end = visible(last_row);
    int tile_begin = 0, tile_end = 0;
    if (key_end > 0) {
        const int tiles = ceil_div(key_end, kBlockN);
        const int per_split = ceil_div(tiles, c.num_splits);
        tile_begin = min(split * per_split, tiles);
        tile_end = min(tile_begin + per_split, tiles);
    }

    // Copies: warp w takes rows w, w + 4, ... of a tile, its lanes a row's 72 chunks (lanes 0-7 a third),
    // so each copy instruction reads 512 contiguous bytes of a row. The rows' pages are looked up one
    // tile ahead, so the lookup's latency hides behind a tile's products.
    const PageTable pages(c, b);
    const T* base = static_cast<const T*>(a.k.ptr);
    const T* dense_rows = base + static_cast<long long>(entry.entry) * a.k.batch_stride +
                          static_cast<long long>(entry.first) * a.k.row_stride;
    bool bad_page = false;
    auto lookup = [&](int tile, int (&page)[kRowsPerWarp]) {
        if (pages.row == nullptr) return;
#pragma unroll
        for (int k = 0; k < kRowsPerWarp; ++k) {
            const int pos = tile * kBlockN + warp + Tr::kWarps * k;
            page[k] = pos < keys ? pages.page(pos) : 0;
        }
    };
    auto issue = [&](int tile, int stage, const int (&page)[kRowsPerWarp]) {
#pragma unroll
        for (int k = 0; k < kRowsPerWarp; ++k) {
            const int row = warp + Tr::kWarps * k, pos = tile * kBlockN + row;
            const bool valid = pos < keys;
            const T* src = base;
            if (!valid) {
            } else if (pages.row != nullptr) {
                int at = page[k];
                if (!pages.valid(at)) {
                    bad_page = true;
                    at = 0;
                }
                src = base + at * a.k.batch_stride + pages.row_in_page(pos) * a.k.row_stride;
            } else {
                src = dense_rows + static_cast<long long>(pos) * a.k.row_stride;
            }
            T* dst = sK + stage * kBlockN * kLd + row * kLd;
#pragma unroll
            for (int u = 0; u < 3; ++u) {
                const int chunk = lane + 32 * u;
                if (chunk < Tr::kChunks) {
                    cp_async_16(smem_addr(dst + 8 * chunk), valid ? src + 8 * chunk : base, valid ? 16 : 0);
                }
            }
        }
    };

    int next_page[kRowsPerWarp];
    {
        int first_pages[kStages - 1][kRowsPerWarp];
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
    // Q rows (zero past the last row).
    for (int idx = threadIdx.x; idx < Tr::kRows * Tr::kChunks; idx += Tr::kThreads) {
        const int row = idx / Tr::kChunks, col = 8 * (idx % Tr::kChunks);
        const int r = r0 + row;
        uint4 x = make_uint4(0u, 0u, 0u, 0u);
        if (r < rows) x = *reinterpret_cast<const uint4*>(head_rows<const T>(a.q, b, r / heads, r % heads) + col);
        *reinterpret_cast<uint4*>(sQ + row * kLd + col) = x;
    }

    // Each thread's rows g and g + 8: the keys they see.
    int limit[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) limit[half] = visible(min(r0 + g + 8 * half, rows - 1));
    const float scale_log2 = static_cast<float>(a.softmax_scale) * kLog2eF;

    float o[kOTiles][4];
#pragma unroll
    for (int n = 0; n < kOTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m[2] = {Consts<float>::neg_inf(), Consts<float>::neg_inf()};  // the rows' maxima (log2 units)
    float l[2] = {0.0f, 0.0f};  // this thread's share of the rows' sums (its keys' probabilities)

    for (int tile = tile_begin, it = 0; tile < tile_end; ++tile, ++it) {
        // The next tile's copies go out before this one's wait, into the stage every warp has just left
        // (its P V): with 75 KB tiles and one CTA an SM, waiting first left one tile in flight per SM, too
        // few bytes to cover DRAM's latency (1.82 TB/s at 16 heads, session 35).
        __syncthreads();  // every warp is done with the previous tile: its stage and P
        if (tile + kStages - 1 < tile_end) issue(tile + kStages - 1, (it + kStages - 1) % kStages, next_page);
        cp_async_commit();
        if (tile + kStages < tile_end) lookup(tile + kStages, next_page);
        cp_async_wait<kStages - 1>();
        __syncthreads();  // tile `tile` (and, on the first, Q) has landed
        const T* sKj = sK + (it % kStages) * kBlockN * kLd;
        const int n0 = tile * kBlockN + 16 * warp;  // this warp's 16 keys

        float s[2][4] = {};
#pragma unroll 4
        for (int kk = 0; kk < kDSteps; ++kk) {
            unsigned qa[4], bk[4];
            load_a_frag<kLd>(qa, sQ, 0, 16 * kk);
            load_bt_frags<kLd>(bk, sKj, 16 * warp, 16 * kk);
            mma_16816<T>(s[0], qa, bk);
            mma_16816<T>(s[1], qa, bk + 2);
        }
        // Scale, mask, and this warp's row maxima.
        float tile_m[2];
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            float x = Consts<float>::neg_inf();
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int key = n0 + 8 * nt + 2 * t + e;
                    float& v = s[nt][2 * half + e];
                    v = key < limit[half] ? v * scale_log2 : Consts<float>::neg_inf();
                    x = fmaxf(x, v);
                }
            }
            tile_m[half] = group_max<4>(x);
            if (t == 0) stat_m[warp * Tr::kRows + g + 8 * half] = tile_m[half];
        }
        __syncthreads();  // every warp's maxima
        float alpha[2], base_m[2];
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            float x = m[half];
#pragma unroll
            for (int w = 0; w < Tr::kWarps; ++w) x = fmaxf(x, stat_m[w * Tr::kRows + g + 8 * half]);
            // No key seen yet: every probability and weight is 0 (base 0 keeps exp2(-inf - base) = 0).
            base_m[half] = x == Consts<float>::neg_inf() ? 0.0f : x;
            alpha[half] = fast_exp2(m[half] - base_m[half]);
            m[half] = x;
        }
        float p_sum[2] = {0.0f, 0.0f};
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                s[nt][e] = fast_exp2(s[nt][e] - base_m[e / 2]);
                p_sum[e / 2] += s[nt][e];
            }
        }
#pragma unroll
        for (int half = 0; half < 2; ++half) l[half] = l[half] * alpha[half] + p_sum[half];
#pragma unroll
        for (int n = 0; n < kOTiles; ++n) {
            o[n][0] *= alpha[0];
            o[n][1] *= alpha[0];
            o[n][2] *= alpha[1];
            o[n][3] *= alpha[1];
        }
        // P (16 x 64, this warp's 16 columns) to shared memory for every warp's P V.
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
            const int col = 16 * warp + 8 * nt + 2 * t;
            *reinterpret_cast<unsigned*>(sP + g * kPLd + col) = pack2<T>(s[nt][0], s[nt][1]);
            *reinterpret_cast<unsigned*>(sP + (g + 8) * kPLd + col) = pack2<T>(s[nt][2], s[nt][3]);
        }
        __syncthreads();  // P stored; the maxima read (the next tile rewrites them)
        // O[:, 128 warp ..] += P V, V the tile's first 512 columns.
#pragma unroll
        for (int kk = 0; kk < kBlockN / 16; ++kk) {
            unsigned pa[4];
            load_a_frag<kPLd>(pa, sP, 0, 16 * kk);
#pragma unroll
            for (int cp = 0; cp < kOTiles / 2; ++cp) {
                unsigned bv[4];
                load_b_frags_trans<kLd>(bv, sKj, 16 * kk, Tr::kOCols * warp + 16 * cp);
                mma_16816<T>(o[2 * cp], pa, bv);
                mma_16816<T>(o[2 * cp + 1], pa, bv + 2);
            }
        }
    }
    cp_async_wait<0>();
    const bool bad = entry.bad || __syncthreads_or(bad_page);  // also: every warp is done with sP and the stats

    // The rows' sums over the warps (each warp's keys' probabilities, all at the rows' common maximum).
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const float x = group_sum<4>(l[half]);
        if (t == 0) stat_l[warp * Tr::kRows + g + 8 * half] = x;
    }
    __syncthreads();
    const float nan = __int_as_float(0x7fc00000);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int r = r0 + g + 8 * half;
        if (r >= rows) continue;
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < Tr::kWarps; ++w) sum += stat_l[w * Tr::kRows + g + 8 * half];
        // A row that saw no key is 0 with lse -inf; a NaN score makes the sum NaN, and NaN != 0.
        const float inv = bad ? nan : (sum != 0.0f ? 1.0f / sum : 0.0f);
        const float lse = bad ? nan : (sum != 0.0f ? kLn2F * (m[half] + __log2f(sum)) : Consts<float>::neg_inf());
        store_row_pairs<T, Tr>(c, b, split, r, o, half, Tr::kOCols * warp + 2 * t, inv, lse, warp == 0 && t == 0);
    }
    if (c.num_splits > 1) merge_splits<T, Tr>(c, smem_raw);
}

}  // namespace cupyflash
