// BlockMask.from_mask_mod on the GPU: the block classes of a mask_mod (cupyflash/_block_mask.py states
// them). One CTA per block of one (batch entry, head) evaluates the function on every pair of the block
// that lies inside the sequences, lanes along the keys (a buffer indexed by the key is then read in
// coalesced runs), and writes whether it holds for some pair (some: the block is visited; a pair whose
// index is out of range counts, since it stays visible with a NaN score) and for every pair, each
// in range (every: the block runs without the mask).
#include "common/user_calls.cuh"

namespace cupyflash {

struct MaskModBlocksArgs {
    ModBuffers buffers;
    unsigned char* some;    // (batch, heads, rows, cols)
    unsigned char* every;
    int batch, heads, seqlen_q, seqlen_k;
    int block_q, block_k, rows, cols;
};

// CTAs of 32 x 8 threads, grid-stride over the blocks of every (batch entry, head), cols fastest.
template <typename ScoreFn, typename MaskFn>
__global__ void __launch_bounds__(256) mask_mod_blocks(const CUPYFLASH_GRID_CONSTANT MaskModBlocksArgs args) {
    static_assert(MaskFn::kEnabled && !ScoreFn::kEnabled, "built with a mask_mod alone");
    const long long cells = static_cast<long long>(args.batch) * args.heads * args.rows * args.cols;
    for (long long cell = blockIdx.x; cell < cells; cell += gridDim.x) {
        const int c = static_cast<int>(cell % args.cols);
        const int r = static_cast<int>(cell / args.cols % args.rows);
        const long long bh = cell / args.cols / args.rows;
        const int b = static_cast<int>(bh / args.heads), h = static_cast<int>(bh % args.heads);
        const long long q0 = static_cast<long long>(r) * args.block_q, k0 = static_cast<long long>(c) * args.block_k;
        const int q1 = static_cast<int>(min(q0 + args.block_q, static_cast<long long>(args.seqlen_q)));
        const int k1 = static_cast<int>(min(k0 + args.block_k, static_cast<long long>(args.seqlen_k)));
        bool some = false, every = true;
        for (int q = static_cast<int>(q0) + threadIdx.y; q < q1; q += blockDim.y) {
            for (int k = static_cast<int>(k0) + threadIdx.x; k < k1; k += blockDim.x) {
                bool poisoned;
                const bool visible = MaskFn::visible(b, h, q, k, args.buffers, &poisoned);
                some |= visible;
                every &= visible && !poisoned;
            }
        }
        some = __syncthreads_or(some) != 0;
        every = __syncthreads_and(every) != 0;
        if (threadIdx.x == 0 && threadIdx.y == 0) {
            args.some[cell] = some;
            args.every[cell] = every;
        }
    }
}

}  // namespace cupyflash
