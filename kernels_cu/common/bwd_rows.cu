// The backward's kernels over rows, shared by every family (one thread group per row of (batch, heads,
// seqlen_q); packed batches pass batch 1 and seqlen_q = total_q):
//   bwd_delta       delta = rowsum(dO * O), the first kernel of every backward; for the tensor-core
//                   families it also zeroes the float32 dQ buffers and the turn counters of the ordered
//                   sum, so a backward call needs no memset of its own;
//   bwd_dq_convert  dQ = softmax_scale * (the sum of the dQ buffers), rounded to T: the last kernel of the
//                   tensor-core families' backward.
#include "common/dtypes.cuh"
#include "common/params.cuh"
#include "common/sequence.cuh"

namespace cupyflash {

// A warp's run: rows s0 .. s0 + run_rows - 1 (those below seqlen_q) of one (batch entry, head),
// run u of the batch * heads * ceil(seqlen_q / run_rows). Locating a row of the flat (batch, heads,
// seqlen_q) index took three 64-bit divisions, each a subroutine call, more instructions than moving
// the row's bytes (512 of dQ at head dim 128); a run's 32-bit divisions locate run_rows rows. Fewer
// than 2^32 runs: 2^36 rows of at least 16 bytes would not fit a GPU's memory.
struct RowRun {
    int b, h, s0;
    __device__ __forceinline__ RowRun(const AttnArgs& a, unsigned u, int run_rows) {
        const unsigned chunks = static_cast<unsigned>((a.seqlen_q + run_rows - 1) / run_rows);
        const unsigned bh = u / chunks;
        const unsigned heads = static_cast<unsigned>(a.heads);
        s0 = static_cast<int>(u - bh * chunks) * run_rows;
        b = static_cast<int>(bh / heads);
        h = static_cast<int>(bh - static_cast<unsigned>(b) * heads);
    }
    __device__ __forceinline__ static unsigned count(const AttnArgs& a, int run_rows) {
        return static_cast<unsigned>(a.batch) * static_cast<unsigned>(a.heads) *
               static_cast<unsigned>((a.seqlen_q + run_rows - 1) / run_rows);
    }
};

// delta_r = sum_c dO_rc * O_rc in the accumulator type (float64 for float64 inputs, else float32), written
// with the layout of lse. A row takes the lanes of a power-of-two group that cover headdim_v with 16 bytes
// each, so short rows share a warp; rows whose addresses are not 16-byte aligned fall back to element
// loads. Grid-stride over the groups of 256 threads; `lanes` is the group size (cupyflash/_families/
// common.py). Where args.dq_accum.ptr is set, the row's dq_ld floats of each of the dq_splits buffers
// are zeroed (dq_ld is even), and where args.dq_turns is set, the turn counters.
template <typename T>
__global__ void __launch_bounds__(256)
bwd_delta(const CUPYFLASH_GRID_CONSTANT BwdArgs args, int lanes) {
    using Acc = acc_t<T>;
    constexpr int kVec = 16 / static_cast<int>(sizeof(T));  // elements of one 16-byte load
    const AttnArgs& a = args.attn;
    const long long rows = static_cast<long long>(a.batch) * a.heads * a.seqlen_q;
    const int lane = threadIdx.x % lanes;
    const long long groups = static_cast<long long>(gridDim.x) * (blockDim.x / lanes);
    float* const accum = static_cast<float*>(args.dq_accum.ptr);
    // Every lane of a warp runs the same number of steps (the shuffles below need the whole group).
    for (long long r = static_cast<long long>(blockIdx.x) * (blockDim.x / lanes) + threadIdx.x / lanes;
         r - threadIdx.x % 32 / lanes < rows; r += groups) {
        Acc acc = 0;
        long long b = 0, h = 0;
        int i = 0;
        if (r < rows) {
            i = static_cast<int>(r % a.seqlen_q);
            const long long bh = r / a.seqlen_q;
            h = bh % a.heads;
            b = bh / a.heads;
            const T* o_row = head_rows<const T>(args.out, b, i, h);
            const T* do_row = head_rows<const T>(args.dout, b, i, h);
            if ((reinterpret_cast<size_t>(o_row) | reinterpret_cast<size_t>(do_row)) % 16 == 0 && a.headdim_v % kVec == 0) {
                for (int c = kVec * lane; c < a.headdim_v; c += kVec * lanes) {
                    const uint4 o = *reinterpret_cast<const uint4*>(o_row + c);
                    const uint4 d = *reinterpret_cast<const uint4*>(do_row + c);
                    const T* ov = reinterpret_cast<const T*>(&o);
                    const T* dv = reinterpret_cast<const T*>(&d);
#pragma unroll
                    for (int e = 0; e < kVec; ++e) acc += to_acc(ov[e]) * to_acc(dv[e]);
                }
            } else {
                for (int c = lane; c < a.headdim_v; c += lanes) acc += to_acc(o_row[c]) * to_acc(do_row[c]);
            }
            if (accum != nullptr) {
                float* row = accum + rows_index(args.dq_accum, b, h, i) * args.dq_ld;
                for (int split = 0; split < args.dq_splits; ++split) {
                    for (int c = 2 * lane; c < args.dq_ld; c += 2 * lanes) {
                        *reinterpret_cast<float2*>(row + split * args.dq_split_stride + c) = make_float2(0.0f, 0.0f);
                    }
                }
            }
        }
        for (int offset = lanes / 2; offset > 0; offset /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, offset);
        if (r < rows && lane == 0) static_cast<Acc*>(args.delta.ptr)[rows_index(args.delta, b, h, i)] = acc;
    }
    if (args.dq_turns != nullptr) {
        const long long turns = args.dq_splits * args.turns_split_stride;
        for (long long k = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; k < turns;
             k += static_cast<long long>(gridDim.x) * blockDim.x) {
            args.dq_turns[k] = 0;
        }
    }
}

// dq[b, s, h, c] = softmax_scale * (sum over the dq_splits buffers, in order, of the accumulator row
// (b, h, s)), rounded to T. A warp per row, each warp taking runs of `run_rows` rows (RowRun),
// grid-stride; packed batches pass batch 1 and seqlen_q = total_q. Lanes read column pairs (dq_ld is
// even, so each pair is 8-byte aligned) and write them as one 32-bit store where the head dim is even.
template <typename T>
__global__ void __launch_bounds__(256)
bwd_dq_convert(const CUPYFLASH_GRID_CONSTANT BwdArgs args, int run_rows) {
    const AttnArgs& a = args.attn;
    const unsigned runs = RowRun::count(a, run_rows);
    const float* accum = static_cast<const float*>(args.dq_accum.ptr);
    const float scale = static_cast<float>(a.softmax_scale);
    const int lane = threadIdx.x % 32;
    for (unsigned u = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; u < runs; u += gridDim.x * (blockDim.x / 32)) {
        const RowRun run(a, u, run_rows);
        const int end = run.s0 + run_rows < a.seqlen_q ? run.s0 + run_rows : a.seqlen_q;
        for (int s = run.s0; s < end; ++s) {
            const long long h = run.h, b = run.b;
            const float* row = accum + rows_index(args.dq_accum, b, h, s) * args.dq_ld;
            T* dst = head_rows<T>(args.dq, b, s, h);
            for (int c = 2 * lane; c < a.headdim; c += 64) {
                float2 sum = *reinterpret_cast<const float2*>(row + c);
                for (int split = 1; split < args.dq_splits; ++split) {
                    const float2 part = *reinterpret_cast<const float2*>(row + split * args.dq_split_stride + c);
                    sum.x += part.x;
                    sum.y += part.y;
                }
                if (a.headdim % 2 == 0) {
                    *reinterpret_cast<unsigned*>(dst + c) = pack2<T>(sum.x * scale, sum.y * scale);
                } else {
                    dst[c] = from_acc<T>(sum.x * scale);
                    if (c + 1 < a.headdim) dst[c + 1] = from_acc<T>(sum.y * scale);
                }
            }
        }
    }
}

}  // namespace cupyflash
