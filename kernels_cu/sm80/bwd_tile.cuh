// Tile traits and warp-level matrix products of the tensor-core backward (float16/bfloat16, and
// float32/float64 through kWide; sm_80+, head-dim buckets up to 256).
//
// One CTA of 8 warps owns kBlockN keys of one (batch, kv head) and walks blocks of kBlockM queries.
// Each iteration has three phases, and each phase splits its own output tile among the 8 warps
// (WarpGrid below):
//   1. S^T = K Q^T and dP^T = V dO^T (kBlockN x kBlockM); P^T and dS^T go to shared memory as T;
//   2. dQ_part = dS K (kBlockM x kHeadDim), added into a float32 buffer in device memory;
//   3. dV += P^T dO and dK += dS^T Q (kBlockN x kHeadDim), in registers for the CTA's whole life.
// Shared memory: K and V (resident), kStages buffers of Q, dO and their rows' lse and delta (with 2, the
// next block loads while this one is computed), P^T and dS^T, and the per-CTA state (sm80/bwd.cu). Tile rows are padded by 16 bytes
// (see sm80/tile.cuh) so the 8 rows one ldmatrix phase reads fall in 8 different bank groups.
#pragma once
#include "sm80/mma.cuh"
#include "sm80/operands.cuh"
#include "sm80/tile.cuh"

namespace cupyflash {

// A (kRows x kCols) tile split among 8 warps as kWarpsR x kWarpsC, each warp computing a
// (kWarpRows x kWarpCols) piece: whole 16-row m-tiles by whole 8-column n-tiles. 32-row warp tiles
// are preferred (each B fragment then feeds two m-tiles, halving shared-memory reads per mma); 16 rows
// are the fallback when 32 would leave a column count that is not a multiple of 8.
template <int kRows, int kCols>
struct WarpGrid {
    static constexpr bool kTall = kRows % 32 == 0 && kRows / 32 <= 8 && (kCols * (kRows / 32)) % (8 * 8) == 0;
    static constexpr int kWarpsR = kTall ? kRows / 32 : kRows / 16;
    static constexpr int kWarpsC = 8 / kWarpsR;
    static constexpr int kWarpRows = kRows / kWarpsR;
    static constexpr int kWarpCols = kCols / kWarpsC;
    static constexpr int kMTiles = kWarpRows / 16;
    static constexpr int kNTiles = kWarpCols / 8;
    static_assert(kWarpsR * kWarpsC == 8 && kWarpsC * kWarpCols == kCols, "the tile must split among 8 warps");
    static_assert(kWarpRows % 16 == 0 && kWarpCols % 8 == 0, "warp tiles are whole m-tiles by whole n-tiles");

