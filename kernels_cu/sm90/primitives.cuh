// Hopper (sm_90a) primitives: TMA tensor copies, mbarriers, named barriers, register reallocation and the
// shared-memory descriptors of wgmma (generated/wgmma_ops.cuh holds the instructions). ../shared/HOPPER.md in the
// developers' notes lists the sources of each encoding; the layouts below were checked against a
// float64 reference on an H200.
//
// Shared-memory tiles of 16-bit elements are stored in "atoms" of 64 columns (128 bytes per row) with
// the 128-byte swizzle: inside every 8-row, 1024-byte group the 16-byte chunk index of row r is XORed
// with r % 8. A tile of R rows and C columns is C / 64 atoms of R * 128 bytes, each 1024-byte aligned;
// TMA writes that layout (CU_TENSOR_MAP_SWIZZLE_128B with a box of 64 columns) and wgmma reads it.
#pragma once

namespace cupyflash {

// A CUtensorMap (built on the host with cuTensorMapEncodeTiled, passed by value as a __grid_constant__
// kernel parameter so the TMA unit can read it from the parameter space).
struct alignas(64) TmaDesc {
    unsigned long long words[16];
};

__device__ __forceinline__ unsigned shared_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// ---- mbarriers (64-bit, in shared memory) ----

__device__ __forceinline__ void mbarrier_init(unsigned long long* bar, int arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_addr(bar)), "r"(arrivals));
}

// Makes the initializations visible to the async proxy (TMA) before any thread uses the barriers.
__device__ __forceinline__ void mbarrier_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// One arrival that also announces `bytes` of TMA transactions the current phase must wait for.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(unsigned long long* bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(shared_addr(bar)), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void mbarrier_arrive(unsigned long long* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(shared_addr(bar)) : "memory");
}

// Waits until the phase of parity `parity` has completed (acquire: the writes released by its arrivals,
// and the TMA bytes counted on it, are visible afterwards).
__device__ __forceinline__ void mbarrier_wait(unsigned long long* bar, int parity) {
    const unsigned addr = shared_addr(bar);
    unsigned done;
    do {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(addr), "r"(parity)
            : "memory");
    } while (!done);
}

// ---- clusters (the paired forward: sm90/fwd.cu's sm90_fwd_pairs) ----

// This CTA's rank in its cluster.
__device__ __forceinline__ int cluster_rank() {
    unsigned rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
    return static_cast<int>(rank);
}

// Every thread of every CTA of the cluster: the writes before it (shared memory of any of them, barrier
// initializations) are visible to all after it.
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}

// The shared::cluster address of `p` (this CTA's shared memory) in CTA `rank` of the cluster: the same
// offset in its shared memory.
__device__ __forceinline__ unsigned cluster_addr(const void* p, int rank) {
    unsigned remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(shared_addr(p)), "r"(rank));
    return remote;
}

// An arrival on the barrier at `bar`'s offset in CTA `rank` of the cluster, releasing this thread's
// earlier writes at cluster scope.
__device__ __forceinline__ void mbarrier_arrive_cluster(unsigned long long* bar, int rank) {
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(cluster_addr(bar, rank))
                 : "memory");
}

// An arrival on the barrier at `bar`'s offset in CTA `rank` of the cluster with the default semantics
// (release at CTA scope: it orders none of this thread's writes for the other CTA's threads).
__device__ __forceinline__ void mbarrier_arrive_remote(unsigned long long* bar, int rank) {
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(cluster_addr(bar, rank)) : "memory");
}

// mbarrier_wait for a barrier whose arrivals release writes at cluster scope (mbarrier_arrive_cluster):
// acquire at cluster scope.
__device__ __forceinline__ void mbarrier_wait_cluster(unsigned long long* bar, int parity) {
    const unsigned addr = shared_addr(bar);
    unsigned done;
    do {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
            "selp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(addr), "r"(parity)
            : "memory");
    } while (!done);
}

// Writes `value` at `p`'s offset in the shared memory of CTA `rank` of the cluster.
__device__ __forceinline__ void store_cluster(int* p, int rank, int value) {
    asm volatile("st.shared::cluster.u32 [%0], %1;\n" ::"r"(cluster_addr(p, rank)), "r"(value) : "memory");
}

// ---- TMA ----

// Copies the box at element coordinates (c0 innermost, c1, c2, c3) of the tensor map into shared memory
// at dst, counting its bytes on bar. Out-of-bounds elements are written as zeros and still counted.
__device__ __forceinline__ void tma_load_4d(void* dst, const TmaDesc& map, unsigned long long* bar, int c0, int c1,
                                            int c2, int c3) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
        "[%6];\n" ::"r"(shared_addr(dst)),
        "l"(reinterpret_cast<unsigned long long>(&map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(shared_addr(bar))
        : "memory");
}

