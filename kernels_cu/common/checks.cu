// The device-side check of a packed batch's row offsets, for calls that must not synchronize with the
// host (cupyflash/_validate.py checks on the host otherwise).
//   varlen_check  sets *bad when cu_seqlens_q or cu_seqlens_k is not non-decreasing from 0 to the rows of
//                 its tensor, or holds a sequence longer than the longest length the launch was sized
//                 for (the attention kernels clamp such sequences, so nothing is read or written out
//                 of bounds, but the results would be meaningless);
//   fill_nan_if   then turns a result into NaN, so that a malformed batch cannot pass unnoticed.
#include "common/dtypes.cuh"
#include "common/params.cuh"

namespace cupyflash {

// One CTA; *bad must be zeroed before the launch.
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
    if (!ok) atomicOr(bad, 1);
}

// x[i] = NaN for i < n when *bad != 0; grid-stride, and every thread returns at once when the batch is
// well formed.
template <typename T>
__global__ void __launch_bounds__(256) fill_nan_if(const int* bad, T* x, long long n) {
    if (*bad == 0) return;
    for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<long long>(gridDim.x) * blockDim.x) {
        x[i] = from_acc<T>(static_cast<acc_t<T>>(__longlong_as_double(0x7ff8000000000000ll)));
    }
}

}  // namespace cupyflash
