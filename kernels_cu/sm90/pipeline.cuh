// How the warpgroups of a warp-specialized Hopper kernel hand stages to each other: a consumer warp's
// release of a stage, and the turns the consumer warpgroups take issuing their products.
#pragma once
#include "sm90/primitives.cuh"

namespace cupyflash {

// Marks a stage free for the producer: one arrival per warp (the barrier counts 4 per consumer
// warpgroup), after the warp's last read of it (the wgmma_wait that covers the product reading it).
__device__ __forceinline__ void release_stage(unsigned long long* empty) {
    __syncwarp();
    if (threadIdx.x % 32 == 0) mbarrier_arrive(empty);
}

// release_stage for a stage that the kCtas CTAs of a cluster fill together, each issuing part of its
// boxes into all of them (sm90/fwd.cu's sm90_fwd_pairs): the warp's lane r arrives on the barrier at
// empty's offset in CTA r, which counts 4 per consumer warpgroup of every CTA. (What it releases are
// wgmma's reads, complete at the warp's wgmma_wait, and the zeroed rows of V (sm90_clear_foreign_values),
// fenced into the async proxy and read by such a wgmma; what follows it is the producers' TMA writes. So
// as CUTLASS's cluster barriers, no cluster-scope release, whose fence would wait for every memory access
// of the warp.)
template <int kCtas>
__device__ __forceinline__ void release_stage_in(unsigned long long* empty) {
    if constexpr (kCtas == 1) {
        release_stage(empty);
    } else {
        __syncwarp();
        if (threadIdx.x % 32 < kCtas) mbarrier_arrive_remote(empty, threadIdx.x % 32);
    }
}

// The kN consumer warpgroups issue their product blocks in turns, round robin ("pingpong" for two): one's
// products run on the tensor cores while the others compute their softmax. Warpgroup wg waits at named
// barrier kFirst + wg, which warpgroup wg - 1 (mod kN) arrives at after issuing; the last warpgroup
// starts by passing (start()), so warpgroup 0 issues first, and at the end warpgroup 0 takes one turn
// more (finish()) to leave the barriers balanced. Every warpgroup must take the same number of turns.
template <int kFirst, int kN = 2>
struct Pingpong {
    static_assert(kFirst >= 1 && kFirst + kN - 1 <= 15, "named barriers 1-15 (0 is __syncthreads)");
    __device__ __forceinline__ static void take_turn(int wg) { named_barrier_sync(kFirst + wg, 256); }
    __device__ __forceinline__ static void pass_turn(int wg) {
        // The same barrier both ways; for two warpgroups the subtraction, which the kernels' register
        // allocation was measured with (the select cost d192 20 bytes of spills).
        if constexpr (kN == 2) {
            named_barrier_arrive(kFirst + 1 - wg, 256);
        } else {
            named_barrier_arrive(kFirst + (wg + 1 == kN ? 0 : wg + 1), 256);
        }
    }
    __device__ __forceinline__ static void start(int wg) {
        if (wg == kN - 1) pass_turn(wg);
    }
    __device__ __forceinline__ static void finish(int wg) {
        if (wg == 0) take_turn(0);
    }
};

}  // namespace cupyflash
