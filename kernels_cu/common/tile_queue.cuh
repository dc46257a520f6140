// The tiles a CTA visits, staged in shared memory.
//
// A CTA walks one or more segments of tiles (the forward: the key tiles of its query tile; the
// backward: the query tiles of every query head of its GQA group), each a TileRange (mask.cuh). The
// walk is staged kRing entries at a time into one half of a two-half ring, one chunk ahead, by warp 0;
// the main loop reads entry `it` from shared memory. So the loop carries one counter in registers,
// whether the tiles come from a range or from a block-sparse list, and a list's load latency is paid
// once per chunk, off the critical path.
//
// Timing: chunk 0 is staged before the loop; chunk c + 1 during iteration c * kRing, after that
// iteration's barrier, into the half that chunk c - 1 used. Chunk c - 1 was last read before that
// barrier; chunk c + 1 is first read at the top of iteration (c + 1) * kRing - 1, after the barriers of
// iterations c * kRing + 1 ... (c + 1) * kRing - 2 (at least one for kRing >= 3; a loop may have no
// other barrier per iteration).
#pragma once
#include "common/mask.cuh"

namespace cupyflash {

template <int kRing>
struct TileQueue {
    static_assert(kRing >= 3 && kRing % 32 == 0, "whole warps stage the ring, one chunk ahead");
    int segment[2 * kRing];  // -1 past the end of the walk
    int entry[2 * kRing];    // tile * 2 + partial (mask.cuh)
    // The walk's position after the last staged entry (written by warp 0 only).
    int next_segment;
    int next_index;
    TileRange range;         // the tiles of next_segment

    __device__ __forceinline__ int segment_at(int it) const { return segment[it % (2 * kRing)]; }
    __device__ __forceinline__ int entry_at(int it) const { return entry[it % (2 * kRing)]; }

    // Warp 0: positions the walk on the first tile of the first segment that has one (range_of(s) gives
    // segment s's tiles) and stages chunk 0. Visible to the CTA after the next __syncthreads. The main
    // loop stages chunk c + 1 in iteration c * kRing, chunk 1 included, so the CTA's prologue stays short.
    template <typename RangeOf>
    __device__ __forceinline__ void start(int segments, const RangeOf& range_of) {
        int s = 0;
        TileRange r{nullptr, 0, 0};
        for (; s < segments; ++s) {
            r = range_of(s);
            if (r.count > 0) break;
        }
        stage_from(0, s, 0, r, segments, range_of);
    }

    // Warp 0, after the loop's barrier in iteration it: stages the next chunk when `it` starts one.
    template <typename RangeOf>
    __device__ __forceinline__ void advance(int it, int segments, const RangeOf& range_of) {
        if (it % kRing == 0) stage(it / kRing + 1, segments, range_of);
    }

    // Warp 0: stages chunk c into half c % 2.
    template <typename RangeOf>
    __device__ __forceinline__ void stage(int chunk, int segments, const RangeOf& range_of) {
        stage_from(chunk, next_segment, next_index, range, segments, range_of);
    }

  private:
    template <typename RangeOf>
    __device__ __forceinline__ void stage_from(int chunk, int s, int index, TileRange r, int segments,
                                               const RangeOf& range_of) {
        const int lane = threadIdx.x % 32;
        int* seg = segment + (chunk % 2) * kRing;
        int* ent = entry + (chunk % 2) * kRing;
        int filled = 0;
        while (filled < kRing && s < segments) {
            const int n = min(kRing - filled, r.count - index);
            for (int i = lane; i < n; i += 32) {
                seg[filled + i] = s;
                ent[filled + i] = r.entry(index + i);
            }
            filled += n;
            index += n;
            if (index == r.count) {
                index = 0;
                while (++s < segments) {
                    r = range_of(s);
                    if (r.count > 0) break;
                }
            }
        }
        for (int i = filled + lane; i < kRing; i += 32) seg[i] = -1;
        __syncwarp();
        if (lane == 0) {
            next_segment = s;
            next_index = index;
            range = r;
        }
    }
};

}  // namespace cupyflash
