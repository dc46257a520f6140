"""The Hopper MLA decode kernel's hand-offs between its two warpgroups alone (kernels_cu/kvcache/mla_sm90.cu),
for compute-sanitizer racecheck:
does racecheck report a `bar.arrive` -> `bar.sync` hand-off where nothing races, and a `__syncthreads`
that follows such hand-offs?

Two warpgroups pass values through shared memory per round, as the MLA kernel passes P and its scales:
warpgroup 0 writes slot[tid] and arrives on barrier 1; warpgroup 1 syncs on 1, reads it, writes its own
value into the same slot and arrives on barrier 2; warpgroup 0 syncs on 2 and reads it. The next round's
write of warpgroup 0 is ordered after warpgroup 1's read of the last by barrier 2, and warpgroup 1's next
write after warpgroup 0's read by barrier 1. After the rounds every thread writes one value, the block
syncs (`__syncthreads`) and every thread reads the value of a thread of the other warpgroup (the kernel's
row sums). Mode 0 uses `bar.arrive` for the arrivals; mode 1 `bar.sync` (both warpgroups wait, in the
same order); mode 2 `bar.sync` too, and each warpgroup also syncs on a barrier of its own 128 threads
(the kernel's `kOwnWarpgroup + wg`), warpgroup 0 once a round and warpgroup 1 twice. Nothing races in any
mode, so any hazard racecheck reports is one of its model. The script checks the sums the threads saw.
On an H100 (2026-12-06, NVRTC 13.0) mode 1 drew no hazard; modes 0 and 2 drew one, 128 times: warpgroup
1's write of slot[tid] against warpgroup 0's read of it after barrier 2, a hand-off that every mode
orders by that barrier (in mode 2 both sides `bar.sync`). So racecheck's reports on the kernel's
hand-offs (bench/NOTES.md, session 38) are not evidence of a race.
Run on an H100/H200 from the repository root, one mode a process (the modes share their instructions):

    PYTHONPATH=$PWD compute-sanitizer --tool racecheck python3 tests/sanitize_named_barrier.py [MODE]
"""

import sys

import cupy
import numpy

from cupyflash import _kernels

SOURCE = r"""
#include "sm90/primitives.cuh"

using namespace cupyflash;

extern "C" __global__ void __launch_bounds__(256, 1)
handoff(int rounds, int mode, unsigned long long* sums) {
    __shared__ int slot[128];
    __shared__ int last[256];
    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
    const auto arrive = [&](int id) {
        if (mode == 0) {
            named_barrier_arrive(id, 256);
        } else {
            named_barrier_sync(id, 256);
        }
    };
    unsigned long long sum = 0;
    for (int i = 0; i < rounds; ++i) {
        if (mode == 2) {
            for (int j = 0; j <= wg; ++j) named_barrier_sync(3 + wg, 128);
        }
        if (wg == 0) {
            slot[tid] = i + tid;
            arrive(1);
            named_barrier_sync(2, 256);
            sum += slot[tid];  // warpgroup 1's i + 2 * tid
        } else {
            named_barrier_sync(1, 256);
            sum += slot[tid];  // i + tid
            slot[tid] = i + 2 * tid;
            arrive(2);
        }
    }
    last[threadIdx.x] = static_cast<int>(threadIdx.x);
    __syncthreads();
    sum += last[(threadIdx.x + 128) % 256];
    sums[threadIdx.x] = sum;
}
"""

ROUNDS = 32


def run(mode):
    """Launch the hand-offs once (mode 0: bar.arrive, 1: bar.sync, 2: bar.sync and barriers of each
    warpgroup's own) and check every thread's sum."""
    module = cupy.RawModule(code=SOURCE, options=_kernels.compile_options("90a"))
    kernel = module.get_function("handoff")
    sums = cupy.zeros(256, dtype=cupy.uint64)
    kernel((1,), (256,), (numpy.int32(ROUNDS), numpy.int32(mode), sums))
    tid = numpy.arange(256) % 128
    rounds = ROUNDS * (ROUNDS - 1) // 2
    expected = rounds + ROUNDS * numpy.where(numpy.arange(256) < 128, 2 * tid, tid) + (numpy.arange(256) + 128) % 256
    got = cupy.asnumpy(sums)
    assert (got == expected).all(), f"mode {mode}: sums differ at threads {numpy.flatnonzero(got != expected)[:8]}"


if __name__ == "__main__":
    if cupy.cuda.Device().compute_capability != "90":
        raise SystemExit("sanitize_named_barrier: needs a compute capability 9.0 GPU (sm_90a)")
    names = {0: "bar.arrive", 1: "bar.sync", 2: "bar.sync and each warpgroup's own barriers"}
    for mode in [int(m) for m in sys.argv[1:]] or names:
        run(mode)
        print(f"sanitize_named_barrier: mode {mode}, {names[mode]}: sums as expected")
    print("sanitize_named_barrier: done")
