// MLA decoding on Hopper's tensor cores (sm_90a): the calls of kvcache/mla.cu's kvc_mla (a latent cache of
// one kv head, 576 columns, v_cache the view of its first 512) with at least MLA_SM90_MIN_ROWS (query,
// head) rows per batch entry (cupyflash/_kvcache/device.py). At 128 heads the products, not the cache's
// bytes, set the pace (2 x 128 x 1088 flops per 1,152 cache bytes); at 16 the tiles of 64 rows waste
// three quarters of the products and still beat kvc_mla's copies-and-barriers chain. Dense caches, and
// pages of a multiple of 64 rows.
//
//   kvc_mla_sm90   one CTA per (64 rows, split of the keys, batch entry), two warpgroups and no producer.
//                  Each 64-key tile of the cache lands once, by TMA, as nine 64-column boxes of the
//                  128-byte swizzled layout (sm90/primitives.cuh), in one of two stages; it is read as K
//                  (all nine) and as V (the first eight, MN-major). Warpgroup 0 owns the even tiles of the
//                  CTA's walk and output columns 0-255, warpgroup 1 the odd tiles and columns 256-511 (the
//                  split of DeepSeek's FlashMLA): each warpgroup forms S = Q K^T of its own tiles (wgmma
//                  64 x 64, Q from shared memory), and both add P V of every tile into their half of O,
//                  their own P from registers and the other's from a shared-memory buffer.
//
// A pair of tiles (e = 2j, o = 2j + 1), m the rows' running maximum in shared memory (log2 units):
//   WG0: m_e = max(m, rowmax S_e), f0 = 2^(m - m_e); P_e (rounded once) to the buffer, with f0 and m_e.
//   WG1: m_o = max(m_e, rowmax S_o), f1 = 2^(m_e - m_o); P_o to the buffer once it has read P_e.
//   both: O *= f0; O += P_e V_e; O *= f1; O += P_o V_o (over the warpgroup's 256 columns).
// Each warpgroup sums its own tiles' probabilities, rescaled with O, and the two sums add at the end.
// Named barriers carry the hand-offs (P_e with f0, f1, P_o): the softmax steps alternate between the
// warpgroups while the other's products run.
//
// Stages are refilled by their last reader, so no stage needs an empty barrier: warpgroup 0 alone reads
// boxes 0-3 as V (its columns), warpgroup 1 boxes 4-7, and S, which reads all nine, is done before its
// tile's P exists. So warpgroup 0 reloads a stage's boxes 0-3 once its P V over them is done, warpgroup 1
// boxes 4-7, and the rope box 8, read by S alone, is reloaded once the tile's S is done (by the next
// warpgroup barrier of its owner, the tile's first P V for the odd tiles). Each box has its own full
// barrier, and S takes the boxes one at a time as they land (a wgmma group each), the rope box first,
// then boxes 0-3 and 4-7: the order in which a stage's boxes are freed.
//
// Rows of the tile past the entry's keys hold whatever the cache holds there: their scores are masked,
// and the owner of the entry's last tile zeroes them in the V boxes before its S (0 x NaN in P V would
// be NaN). Scores are softmax_scale * q.k masked past each entry's keys and, with causal, past key keys -
// seqlen_q + i for query i. Bad entries and pages give NaN rows, as kvc_mla's. With num_splits > 1 the
// last split of a row tile merges (kvcache/split_merge.cuh).
#include "common/dtypes.cuh"
#include "common/launch.cuh"
#include "common/math.cuh"
#include "common/params.cuh"
#include "common/reduce.cuh"
#include "common/sequence.cuh"
#include "fragment/operand.cuh"
#include "generated/wgmma_ops.cuh"
#include "kvcache/cache.cuh"
#include "kvcache/split_merge.cuh"
#include "sm90/primitives.cuh"

