// The backward's kernels over rows, shared by every family (a warp per run of rows of one (batch entry,
// head) of (batch, heads, seqlen_q); packed batches pass batch 1 and seqlen_q = total_q). Both move
// bytes and little else, so what sets their speed is how many loads each lane keeps in flight:
//   bwd_delta       delta = rowsum(dO * O), the first kernel of every backward; for the tensor-core
//                   families it also zeroes the float32 dQ buffers and the turn counters of the ordered
//                   sum (or, with dq_in_place, dq itself; with dq_claims, whose first share of a tile is
//                   stored, the claims instead of the buffers), so a backward call needs no memset of its
//                   own; with sinks it writes each row's term of their gradient;
//   bwd_dq_convert  dQ = softmax_scale * (the sum of the dQ buffers), rounded to T: the last kernel of the
//                   tensor-core families' backward (but the Hopper float32 one's with dq_in_place).
#include "common/dtypes.cuh"
#include "common/math.cuh"
#include "common/ordered_sum.cuh"
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
// with the layout of lse. A warp takes runs of `run_rows` rows of one (batch entry, head) (RowRun); a
// row takes the lanes of a power-of-two group (`lanes`, cupyflash/_families/common.py) that cover
// headdim_v with 16 bytes each, so short rows share a warp, and each group's rows kDeltaSteps warp
// steps apart load together: at 16 bytes per load a lane needs several loads in flight to keep the
// memory busy (a row at a time the kernel ran at 3 TB/s, now about 4). Runs whose rows are not all
// 16-byte aligned, or wider than one load per lane, take element loads. Where args.dq_accum.ptr is set,
// the run's dq_ld floats per row of each of the dq_splits buffers are zeroed (a run's rows are
// contiguous there: 16-byte stores where dq_ld and the split stride are multiples of 4, as on the
// Hopper path, else 8-byte, dq_ld being even), unless args.dq_claims is set: then the claims instead
// (common/ordered_sum.cuh); with args.dq_in_place, dq's own rows instead; and where args.dq_turns is set,
// the turn counters.
// Where args.sink_terms is set (sinks), row r's term of d loss / d sinks[h] is written beside delta:
// the sink's probability exp(sink - lse_r) times delta_r (0 where lse is -inf: a row that saw no key
// beside a sink of -inf), the difference in lse's type and the rest in the accumulators' (float32's
// double exp is a called routine whose frame spilled), stored in lse's type; the host sums them per head
// in a fixed order (deterministic) and negates the sum (cupyflash/_merge.py's sink_gradient, the same
// arithmetic, without re-reading dO and O).
constexpr int kDeltaSteps = 4;

