// How the warpgroups of a warp-specialized Hopper kernel hand stages to each other: a consumer warp's
// release of a stage, and the turns the two consumer warpgroups take issuing their products.
#pragma once
#include "sm90/primitives.cuh"

namespace cupyflash {

// Marks a stage free for the producer: one arrival per warp (the barrier counts 4 per consumer
// warpgroup), after the warp's last read of it (the wgmma_wait that covers the product reading it).
__device__ __forceinline__ void release_stage(unsigned long long* empty) {
    __syncwarp();
    if (threadIdx.x % 32 == 0) mbarrier_arrive(empty);
}

// The two consumer warpgroups issue their product blocks in turns ("pingpong"): one's products run on
// the tensor cores while the other computes its softmax. Warpgroup wg waits at named barrier kFirst + wg,
// which the other warpgroup arrives at after issuing; warpgroup 1 starts by passing (warpgroup 0 issues
// first), so at the end warpgroup 0 takes one turn more to leave the barriers balanced.
template <int kFirst>
struct Pingpong {
    static_assert(kFirst >= 1 && kFirst + 1 <= 15, "named barriers 1-15 (0 is __syncthreads)");
    __device__ __forceinline__ static void take_turn(int wg) { named_barrier_sync(kFirst + wg, 256); }
    __device__ __forceinline__ static void pass_turn(int wg) { named_barrier_arrive(kFirst + 1 - wg, 256); }
};

}  // namespace cupyflash