namespace cupyflash {

template <typename T>
struct MlaSm90Traits {
    static constexpr int kHeadDim = 576;     // q.k columns
    static constexpr int kHeadDimV = 512;    // v: the cache rows' first 512 columns
    static constexpr int kPartCols = kHeadDimV;
    static constexpr int kRows = 64;         // (query, head) rows per CTA: wgmma's M
    static constexpr int kBlockN = 64;       // keys per tile
    static constexpr int kWarps = 8;
    static constexpr int kThreads = 32 * kWarps;
    static constexpr int kBoxes = kHeadDim / 64;       // 64-column boxes (swizzle atoms) of a tile
    static constexpr int kLowBoxes = 4;                // warpgroup 0's V columns; it loads boxes 0-3, warpgroup 1 the rest
    static constexpr int kBoxBytes = kBlockN * 128;
    static constexpr int kTileBytes = kBoxes * kBoxBytes;
    static constexpr int kKOffset = kTileBytes;        // after Q (64 rows, the same layout)
    static constexpr int kPOffset = kKOffset + 2 * kTileBytes;
    static constexpr int kPBytes = 128 * 16 * 4;       // a warpgroup's P fragments: 16 registers a thread
    static constexpr int kStatOffset = kPOffset + kPBytes;
    static constexpr int kStatBytes = 5 * kRows * 4;   // the maximum, scale0, scale1, each warpgroup's sums
    static constexpr int kBarOffset = kStatOffset + kStatBytes;
    static constexpr int kSmemBytes = 1024 + kBarOffset + 2 * kBoxes * 8;  // 1024: the base's alignment
};

// Named barriers (0 is __syncthreads): the three hand-offs between the warpgroups, then one per warpgroup.
enum MlaSm90Barrier { kP0Ready = 1, kScale1Ready = 2, kP1Ready = 3, kOwnWarpgroup = 4 };

// S = Q K^T of the tile in k_tile (its boxes counted on full[0..8], phase `parity`), the boxes taken in
// the order kFirst, kFirst + 1, ... (mod 9), each issued as soon as it has landed and committed as its
// own group (so the products of the first boxes run while the last are still copied).
template <typename T, int kFirst>
__device__ __forceinline__ void mla_issue_scores(float (&s)[8][4], unsigned q_tile, unsigned k_tile,
                                                 unsigned long long* full, int parity) {
    const unsigned long long q_desc = kmajor_desc(q_tile, 0), k_desc = kmajor_desc(k_tile, 0);
#pragma unroll
    for (int j = 0; j < 9; ++j) {
        const int box = (kFirst + j) % 9;
        mbarrier_wait(&full[box], parity);
        wgmma_fence();
#pragma unroll
        for (int kk = 4 * box; kk < 4 * box + 4; ++kk) {
            const unsigned long long qd = desc_advance(q_desc, kmajor_step<64>(kk));
            const unsigned long long kd = desc_advance(k_desc, kmajor_step<64>(kk));
            if (j == 0 && kk == 4 * box) {
                WgmmaSS<T, 64>::overwrite(s, qd, kd);
            } else {
                WgmmaSS<T, 64>::mma(s, qd, kd, 1);
            }
        }
        wgmma_commit();
    }
}

// O += P V over this warpgroup's 256 columns (the boxes from v_tile on), P the register operand; issued
// and committed.
template <typename T>
__device__ __forceinline__ void mla_issue_values(float (&o)[32][4], const unsigned (&p)[4][4], unsigned v_tile) {
    const unsigned long long v_desc = mnmajor_desc<64>(v_tile);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) WgmmaRS<T, 256>::mma(o, p[kk], desc_advance(v_desc, mnmajor_step(kk)), 1);
    wgmma_commit();
}