    __device__ __forceinline__ static int row0(int warp) { return (warp / kWarpsC) * kWarpRows; }
    __device__ __forceinline__ static int col0(int warp) { return (warp % kWarpsC) * kWarpCols; }
};

// Registers decide the passes. dK and dV take kDkvFloats accumulators per thread for the CTA's whole
// life; on top of them, phase 1 holds S^T and dP^T and phase 2 the dQ share. Where the sum would pass
// kFloatBudget (measured: beyond it ptxas spills under the 255-register cap), phase 1 covers the
// query block in two halves and phase 2 the head dim in column passes, re-reading A fragments each
// pass instead of spilling.
constexpr bool dq_passes_fit(int dkv_floats, int dq_floats, int headdim, int passes, int budget) {
    return dkv_floats + dq_floats / passes <= budget && headdim % (8 * passes) == 0;
}

// kWords: registers per accumulator (2 for float64); kFloatBudget the 16-bit kernels' measured budget,
// and the float32 kernels', whose split operands take what the budget leaves to fragments.
template <int kBlockN, int kBlockM, int kHeadDim, int kWords = 1>
struct Sm80BwdPasses {
    static constexpr int kFloatBudget = 144;
    static constexpr int kDkvFloats = kWords * 2 * kBlockN * kHeadDim / 256;
    static constexpr int kSdp = kDkvFloats + kWords * 2 * kBlockN * kBlockM / 256 <= kFloatBudget ? 1 : 2;
    static constexpr int kDqFloats = kWords * kBlockM * kHeadDim / 256;
    static constexpr int kDq = dq_passes_fit(kDkvFloats, kDqFloats, kHeadDim, 1, kFloatBudget)   ? 1
                               : dq_passes_fit(kDkvFloats, kDqFloats, kHeadDim, 2, kFloatBudget) ? 2
                                                                                                 : 4;
};

template <typename T, int kHeadDim_, int kBlockN_, int kBlockM_, int kStages_>
struct Sm80BwdTraits {
    static constexpr int kHeadDim = kHeadDim_;
    static constexpr int kBlockN = kBlockN_;  // keys owned by the CTA
    static constexpr int kBlockM = kBlockM_;  // queries per iteration
    static constexpr int kStages = kStages_;  // buffers of the streamed Q/dO blocks
    static constexpr int kWarps = 8;
    static constexpr int kThreads = 32 * kWarps;
    // float32 and float64 (kWide): P^T and dS^T in T like the other tiles (16-bit: the next products'
    // operands; wide: split into parts, or multiplied, as they are read), the rows' lse in float64
    // (16-bit: lse * LOG2E in float32) and delta in the accumulators' type (sm80/bwd.cu).
    static constexpr bool kWide = sizeof(T) >= 4;
    using Acc = acc_t<T>;
    using LseStore = lse_t<T>;
    // Padded rows, in elements: of the K, V, Q and dO tiles (kLd) and of the P^T and dS^T tiles (kLdP).
    // 16-bit: 16 bytes of padding (ldmatrix); float32: 8 words (8-byte fragment loads of rows g in 32
    // banks, sm80/operands.cuh); float64: 4 doubles, likewise.
    static constexpr int kLd = kHeadDim + (sizeof(T) == 8 ? 4 : 8);
    static constexpr int kLdP = kBlockM + (sizeof(T) == 8 ? 4 : 8);
    using Passes = Sm80BwdPasses<kBlockN, kBlockM, kHeadDim, static_cast<int>(sizeof(Acc)) / 4>;
    using SdpGrid = WarpGrid<kBlockN, kBlockM / Passes::kSdp>;  // phase 1, per pass
    using DqGrid = WarpGrid<kBlockM, kHeadDim / Passes::kDq>;   // phase 2, per pass
    using DkvGrid = WarpGrid<kBlockN, kHeadDim>;                // phase 3
    static constexpr int kKeyTileElems = kBlockN * kLd;
    static constexpr int kQueryTileElems = kBlockM * kLd;
    static constexpr int kProbTileElems = kBlockN * kLdP;
    static constexpr int kStateBytes = kCtaStateBytes;  // per-CTA state and tile queue, at the end
    static constexpr int kSmemBytes = (2 * kKeyTileElems + 2 * kStages * kQueryTileElems) * static_cast<int>(sizeof(T)) +
                                      2 * kProbTileElems * static_cast<int>(sizeof(T)) +
                                      kStages * kBlockM * static_cast<int>(sizeof(LseStore) + sizeof(Acc)) + kStateBytes;
    static_assert(kHeadDim % 32 == 0 && kHeadDim <= 256, "head-dim buckets are multiples of 32 up to 256");
    static_assert(kStages == 1 || kStages == 2, "one or two query buffers");
};

// acc[x][mt][nt] = A_x[a_row0 + 16 mt + .., :] . B_x[b_row0 + 8 nt + .., :] over kDepth columns for
// the two products x = 0, 1 (S^T = K Q^T and dP^T = V dO^T), all tiles row-major with the reduction along
// their rows. The two run in one k loop: a warp tile of phase 1 is small (4-16 accumulators per
// product), and interleaving the products doubles the independent mma between two that update the
// same accumulator.
template <int kMTiles, int kNTiles, int kDepth, int kLd, typename T>
__device__ __forceinline__ void warp_abt2(float (&acc)[2][kMTiles][kNTiles][4], const T* a0, const T* b0,
                                          const T* a1, const T* b1, int a_row0, int b_row0) {
    const T* const a[2] = {a0, a1};
    const T* const b[2] = {b0, b1};
#pragma unroll
    for (int x = 0; x < 2; ++x) {
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
            for (int nt = 0; nt < kNTiles; ++nt) acc[x][mt][nt][0] = acc[x][mt][nt][1] = acc[x][mt][nt][2] = acc[x][mt][nt][3] = 0.0f;
        }
    }
#pragma unroll 2  // see warp_ab
    for (int kk = 0; kk < kDepth / 16; ++kk) {
        unsigned af[2][kMTiles][4];
#pragma unroll
        for (int x = 0; x < 2; ++x) {
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt) load_a_frag<kLd>(af[x][mt], a[x], a_row0 + 16 * mt, 16 * kk);
        }
#pragma unroll
        for (int np = 0; np < kNTiles / 2; ++np) {
            unsigned bf[2][4];
#pragma unroll
            for (int x = 0; x < 2; ++x) load_bt_frags<kLd>(bf[x], b[x], b_row0 + 16 * np, 16 * kk);
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
                for (int x = 0; x < 2; ++x) {
                    mma_16816<T>(acc[x][mt][2 * np], af[x][mt], bf[x]);
                    mma_16816<T>(acc[x][mt][2 * np + 1], af[x][mt], bf[x] + 2);
                }
            }
        }
        if (kNTiles % 2) {
            unsigned bf[2][2];
#pragma unroll
            for (int x = 0; x < 2; ++x) load_bt_frag<kLd>(bf[x], b[x], b_row0 + 8 * (kNTiles - 1), 16 * kk);
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
                for (int x = 0; x < 2; ++x) mma_16816<T>(acc[x][mt][kNTiles - 1], af[x][mt], bf[x]);
            }
        }
    }
}

