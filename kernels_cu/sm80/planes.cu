// float32 operands as three bfloat16 planes, split once before the tensor-core kernels read them:
//   split_planes  x = hi + mid + lo exactly (Sm80Operands<float>::split2, so the planes hold the very
//                 parts the kernels split in registers), for every element of a (batch, rows, heads,
//                 dim) tensor, into (batch, rows, 3 * heads, dim_planes): plane p of head h is head
//                 p * heads + h, its columns from dim to dim_planes zero. With kTf32, lo is left zero.
// A thread takes 8 columns of one (batch entry, row, head): two 16-byte loads where they are whole and
// aligned (else 8), three 16-byte stores.
#include "common/dtypes.cuh"
#include "common/params.cuh"
#include "common/sequence.cuh"
#include "sm80/operands.cuh"

namespace cupyflash {

template <typename T, bool kTf32>
__global__ void __launch_bounds__(256)
split_planes(const CUPYFLASH_GRID_CONSTANT TensorArg src, const CUPYFLASH_GRID_CONSTANT TensorArg dst, int batch,
             int rows, int heads, int dim, int dim_planes) {
    static_assert(sizeof(T) == 4, "float32 only");
    using Ops = Sm80Operands<float, kTf32>;
    const int chunks = dim_planes / 8;
    const long long count = static_cast<long long>(batch) * rows * heads * chunks;
    for (long long u = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; u < count;
         u += static_cast<long long>(gridDim.x) * blockDim.x) {
        const int c0 = static_cast<int>(u % chunks) * 8;
        const long long rest = u / chunks;
        const int h = static_cast<int>(rest % heads);
        const int r = static_cast<int>((rest / heads) % rows);
        const int b = static_cast<int>(rest / (static_cast<long long>(heads) * rows));
        const float* x = head_rows<const float>(src, b, r, h) + c0;
        float v[8];
        if (c0 + 8 <= dim && reinterpret_cast<size_t>(x) % 16 == 0) {  // two 16-byte loads
            const float4 a = reinterpret_cast<const float4*>(x)[0], c = reinterpret_cast<const float4*>(x)[1];
            v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = c.x, v[5] = c.y, v[6] = c.z, v[7] = c.w;
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) v[e] = c0 + e < dim ? x[e] : 0.0f;
        }
        unsigned hi[4], mid[4], lo[4] = {0u, 0u, 0u, 0u};
#pragma unroll
        for (int i = 0; i < 4; ++i) Ops::split2(v[2 * i], v[2 * i + 1], hi[i], mid[i], lo[i]);
        __nv_bfloat16* out = head_rows<__nv_bfloat16>(dst, b, r, h) + c0;
        const long long plane = static_cast<long long>(heads) * dst.head_stride;
        *reinterpret_cast<uint4*>(out) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
        *reinterpret_cast<uint4*>(out + plane) = make_uint4(mid[0], mid[1], mid[2], mid[3]);
        *reinterpret_cast<uint4*>(out + 2 * plane) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
    }
}

}  // namespace cupyflash
