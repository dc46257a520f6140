// cupyflash.merge_attention_states and merge_attention_states_stacked on CuPy arrays, and the merges of
// ring attention: up to kMergeParts parts of attention over disjoint key sets merged in one pass
// (cupyflash/_merge.py is the NumPy twin and states the arithmetic, which this follows, but for the order
// of the weights' sum: a butterfly here, part order there, which may differ in the last bits).
// Per row, in lse_t<T> (float32 for 16-bit parts, float64 for float32 and float64 ones):
//   top = max_i lse_i (NaN if any is NaN), shift = top, or 0 where top = -inf (no part saw a key),
//   w_i = exp(lse_i - shift), total = sum_i w_i,
//   lse = shift + ln(total) and out = sum_i (w_i / total) out_i, or lse = -inf and out = 0 where total = 0.
// More parts are merged by the host in rounds, each round's result the first part of the next.
//
// A warp per row: lane i < parts reads lse_i, the warp reduces them with shuffles, and each lane then
// takes kVec consecutive columns of every part at a time (16-byte loads where the host found every part
// aligned, kVec = 16 / sizeof(T); else kVec = 1), the parts' loads of one column step unrolled so they
// are in flight together. Rows are (b, s, h), h fastest, in a grid-stride loop over warps. Products are
// rounded before they are added (mul_rn: no fused multiply-add), as the twin rounds them.
#include "common/dtypes.cuh"
#include "common/math.cuh"
#include "common/params.cuh"

namespace cupyflash {

constexpr int kMergeParts = 16;

struct MergeArgs {
    TensorArg parts[kMergeParts];  // T, (batch, seqlen, heads, headdim); packed: batch 1, batch_stride 0
    RowsArg lses[kMergeParts];     // lse_t<T>, (batch, heads, seqlen) at unit row stride
    TensorArg out;                 // the merged rows, T
    RowsArg lse;                   // the merged lse, lse_t<T>
    int num_parts;                 // 1 .. kMergeParts
    int batch, seqlen, heads, headdim;
};

template <typename T, bool kVectors>
__global__ void __launch_bounds__(256) merge_states(const CUPYFLASH_GRID_CONSTANT MergeArgs args) {
    using L = lse_t<T>;
    constexpr int kVec = kVectors ? 16 / static_cast<int>(sizeof(T)) : 1;
    struct alignas(kVec * sizeof(T)) Chunk {
        T x[kVec];
    };
    const int lane = threadIdx.x % 32;
    const long long rows = static_cast<long long>(args.batch) * args.seqlen * args.heads;
    const long long warps = static_cast<long long>(gridDim.x) * (blockDim.x / 32);
    for (long long r = blockIdx.x * static_cast<long long>(blockDim.x / 32) + threadIdx.x / 32; r < rows; r += warps) {
        const long long bs = r / args.heads;
        const int h = static_cast<int>(r - bs * args.heads);
        const int b = static_cast<int>(bs / args.seqlen), s = static_cast<int>(bs - static_cast<long long>(b) * args.seqlen);

        const bool mine = lane < args.num_parts;
        const RowsArg& in = args.lses[mine ? lane : 0];
        const L x = mine ? static_cast<const L*>(in.ptr)[b * in.batch_stride + h * in.head_stride + s]
                         : Consts<L>::neg_inf();
        // fmax drops NaN, the twin's maximum keeps it: a NaN part makes the whole row NaN.
        L top = __any_sync(0xffffffffu, x != x) ? Consts<L>::nan() : x;
#pragma unroll
        for (int offset = 16; offset > 0; offset /= 2) top = fmax(top, __shfl_xor_sync(0xffffffffu, top, offset));
        const L shift = top == Consts<L>::neg_inf() ? L(0) : top;
        const L w = mine ? exp_acc(x - shift) : L(0);  // -inf parts: 0
        L total = w;
#pragma unroll
        for (int offset = 16; offset > 0; offset /= 2) total += __shfl_xor_sync(0xffffffffu, total, offset);
        // total != 0 lets a NaN through to a NaN row, as the twin does.
        const bool seen = total != L(0);
        const L scale = seen ? L(1) / total : L(0);
        if (lane == 0) {
            static_cast<L*>(args.lse.ptr)[b * args.lse.batch_stride + h * args.lse.head_stride + s] =
                seen ? shift + log_acc(total) : Consts<L>::neg_inf();
        }
        // Every lane takes every part's weight before the column loop, which lanes leave at different steps.
        L coef[kMergeParts];
#pragma unroll
        for (int i = 0; i < kMergeParts; ++i) coef[i] = __shfl_sync(0xffffffffu, w * scale, i);

        T* const out = static_cast<T*>(args.out.ptr) + b * args.out.batch_stride + s * args.out.row_stride +
                       h * args.out.head_stride;
        for (int c = lane * kVec; c < args.headdim; c += 32 * kVec) {
            L acc[kVec];
#pragma unroll
            for (int j = 0; j < kVec; ++j) acc[j] = L(0);
#pragma unroll
            for (int i = 0; i < kMergeParts; ++i) {
                if (i < args.num_parts) {
                    const TensorArg& p = args.parts[i];
                    const Chunk chunk = *reinterpret_cast<const Chunk*>(
                        static_cast<const T*>(p.ptr) + b * p.batch_stride + s * p.row_stride + h * p.head_stride + c);
#pragma unroll
                    for (int j = 0; j < kVec; ++j) acc[j] += mul_rn(coef[i], static_cast<L>(to_acc(chunk.x[j])));
                }
            }
            Chunk result;
#pragma unroll
            for (int j = 0; j < kVec; ++j) result.x[j] = from_acc<T>(static_cast<acc_t<T>>(acc[j]));
            *reinterpret_cast<Chunk*>(out + c) = result;
        }
    }
}

}  // namespace cupyflash
