// Tile traits and tile operations of the general path (SIMT, any dtype, any head dim).
//
// The general path is the correctness baseline: float32 and float64, head dims the tensor-core kernels
// do not cover, and GPUs without them. A CTA of kThreads threads owns a kBlockM x kBlockN score tile:
// thread t owns row t / kLanesPerRow and the columns lane + kLanesPerRow * j of it
// (lane = t % kLanesPerRow), so a row's reductions stay inside kLanesPerRow consecutive lanes.
// Products over the head dim are staged through shared memory kDepth columns at a time, so any head
// dim works with a fixed register budget; each CTA writes one kChunk-wide column chunk of its output
// (the grid walks the chunks), which bounds the accumulator registers for head dims up to 512 and beyond.
#pragma once
#include "common/dtypes.cuh"

namespace cupyflash {

template <typename T>
struct GeneralTraits {
    using Acc = acc_t<T>;
    static constexpr int kThreads = 128;
    // CTAs per SM that __launch_bounds__ asks ptxas to fit. 3 caps registers at 65536 / (128 * 3) = 170,
    // which fits the float32 tiles and keeps ptxas from squeezing them to 64 registers (that spilled
    // in general_bwd_dq for sm_90); float64 dK/dV needs more than 170 (it spilled 240 bytes on sm_90),
    // so float64 asks for 2 (a 255-register cap).
    static constexpr int kMinCtasPerSm = sizeof(Acc) == 8 ? 2 : 3;
    // Dropout's generator calls need more registers than 170 in dK/dV (8 bytes spilled): 2 CTAs there.
    static constexpr int min_ctas_per_sm(bool dropout) { return dropout ? 2 : kMinCtasPerSm; }
    static constexpr int kBlockM = 32;  // score-tile rows: queries (forward, dQ) or keys (dK/dV)
    static constexpr int kBlockN = 32;  // score-tile columns: keys (forward, dQ) or queries (dK/dV)
    static constexpr int kLanesPerRow = kThreads / kBlockM;           // 4
    static constexpr int kScoresPerThread = kBlockN / kLanesPerRow;   // 8
    static constexpr int kDepth = 32;   // head-dim columns staged per step of a score product
    static constexpr int kChunk = 64;   // output columns per CTA
    static constexpr int kOutPerThread = kChunk / kLanesPerRow;       // 16
    // Blocked summation: products are summed in groups of kSumGroup before they join the running sum,
    // so rounding error grows like kSumGroup + n / kSumGroup terms instead of n. The plain float32
    // implementation the tests compare against (BLAS) keeps several partial sums per dot product too;
    // strictly sequential sums over headdim 128 or 147 keys were measured 2-3x less accurate.
    static constexpr int kSumGroup = 8;
    static_assert(kThreads % kBlockM == 0 && kBlockN % kLanesPerRow == 0 && kChunk % kLanesPerRow == 0,
                  "tile shape must divide evenly among the threads");
    static_assert(kDepth % kSumGroup == 0 && kBlockN % kSumGroup == 0, "summation groups must tile the loops");
};

// Shared memory of one CTA. Rows are padded by one element so that the column-strided reads of a warp
// fall in distinct banks. float64: 42 KB, float32: 21 KB (under the 48 KB static limit).
template <typename T>
struct GeneralSmem {
    using Tr = GeneralTraits<T>;
    using Acc = typename Tr::Acc;
    static constexpr int kLdDepth = Tr::kDepth + 1;
    static constexpr int kLdW = Tr::kBlockN + 1;
    static constexpr int kLdX = Tr::kChunk + 1;
    Acc a[Tr::kBlockM * kLdDepth];  // row operand of a score product, one depth slice
    Acc b[Tr::kBlockN * kLdDepth];  // column operand of a score product, one depth slice
    Acc w[Tr::kBlockM * kLdW];      // weights of an accumulation product (P or dS), row-major
    Acc x[Tr::kBlockN * kLdX];      // right operand of an accumulation product, one column chunk
};

// The rows of one (batch, head) slice of a (batch, seqlen, heads, dim) tensor whose last axis is
// contiguous: element (r, c) is ptr[r * row_stride + c]. Reads outside rows x cols return 0.
template <typename T>
struct RowView {
    const T* ptr;
    long long row_stride;
    int rows;
    int cols;