// acc[mt][nt] += A[a_row0 + 16 mt + .., 0..kDepth) x B[0..kDepth, b_col0 + 8 nt + ..), B row-major
// [k][n] (read through ldmatrix.trans). A is row-major [m][k] (dV += P^T dO, dK += dS^T Q) or, with
// kATransposed, stored as its transpose [k][m] (dQ += dS K with dS^T in shared memory).
template <bool kATransposed, int kMTiles, int kNTiles, int kDepth, int kLdA, int kLdB, typename T>
__device__ __forceinline__ void warp_ab(float (&acc)[kMTiles][kNTiles][4], const T* a, int a_row0, const T* b,
                                        int b_col0) {
    // Fully unrolled, ptxas issues every k-step's ldmatrix up front and the fragments (up to ~100
    // registers) push the dK/dV accumulators into local memory; two k-steps at a time keep them in
    // registers and still overlap one step's loads with the other's mma (measured on the H200: 3%
    // faster than one step, and no spills where the full unroll spilled 16-56 bytes).
#pragma unroll 2
    for (int kk = 0; kk < kDepth / 16; ++kk) {
        unsigned af[kMTiles][4];
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
            if (kATransposed) {
                load_a_frag_trans<kLdA>(af[mt], a, a_row0 + 16 * mt, 16 * kk);
            } else {
                load_a_frag<kLdA>(af[mt], a, a_row0 + 16 * mt, 16 * kk);
            }
        }
#pragma unroll
        for (int np = 0; np < kNTiles / 2; ++np) {
            unsigned bf[4];
            load_b_frags_trans<kLdB>(bf, b, 16 * kk, b_col0 + 16 * np);
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt) {
                mma_16816<T>(acc[mt][2 * np], af[mt], bf);
                mma_16816<T>(acc[mt][2 * np + 1], af[mt], bf + 2);
            }
        }
        if (kNTiles % 2) {
            unsigned bf[2];
            load_b_frag_trans<kLdB>(bf, b, 16 * kk, b_col0 + 8 * (kNTiles - 1));
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt) mma_16816<T>(acc[mt][kNTiles - 1], af[mt], bf);
        }
    }
}

// The float32 and float64 backward's products (Sm80Operands: float32 in bfloat16 parts with split sums,
// float64 on the float64 tensor cores). acc[0] = S^T = K Q^T summed exactly as the forward sums S = Q K^T
// (sm80/fwd.cu: each k-step's leading products from zero, then added in k order; float32's small
// products chained in their own sum, the products' roles swapped), so that P^T recomputes the
// forward's probabilities from bitwise the same scores; acc[1] = dP^T = V dO^T summed the same way.
// The k loop is rolled: the split operands of a k-step take the registers an unrolled one would give
// the next step's loads.
template <typename Ops, int kMTiles, int kNTiles, int kDepth, int kLd, typename T>
__device__ __forceinline__ void warp_abt2_wide(typename Ops::Acc (&acc)[2][kMTiles][kNTiles][4], const T* a0, const T* b0,
                                               const T* a1, const T* b1, int a_row0, int b_row0) {
    using Acc = typename Ops::Acc;
    const T* const a[2] = {a0, a1};
    const T* const b[2] = {b0, b1};
    Acc small[2][Ops::kSmallSum ? kMTiles : 1][Ops::kSmallSum ? kNTiles : 1][4];
#pragma unroll
    for (int x = 0; x < 2; ++x) {
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
            for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    acc[x][mt][nt][e] = Acc(0);
                    if constexpr (Ops::kSmallSum) small[x][mt][nt][e] = Acc(0);
                }
            }
        }
    }
