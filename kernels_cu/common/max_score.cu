// The maximum score's result: the float32 (batch, heads) values of the images the forward's rows raised
// (common/max_score.cuh), after the forward, in the call's plan.
#include "common/max_score.cuh"

namespace cupyflash {

struct MaxScoreDecodeArgs {
    const unsigned* images;
    float* out;
    int count;
};

__global__ void __launch_bounds__(256) max_score_decode(const MaxScoreDecodeArgs args) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < args.count; i += gridDim.x * blockDim.x) {
        args.out[i] = max_score_value(args.images[i]);
    }
}

}  // namespace cupyflash