    __device__ __forceinline__ acc_t<T> load(int r, int c) const {
        return (r < rows && c < cols) ? to_acc(ptr[static_cast<long long>(r) * row_stride + c]) : acc_t<T>(0);
    }
};

// dst[r * ld + c] = src(r0 + r, c0 + c) for r < kRows, c < kCols; consecutive threads read consecutive
// columns, so each row segment is one coalesced access.
template <int kRows, int kCols, int kLd, int kThreads, typename T>
__device__ __forceinline__ void stage(acc_t<T>* dst, const RowView<T>& src, int r0, int c0) {
#pragma unroll 4
    for (int idx = threadIdx.x; idx < kRows * kCols; idx += kThreads) {
        const int r = idx / kCols;
        const int c = idx % kCols;
        dst[r * kLd + c] = src.load(r0 + r, c0 + c);
    }
}

// sum + comp += x, with the rounding error of sum + x kept in comp (Knuth's TwoSum: exact in any
// rounding-to-nearest arithmetic, branch-free).
template <typename Acc>
__device__ __forceinline__ void add_compensated(Acc& sum, Acc& comp, Acc x) {
    const Acc t = sum + x;
    const Acc x_part = t - sum;
    comp += (sum - (t - x_part)) + (x - x_part);
    sum = t;
}

// s[j] = sum_d A(a0 + row, d) * B(b0 + lane + kLanesPerRow * j, d) over d < depth. Rows or columns
// outside the views contribute 0. All threads of the CTA must call it (it synchronizes).
//
// kScores (the scores q.k), float32: the groups' partial sums join s with TwoSum compensation, so that s
// is within about a rounding of the groups' exact sum; a score then agrees with the tensor-core forward's
// float32 scores (kernels_cu/sm80/operands.cuh) to a fraction of an ulp, where plain sums differ by a
// few. The backward's probabilities exp(s - lse) take s from here and lse from whichever forward ran,
// and at scores in the thousands (an ulp of 2^-12) a few ulps of disagreement cost dV 3x the error of a
// plain float32 implementation, whose own s and lse agree (bench/NOTES.md, session 19). float64 sums
// the scores in the float64 tensor cores' order instead, bitwise: each group of 8 columns (a k-step of
// their 16x8x8 product, aligned alike) an FMA chain from zero in column order, which is what the product
// computes (bench/mma_probe.py: 2560 of 2560 results), the groups then added in order, as the
// tensor-core forward adds its k-steps (sm80/fwd.cu); the scores, and so its lse, are then this
// backward's own. dP = dO.V sums plainly: it cancels against delta = rowsum(dO * O), summed plainly too
// (one key: dS = dP - delta = 0 up to their roundings), and a compensated dP alone put dQ past the rule
// there.
template <bool kScores, typename T>
__device__ __forceinline__ void score_tile(acc_t<T> (&s)[GeneralTraits<T>::kScoresPerThread],
                                           const RowView<T>& A, int a0, const RowView<T>& B, int b0,
                                           int depth, GeneralSmem<T>& sm) {
    using Tr = GeneralTraits<T>;
    using Sm = GeneralSmem<T>;
    const int row = threadIdx.x / Tr::kLanesPerRow;
    const int lane = threadIdx.x % Tr::kLanesPerRow;
    constexpr bool kCompensated = kScores && sizeof(acc_t<T>) == 4;
    static_assert(!kScores || sizeof(acc_t<T>) == 4 || Tr::kSumGroup == 8, "float64 scores sum 8 columns a group");
    acc_t<T> comp[Tr::kScoresPerThread];
#pragma unroll
    for (int j = 0; j < Tr::kScoresPerThread; ++j) s[j] = comp[j] = 0;
    for (int d0 = 0; d0 < depth; d0 += Tr::kDepth) {
        stage<Tr::kBlockM, Tr::kDepth, Sm::kLdDepth, Tr::kThreads>(sm.a, A, a0, d0);
        stage<Tr::kBlockN, Tr::kDepth, Sm::kLdDepth, Tr::kThreads>(sm.b, B, b0, d0);
        __syncthreads();
        for (int g = 0; g < Tr::kDepth; g += Tr::kSumGroup) {
            acc_t<T> part[Tr::kScoresPerThread] = {};
#pragma unroll
            for (int d = g; d < g + Tr::kSumGroup; ++d) {
                const acc_t<T> a = sm.a[row * Sm::kLdDepth + d];
#pragma unroll
                for (int j = 0; j < Tr::kScoresPerThread; ++j) {
                    part[j] += a * sm.b[(lane + Tr::kLanesPerRow * j) * Sm::kLdDepth + d];
                }
            }
#pragma unroll
            for (int j = 0; j < Tr::kScoresPerThread; ++j) {
                if constexpr (kCompensated) {
                    add_compensated(s[j], comp[j], part[j]);
                } else {
                    s[j] += part[j];
                }
            }
        }
        __syncthreads();
    }
    if constexpr (kCompensated) {
        // An infinite sum has a NaN compensation (inf - inf): it stays infinite (NaN stays NaN).
#pragma unroll
        for (int j = 0; j < Tr::kScoresPerThread; ++j) s[j] = isinf(s[j]) ? s[j] : s[j] + comp[j];
    }
}

// Stores this thread's row of weights w[j] (columns lane + kLanesPerRow * j) for accumulate_chunk.
template <typename T>
__device__ __forceinline__ void store_weights(const acc_t<T> (&w)[GeneralTraits<T>::kScoresPerThread],
                                              GeneralSmem<T>& sm) {
    using Tr = GeneralTraits<T>;
    const int row = threadIdx.x / Tr::kLanesPerRow;
    const int lane = threadIdx.x % Tr::kLanesPerRow;
#pragma unroll
    for (int j = 0; j < Tr::kScoresPerThread; ++j) {
        sm.w[row * GeneralSmem<T>::kLdW + lane + Tr::kLanesPerRow * j] = w[j];
    }
}

// acc[j] += sum_n W(row, n) * X(x0 + n, c0 + lane + kLanesPerRow * j) over the kBlockN rows of X that
// follow x0, with W the weights stored by store_weights. All threads must call it (it synchronizes,
// which also publishes the stored weights).
template <typename T>
__device__ __forceinline__ void accumulate_chunk(acc_t<T> (&acc)[GeneralTraits<T>::kOutPerThread],
                                                 const RowView<T>& X, int x0, int c0, GeneralSmem<T>& sm) {
    using Tr = GeneralTraits<T>;
    using Sm = GeneralSmem<T>;
    const int row = threadIdx.x / Tr::kLanesPerRow;
    const int lane = threadIdx.x % Tr::kLanesPerRow;
    stage<Tr::kBlockN, Tr::kChunk, Sm::kLdX, Tr::kThreads>(sm.x, X, x0, c0);
    __syncthreads();
    for (int g = 0; g < Tr::kBlockN; g += Tr::kSumGroup) {
        acc_t<T> part[Tr::kOutPerThread] = {};
#pragma unroll
        for (int n = g; n < g + Tr::kSumGroup; ++n) {
            const acc_t<T> w = sm.w[row * Sm::kLdW + n];
#pragma unroll
            for (int j = 0; j < Tr::kOutPerThread; ++j) {
                part[j] += w * sm.x[n * Sm::kLdX + lane + Tr::kLanesPerRow * j];
            }
        }
#pragma unroll
        for (int j = 0; j < Tr::kOutPerThread; ++j) acc[j] += part[j];
    }
    __syncthreads();
}

}  // namespace cupyflash