template <typename T>
__global__ void __launch_bounds__(MlaSm90Traits<T>::kThreads, 1)
    kvc_mla_sm90(const CUPYFLASH_GRID_CONSTANT KvCacheArgs c, const CUPYFLASH_GRID_CONSTANT TmaDesc cache_map) {
    using Tr = MlaSm90Traits<T>;
    constexpr int kBoxes = Tr::kBoxes, kLow = Tr::kLowBoxes, kRope = kBoxes - 1;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    require_dynamic_smem<Tr::kSmemBytes>();
    unsigned char* smem = smem_raw + ((1024 - shared_addr(smem_raw) % 1024) % 1024);
    const AttnArgs& a = c.attn;
    float* row_max = reinterpret_cast<float*>(smem + Tr::kStatOffset);  // [row]: the running maximum
    float* scale0 = row_max + Tr::kRows;                                  // [row]
    float* scale1 = scale0 + Tr::kRows;                                   // [row]
    float* row_sum = scale1 + Tr::kRows;                                  // [warpgroup][row]
    unsigned long long* full = reinterpret_cast<unsigned long long*>(smem + Tr::kBarOffset);  // [stage][box]
    // A warpgroup's P for the other, as the other's threads take it: thread x's 16 registers at slots
    // [k-step][x] (a uint4 each), read back by thread x of the other warpgroup, which holds the same rows.
    uint4* p_slots = reinterpret_cast<uint4*>(smem + Tr::kPOffset);

    const int split = blockIdx.x % c.num_splits, row_tile = blockIdx.x / c.num_splits, b = blockIdx.z;
    const int heads = a.heads, rows = a.seqlen_q * heads, r0 = row_tile * Tr::kRows;
    // Through a shuffle the compiler knows the warpgroup is warp-uniform (sm90/fwd_kernel.cuh).
    const int wg = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0);
    const int tid = threadIdx.x % 128, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int row_a = 16 * (tid / 32) + g;  // this thread's rows of the tile: row_a and row_a + 8

    const CacheEntry entry(c, b);
    const int keys = entry.keys - entry.first;  // positions entry.first .. entry.keys - 1 of the cache
    const auto visible = [&](int r) {
        if (a.window_right < 0) return keys;
        return clamp_int(keys - a.seqlen_q + r / heads + 1, 0, keys);
    };
    const int key_end = visible(min(r0 + Tr::kRows, rows) - 1);
    int tile_begin = 0, tiles = 0;
    if (key_end > 0) {
        const int all = ceil_div(key_end, Tr::kBlockN), per_split = ceil_div(all, c.num_splits);
        tile_begin = min(split * per_split, all);
        tiles = min(tile_begin + per_split, all) - tile_begin;
    }
    // Keys every row of the CTA sees: tiles below need no mask.
    const int seen_by_all = visible(r0);
    int limit[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) limit[h] = visible(min(r0 + row_a + 8 * h, rows - 1));
    const float scale_log2 = static_cast<float>(a.softmax_scale) * kLog2eF;

    // The copies of walk tile `it` (boxes [first, last)) into stage it % 2, by one thread. Pages of a
    // multiple of 64 rows hold whole tiles.
    const PageTable pages(c, b);
    bool bad_page = false;
    const auto load = [&](int it, int first, int last) {
        const int pos = (tile_begin + it) * Tr::kBlockN;
        int page = entry.entry, row = entry.first + pos;
        if (pages.row != nullptr) {
            page = pages.page(pos);
            row = pages.row_in_page(pos);
            if (!pages.valid(page)) {
                bad_page = true;
                page = 0;
            }
        }
        unsigned char* stage = smem + Tr::kKOffset + (it % 2) * Tr::kTileBytes;
        for (int box = first; box < last; ++box) {
            unsigned long long* bar = &full[(it % 2) * kBoxes + box];
            mbarrier_arrive_expect_tx(bar, Tr::kBoxBytes);
            tma_load_4d(stage + box * Tr::kBoxBytes, cache_map, bar, 64 * box, row, 0, page);
        }
    };

    if (threadIdx.x == 0) {
        for (int i = 0; i < 2 * kBoxes; ++i) mbarrier_init(&full[i], 1);
        mbarrier_init_fence();
    }
    if (threadIdx.x < Tr::kRows) row_max[threadIdx.x] = Consts<float>::neg_inf();
    __syncthreads();
    if (tid == 0) {
        tma_prefetch_desc(cache_map);
        for (int it = 0; it < min(tiles, 2); ++it) load(it, wg == 0 ? 0 : kLow, wg == 0 ? kLow : kBoxes);
    }
    // Q rows (zero past the last row) into the swizzled layout: row r's 16-byte chunk k of box k / 8 at
    // chunk (k % 8) ^ (r % 8) of its 128 bytes.
    for (int idx = threadIdx.x; idx < Tr::kRows * (Tr::kHeadDim / 8); idx += Tr::kThreads) {
        const int row = idx / (Tr::kHeadDim / 8), chunk = idx % (Tr::kHeadDim / 8), r = r0 + row;
        uint4 x = make_uint4(0u, 0u, 0u, 0u);
        if (r < rows) x = *reinterpret_cast<const uint4*>(head_rows<const T>(a.q, b, r / heads, r % heads) + 8 * chunk);
        *reinterpret_cast<uint4*>(smem + (chunk / 8) * Tr::kBoxBytes + row * 128 + ((chunk % 8) ^ (row % 8)) * 16) = x;
    }
    fence_proxy_async();
    __syncthreads();

    const unsigned q_tile = shared_addr(smem);
    const auto k_tile = [&](int it) { return shared_addr(smem + Tr::kKOffset + (it % 2) * Tr::kTileBytes); };
    const auto stage_full = [&](int it) { return full + (it % 2) * kBoxes; };
    const int last_tile = ceil_div(keys, Tr::kBlockN) - 1;  // the entry's tile with its last key

    // The owner's preparation of tile `it`'s scores s: rows of the entry's last tile past its keys zeroed
    // in the V boxes (after every box landed; ordered before the products by the fence and a barrier of
    // the warpgroup), then S issued.
    const auto zero_tail = [&](int it) {
        const int first = keys - (tile_begin + it) * Tr::kBlockN;
        if (tile_begin + it != last_tile || first >= Tr::kBlockN) return;
        for (int box = 0; box < kBoxes; ++box) mbarrier_wait(&stage_full(it)[box], (it / 2) & 1);
        zero_tile_rows(smem + Tr::kKOffset + (it % 2) * Tr::kTileBytes, Tr::kBlockN, first, 8, tid, 128);
        fence_proxy_async();
        named_barrier_sync(kOwnWarpgroup + wg, 128);
    };
    // Tile `it`'s scores: in log2 units, masked past each row's keys; and the rows' maxima over the tile.
    const auto mask_and_max = [&](float (&s)[8][4], int it, float (&mx)[2]) {
        const int n0 = (tile_begin + it) * Tr::kBlockN;
        const bool masked = n0 + Tr::kBlockN > seen_by_all;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float x = Consts<float>::neg_inf();
#pragma unroll
            for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    float& v = s[nt][2 * h + e];
                    v = !masked || n0 + 8 * nt + 2 * t + e < limit[h] ? v * scale_log2 : Consts<float>::neg_inf();
                    x = fmaxf(x, v);
                }
            }
            mx[h] = group_max<4>(x);
        }
    };
    // exp2(s - base) in place; returns this thread's share of the rows' sums.
    const auto exponentiate = [&](float (&s)[8][4], const float (&base)[2], float (&sum)[2]) {
        sum[0] = sum[1] = 0.0f;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                s[nt][e] = fast_exp2(s[nt][e] - base[e / 2]);
                sum[e / 2] += s[nt][e];
            }
        }
    };
    // The P fragments in this thread's slots: written by thread tid of one warpgroup, read by thread tid of
    // the other (which holds the same rows and key columns).
    const auto read_slots = [&](unsigned (&p)[4][4]) {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            const uint4 x = p_slots[kk * 128 + tid];
            p[kk][0] = x.x;
            p[kk][1] = x.y;
            p[kk][2] = x.z;
            p[kk][3] = x.w;
        }
    };
    const auto write_slots = [&](const unsigned (&p)[4][4]) {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) p_slots[kk * 128 + tid] = make_uint4(p[kk][0], p[kk][1], p[kk][2], p[kk][3]);
    };
    const auto rescale = [&](float (&o)[32][4], const float (&f)[2]) {
#pragma unroll
        for (int n = 0; n < 32; ++n) {
            o[n][0] *= f[0];
            o[n][1] *= f[0];
            o[n][2] *= f[1];
            o[n][3] *= f[1];
        }
    };

    float o[32][4];
