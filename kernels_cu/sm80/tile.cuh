// Tile traits and tile movement of the tensor-core (mma.sync) kernels, float16 and bfloat16 (and for the
// forward float32 in bfloat16 parts and float64 on the float64 tensor cores, sm80/operands.cuh), sm_80+.
//
// A CTA owns kBlockM = 128 query rows (64 for float64); each of its warps computes kMTiles consecutive 16-row m-tiles with
// m16n8k16 mma.sync (fragment maps in mma.cuh), so every K/V fragment read from shared memory feeds
// kMTiles tensor-core instructions. Q, K and V tiles are kHeadDim columns wide, kHeadDim being
// the compiled bucket (a multiple of 32, at most 256) that covers both headdim and headdim_v; columns past
// the real head dims are zero-filled on load, so they add nothing to q.k and produce output columns that
// are never written.
//
// Shared-memory rows are padded by 16 bytes (kLd = kHeadDim + 8 16-bit elements): the eight 16-byte row
// segments one ldmatrix phase reads then fall into eight different bank groups for every bucket (row
// stride mod 128 bytes is 16 or 80), and cp.async writes stay 16-byte aligned. float32 and float64 tiles
// pad as their operand loads need (Sm80FwdTraits::kLd, kLdV).
#pragma once
#include "common/dtypes.cuh"
#include "common/launch.cuh"
#include "sm80/mma.cuh"

