// fp8_transpose_values: the FP8 forward's pre-pass (sm90/fwd_fp8_mainloop.cuh). v, e4m3 (batch, seqlen_k,
// heads_k, headdim_v) with any strides of 16-byte aligned rows, becomes V^T (batch, heads_k, headdim_v,
// keys), keys = seqlen_k rounded up to 32, contiguous: row c of (b, kv head) holds column c of every key,
// each 32-key block in the order the forward's P fragments take its keys (position 16 h + 4 t + j of
// block n holds key 32 n + 16 h + 8 (j / 2) + 2 t + j % 2, t < 4, j < 4), zeros past seqlen_k.
//
// A thread writes 16 bytes (half a block of one row c) from 16 key rows; consecutive threads take
// consecutive c, so a warp's reads of one key row are 32 consecutive bytes. Grid-stride over (b, kv head,
// half block, c).
#include "common/params.cuh"
#include "common/sequence.cuh"

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
                const int j = 4 * w + e;  // position 16 (half % 2) + j of the block: t = j / 4, j % 4
                const int key = 32 * (half / 2) + 16 * (half % 2) + 8 * ((j % 4) / 2) + 2 * (j / 4) + j % 2;
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

}  // namespace cupyflash