#pragma unroll 1
    for (int kk = 0; kk < kDepth / Ops::kK; ++kk) {
        typename Ops::A af[2][kMTiles];
#pragma unroll
        for (int x = 0; x < 2; ++x) {
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt) Ops::template load_q<kLd>(af[x][mt], a[x], a_row0 + 16 * mt, Ops::kK * kk);
        }
        // n-tiles in pairs (an odd last one alone: the fragments of its missing partner are never used,
        // and their loads and splits are dropped by the compiler).
#pragma unroll
        for (int np = 0; np < (kNTiles + 1) / 2; ++np) {
            typename Ops::B2 bf[2];
#pragma unroll
            for (int x = 0; x < 2; ++x) Ops::template load_k<kLd>(bf[x], b[x], b_row0 + 16 * np, Ops::kK * kk);
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
                for (int x = 0; x < 2; ++x) {
#pragma unroll
                    for (int half = 0; half < 2 && 2 * np + half < kNTiles; ++half) {
                        if constexpr (Ops::kSmallSum) {
                            Ops::template mma_rn<true>(acc[x][mt][2 * np + half], small[x][mt][2 * np + half], af[x][mt], bf[x], half);
                        } else {
                            Ops::mma_rn(acc[x][mt][2 * np + half], af[x][mt], bf[x], half);
                        }
                    }
                }
            }
        }
    }
    if constexpr (Ops::kSmallSum) {
#pragma unroll
        for (int x = 0; x < 2; ++x) {
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
                for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc[x][mt][nt][e] += small[x][mt][nt][e];
                }
            }
        }
    }
}

// acc[mt][nt] += A[a_row0 + 16 mt + .., 0..kDepth) x B[0..kDepth, b_col0 + 8 nt + ..) for the wide dtypes,
// per 16 columns summed from zero and then added (the products' roundings, truncations for float32, are
// of this block's share, not of the running dK, dV: see Sm80Operands' split sums). B is row-major [k][n];
// A row-major [m][k] (P^T, dS^T) or, with kATransposed, stored [k][m] (dS from dS^T).
template <typename Ops, bool kATransposed, int kMTiles, int kNTiles, int kDepth, int kLdA, int kLdB, typename TA, typename TB>
__device__ __forceinline__ void warp_ab_wide(typename Ops::Acc (&acc)[kMTiles][kNTiles][4], const TA* a, int a_row0,
                                             const TB* b, int b_col0) {
    using Acc = typename Ops::Acc;
#pragma unroll
    for (int np = 0; np < (kNTiles + 1) / 2; ++np) {  // pairs of n-tiles, as warp_abt2_wide takes them
        Acc z[kMTiles][2][4];
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
            for (int i = 0; i < 8; ++i) z[mt][i / 4][i % 4] = Acc(0);
        }
#pragma unroll 1
        for (int kk = 0; kk < kDepth / Ops::kK; ++kk) {
            typename Ops::A af[kMTiles];
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt) {
                if constexpr (kATransposed) {
                    Ops::template load_a_km<kLdA>(af[mt], a, a_row0 + 16 * mt, Ops::kK * kk);
                } else {
                    Ops::template load_q<kLdA>(af[mt], a, a_row0 + 16 * mt, Ops::kK * kk);
                }
            }
            typename Ops::B2 bf;
            Ops::template load_b_kn<kLdB>(bf, b, Ops::kK * kk, b_col0 + 16 * np);
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
                for (int half = 0; half < 2 && 2 * np + half < kNTiles; ++half) {
                    if constexpr (Ops::kSmallSum) {
                        Ops::mma(z[mt][half], z[mt][half], af[mt], bf, half);
                    } else {
                        Ops::mma(z[mt][half], af[mt], bf, half);
                    }
                }
            }
        }
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
            for (int i = 0; i < 8 && 2 * np + i / 4 < kNTiles; ++i) acc[mt][2 * np + i / 4][i % 4] += z[mt][i / 4][i % 4];
        }
    }
}

}  // namespace cupyflash