template <typename T>
__global__ void __launch_bounds__(256)
bwd_delta(const CUPYFLASH_GRID_CONSTANT BwdArgs args, int lanes, int run_rows) {
    using Acc = acc_t<T>;
    constexpr int kVec = 16 / static_cast<int>(sizeof(T));  // elements of one 16-byte load
    const AttnArgs& a = args.attn;
    const unsigned runs = RowRun::count(a, run_rows);
    const int lane = threadIdx.x % lanes;
    const int group = threadIdx.x % 32 / lanes;  // the lane's row of each warp step
    const int step_rows = 32 / lanes;
    // float64 for float64 inputs; null where the first shares are stored (dq_claims: 16-bit inputs only)
    Acc* const accum = sizeof(T) == 2 && args.dq_claims != nullptr ? nullptr : static_cast<Acc*>(args.dq_accum.ptr);
    const bool quads = args.dq_ld % 4 == 0 && args.dq_split_stride % 4 == 0;
    for (unsigned u = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; u < runs; u += gridDim.x * (blockDim.x / 32)) {
        const RowRun run(a, u, run_rows);
        const long long b = run.b, h = run.h;
        const int end = run.s0 + run_rows < a.seqlen_q ? run.s0 + run_rows : a.seqlen_q;
        Acc* const delta = static_cast<Acc*>(args.delta.ptr) + rows_index(args.delta, b, h, 0);
        const T* const o_rows = head_rows<const T>(args.out, b, 0, h);
        const T* const do_rows = head_rows<const T>(args.dout, b, 0, h);
        // The fast path: every row of the run 16-byte aligned and covered by one load per lane.
        const bool vectors = (reinterpret_cast<size_t>(o_rows) | reinterpret_cast<size_t>(do_rows)) % 16 == 0 &&
                             (args.out.row_stride | args.dout.row_stride) % kVec == 0 && a.headdim_v % kVec == 0 &&
                             kVec * lanes >= a.headdim_v;
        // Every lane of a warp runs the same steps (the shuffles need the whole group).
        for (int s0 = run.s0; s0 < end; s0 += kDeltaSteps * step_rows) {
            Acc acc[kDeltaSteps];
            if (vectors) {
                uint4 o[kDeltaSteps], d[kDeltaSteps];
#pragma unroll
                for (int k = 0; k < kDeltaSteps; ++k) {
                    const long long s = s0 + k * step_rows + group;
                    o[k] = d[k] = make_uint4(0, 0, 0, 0);
                    if (s < end && kVec * lane < a.headdim_v) {
                        o[k] = *reinterpret_cast<const uint4*>(o_rows + s * args.out.row_stride + kVec * lane);
                        d[k] = *reinterpret_cast<const uint4*>(do_rows + s * args.dout.row_stride + kVec * lane);
                    }
                }
#pragma unroll
                for (int k = 0; k < kDeltaSteps; ++k) {
                    const T* ov = reinterpret_cast<const T*>(&o[k]);
                    const T* dv = reinterpret_cast<const T*>(&d[k]);
                    acc[k] = 0;
#pragma unroll
                    for (int e = 0; e < kVec; ++e) acc[k] += to_acc(ov[e]) * to_acc(dv[e]);
                }
            } else {
                for (int k = 0; k < kDeltaSteps; ++k) {
                    const long long s = s0 + k * step_rows + group;
                    acc[k] = 0;
                    if (s >= end) continue;
                    const T* o_row = o_rows + s * args.out.row_stride;
                    const T* do_row = do_rows + s * args.dout.row_stride;
                    for (int c = lane; c < a.headdim_v; c += lanes) acc[k] += to_acc(o_row[c]) * to_acc(do_row[c]);
                }
            }
#pragma unroll
            for (int k = 0; k < kDeltaSteps; ++k) {
                for (int offset = lanes / 2; offset > 0; offset /= 2) acc[k] += __shfl_xor_sync(0xffffffffu, acc[k], offset);
                const int s = s0 + k * step_rows + group;
                if (s < end && lane == 0) delta[s] = acc[k];
            }
        }
        if (args.sink_terms != nullptr) {
            // The run's sink terms, a lane per row, from the delta values the warp has just written.
            using L = lse_t<T>;
            __syncwarp();
            L* const terms = static_cast<L*>(args.sink_terms) + rows_index(args.delta, b, h, 0);
            const L* const lse = static_cast<const L*>(args.lse.ptr) + rows_index(args.lse, b, h, 0);
            const L sink = static_cast<L>(attention_sink(a, static_cast<int>(h)));
            for (int s = run.s0 + static_cast<int>(threadIdx.x % 32); s < end; s += 32) {
                const L row_lse = lse[s];
                const Acc weight = row_lse == Consts<L>::neg_inf() ? Acc(0) : exp_acc(static_cast<Acc>(sink - row_lse));
                terms[s] = static_cast<L>(weight * delta[s]);
            }
        }
        if (accum != nullptr) {
            const int lane32 = threadIdx.x % 32;
            const int count = (end - run.s0) * args.dq_ld;  // elements per buffer
            Acc* const rows = accum + rows_index(args.dq_accum, b, h, run.s0) * args.dq_ld;
            for (int split = 0; split < args.dq_splits; ++split) {
                Acc* const dst = rows + split * args.dq_split_stride;
                if constexpr (sizeof(Acc) == 8) {
                    for (int c = 2 * lane32; c < count; c += 64) *reinterpret_cast<double2*>(dst + c) = make_double2(0.0, 0.0);
                } else if (quads) {
                    for (int c = 4 * lane32; c < count; c += 128) *reinterpret_cast<float4*>(dst + c) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                } else {
                    for (int c = 2 * lane32; c < count; c += 64) *reinterpret_cast<float2*>(dst + c) = make_float2(0.0f, 0.0f);
                }
            }
        }
    }
    if constexpr (sizeof(T) == 4) {
        if (args.dq_in_place) {
            // dq itself takes the reductions (float32 only; the host sets dq_in_place for 16-byte rows):
            // the run's rows zeroed, a warp a run, 16 bytes a lane.
            const int lane32 = threadIdx.x % 32;
            for (unsigned u = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; u < runs;
                 u += gridDim.x * (blockDim.x / 32)) {
                const RowRun run(a, u, run_rows);
                const int end = run.s0 + run_rows < a.seqlen_q ? run.s0 + run_rows : a.seqlen_q;
                T* const rows = head_rows<T>(args.dq, run.b, 0, run.h);
                for (int s = run.s0; s < end; ++s) {
                    T* const row = rows + s * args.dq.row_stride;
                    for (int c = 4 * lane32; c < a.headdim; c += 128) {
                        *reinterpret_cast<float4*>(row + c) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                    }
                }
            }
        }
    }
    if (args.dq_turns != nullptr) {
        // One counter per query tile and buffer: far fewer than 2^32.
        const unsigned turns = static_cast<unsigned>(args.dq_splits * args.turns_split_stride);
#pragma unroll 1
        for (unsigned k = blockIdx.x * blockDim.x + threadIdx.x; k < turns; k += gridDim.x * blockDim.x) args.dq_turns[k] = 0;
    }
    if (sizeof(T) == 2 && args.dq_claims != nullptr) {
        // Two counters per (batch entry, head, claim tile): far fewer than 2^32.
        const unsigned claims = 2u * static_cast<unsigned>(a.batch * a.heads * ceil_div(a.seqlen_q, args.dq_claim_rows));
#pragma unroll 1
        for (unsigned k = blockIdx.x * blockDim.x + threadIdx.x; k < claims; k += gridDim.x * blockDim.x) args.dq_claims[k] = 0;
    }
}

