// The device-side checks of calls that must not synchronize with the host (cupyflash/_problem.py checks
// on the host otherwise):
//   varlen_check  sets *bad to 1 when cu_seqlens_q or cu_seqlens_k is not non-decreasing from 0 to the
//                 rows of its tensor, or holds a sequence longer than the longest length the launch was
//                 sized for (the attention kernels clamp such sequences, so nothing is read or written
//                 out of bounds, but the results would be meaningless), and to 0 otherwise;
//   fill_nan_if   then turns every result into NaN, so that a malformed batch cannot pass unnoticed.
#include "common/dtypes.cuh"
#include "common/params.cuh"

namespace cupyflash {

// One CTA. *bad is written whatever its value was, so it needs no zeroing before the launch.
__global__ void __launch_bounds__(256) varlen_check(const CUPYFLASH_GRID_CONSTANT AttnArgs a, int* bad) {
    bool ok = true;
    for (int b = threadIdx.x; b <= a.batch; b += blockDim.x) {
        const int q = a.cu_seqlens_q[b], k = a.cu_seqlens_k[b];
        if (b == 0) ok = ok && q == 0 && k == 0;
        if (b == a.batch) ok = ok && q == a.total_q && k == a.total_k;
        if (b > 0) {
            const int len_q = q - a.cu_seqlens_q[b - 1], len_k = k - a.cu_seqlens_k[b - 1];
            ok = ok && len_q >= 0 && len_k >= 0 && len_q <= a.seqlen_q && len_k <= a.seqlen_k;
        }
    }
    ok = __syncthreads_and(ok);
    if (threadIdx.x == 0) *bad = ok ? 0 : 1;
}

// Up to three results of one call (a forward's out and lse, a backward's dq, dk and dv), each `words`
// elements of `width` bytes (2, 4 or 8) whose NaN is the bit pattern `nan`; unused entries have no
// words.
struct NanFill {
    void* ptr[3];
    long long words[3];
    unsigned long long nan[3];
    int width[3];
};

// Every element of every result becomes NaN when *bad != 0; grid-stride, and every thread returns at
// once when the batch is well formed.
__global__ void __launch_bounds__(256) fill_nan_if(const int* bad, const CUPYFLASH_GRID_CONSTANT NanFill f) {
    if (*bad == 0) return;
    const long long start = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
    const long long step = static_cast<long long>(gridDim.x) * blockDim.x;
#pragma unroll 1
    for (int x = 0; x < 3; ++x) {
        for (long long i = start; i < f.words[x]; i += step) {
            if (f.width[x] == 2) {
                static_cast<unsigned short*>(f.ptr[x])[i] = static_cast<unsigned short>(f.nan[x]);
            } else if (f.width[x] == 4) {
                static_cast<unsigned*>(f.ptr[x])[i] = static_cast<unsigned>(f.nan[x]);
            } else {
                static_cast<unsigned long long*>(f.ptr[x])[i] = f.nan[x];
            }
        }
    }
}

}  // namespace cupyflash