// tma_load_4d for a 5-D map (coordinates c0 innermost, ..., c4).
__device__ __forceinline__ void tma_load_5d(void* dst, const TmaDesc& map, unsigned long long* bar, int c0, int c1,
                                            int c2, int c3, int c4) {
    asm volatile(
        "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5, "
        "%6}], [%7];\n" ::"r"(shared_addr(dst)),
        "l"(reinterpret_cast<unsigned long long>(&map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4),
        "r"(shared_addr(bar))
        : "memory");
}

// tma_load_4d and tma_load_5d into every CTA of `ctas` (a mask of cluster ranks): the box lands at dst's
// offset in each one's shared memory and its bytes count on the barrier at bar's offset there.
__device__ __forceinline__ void tma_load_4d_multicast(void* dst, const TmaDesc& map, unsigned long long* bar,
                                                      unsigned short ctas, int c0, int c1, int c2, int c3) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, "
        "{%2, %3, %4, %5}], [%6], %7;\n" ::"r"(shared_addr(dst)),
        "l"(reinterpret_cast<unsigned long long>(&map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(shared_addr(bar)),
        "h"(ctas)
        : "memory");
}

__device__ __forceinline__ void tma_load_5d_multicast(void* dst, const TmaDesc& map, unsigned long long* bar,
                                                      unsigned short ctas, int c0, int c1, int c2, int c3, int c4) {
    asm volatile(
        "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, "
        "{%2, %3, %4, %5, %6}], [%7], %8;\n" ::"r"(shared_addr(dst)),
        "l"(reinterpret_cast<unsigned long long>(&map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4),
        "r"(shared_addr(bar)), "h"(ctas)
        : "memory");
}

// Adds the box at src (shared memory, in the map's swizzled layout) into the tensor at element
// coordinates (c0 innermost, ..., c4), elementwise, done by the TMA unit in L2; elements outside the
// tensor are dropped. Completes in this thread's bulk group (bulk_commit, then bulk_wait_read or
// bulk_wait).
__device__ __forceinline__ void tma_reduce_add_5d(const TmaDesc& map, const void* src, int c0, int c1, int c2, int c3,
                                                  int c4) {
    asm volatile(
        "cp.reduce.async.bulk.tensor.5d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2, %3, %4, %5}], [%6];\n" ::"l"(
            reinterpret_cast<unsigned long long>(&map)),
        "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(shared_addr(src))
        : "memory");
}

// Writes the box at src (shared memory, in the map's swizzled layout) into the tensor at element
// coordinates (c0 innermost, ..., c3); elements outside the tensor are dropped. Completes in this
// thread's bulk group, like tma_reduce_add_5d.
__device__ __forceinline__ void tma_store_4d(const TmaDesc& map, const void* src, int c0, int c1, int c2, int c3) {
    asm volatile(
        "cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n" ::"l"(
            reinterpret_cast<unsigned long long>(&map)),
        "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(shared_addr(src))
        : "memory");
}

// The same into a 5-D tensor (the float32 dQ buffers' view, whose first share of a tile is stored, not
// added: BwdArgs::dq_claims).
__device__ __forceinline__ void tma_store_5d(const TmaDesc& map, const void* src, int c0, int c1, int c2, int c3, int c4) {
    asm volatile(
        "cp.async.bulk.tensor.5d.global.shared::cta.tile.bulk_group [%0, {%1, %2, %3, %4, %5}], [%6];\n" ::"l"(
            reinterpret_cast<unsigned long long>(&map)),
        "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(shared_addr(src))
        : "memory");
}

__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }

// Waits until this thread's bulk groups have read their shared-memory sources (the buffer may be
// rewritten), or, for bulk_wait, until their writes are done too; bulk_wait_read<kPending> leaves the
// kPending most recent groups running.
template <int kPending = 0>
__device__ __forceinline__ void bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}
__device__ __forceinline__ void bulk_wait() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

// Orders this thread's accesses to device memory through the generic proxy (ordinary loads, stores,
// atomics) with those of the async proxy (bulk copies), both ways.
__device__ __forceinline__ void fence_proxy_async_global() {
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

__device__ __forceinline__ void tma_prefetch_desc(const TmaDesc& map) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<unsigned long long>(&map)) : "memory");
}

// ---- barriers among some warps, and register reallocation ----

// Named barrier `id` (1-15; 0 is __syncthreads) for `threads` threads (a multiple of 32).
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// The registers of every thread of the calling warpgroup become kRegs (effective only under
// __launch_bounds__(threads, 1); ptxas warns C7508 otherwise).
template <int kRegs>
__device__ __forceinline__ void warpgroup_set_registers() {
    static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg takes multiples of 8 in [24, 256]");
    if constexpr (kRegs >= 128) {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
    } else {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
    }
}