// dq[b, s, h, c] = softmax_scale * (sum over the dq_splits buffers, in order, of the accumulator row
// (b, h, s)), rounded to T. A warp takes runs of `run_rows` rows (RowRun), grid-stride; packed batches
// pass batch 1 and seqlen_q = total_q. Lanes take 4 columns each (16-byte loads, 8-byte stores) where
// dq_ld, the split stride and the head dim are multiples of 4 and dQ's rows 8-byte aligned (kQuads),
// else column pairs (dq_ld is even) written as one 32-bit store where the head dim is even. A row takes
// the lanes of a power-of-two group that covers the head dim, so short rows share a warp, and each
// group's rows kConvertSteps warp steps apart load together (as in bwd_delta).
constexpr int kConvertSteps = 8;

template <typename T, bool kQuads>
__device__ __forceinline__ void convert_run(const BwdArgs& args, const float* src, T* dst, long long dst_ld, int rows) {
    constexpr int kWidth = kQuads ? 4 : 2;  // columns per lane
    const AttnArgs& a = args.attn;
    const float scale = static_cast<float>(a.softmax_scale);
    int lanes = 1;
    while (lanes < 32 && kWidth * lanes < a.headdim) lanes *= 2;
    const int lane = threadIdx.x % lanes;
    const int group = threadIdx.x % 32 / lanes;
    const int step_rows = 32 / lanes;
    for (int r0 = group; r0 < rows; r0 += kConvertSteps * step_rows) {
        for (int c = kWidth * lane; c < a.headdim; c += kWidth * lanes) {
            float4 sum[kConvertSteps];
            const auto add = [&](int split) {
#pragma unroll
                for (int k = 0; k < kConvertSteps; ++k) {
                    if (r0 + k * step_rows >= rows) continue;
                    const float* row = src + split * args.dq_split_stride + (r0 + k * step_rows) * args.dq_ld + c;
                    float4 part = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                    if constexpr (kQuads) {
                        part = *reinterpret_cast<const float4*>(row);
                    } else {
                        const float2 pair = *reinterpret_cast<const float2*>(row);
                        part.x = pair.x;
                        part.y = pair.y;
                    }
                    if (split == 0) {
                        sum[k] = part;
                    } else {
                        sum[k].x += part.x;
                        sum[k].y += part.y;
                        sum[k].z += part.z;
                        sum[k].w += part.w;
                    }
                }
            };
            add(0);
#pragma unroll 1
            for (int split = 1; split < args.dq_splits; ++split) add(split);
#pragma unroll
            for (int k = 0; k < kConvertSteps; ++k) {
                if (r0 + k * step_rows >= rows) continue;
                T* out = dst + (r0 + k * step_rows) * dst_ld + c;
                if constexpr (kQuads) {
                    *reinterpret_cast<uint2*>(out) = make_uint2(pack2<T>(sum[k].x * scale, sum[k].y * scale),
                                                                pack2<T>(sum[k].z * scale, sum[k].w * scale));
                } else if (a.headdim % 2 == 0) {
                    *reinterpret_cast<unsigned*>(out) = pack2<T>(sum[k].x * scale, sum[k].y * scale);
                } else {
                    out[0] = from_acc<T>(sum[k].x * scale);
                    if (c + 1 < a.headdim) out[1] = from_acc<T>(sum[k].y * scale);
                }
            }
        }
    }
}

