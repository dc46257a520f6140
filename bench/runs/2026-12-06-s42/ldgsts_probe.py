"""Issue 26: which shared-memory layouts let a warp's cp.async of whole K/V rows stay one wavefront a
128-byte line (cuDNN's decode: 4.0 wavefronts and 16 L2 sectors an instruction; ours: 10.5 and 24 with
rows padded by 16 bytes, 12 and 32 with the 16-byte XOR swizzle, 14 and 32 padded by 32; ncu, sessions
41-42), and what each costs in streaming bandwidth.

Each warp streams tiles of 16 rows of 256 bytes (head dim 128, 16-bit) of K and of V from global memory
into three stages of its own shared-memory tiles, 16 bytes a lane, as the decode kernel does (no
arithmetic). Layouts (byte offset of chunk c < 16 of row r < 16; lanes 0-15 row 2p, 16-31 row 2p + 1
in pass p, unless said):
  flat    r * 256 + 16 c                                  (no padding, no swizzle: ldmatrix 8-way conflicts)
  pad16   r * 272 + 16 c                                  (main's tiles)
  pad32   r * 288 + 16 c                                  (session 41's p32)
  xor16   r * 256 + 16 (c ^ (r % 8))                      (session 41's swz; CUTLASS's 128-byte swizzle)
  xor32   r * 256 + 32 ((c / 2) ^ (r % 4)) + 16 (c % 2)   (sectors permuted, each sector's chunks in order)
  gperm   r * 256 + 16 c, reading global chunk c ^ (r % 8) (session 41's isw)
  xor16q  xor16's layout, a pass four rows' halves: lanes 8 j .. 8 j + 7 row 4 (p % 4) + j, half p / 4
  pairs   pass p copies sector p (chunks 2p, 2p + 1) of all 16 rows, lane l row l / 2, chunk 2p + l % 2, to
          512 p + 16 l: shared writes in lane order, each global sector whole; a tile is [sector][row][2]
          (an ldmatrix phase, 8 rows at one chunk, then takes 2 wavefronts: rows r and r + 4 share banks)
  pairsw  pairs with the two chunks of rows r with (r / 4) odd swapped (16 l ^ 16): conflict-free
          ldmatrix, each global sector in one shared sector but its halves swapped
each with and without the .L2::256B prefetch hint (main's copies have it).

PYTHONPATH=$PWD python ldgsts_probe.py           GB/s of each layout (1 GiB of K and V, median of 15)
PYTHONPATH=$PWD python ldgsts_probe.py --ncu     one launch of each on 64 MiB, for
    ncu --metrics smsp__sass_l1tex_data_pipe_lsu_wavefronts_mem_shared_op_ldgsts.sum,... -k regex:probe
"""
import sys

import cupy
import numpy as np

LAYOUTS = ("flat", "pad16", "pad32", "xor16", "xor32", "gperm", "xor16q", "pairs", "pairsw")