#pragma unroll
    for (int n = 0; n < 32; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float l[2] = {0.0f, 0.0f};  // this thread's share of its warpgroup's tiles' sums, at O's scale
    const unsigned v_half = shared_addr(smem + Tr::kKOffset) + wg * kLow * Tr::kBoxBytes;  // stage 0's V columns

    if (wg == 0) {
        float s[8][4];
        if (tiles > 0) {
            zero_tail(0);
            // O's zeros are defined before the first product (not sunk below it into the loop's entry).
            fence_fragments(o);
            mla_issue_scores<T, kRope>(s, q_tile, k_tile(0), stage_full(0), 0);
        }
        for (int it = 0; it < tiles; it += 2) {
            const bool second = it + 1 < tiles;
            wgmma_wait<0>();  // S0
            fence_fragments(s);
            fence_fragments(o);
            // (The branches on r0 < rows, always taken, are for ptxas: with the softmax's writes to S's
            // registers unconditional here it serialized every product of the kernel, C7515, session 37.)
            float mx[2], m0[2], base[2], f[2], sum[2] = {0.0f, 0.0f};
            mx[0] = mx[1] = Consts<float>::neg_inf();
            if (r0 < rows) mask_and_max(s, it, mx);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float m = row_max[row_a + 8 * h];
                m0[h] = fmaxf(m, mx[h]);
                base[h] = m0[h] == Consts<float>::neg_inf() ? 0.0f : m0[h];  // no key seen yet: P and the scale 0
                f[h] = fast_exp2(m - base[h]);
            }
            if (r0 < rows) exponentiate(s, base, sum);
#pragma unroll
            for (int h = 0; h < 2; ++h) l[h] = l[h] * f[h] + sum[h];
            unsigned p[4][4];
            to_operand<T, 4>(p, s);
            __syncwarp();  // the quad's reads of the maximum before its first thread rewrites it
            if (t == 0) {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    row_max[row_a + 8 * h] = m0[h];
                    scale0[row_a + 8 * h] = f[h];
                }
            }
            // This thread's slot: warpgroup 1 read the previous P0 from it before writing P1, which
            // this thread read before.
            write_slots(p);
            named_barrier_arrive(kP0Ready, 256);
            rescale(o, f);
            mla_issue_values<T>(o, p, v_half);
            named_barrier_sync(kScale1Ready, 256);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                f[h] = scale1[row_a + 8 * h];
                l[h] *= f[h];
            }
            wgmma_wait<0>();  // P0 V0_L: tile it + 2 may take boxes 0-3 of stage 0
            fence_fragments(o);
            named_barrier_sync(kOwnWarpgroup, 128);
            if (tid == 0 && it + 2 < tiles) {
                load(it + 2, 0, kLow);
                load(it + 2, kRope, kBoxes);
            }
            rescale(o, f);
            named_barrier_sync(kP1Ready, 256);
            if (second) {
                read_slots(p);
#pragma unroll
                for (int box = 0; box < kLow; ++box) mbarrier_wait(&stage_full(it + 1)[box], ((it + 1) / 2) & 1);
                mla_issue_values<T>(o, p, v_half + Tr::kTileBytes);
                wgmma_wait<0>();  // P1 V1_L: tile it + 3 may take boxes 0-3 of stage 1
                fence_fragments(o);
                named_barrier_sync(kOwnWarpgroup, 128);
                if (tid == 0 && it + 3 < tiles) load(it + 3, 0, kLow);
            }
            if (it + 2 < tiles) {
                zero_tail(it + 2);
                mla_issue_scores<T, kRope>(s, q_tile, k_tile(it + 2), stage_full(it + 2), ((it + 2) / 2) & 1);
            }
        }
    } else {
        float s[8][4];
        if (tiles > 1) {
            zero_tail(1);
            fence_fragments(o);
            mla_issue_scores<T, kRope>(s, q_tile, k_tile(1), stage_full(1), 0);
        }
        for (int it = 0; it < tiles; it += 2) {
            const bool second = it + 1 < tiles;
            named_barrier_sync(kP0Ready, 256);
            float f0[2], f1[2], m0[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                f0[h] = scale0[row_a + 8 * h];
                m0[h] = row_max[row_a + 8 * h];
            }
            wgmma_wait<0>();  // S1
            fence_fragments(s);
            fence_fragments(o);
            if (second) {
                float mx[2], m1[2], base[2];
                mask_and_max(s, it + 1, mx);
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    m1[h] = fmaxf(m0[h], mx[h]);
                    base[h] = m1[h] == Consts<float>::neg_inf() ? 0.0f : m1[h];
                    f1[h] = fast_exp2(m0[h] - base[h]);
                }
                __syncwarp();  // the quad's reads of the maximum before its first thread rewrites it
                if (t == 0) {
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        row_max[row_a + 8 * h] = m1[h];
                        scale1[row_a + 8 * h] = f1[h];
                    }
                }
                named_barrier_arrive(kScale1Ready, 256);
                exponentiate(s, base, sum);
            } else {
                f1[0] = f1[1] = 1.0f;  // no odd tile: the maximum stays m0
                if (t == 0) scale1[row_a] = scale1[row_a + 8] = 1.0f;
                named_barrier_arrive(kScale1Ready, 256);
            }
            // O_R to m0, then P0 V0_R; then to m1, and P1 V1_R.
            rescale(o, f0);
            unsigned p[4][4], p_own[4][4];
            if (second) to_operand<T, 4>(p_own, s);
            read_slots(p);
            if (second) write_slots(p_own);  // (the slots this thread has just read)
            named_barrier_arrive(kP1Ready, 256);
            // Boxes 4-7 of the even tile: warpgroup 0 waited for them, but this warpgroup's own wait is
            // what makes the copies visible to its products (and it alone refills them: no later phase).
