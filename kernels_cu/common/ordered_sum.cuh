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

// Without the ordered sum the dQ buffers need not be zeroed first (BwdArgs::dq_claims, the Hopper 16-bit
// backward): each query tile keeps a pair {claims, written}. A CTA claims the tile (atomicAdd on claims)
// before it writes its share; the first claimant stores the share, then hands on the written turn (0 to 1,
// hand_on_turn after its bulk writes are done), and every later claimant waits for that turn before it
// adds (an addition the store overtook would be lost). A claimant waits only for a first claimant that
// is running and holds no other unwritten claim, so the waits cannot form a cycle. A tile no CTA claims
// is never written: bwd_dq_convert writes its rows as zeros. Zeroing the buffers cost a write of all of
// them (half of bwd_delta's bytes) and the additions' reads of those zeros back.
__device__ __forceinline__ int* dq_claim(const BwdArgs& args, long long b, long long h, int tile) {
    return args.dq_claims + 2 * ((b * args.attn.heads + h) * ceil_div(args.attn.seqlen_q, args.dq_claim_rows) + tile);
}

// BwdArgs::deterministic: 0, atomic additions in any order; otherwise the ordered sum, in one of two
// orders. kOrderedByLaunch: later key tiles add first, and the key tiles launch last-first, so a CTA
// only waits for CTAs launched before it, on any number of SMs. kOrderedByWalk (the host sets it when
// the key tiles of one (batch entry, kv head) are at most the SMs, so they all run at once): a query
// tile takes its additions in the order the CTAs' walks reach it, so a CTA waits only for CTAs that
// reached the tile earlier (walk_rotation, key_tile_turn), and the key tiles launch first-first.
constexpr int kOrderedByLaunch = 1;
constexpr int kOrderedByWalk = 2;

// The turn of key tile kt in the ordered sum of query tile qt under kOrderedByLaunch: how many later
// key tiles that visit qt add into the same buffer (tile % splits). They add before it.
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

// Rotated walks. Without a causal mask, window or block mask every key tile visits every query tile,
// so walks that all start at query tile 0 reach each tile at the same step, and its additions form one
// chain of hand-overs (a turn waits for the previous CTA's additions to be written): at the start the
// last CTA of a buffer's chain of n waits n - 1 of them. Under kOrderedByWalk the CTAs of a chain (key
// tiles c * splits + kt % splits, c < n) instead start their walks at query tile r(c) = c * M / n of
// the M and go round; query tile q then meets them in order of (q - r(c)) mod M, the step at which they
// reach it, so each CTA finds its predecessor there M / n steps ahead (ties, when M < n: the higher c
// first). Waits only go to CTAs at earlier steps of their own walks (at equal steps, to a higher c), so
// no cycle of waits forms, and with every CTA of the chain running none waits for ever. The host sets
// kOrderedByWalk only where M * n fits 31 bits and the problem has no causal mask, window or block
// mask (the test below repeats that). Causal and window walks are staggered already (key tile kt
// starts where the later ones have passed) and keep kOrderedByLaunch, in which each CTA waits for the
// later key tiles, which reached the query tile before it and launched before it.
__device__ __forceinline__ bool rotated_walks(const BwdArgs& args, const Mask& mask) {
    return args.deterministic == kOrderedByWalk && mask.unbounded() && args.attn.sparse.kv_index == nullptr;
}

// Query tiles (m) and key tiles of kt's chain (n) of the rotated walks.
template <int kTileQ, int kTileK>
__device__ __forceinline__ void rotation_sizes(const BwdArgs& args, const Mask& mask, int kt, int* m, int* n) {
    *m = ceil_div(mask.seqlen_q, kTileQ);
    *n = (ceil_div(mask.seqlen_k, kTileK) - 1 - kt % args.dq_splits) / args.dq_splits + 1;
}

// The entry of key tile kt's query tiles at which its walk starts: r(c), or 0 for unrotated walks.
template <int kTileQ, int kTileK>
__device__ __forceinline__ int walk_rotation(const BwdArgs& args, const Mask& mask, int kt) {
    if (!rotated_walks(args, mask)) return 0;
    int m, n;
    rotation_sizes<kTileQ, kTileK>(args, mask, kt, &m, &n);
    return kt / args.dq_splits * m / n;
}

// The turn of key tile kt in the ordered sum of query tile qt: the CTAs before it in that tile's order.
template <int kTileQ, int kTileK>
__device__ __forceinline__ int key_tile_turn(const BwdArgs& args, const Mask& mask, const BlockLayout& layout, int qt,
                                             int kt, bool rotated) {
    if (!rotated) return later_key_tiles<kTileQ, kTileK>(args.attn, mask, layout, qt, kt, args.dq_splits);
    // Members with r(c') <= qt (c' * m < (qt + 1) * n: the first `reached`) meet qt in descending c'
    // from the last of them, then those with r(c') > qt, again descending.
    int m, n;
    rotation_sizes<kTileQ, kTileK>(args, mask, kt, &m, &n);
    return (min(ceil_div((qt + 1) * n, m), n) - 1 - kt / args.dq_splits + n) % n;
}

}  // namespace cupyflash
