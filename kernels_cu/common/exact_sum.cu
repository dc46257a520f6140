// The deterministic backward's score_mod buffer gradients from their exact sums (common/exact_sum.cuh):
// one thread per element, grid-stride.
#include "common/exact_sum.cuh"

namespace cupyflash {

struct FinishExactArgs {
    const long long* words;  // exact_sum_slots<F>() per element
    void* out;               // F, count elements
    long long count;
};

template <typename F>
__global__ void __launch_bounds__(256) finish_exact_sums(const FinishExactArgs args) {
    for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < args.count;
         i += static_cast<long long>(gridDim.x) * blockDim.x) {
        static_cast<F*>(args.out)[i] = exact_sum_finish<F>(args.words + i * exact_sum_slots<F>());
    }
}

}  // namespace cupyflash
