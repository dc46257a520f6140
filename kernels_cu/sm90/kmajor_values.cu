// The pre-passes of the Hopper forwards with K-major operands (sm90/fwd_kmajor_mainloop.cuh).
//
// fp8_transpose_values, tf32_transpose_values: v (batch, seqlen_k, heads_k, headdim_v), e4m3 or float32,
// with any strides of 16-byte aligned rows (e4m3; float32 rows any), becomes V^T (batch, heads_k,
// headdim_v, keys), keys = seqlen_k rounded up to a k-step (32 e4m3 keys, 8 float32 ones), contiguous: row
// c of (b, kv head) holds column c of every key, position p of each k-step's block holding the step's key
// Op::key_at(p) (sm90/kmajor_operands.cuh: the order in which the forward's P fragments take the keys),
// zeros past seqlen_k. float32 values are rounded to tf32, to nearest even. A thread writes 16 bytes of one
// row c from the key rows they hold; consecutive threads take consecutive c, so a warp's reads of one key
// row are consecutive. Grid-stride over (b, kv head, 16-byte chunk, c).
//
// tf32_round_rows: q or k (batch, rows, heads, dim) float32, any strides, rounded to tf32 (to nearest even)
// into a contiguous copy (batch, rows, heads, dim_out), dim_out = dim rounded up to 4 (zeros past dim), so
// that the forward's products are those of the rounded inputs (the tensor cores would truncate).
#include "common/params.cuh"
#include "common/sequence.cuh"
#include "sm90/kmajor_operands.cuh"

namespace cupyflash {

__global__ void __launch_bounds__(256) fp8_transpose_values(const CUPYFLASH_GRID_CONSTANT TransposeValuesArgs args) {
    const long long halves = args.keys / 16;
    const long long total = static_cast<long long>(args.batch) * args.heads_k * halves * args.headdim_v;
    for (long long idx = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; idx < total;
         idx += static_cast<long long>(gridDim.x) * blockDim.x) {
        const int c = static_cast<int>(idx % args.headdim_v);
        long long rest = idx / args.headdim_v;
        const int half = static_cast<int>(rest % halves);
        rest /= halves;
        const int h = static_cast<int>(rest % args.heads_k);
        const int b = static_cast<int>(rest / args.heads_k);
        const unsigned char* col = head_rows<const unsigned char>(args.v, b, 0, h) + c;
        unsigned words[4];
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            unsigned word = 0;
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int key = 32 * (half / 2) + E4m3Operands::key_at(16 * (half % 2) + 4 * w + e);
                const unsigned byte = key < args.seqlen_k ? col[static_cast<long long>(key) * args.v.row_stride] : 0u;
                word |= byte << (8 * e);
            }
            words[w] = word;
        }
        unsigned char* dst = args.vt + ((static_cast<long long>(b) * args.heads_k + h) * args.headdim_v + c) * args.keys +
                             16 * half;
        *reinterpret_cast<uint4*>(dst) = make_uint4(words[0], words[1], words[2], words[3]);
    }
}

__global__ void __launch_bounds__(256) tf32_transpose_values(const CUPYFLASH_GRID_CONSTANT TransposeValuesArgs args) {
    const long long halves = args.keys / 4;
    const long long total = static_cast<long long>(args.batch) * args.heads_k * halves * args.headdim_v;
    for (long long idx = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; idx < total;
         idx += static_cast<long long>(gridDim.x) * blockDim.x) {
        const int c = static_cast<int>(idx % args.headdim_v);
        long long rest = idx / args.headdim_v;
        const int half = static_cast<int>(rest % halves);
        rest /= halves;
        const int h = static_cast<int>(rest % args.heads_k);
        const int b = static_cast<int>(rest / args.heads_k);
        const float* col = head_rows<const float>(args.v, b, 0, h) + c;
        float x[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int key = 8 * (half / 2) + Tf32Operands::key_at(4 * (half % 2) + e);
            x[e] = key < args.seqlen_k ? Tf32Operands::round_even(col[static_cast<long long>(key) * args.v.row_stride]) : 0.0f;
        }
        float* dst = reinterpret_cast<float*>(args.vt) +
                     ((static_cast<long long>(b) * args.heads_k + h) * args.headdim_v + c) * args.keys + 4 * half;
        *reinterpret_cast<float4*>(dst) = make_float4(x[0], x[1], x[2], x[3]);
    }
}

__global__ void __launch_bounds__(256) tf32_round_rows(const CUPYFLASH_GRID_CONSTANT RoundRowsArgs args) {
    const int chunks = args.dim_out / 4;
    const long long total = static_cast<long long>(args.batch) * args.rows * args.heads * chunks;
    for (long long idx = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; idx < total;
         idx += static_cast<long long>(gridDim.x) * blockDim.x) {
        const int chunk = static_cast<int>(idx % chunks);
        long long rest = idx / chunks;
        const int h = static_cast<int>(rest % args.heads);
        rest /= args.heads;
        const int row = static_cast<int>(rest % args.rows);
        const int b = static_cast<int>(rest / args.rows);
        const float* src = head_rows<const float>(args.x, b, row, h);
        float x[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int col = 4 * chunk + e;
            x[e] = col < args.dim ? Tf32Operands::round_even(src[col]) : 0.0f;
        }
        *reinterpret_cast<float4*>(args.out + 4 * idx) = make_float4(x[0], x[1], x[2], x[3]);
    }
}

}  // namespace cupyflash