SOURCE = r"""
template <int kLayout>
__device__ __forceinline__ void place(int pass, int lane, int* row, int* chunk, int* offset, int* gchunk) {
    int r = 2 * pass + lane / 16, c = lane % 16;
    if (kLayout == 6) { r = 4 * (pass % 4) + lane / 8; c = 8 * (pass / 4) + lane % 8; }
    if (kLayout >= 7) { r = lane / 2; c = 2 * pass + lane % 2; }
    int o;
    switch (kLayout) {
        case 7: o = 512 * pass + 16 * lane; break;
        case 8: o = (512 * pass + 16 * lane) ^ (((r >> 2) & 1) << 4); break;
        case 0: o = r * 256 + 16 * c; break;
        case 1: o = r * 272 + 16 * c; break;
        case 2: o = r * 288 + 16 * c; break;
        case 3: case 6: o = r * 256 + 16 * (c ^ (r & 7)); break;
        case 4: o = r * 256 + 32 * ((c >> 1) ^ (r & 3)) + 16 * (c & 1); break;
        default: o = r * 256 + 16 * c; break;
    }
    *row = r; *chunk = c; *offset = o;
    *gchunk = kLayout == 5 ? (c ^ (r & 7)) : c;
}

template <int kLayout, bool kHint>
__global__ void __launch_bounds__(128) probe(const unsigned char* __restrict__ k, const unsigned char* __restrict__ v,
                                             int tiles, int* out) {
    extern __shared__ __align__(1024) unsigned char smem[];
    constexpr int kTileBytes = 16 * 288, kStages = 3;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int warps = gridDim.x * 4, me = blockIdx.x * 4 + warp;
    unsigned char* mine = smem + warp * 2 * kStages * kTileBytes;
    const unsigned base = static_cast<unsigned>(__cvta_generic_to_shared(mine));
    int it = 0;
    for (int tile = me; tile < tiles; tile += warps, ++it) {
        const int stage = it % kStages;
        const unsigned dk = base + stage * 2 * kTileBytes, dv = dk + kTileBytes;
#pragma unroll
        for (int pass = 0; pass < 8; ++pass) {
            int r, c, o, gc;
            place<kLayout>(pass, lane, &r, &c, &o, &gc);
            const long long g = (static_cast<long long>(tile) * 16 + r) * 256 + 16 * gc;
            if (kHint) {
                asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" :: "r"(dk + o), "l"(k + g));
                asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" :: "r"(dv + o), "l"(v + g));
            } else {
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(dk + o), "l"(k + g));
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(dv + o), "l"(v + g));
            }
        }
        asm volatile("cp.async.commit_group;\n" ::);
        asm volatile("cp.async.wait_group 1;\n" ::);
        __syncwarp();
    }
    asm volatile("cp.async.wait_group 0;\n" ::);
    __syncwarp();
    if (lane == 0 && mine[0] == 0x5a && mine[1] == 0xa5) atomicAdd(out, 1);  // keeps the copies observable
}
"""

SMEM = 4 * 2 * 3 * 16 * 288  # 110,592 bytes: two CTAs an SM


def kernels():
    names = [f"probe<{i}, {'true' if h else 'false'}>" for i in range(len(LAYOUTS)) for h in (False, True)]
    module = cupy.RawModule(code=SOURCE, options=("-std=c++17",), name_expressions=names)
    out = {}
    for i, layout in enumerate(LAYOUTS):
        for h in (False, True):
            f = module.get_function(f"probe<{i}, {'true' if h else 'false'}>")
            f.max_dynamic_shared_size_bytes = SMEM
            out[layout + ("+L2" if h else "")] = f
    return out


def main():
    ncu = "--ncu" in sys.argv
    total = (64 if ncu else 1024) << 20  # bytes of K and V together
    tiles = total // 2 // 4096
    rng = np.random.default_rng(0)
    k = cupy.asarray(rng.integers(0, 255, total // 2, dtype=np.uint8))
    v = cupy.asarray(rng.integers(0, 255, total // 2, dtype=np.uint8))
    out = cupy.zeros(1, np.int32)
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    grid = (2 * sms,)
    fs = kernels()
    args = (k, v, np.int32(tiles), out)
    print(cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), f"{total >> 20} MiB, grid {grid[0]} x 128")
    for name, f in fs.items():
        if ncu:
            f(grid, (128,), args, shared_mem=SMEM)
            continue
        for _ in range(3):
            f(grid, (128,), args, shared_mem=SMEM)
        times = []
        for _ in range(15):
            a, b = cupy.cuda.Event(), cupy.cuda.Event()
            a.record()
            f(grid, (128,), args, shared_mem=SMEM)
            b.record()
            b.synchronize()
            times.append(cupy.cuda.get_elapsed_time(a, b))
        ms = float(np.median(times))
        print(f"{name:10s} {ms:7.3f} ms  {total / ms / 1e6:7.1f} GB/s", flush=True)
    cupy.cuda.Device().synchronize()


if __name__ == "__main__":
    main()
