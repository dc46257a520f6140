// Which tile, batch entry and head a CTA works on: the decode of the flattened grid index.
//
// The attention kernels that launch a CTA per tile (not the persistent Hopper forwards, sm90/scheduler.cuh,
// nor the Hopper backward, whose order sm90/bwd_kernel.cuh sets) launch grid.x = tiles * batch * heads,
// tiles fastest: one axis of up to
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

// The key tiles of groups of `group` (batch entry, head) pairs in turn: tile 0 of each pair of the
// first group, then tile 1 of each, ..., then the next group (the last may hold fewer pairs); group 1
// is schedule_tile's tiles-fastest order. Under a causal mask a key tile's walk shrinks with its index,
// so tiles fastest leaves the last pairs' longest walks to start near the end of the grid and run on
// while the other SMs idle; in turn, each group starts with its longest walks and ends with its
// shortest. The host makes a group about one wave of CTAs, so as many pairs run at once as with tiles
// fastest and their Q, dO and dQ rows still share L2 (bench/NOTES.md, session 16).
__device__ __forceinline__ TileWork schedule_tile_groups(int num_tiles, int heads, int group) {
    const int pairs = static_cast<int>(gridDim.x / num_tiles);
    const int first = static_cast<int>(blockIdx.x / (static_cast<unsigned>(group) * num_tiles)) * group;
    const int members = min(group, pairs - first);
    const int index = static_cast<int>(blockIdx.x) - first * num_tiles;  // within the group
    const int bh = first + index % members;
    return {index / members, bh / heads, bh % heads};
}

// Launch index x of `pairs` pairs of `tiles` tiles each, numbered from tile `skip` on: the pairs before
// the last `tail` take their tiles fastest, then the last `tail` pairs theirs in turn, as one group.
__device__ __forceinline__ TileWork tile_tail_at(int x, int pairs, int tiles, int heads, int tail, int skip) {
    const int first = pairs - tail;  // the tail's first pair
    int tile, bh;
    if (x / tiles < first) {
        tile = x % tiles;
        bh = x / tiles;
    } else {
        const int index = x - first * tiles;  // within the tail
        tile = index / tail;
        bh = first + index % tail;
    }
    return {skip + tile, bh / heads, bh % heads};
}

// The pairs before the last `tail` take their key tiles fastest (schedule_tile), then the last `tail`
// pairs theirs in turn, as one group: the grid ends on its shortest causal walks while the pairs before
// keep tiles fastest's L2 reuse (schedule_tile_groups over every pair gained nothing above head dim 128,
// bench/NOTES.md, session 16).
__device__ __forceinline__ TileWork schedule_tile_tail(int num_tiles, int heads, int tail) {
    return tile_tail_at(static_cast<int>(blockIdx.x), static_cast<int>(gridDim.x / num_tiles), num_tiles, heads, tail, 0);
}

// For tiles numbered longest walk first (the Hopper backward's key order under a block mask): tile 0 of
// every pair first, in turn, then tiles 1 on as schedule_tile_tail. Tiles fastest starts a pair's
// longest walk only once the pairs before it have run, which is late for the last pairs before the
// tail; under a document mask whose boundaries lie inside blocks, a boundary's key tile walks its two
// documents' queries in partial tiles, each about twice a full one, and those walks ran past the end
// of every other CTA (bench/NOTES.md, session 52). Only those `pairs` CTAs move; the rest keep
// schedule_tile_tail's order and its L2 reuse.
__device__ __forceinline__ TileWork schedule_ranked_tail(int num_tiles, int heads, int tail) {
    const int pairs = static_cast<int>(gridDim.x / num_tiles);
    const int x = static_cast<int>(blockIdx.x);
    if (x < pairs) return {0, x / heads, x % heads};
    return tile_tail_at(x - pairs, pairs, num_tiles - 1, heads, tail, 1);
}

}  // namespace cupyflash
