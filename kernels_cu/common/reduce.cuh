// Reductions across the kLanes consecutive lanes of a warp that share one row of a tile.
// kLanes is a power of two no larger than 32, so the xor butterfly stays inside the group.
#pragma once

namespace cupyflash {

template <int kLanes, typename Acc>
__device__ __forceinline__ Acc group_max(Acc x) {
    static_assert(kLanes > 0 && kLanes <= 32 && (kLanes & (kLanes - 1)) == 0, "lanes: power of two <= 32");
#pragma unroll
    for (int offset = kLanes / 2; offset > 0; offset /= 2) {
        x = fmax(x, __shfl_xor_sync(0xffffffffu, x, offset));
    }
    return x;
}

template <int kLanes, typename Acc>
__device__ __forceinline__ Acc group_sum(Acc x) {
    static_assert(kLanes > 0 && kLanes <= 32 && (kLanes & (kLanes - 1)) == 0, "lanes: power of two <= 32");
#pragma unroll
    for (int offset = kLanes / 2; offset > 0; offset /= 2) {
        x += __shfl_xor_sync(0xffffffffu, x, offset);
    }
    return x;
}

}  // namespace cupyflash