namespace cupyflash {

template <typename T, int kHeadDim_, int kBlockN_, int kMTiles_>
struct Sm80FwdTraits {
    static constexpr int kHeadDim = kHeadDim_;
    static constexpr int kBlockN = kBlockN_;    // keys per iteration
    static constexpr int kMTiles = kMTiles_;    // 16-row m-tiles per warp: each K/V fragment feeds kMTiles mmas
    static constexpr int kBlockM = sizeof(T) == 8 ? 64 : 128;  // query rows per CTA (float64: 64 fit)
    static constexpr int kWarps = kBlockM / (16 * kMTiles);
    static constexpr int kThreads = 32 * kWarps;
    // Padded shared-memory rows, in elements: Q and K (kLd), V (kLdV). 16-bit: 16 bytes of padding.
    // float32: three bfloat16 planes per tile (Sm80PlaneOperands), each padded as a 16-bit tile, kQPlane,
    // kKPlane and kVPlane elements apart. float64: kLd = 4 doubles (8 words mod 32), where a half-warp's
    // loads of rows g, columns t (Q, K) fall in 32 banks, and kLdV = 2 doubles (4 words mod 32), where
    // those of rows 2t and 2t + 1 do.
    static constexpr int kPlanes = sizeof(T) == 4 ? 3 : 1;
    static constexpr int kStoredBytes = sizeof(T) == 4 ? 2 : static_cast<int>(sizeof(T));
    static constexpr int kLd = sizeof(T) == 8 ? kHeadDim + 4 : kHeadDim + 8;
    static constexpr int kLdV = sizeof(T) == 8 ? kHeadDim + 2 : kLd;
    static constexpr int kQPlane = kBlockM * kLd;
    static constexpr int kKPlane = kBlockN * kLd;
    static constexpr int kVPlane = kBlockN * kLdV;
    // K/V stages: block j + 1 loads while block j is computed. Three stages, where they fit in 99 KB
    // (the per-block limit of sm_86/sm_89), also drop the barrier at the end of each iteration: the
    // stage being refilled was last read two iterations back, before the previous iteration's barrier,
    // so warps drift apart and one warp's softmax overlaps another's mma.
    static constexpr int kSmemBytesPerStageSet = kPlanes * kBlockN * (kLd + kLdV) * kStoredBytes;
    static constexpr int kQSmemBytes = kPlanes * kBlockM * kLd * kStoredBytes;
    // Per-CTA values and the tile queue (sm80_fwd.cu), at the end of the dynamic shared memory.
    static constexpr int kStateBytes = kCtaStateBytes;
    // float64 at head dim 128 (Q alone 67.6 KB): two stages would leave one 4-warp CTA per SM (ncu: 6%
    // occupancy), one stage fits two in sm_90's 227 KB (sm80/fwd.cu staggers the K and V loads).
    static constexpr int kTwoCtaBytes = 113 * 1024;
    static constexpr int kStages = kQSmemBytes + 3 * kSmemBytesPerStageSet + kStateBytes <= 99 * 1024 ? 3
                                   : sizeof(T) == 8 && kQSmemBytes + 2 * kSmemBytesPerStageSet + kStateBytes > kTwoCtaBytes
                                       ? 1
                                       : 2;
    // Q stays in registers as the A operand of every q.k product while it costs at most 32 registers;
    // otherwise each warp re-reads its rows from shared memory, which keeps the large tiles spill-free.
    // float32 operands take twice the registers of 16-bit ones before they are split into parts.
    static constexpr bool kQInRegs = sizeof(T) == 2 && kHeadDim * kMTiles <= 128;
    // Two 4-warp CTAs per SM (the 255-register cap allows both); one 8-warp CTA otherwise.
    static constexpr int kMinCtasPerSm = kWarps <= 4 ? 2 : 1;
    static constexpr int kSmemBytes = kQSmemBytes + kStages * kSmemBytesPerStageSet + kStateBytes;
    static_assert(kHeadDim % 32 == 0 && kHeadDim <= 256, "head-dim buckets are multiples of 32 up to 256");
    static_assert(kBlockN % 16 == 0, "keys are consumed 16 at a time");
    static_assert(sizeof(T) != 8 || kMTiles == 1, "float64 fragments fit one m-tile per warp");
    static_assert(kBlockM % (16 * kMTiles) == 0, "the CTA's rows must split evenly among its warps");
};

// Stages rows [r0, r0 + kRows) of a (rows x cols) row-major slice (row stride in elements) into shared
// memory dst[kRows][kLd], zero-filling rows >= rows and columns >= cols up to kCols. With vec (the host
// checked 16-byte alignment of the base pointer and the row stride) each thread issues 16-byte cp.async
// copies that complete in the caller's commit group; otherwise it falls back to element loads.
template <int kRows, int kCols, int kLd, int kThreads, typename T>
__device__ __forceinline__ void load_tile_async(T* dst, const T* src, long long row_stride, int r0, int rows,
                                                int cols, bool vec) {
    constexpr int kVec = 16 / static_cast<int>(sizeof(T));  // elements of a 16-byte chunk
    constexpr int kChunks = kCols / kVec;  // 16-byte chunks per row
    if (vec && r0 + kRows <= rows && cols >= kCols) {
        // Interior tile: every chunk is whole, so a chunk's address is the tile's base plus an offset
        // that does not depend on the tile (the bounds checks below cost as much as the copies).
        const T* base = src + static_cast<long long>(r0) * row_stride;
#pragma unroll 4
        for (int idx = threadIdx.x; idx < kRows * kChunks; idx += kThreads) {
            const int r = idx / kChunks;
            const int c = (idx % kChunks) * kVec;
            cp_async_16(smem_addr(dst + r * kLd + c), base + r * row_stride + c, 16);
        }
    } else if (vec) {
#pragma unroll 4
        for (int idx = threadIdx.x; idx < kRows * kChunks; idx += kThreads) {
            const int r = idx / kChunks;
            const int c = (idx % kChunks) * kVec;
            const int row = r0 + r;
            const int valid = row < rows ? min(kVec, max(0, cols - c)) : 0;
            // A chunk with nothing to read still needs a valid, aligned source address: use the base.
            const T* g = valid > 0 ? src + static_cast<long long>(row) * row_stride + c : src;
            cp_async_16(smem_addr(dst + r * kLd + c), g, valid * static_cast<int>(sizeof(T)));
        }
    } else {
        // Element copies; rolled for float64, whose d128 forward spilled this loop's addresses unrolled.
        constexpr int kUnroll = sizeof(T) == 8 ? 1 : 4;
#pragma unroll (kUnroll)
        for (int idx = threadIdx.x; idx < kRows * kCols; idx += kThreads) {
            const int r = idx / kCols;
            const int c = idx % kCols;
            const int row = r0 + r;
            dst[r * kLd + c] = (row < rows && c < cols) ? src[static_cast<long long>(row) * row_stride + c]
                                                        : from_acc<T>(0.0f);
        }
    }
}

// A fragment (16 rows x 16 columns starting at (row0, col0)) of a row-major shared tile.
template <int kLd, typename T>
__device__ __forceinline__ void load_a_frag(unsigned (&a)[4], const T* tile, int row0, int col0) {
    const int lane = threadIdx.x % 32;
    const int row = row0 + lane % 8 + 8 * ((lane / 8) % 2);
    const int col = col0 + 8 * (lane / 16);
    ldmatrix_x4(a, smem_addr(tile + row * kLd + col));
}

// A fragment (16 rows x 16 columns starting at (row0, col0)) of a matrix stored transposed: the tile
// holds A^T row-major, A[m][k] at tile[k * kLd + m]. ldmatrix.trans of the four 8x8 blocks
// (m 0-7 | 8-15) x (k 0-7 | 8-15) gives the same registers as load_a_frag of the untransposed matrix.
template <int kLd, typename T>
__device__ __forceinline__ void load_a_frag_trans(unsigned (&a)[4], const T* tile, int row0, int col0) {
    const int lane = threadIdx.x % 32;
    const int k = col0 + lane % 8 + 8 * (lane / 16);
    const int m = row0 + 8 * ((lane / 8) % 2);
    ldmatrix_x4_trans(a, smem_addr(tile + k * kLd + m));
}

// B fragments of two n-tiles for S = Q K^T: keys n0..n0+15 (rows of the K tile) and head-dim columns
// k0..k0+15. b[0..1] serve keys n0..n0+7, b[2..3] keys n0+8..n0+15.
template <int kLd, typename T>
__device__ __forceinline__ void load_bt_frags(unsigned (&b)[4], const T* tile, int n0, int k0) {
    const int lane = threadIdx.x % 32;
    const int row = n0 + lane % 8 + 8 * (lane / 16);
    const int col = k0 + 8 * ((lane / 8) % 2);
    ldmatrix_x4(b, smem_addr(tile + row * kLd + col));
}

// B fragments of two n-tiles for O = P V: keys k0..k0+15 (rows of the V tile) and value columns
// c0..c0+15, transposed on load. b[0..1] serve columns c0..c0+7, b[2..3] columns c0+8..c0+15.
template <int kLd, typename T>
__device__ __forceinline__ void load_b_frags_trans(unsigned (&b)[4], const T* tile, int k0, int c0) {
    const int lane = threadIdx.x % 32;
    const int row = k0 + lane % 8 + 8 * ((lane / 8) % 2);
    const int col = c0 + 8 * (lane / 16);
    ldmatrix_x4_trans(b, smem_addr(tile + row * kLd + col));
}

// One n-tile of load_bt_frags (keys n0..n0+7): b[0..1].
template <int kLd, typename T>
__device__ __forceinline__ void load_bt_frag(unsigned* b, const T* tile, int n0, int k0) {
    const int lane = threadIdx.x % 32;
    ldmatrix_x2(b, smem_addr(tile + (n0 + lane % 8) * kLd + k0 + 8 * ((lane / 8) % 2)));
}

// One n-tile of load_b_frags_trans (columns c0..c0+7): b[0..1].
template <int kLd, typename T>
__device__ __forceinline__ void load_b_frag_trans(unsigned* b, const T* tile, int k0, int c0) {
    const int lane = threadIdx.x % 32;
    ldmatrix_x2_trans(b, smem_addr(tile + (k0 + lane % 8 + 8 * ((lane / 8) % 2)) * kLd + c0));
}

}  // namespace cupyflash