#pragma unroll
            for (int box = kLow; box < 2 * kLow; ++box) mbarrier_wait(&stage_full(it)[box], (it / 2) & 1);
            mla_issue_values<T>(o, p, v_half);
#pragma unroll
            for (int h = 0; h < 2; ++h) l[h] = l[h] * f0[h] * f1[h] + sum[h];
            wgmma_wait<0>();  // P0 V0_R: tile it + 2 may take boxes 4-8 of stage 0
            fence_fragments(o);
            named_barrier_sync(kOwnWarpgroup + 1, 128);
            if (tid == 0 && it + 2 < tiles) {
                load(it + 2, kLow, kRope);
                if (it + 3 < tiles) load(it + 3, kRope, kBoxes);  // (S1 is done: its rope box is free)
            }
            rescale(o, f1);
            if (second) {
                mla_issue_values<T>(o, p_own, v_half + Tr::kTileBytes);
                wgmma_wait<0>();  // P1 V1_R: tile it + 3 may take boxes 4-8 of stage 1
                fence_fragments(o);
                named_barrier_sync(kOwnWarpgroup + 1, 128);
                if (tid == 0 && it + 3 < tiles) load(it + 3, kLow, kRope);
            }
            if (it + 3 < tiles) {
                zero_tail(it + 3);
                mla_issue_scores<T, kRope>(s, q_tile, k_tile(it + 3), stage_full(it + 3), ((it + 3) / 2) & 1);
            }
        }
    }
    wgmma_wait<0>();
    fence_fragments(o);
    const bool bad = entry.bad || __syncthreads_or(bad_page);  // also: every product and hand-off is done

    // The rows' sums: each warpgroup's over its quads, then the two added.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const float x = group_sum<4>(l[h]);
        if (t == 0) row_sum[wg * Tr::kRows + row_a + 8 * h] = x;
    }
    __syncthreads();
    const float nan = __int_as_float(0x7fc00000);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = r0 + row_a + 8 * h;
        if (r >= rows) continue;
        const float sum = row_sum[row_a + 8 * h] + row_sum[Tr::kRows + row_a + 8 * h];
        // A row that saw no key is 0 with lse -inf; a NaN score makes the sum NaN, and NaN != 0.
        const float inv = bad ? nan : (sum != 0.0f ? 1.0f / sum : 0.0f);
        const float m = row_max[row_a + 8 * h];
        const float lse = bad ? nan : (sum != 0.0f ? kLn2F * (m + __log2f(sum)) : Consts<float>::neg_inf());
        store_row_pairs<T, Tr>(c, b, split, r, o, h, 256 * wg + 2 * t, inv, lse, wg == 0 && t == 0);
    }
    if (c.num_splits > 1) merge_splits<T, Tr>(c, smem_raw);
}

}  // namespace cupyflash
