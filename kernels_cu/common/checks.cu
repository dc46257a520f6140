// The device-side check of a packed batch, for calls that must not synchronize with the host
// (cupyflash/_problem.py checks on the host otherwise): varlen_check_fill turns every result of the
// call into NaN when cu_seqlens_q or cu_seqlens_k is not non-decreasing from 0 to the rows of its tensor,
// or holds a sequence longer than the longest length the launch was sized for. The attention kernels
// clamp such sequences, so nothing is read or written out of bounds, but their results would be
// meaningless, and a malformed batch must not pass unnoticed.
#include "common/dtypes.cuh"
#include "common/params.cuh"

namespace cupyflash {

// Up to three results of one call (a forward's out and lse, a backward's dq, dk and dv), each `words`
// elements of `width` bytes (2, 4 or 8) whose NaN is the bit pattern `nan`; unused entries have no
// words.
struct NanFill {
    void* ptr[3];
    long long words[3];
    unsigned long long nan[3];
    int width[3];
};

// Launched after the call's kernels: every CTA checks the batch (2 * (batch + 1) loads, from L2 after the
// first CTA), and when it is malformed turns its grid-stride share of every result into NaN. One launch,
// no flag in memory; the host caps the grid so the checks read little (cupyflash/_families/common.py).
__global__ void __launch_bounds__(256) varlen_check_fill(const CUPYFLASH_GRID_CONSTANT AttnArgs a,
                                                         const CUPYFLASH_GRID_CONSTANT NanFill f) {
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
    if (__syncthreads_and(ok)) return;
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