// Orders this thread's earlier ordinary shared-memory stores before later reads by the async proxy
// (wgmma operands, TMA stores).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// ---- wgmma ordering ----

// Before the first wgmma of a batch: orders earlier register writes (accumulators, A fragments) and
// shared-memory accesses before the asynchronous products.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most kPending committed groups of this warpgroup are still running.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Keeps the compiler from moving reads or writes of accumulator registers across a wgmma batch: the
// asm statements above do not name them, so without this the registers an asynchronous product is
// still writing could be read early.
template <int kTiles>
__device__ __forceinline__ void fence_fragments(float (&d)[kTiles][4]) {
#pragma unroll
    for (int i = 0; i < kTiles; ++i) {
#pragma unroll
        for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[i][e])::"memory");
    }
}

// Zeroes rows [first, rows) of a tile of `rows` rows in `atoms` 64-column atoms, shared among `threads`
// threads (this one is number `thread`). The swizzle permutes 16-byte chunks only inside a row, so whole
// rows are zeroed without it. The caller orders the stores before wgmma reads (fence_proxy_async and a
// barrier).
__device__ __forceinline__ void zero_tile_rows(unsigned char* tile, int rows, int first, int atoms, int thread,
                                               int threads) {
    const int chunks = (rows - first) * 8;  // 16-byte chunks per atom
    for (int idx = thread; idx < chunks * atoms; idx += threads) {
        const int atom = idx / chunks, chunk = idx % chunks;
        *reinterpret_cast<uint4*>(tile + atom * rows * 128 + first * 128 + chunk * 16) = make_uint4(0, 0, 0, 0);
    }
}

// zero_tile_rows for a tile laid out in blocks of block_rows rows, [block][atom][block_rows][64] (the
// paged forward's V tiles: Sm90FwdMaps::v_box_rows).
__device__ __forceinline__ void zero_blocked_rows(unsigned char* tile, int rows, int first, int atoms, int block_rows,
                                                  int thread, int threads) {
#pragma unroll 1  // (a cold path: the last tile of a sequence)
    for (int idx = thread; idx < (rows - first) * 8 * atoms; idx += threads) {
        const int row = first + idx / (8 * atoms), atom = idx / 8 % atoms, chunk = idx % 8;
        const int block = row / block_rows;
        *reinterpret_cast<uint4*>(tile + ((block * atoms + atom) * block_rows + row - block * block_rows) * 128 +
                                  chunk * 16) = make_uint4(0, 0, 0, 0);
    }
}

// ---- shared-memory descriptors (128-byte swizzle) ----

// Bits 0-13: address / 16; 16-29: leading byte offset / 16; 32-45: stride byte offset / 16; 62-63:
// swizzle mode 1 = 128B. The stride byte offset is the 1024 bytes between 8-row groups.
__device__ __forceinline__ unsigned long long smem_desc(unsigned addr, unsigned leading_bytes) {
    return static_cast<unsigned long long>((addr & 0x3FFFF) >> 4) |
           static_cast<unsigned long long>(leading_bytes >> 4) << 16 | static_cast<unsigned long long>(1024 >> 4) << 32 |
           1ull << 62;
}

// The descriptor of the same layout `bytes` further on (a multiple of 16 that keeps the address inside
// shared memory): the address field is the low 14 bits, so a 64-bit add moves it.
__device__ __forceinline__ unsigned long long desc_advance(unsigned long long desc, unsigned bytes) {
    return desc + (bytes >> 4);
}

// K-major operand (A = Q rows, or B = K rows of a q.k product): the descriptor of k-step 0 of a tile of
// kRows rows starting at row `row` (a multiple of 8), and the offset of k-step kk. Steps inside an atom
// move 32 bytes; atoms are kRows * 128 bytes apart. The leading byte offset is unused for swizzled
// K-major layouts (encoded as 1).
__device__ __forceinline__ unsigned long long kmajor_desc(unsigned tile, int row) {
    return smem_desc(tile + row * 128, 16);
}
template <int kRows>
__device__ __forceinline__ constexpr unsigned kmajor_step(int kk) {
    return (kk / 4) * kRows * 128 + (kk % 4) * 32;
}

// MN-major B operand (V stored [keys][columns], read transposed for P V): the descriptor of k-step 0;
// k-step kk covers keys 16 kk ... 16 kk + 15, 2048 bytes on. The leading byte offset is the kRows * 128
// bytes between the 64-column atoms that N spans.
template <int kRows>
__device__ __forceinline__ unsigned long long mnmajor_desc(unsigned tile) {
    return smem_desc(tile, kRows * 128);
}
__device__ __forceinline__ constexpr unsigned mnmajor_step(int kk) { return kk * 2048; }

}  // namespace cupyflash
