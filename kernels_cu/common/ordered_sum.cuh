// Sums into float32 device memory from many CTAs: relaxed vector reductions, and a per-block counter
// that, when asked, makes the CTAs add in a fixed order so the float32 result is bitwise reproducible.
#pragma once
#include "common/mask.cuh"
#include "common/params.cuh"

namespace cupyflash {

// *p += a, *(p + 1) += b (p 8-byte aligned). One vector reduction on sm_90+ (PTX ISA 8.1, CUDA 12.1+),
// two scalar ones otherwise.
__device__ __forceinline__ void reduce_add_f32x2(float* p, float a, float b) {
#if __CUDA_ARCH__ >= 900 && __CUDACC_VER_MAJOR__ * 100 + __CUDACC_VER_MINOR__ >= 1201
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" :: "l"(p), "f"(a), "f"(b) : "memory");
#else
    atomicAdd(p, a);
    atomicAdd(p + 1, b);
#endif
}

// Float addition is not associative, so atomics from several CTAs give run-to-run different sums. A
// counter per destination block fixes the order: the CTA whose turn it is waits until the counter
// equals its turn, adds, then increments the counter. All threads of the CTA call both functions.
// Progress needs every earlier turn's CTA to be running or done: callers number the turns in launch
// order (lower blockIdx first), so a CTA only ever waits for CTAs launched before it. That relies on
// the GPU dispatching CTAs in blockIdx order, which every NVIDIA GPU does but CUDA does not promise
// (FlashAttention's deterministic backward relies on it too).
// The leader's halves of a turn, for kernels whose adding threads meet at a named barrier instead of
// __syncthreads (the sm90 backward's consumer warpgroups): wait_for_turn before that barrier, then the
// additions, the barrier again, then hand_on_turn.
__device__ __forceinline__ void wait_for_turn(const int* counter, int turn) {
    int seen;
    do {
        asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(seen) : "l"(counter) : "memory");
    } while (seen != turn);
}

__device__ __forceinline__ void hand_on_turn(int* counter) {
    asm volatile("fence.acq_rel.gpu;\nred.relaxed.gpu.global.add.s32 [%0], 1;\n" :: "l"(counter) : "memory");
}

__device__ __forceinline__ void wait_turn(const int* counter, int turn) {
    if (threadIdx.x == 0) wait_for_turn(counter, turn);
    __syncthreads();  // the whole CTA's additions come after the acquire
}

__device__ __forceinline__ void pass_turn(int* counter) {
    __syncthreads();  // every thread's additions are issued before thread 0 releases them all
    if (threadIdx.x == 0) hand_on_turn(counter);
}

// The counter of query tile qt (of kTileQ rows) of (b, h) in dQ buffer `split`.
template <int kTileQ>
__device__ __forceinline__ int* dq_turn_counter(const BwdArgs& args, long long b, long long h, int qt, int split) {
    return args.dq_turns + split * args.turns_split_stride +
           (b * args.attn.heads + h) * ceil_div(args.attn.seqlen_q, kTileQ) + qt;
}

// The turn of key tile kt in the ordered sum of query tile qt: how many later key tiles that visit qt
// add into the same buffer (tile % splits). They add before it.
template <int kTileQ, int kTileK>
__device__ __forceinline__ int later_key_tiles(const AttnArgs& a, const Mask& mask, const BlockLayout& layout, int qt,
                                               int kt, int splits) {
    const TileRange tiles = key_tiles<kTileQ, kTileK>(a, mask, layout, qt);
    if (tiles.list == nullptr) return (tiles.first + tiles.count - 1 - kt) / splits;
    int turn = 0;
    for (int it = tiles.count - 1; it >= 0; --it) {
        const int tile = entry_tile(tiles.entry(it));
        if (tile <= kt) break;
        turn += (tile - kt) % splits == 0;
    }
    return turn;
}

}  // namespace cupyflash
