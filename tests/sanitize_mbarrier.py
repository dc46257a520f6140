"""The Hopper kernels' stage hand-off alone, for compute-sanitizer racecheck (issue 20): does racecheck
report the pattern when nothing races?

One producer thread writes a value into shared memory and arrives on the stage's `full` mbarrier (with a
bulk copy counted on it, as the forward's TMA loads are, or with a plain arrival), or each of the 32 lanes
of the producer warp writes one value of a row and arrives (the backward's lse and delta rows,
sm90/bwd_mainloop.cuh `load_rows`: `full` counts 32 arrivals); eight consumer warps wait on `full`, read
the value, and release the stage through `release_stage` (sm90/pipeline.cuh: a `__syncwarp`, then one
arrival per warp on `empty`, which counts the eight); the producer waits on `empty` before it writes the
stage again. These are the forward's `st.entry[stage]` accesses (sm90/fwd_mainloop.cuh) and the
backward's `st.head` / `st.entry` and rows, with everything else taken away, built from the kernels' own
primitives. Every read is ordered after the write it sees by the mbarrier's release and acquire, so any
hazard racecheck reports here is one it reports where no race exists. The script checks the sums the
consumers saw.
Run on an H100/H200 from the repository root:

    PYTHONPATH=$PWD compute-sanitizer --tool racecheck python3 tests/sanitize_mbarrier.py
"""

import cupy
import numpy

from cupyflash import _kernels

SOURCE = r"""
#include "sm90/primitives.cuh"
#include "sm90/pipeline.cuh"

using namespace cupyflash;

constexpr int kStages = 2;
constexpr int kConsumerWarps = 8;
constexpr int kFloats = 256;  // bytes per stage: 1024, a multiple of the bulk copy's 16

extern "C" __global__ void __launch_bounds__(32 * (kConsumerWarps + 1), 1)
handoff(const float* src, int rounds, int mode, unsigned long long* sums) {
    // mode 0: one writer, plain arrival; 1: one writer, bulk copy counted on full; 2: 32 writers.
    const bool with_copy = mode == 1, lanes = mode == 2;
    __shared__ alignas(128) float data[kStages][kFloats];
    __shared__ int entry[kStages];
    __shared__ int row[kStages][32];
    __shared__ unsigned long long full[kStages], empty[kStages];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (threadIdx.x == 0) {
        for (int s = 0; s < kStages; ++s) {
            mbarrier_init(&full[s], lanes ? 32 : 1);
            mbarrier_init(&empty[s], kConsumerWarps);
        }
        mbarrier_init_fence();
    }
    __syncthreads();
    if (warp == kConsumerWarps && lanes) {
        for (int i = 0; i < rounds; ++i) {
            const int stage = i % kStages;
            if (i >= kStages) mbarrier_wait(&empty[stage], (i / kStages - 1) & 1);
            row[stage][lane] = i + lane;  // released by this lane's arrival
            mbarrier_arrive(&full[stage]);
        }
        return;
    }
    if (warp == kConsumerWarps) {
        if (lane != 0) return;
        for (int i = 0; i < rounds; ++i) {
            const int stage = i % kStages;
            if (i >= kStages) mbarrier_wait(&empty[stage], (i / kStages - 1) & 1);
            entry[stage] = i;  // released by the arrival below
            if (with_copy) {
                mbarrier_arrive_expect_tx(&full[stage], kFloats * 4);
                asm volatile(
                    "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                    ::"r"(shared_addr(data[stage])), "l"(src + i * kFloats), "r"(kFloats * 4),
                      "r"(shared_addr(&full[stage]))
                    : "memory");
            } else {
                mbarrier_arrive(&full[stage]);
            }
        }
        return;
    }
    unsigned long long sum = 0;
    for (int i = 0; i < rounds; ++i) {
        const int stage = i % kStages;
        mbarrier_wait(&full[stage], (i / kStages) & 1);
        sum += lanes ? row[stage][lane] : entry[stage];
        if (with_copy) sum += static_cast<unsigned long long>(data[stage][lane]);
        release_stage(&empty[stage]);
    }
    atomicAdd(&sums[warp * 32 + lane], sum);
}
"""

ROUNDS = 64
CONSUMER_WARPS = 8


def run(mode):
    """Launch the hand-off once (mode 0: plain arrival, 1: bulk copy, 2: 32 writing lanes) and check every
    consumer thread's sum; returns it."""
    module = cupy.RawModule(code=SOURCE, options=_kernels.compile_options("90a"))
    kernel = module.get_function("handoff")
    # Row i of the source holds i + 1 in every column, so thread (w, l) sums i + (i + 1) over the rounds.
    src = cupy.asarray(numpy.repeat(numpy.arange(1, ROUNDS + 1, dtype=numpy.float32), 256))
    sums = cupy.zeros(CONSUMER_WARPS * 32, dtype=cupy.uint64)
    kernel((1,), (32 * (CONSUMER_WARPS + 1),),
           (src, numpy.int32(ROUNDS), numpy.int32(mode), sums))
    entries = ROUNDS * (ROUNDS - 1) // 2
    copied = ROUNDS * (ROUNDS + 1) // 2 if mode == 1 else 0
    got = cupy.asnumpy(sums)
    lanes = numpy.tile(numpy.arange(32) * ROUNDS, CONSUMER_WARPS) if mode == 2 else 0  # row[lane] = i + lane
    assert (got == entries + copied + lanes).all(), f"mode {mode}: sums {sorted(set(got.tolist()))}"
    return int(got[0])


if __name__ == "__main__":
    if cupy.cuda.Device().compute_capability != "90":
        raise SystemExit("sanitize_mbarrier: needs a compute capability 9.0 GPU (sm_90a)")
    for mode, name in ((1, "bulk copy"), (0, "plain arrival"), (2, "32 writing lanes")):
        print(f"sanitize_mbarrier: {name}: sum of thread 0 {run(mode)}")
    print("sanitize_mbarrier: done")
