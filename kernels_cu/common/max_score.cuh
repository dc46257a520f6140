// The per-head maximum score (return_max_score): each query row's largest score, combined over a head's
// rows by an atomic maximum on an ordered-integer image of the float, in a (batch, heads) buffer the host
// zeroes before the launch and that max_score_decode (common/max_score.cu) turns into the float32 result.
//
// The image: the float's bits with the magnitude bits of negative values flipped order as signed
// integers the way the floats order; the sign bit flipped then makes that an unsigned order, and
// subtracting the image of -inf (0x007fffff) puts -inf at 0, so a zeroed buffer holds -inf and only
// the rows that see a key raise it. Every NaN becomes the positive quiet NaN first, whose image is
// above +inf's: a NaN score makes its head's maximum NaN, as the NumPy twin's does.
#pragma once

namespace cupyflash {

constexpr unsigned kMaxScoreNegInf = 0x007FFFFFu;

__device__ __forceinline__ unsigned max_score_image(float x) {
    const int bits = x != x ? 0x7FC00000 : __float_as_int(x);
    const unsigned ordered = static_cast<unsigned>(bits >= 0 ? bits : bits ^ 0x7FFFFFFF) ^ 0x80000000u;
    return ordered - kMaxScoreNegInf;  // -inf -> 0; nothing orders below it
}

// The float of an image.
__device__ __forceinline__ float max_score_value(unsigned image) {
    const int ordered = static_cast<int>((image + kMaxScoreNegInf) ^ 0x80000000u);
    return __int_as_float(ordered >= 0 ? ordered : ordered ^ 0x7FFFFFFF);
}

// Raises the (batch entry, head) maximum at `slot` to `score` (a row's largest score; -inf: none).
__device__ __forceinline__ void record_max_score(unsigned* slot, float score) {
    const unsigned image = max_score_image(score);
    if (image != 0u) atomicMax(slot, image);
}

}  // namespace cupyflash