// A run's dQ rows as zeros: a claim tile no CTA claimed (BwdArgs::dq_claims), whose buffer rows were
// never written, holds rows that see no key.
template <typename T>
__device__ __forceinline__ void zero_run(const AttnArgs& a, T* dst, long long dst_ld, int rows) {
    for (int r = 0; r < rows; ++r) {
        for (int c = static_cast<int>(threadIdx.x % 32); c < a.headdim; c += 32) dst[r * dst_ld + c] = from_acc<T>(0.0f);
    }
}

// The same for float32 and float64 (buffers of their accumulators' type): a lane per column, the
// splits summed in order, then scaled and stored.
template <typename T>
__device__ __forceinline__ void convert_run_wide(const BwdArgs& args, const acc_t<T>* src, T* dst, long long dst_ld, int rows) {
    using Acc = acc_t<T>;
    const Acc scale = static_cast<Acc>(args.attn.softmax_scale);
    const int lane = threadIdx.x % 32;
    for (int r = 0; r < rows; ++r) {
        for (int c = lane; c < args.attn.headdim; c += 32) {
            const Acc* row = src + static_cast<long long>(r) * args.dq_ld + c;
            Acc sum = row[0];
#pragma unroll 1
            for (int split = 1; split < args.dq_splits; ++split) sum += row[split * args.dq_split_stride];
            dst[r * dst_ld + c] = sum * scale;
        }
    }
}

template <typename T>
__global__ void __launch_bounds__(256)
bwd_dq_convert(const CUPYFLASH_GRID_CONSTANT BwdArgs args, int run_rows) {
    const AttnArgs& a = args.attn;
    const unsigned runs = RowRun::count(a, run_rows);
    if constexpr (sizeof(T) >= 4) {
        using Acc = acc_t<T>;
        for (unsigned u = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; u < runs; u += gridDim.x * (blockDim.x / 32)) {
            const RowRun run(a, u, run_rows);
            const int rows = (run.s0 + run_rows < a.seqlen_q ? run.s0 + run_rows : a.seqlen_q) - run.s0;
            const Acc* src = static_cast<const Acc*>(args.dq_accum.ptr) + rows_index(args.dq_accum, run.b, run.h, run.s0) * args.dq_ld;
            convert_run_wide<T>(args, src, head_rows<T>(args.dq, run.b, run.s0, run.h), args.dq.row_stride, rows);
        }
    } else {
        const float* accum = static_cast<const float*>(args.dq_accum.ptr);
        const bool quads = a.headdim % 4 == 0 && args.dq_ld % 4 == 0 && args.dq_split_stride % 4 == 0 &&
                           reinterpret_cast<size_t>(args.dq.ptr) % 8 == 0 && args.dq.batch_stride % 4 == 0 &&
                           args.dq.row_stride % 4 == 0 && args.dq.head_stride % 4 == 0;
        for (unsigned u = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; u < runs; u += gridDim.x * (blockDim.x / 32)) {
            const RowRun run(a, u, run_rows);
            const int rows = (run.s0 + run_rows < a.seqlen_q ? run.s0 + run_rows : a.seqlen_q) - run.s0;
            const float* src = accum + rows_index(args.dq_accum, run.b, run.h, run.s0) * args.dq_ld;
            T* dst = head_rows<T>(args.dq, run.b, run.s0, run.h);
            // (a run lies in one claim tile: the host makes dq_claim_rows a multiple of run_rows)
            if (args.dq_claims != nullptr && *dq_claim(args, run.b, run.h, run.s0 / args.dq_claim_rows) == 0) {
                zero_run<T>(a, dst, args.dq.row_stride, rows);
            } else if (quads) {
                convert_run<T, true>(args, src, dst, args.dq.row_stride, rows);
            } else {
                convert_run<T, false>(args, src, dst, args.dq.row_stride, rows);
            }
        }
    }
}

}  // namespace cupyflash
