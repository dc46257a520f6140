// Which tile, batch entry and head a CTA works on: the decode of the flattened grid index.
//
// Every attention kernel launches grid.x = tiles * batch * heads, tiles fastest: one axis of up to
// 2^31 - 1 CTAs, so there is no batch * heads limit of 65535. Tiles are of query rows (forward, dQ) or
// of keys (dK/dV); heads are query or kv heads, by kernel. Packed (varlen) batches count the tiles of
// the longest sequence, and a CTA whose tile starts past its own sequence's end has nothing to do.
#pragma once

namespace cupyflash {

struct TileWork {
    int tile;  // the CTA's tile
    int b;     // batch entry
    int h;     // head
};

// reverse hands out the last tiles first. sm80_fwd (tiles of queries) always does: under a causal mask
// the last query tiles see the most keys, so the longest CTAs start early and the tail of the launch is
// short. sm80_bwd (tiles of keys) does under its ordered sum, which needs the last key tiles launched
// first. The general kernels do not.
__device__ __forceinline__ TileWork schedule_tile(int num_tiles, int heads, bool reverse) {
    const int index = static_cast<int>(blockIdx.x % num_tiles);
    const int bh = static_cast<int>(blockIdx.x / num_tiles);
    return {reverse ? num_tiles - 1 - index : index, bh / heads, bh % heads};
}

}  // namespace cupyflash
