// BlockMask.from_mask_mod on the GPU: the block classes of a mask_mod (cupyflash/_block_mask.py states
// them). One CTA per block of one (batch entry, head) evaluates the function on every pair of the block
// that lies inside the sequences, lanes along the keys (a buffer indexed by the key is then read in
// coalesced runs), and writes whether it holds for some pair (some: the block is visited; a pair whose
// index is out of range counts, since it stays visible with a NaN score) and for every pair, each
// in range (every: the block runs without the mask). Then, for the blocks in between (partial), the
// function's value at each of their pairs as bits (mask_mod_bits), which the kernels read in their place.
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
                const bool visible = MaskFn::visible(b, h, static_cast<int>(q), static_cast<int>(k), args.buffers,
                                                     &poisoned);
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

struct MaskModBitsArgs {
    ModBuffers buffers;
    int* slot;                // (batch, heads, rows, cols): the block's slot; set to -1 here where poisoned
    const long long* cells;   // [slots]: the linear cell (of slot) of each slot
    unsigned* bits;           // [slots][block_q * block_k / 16]
    long long slots;
    int heads, seqlen_q, seqlen_k;
    int block_q, block_k, rows, cols;
};

// A slot's words, in two orientations (block_q and block_k multiples of 128, the host checks). Rows of
// queries first: word (i * 4 + c) * (block_k / 128) + w holds, at bit t, whether query i of the block sees
// key 128 w + 2 c + 8 (t / 2) + t % 2; then rows of keys: word block_q * block_k / 32 + (j * 4 + c) *
// (block_q / 128) + w, at bit t, whether key j is seen by query 128 w + 2 c + 8 (t / 2) + t % 2. That is
// the order in which a thread of a row fragment (c = lane % 4, fragment/scores.cuh) holds its columns: the
// word of its row is its bits of 16 n-tiles, so UserMaskAt::bits loads one word a row and shifts. Pairs
// past the sequences read 0 (the kernels mask them anyway). A block where the function reads out of
// range for some pair (visible with a NaN score, which bits cannot say) gives its slot back: -1.
// CTAs of 256 threads, grid-stride over the slots, a word a thread at a time.
template <typename ScoreFn, typename MaskFn>
__global__ void __launch_bounds__(256) mask_mod_bits(const CUPYFLASH_GRID_CONSTANT MaskModBitsArgs args) {
    static_assert(MaskFn::kEnabled && !ScoreFn::kEnabled, "built with a mask_mod alone");
    const int words = args.block_q * args.block_k / 32;  // of one orientation
    for (long long s = blockIdx.x; s < args.slots; s += gridDim.x) {
        const long long cell = args.cells[s];
        const int c_blk = static_cast<int>(cell % args.cols);
        const int r_blk = static_cast<int>(cell / args.cols % args.rows);
        const long long bh = cell / args.cols / args.rows;
        const int b = static_cast<int>(bh / args.heads), h = static_cast<int>(bh % args.heads);
        const long long q0 = static_cast<long long>(r_blk) * args.block_q, k0 = static_cast<long long>(c_blk) * args.block_k;
        unsigned* out = args.bits + s * 2 * words;
        bool bad = false;
        for (int word = threadIdx.x; word < 2 * words; word += blockDim.x) {
            const bool key_rows = word >= words;
            const int index = key_rows ? word - words : word;
            const int per_row = 4 * (key_rows ? args.block_q : args.block_k) / 128;  // words of a row
            const int fixed = index / per_row;
            const int c = index % per_row / (per_row / 4);
            const int w = index % (per_row / 4);
            unsigned bits = 0;
            for (int t = 0; t < 32; ++t) {
                const int x = 128 * w + 2 * c + 8 * (t / 2) + t % 2;
                const long long q = q0 + (key_rows ? x : fixed), k = k0 + (key_rows ? fixed : x);
                if (q >= args.seqlen_q || k >= args.seqlen_k) continue;
                bool poisoned;
                const bool visible = MaskFn::visible(b, h, static_cast<int>(q), static_cast<int>(k), args.buffers,
                                                     &poisoned);
                bits |= static_cast<unsigned>(visible) << t;
                bad |= poisoned;
            }
            out[word] = bits;
        }
        if (__syncthreads_or(bad) && threadIdx.x == 0) args.slot[cell] = -1;
    }
}

}  // namespace cupyflash
