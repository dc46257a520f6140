// The Hopper backward's launch order and walk ranges under a block mask (BwdArgs::key_order and
// walk_ranges): for each (batch entry, kv
// head) pair, its key tiles by the length of their walks, longest first (ties: the lower tile first).
// A key tile's walk is the query tiles it visits over the heads of its GQA group (query_tiles: the block
// mask's list inside the mask's range), so it is the CTA's work. A document mask makes the walks of a
// pair's tiles uneven and unordered (a document's first tile walks to the document's end, its last
// tile one tile), and in the tiles-fastest order the last pairs' longest walks started in the grid's
// last wave, leaving SMs idle behind them; the backward takes the last pairs' tiles in turn in this
// order (scheduler.cuh's schedule_tile_tail), so the grid ends on its shortest walks.
//
// One CTA per pair: the walks into shared memory (one int a key tile, num_tiles of them), then each
// tile's rank counted against every other (num_tiles^2 / blockDim.x steps a thread, reads of one word
// that every lane shares: 4096 steps at 1,024 key tiles).
//
// Under every block mask (with key_order null: the deterministic mode, or too many key tiles to order)
// it also writes each walk's range in the block mask's lists (BwdArgs::walk_ranges), which the
// backward's producers read in one load: their binary searches of the list took ~2 log2(n) dependent
// loads before a CTA's first Q and dO tile (bench/NOTES.md, session 53: 1.6 us later than under a plain
// causal mask), and without them the producers keep no list search at all.
#include "common/math.cuh"
#include "common/mask.cuh"
#include "common/params.cuh"
#include "common/sequence.cuh"

namespace cupyflash {

__global__ void __launch_bounds__(256) bwd_key_order(const CUPYFLASH_GRID_CONSTANT BwdArgs args) {
    extern __shared__ int walks[];  // num_tiles, rounded up to 4 (the rank loop reads 16 bytes at a time)
    const AttnArgs& a = args.attn;
    const int num_tiles = ceil_div(a.seqlen_k, a.sparse.tile_k);
    const int b = static_cast<int>(blockIdx.x) / a.heads_k;
    const int hk = static_cast<int>(blockIdx.x) % a.heads_k;
    const Sequence seq(a, b);
    const Mask mask(a, seq);
    const int group = a.heads / a.heads_k;
    int2* ranges = args.walk_ranges + static_cast<long long>(blockIdx.x) * num_tiles * group;
    for (int kt = threadIdx.x; kt < num_tiles; kt += blockDim.x) {
        int walk = 0;
        for (int g = 0; g < group; ++g) {
            TileRange tiles{nullptr, 0, 0};
            if (kt * a.sparse.tile_k < seq.seqlen_k) {  // (past a packed sequence's end: no work)
                tiles = query_tiles(a, mask, BlockLayout(a, b, hk * group + g), kt, a.sparse.tile_q, a.sparse.tile_k);
            }
            ranges[kt * group + g] = make_int2(tiles.first, tiles.count);
            walk += tiles.count;
        }
        if (args.key_order != nullptr) walks[kt] = walk;
    }
    if (args.key_order == nullptr) return;
    __syncthreads();
    int* pair_order = args.key_order + static_cast<long long>(blockIdx.x) * num_tiles;
    for (int kt = threadIdx.x; kt < num_tiles; kt += blockDim.x) {
        const int walk = walks[kt];
        int rank = 0;
        for (int u = 0; u < num_tiles; ++u) {
            const int other = walks[u];
            rank += other > walk || (other == walk && u < kt);
        }
        pair_order[rank] = kt;
    }
}

}  // namespace cupyflash
