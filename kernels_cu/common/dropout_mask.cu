// cupyflash.dropout_mask on the GPU: the keep mask (batch, heads, seqlen_q, seqlen_k) of bytes (numpy
// bool), drawn by common/dropout.cuh as the attention kernels draw it. One thread per generator call:
// the sixteen entries {i, i + 8} x {j, j + 1, j + 8, j + 9, j + 16, j + 17, j + 24, j + 25} of a 16 x 32
// block (i, j the block's row and column in it, i < 8, j even and < 8), in a grid-stride loop over every
// call of the mask.
#include "common/dropout.cuh"

namespace cupyflash {

struct DropoutMaskArgs {
    DropoutArg dropout;
    unsigned char* mask;
    int batch, heads, seqlen_q, seqlen_k;
};

__global__ void __launch_bounds__(256) dropout_mask(const DropoutMaskArgs args) {
    const int row_blocks = (args.seqlen_q + 15) / 16, col_blocks = (args.seqlen_k + 31) / 32;
    // Calls of one (batch entry, head): 8 row pairs x 4 column quads per 16 x 32 block.
    const long long per_head = static_cast<long long>(row_blocks) * col_blocks * 32;
    const long long calls = per_head * args.batch * args.heads;
    for (long long c = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; c < calls;
         c += static_cast<long long>(gridDim.x) * blockDim.x) {
        const long long bh = c / per_head;
        long long rest = c % per_head;
        const int quad = static_cast<int>(rest % 4);  // column pair 2 * quad, 2 * quad + 1 (and + 8, 16, 24)
        rest /= 4;
        const int pair = static_cast<int>(rest % 8);  // rows pair and pair + 8
        rest /= 8;
        const int i0 = static_cast<int>(rest / col_blocks) * 16 + pair;
        const int j0 = static_cast<int>(rest % col_blocks) * 32 + 2 * quad;
        unsigned w[4];
        dropout_draw(args.dropout, static_cast<unsigned>(bh), dropout_row_word(i0), dropout_col_word(j0), w);
        unsigned char* head = args.mask + bh * args.seqlen_q * static_cast<long long>(args.seqlen_k);
#pragma unroll
        for (int di = 0; di < 16; di += 8) {
#pragma unroll
            for (int dj = 0; dj < 32; dj += (dj % 2 == 0 ? 1 : 7)) {  // dj = 0, 1, 8, 9, 16, 17, 24, 25
                const int i = i0 + di, j = j0 + dj;
                if (i < args.seqlen_q && j < args.seqlen_k) {
                    const int byte = dropout_byte(i, j);
                    head[static_cast<long long>(i) * args.seqlen_k + j] =
                        ((w[byte >> 2] >> (8 * (byte & 3))) & 0xFFu) >= args.dropout.threshold;
                }
            }
        }
    }
}

}  // namespace cupyflash
