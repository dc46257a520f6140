// Accumulator fragments as the A operand of the next product: the probabilities P of the forward
// (O += P V), P^T and dS^T of the backward (dV += P^T dO, dK += dS^T Q), rounded to T. Two 8-column
// n-tiles of a 16-row accumulator (the mma.sync C layout) make one 16 x 16 A fragment of packed pairs:
// exactly the register layout mma.sync and wgmma take for A (sm80/mma.cuh), with no data movement.
#pragma once
#include "common/dtypes.cuh"

namespace cupyflash {

// The A fragment of k-step kk from n-tiles 2 kk (lo) and 2 kk + 1 (hi).
template <typename T>
__device__ __forceinline__ void pack_a_fragment(unsigned (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
    a[0] = pack2<T>(lo[0], lo[1]);
    a[1] = pack2<T>(lo[2], lo[3]);
    a[2] = pack2<T>(hi[0], hi[1]);
    a[3] = pack2<T>(hi[2], hi[3]);
}

// Every k-step of a 16-row accumulator of 2 kSteps n-tiles.
template <typename T, int kSteps>
__device__ __forceinline__ void to_operand(unsigned (&a)[kSteps][4], const float (&x)[2 * kSteps][4]) {
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) pack_a_fragment<T>(a[kk], x[2 * kk], x[2 * kk + 1]);
}

}  // namespace cupyflash
