"""Issue 25: can one warp a scheduler keep the special-function unit busy with a softmax's exponentials?

The FP8 forward at d64/d128 needs, per pair of 64 x 128 tiles, ~1,024 cycles of MUFU.EX2 (64 a thread,
4 lanes a clock per SMSP) and ~1,024 (d128) or ~512 (d64) of tensor work; ncu (session 41) found it at a
~2,050-cycle period with the XU pipe 50% busy, as if each warpgroup's softmax phase took twice its MUFU
time and the two warpgroups' phases did not overlap. With the pingpong turns, a softmax phase runs on
one warp per SMSP; this measures the exponentials' rate for 1, 2, 3 and 4 warps per SMSP, each thread
doing what the softmax does per score: t = FFMA(s, scale, -max); p = ex2(t); sum += p (64 independent
scores a thread, the sums in 2 chains as the two rows'), and the same with only the ex2; then the same
with ex2.approx.f16x2 on packed pairs (P becomes e4m3, whose 3 mantissa bits float16's 10 cover). ptxas
lowers each to two MUFU.EX2.F16 and a PRMT on sm_90 (SASS, NVRTC 12.9): no packed pass, so these rows
only say whether the float16 form is any faster a value. Each f16x2 row counts its 64 values.

PYTHONPATH=$PWD python mufu_probe.py   prints exponentials per clock per SM (peak 16 if MUFU is 4 lanes
a clock per SMSP) and the cycles of one 64-score phase per warp.
"""
import cupy
import numpy as np

SOURCE = r"""
__device__ __forceinline__ unsigned pack_half2(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ float low_half(unsigned x) {
    float r;
    asm("{ .reg .b16 l, h; mov.b32 {l, h}, %1; cvt.f32.f16 %0, l; }" : "=f"(r) : "r"(x));
    return r;
}

// kMode 0: ex2 alone; 1: the softmax's FFMA, ex2 and sum per score; 2: ex2.approx.f16x2 on packed pairs
// alone; 3: the softmax with packed pairs (two FFMAs, a pack to f16x2, one ex2.f16x2, an HADD2 sum).
template <int kMode>
__global__ void ex2_probe(float* out, int iters, float scale, long long* cycles) {
    if constexpr (kMode >= 2) {
        unsigned h[32];
        float s[64];
#pragma unroll
        for (int i = 0; i < 64; ++i) s[i] = -0.001f * (threadIdx.x + i);
#pragma unroll
        for (int i = 0; i < 32; ++i) {
            h[i] = pack_half2(s[2 * i], s[2 * i + 1]);
        }
        unsigned sum = 0;
        float m = 0.5f;
        const long long t0 = clock64();
        for (int it = 0; it < iters; ++it) {
#pragma unroll
            for (int i = 0; i < 32; ++i) {
                unsigned x = h[i];
                if (kMode == 3) {
                    const float a = fmaf(s[2 * i], scale, -m), b = fmaf(s[2 * i + 1], scale, -m);
                    x = pack_half2(a, b);
                }
                unsigned p;
                asm volatile("ex2.approx.f16x2 %0, %1;" : "=r"(p) : "r"(x));
                if (kMode == 3) {
                    asm("add.rn.f16x2 %0, %0, %1;" : "+r"(sum) : "r"(p));
                    s[2 * i] = low_half(p) - 1.0f;
                } else {
                    h[i] = p;
                }
            }
            m += 1e-7f;
        }
        const long long t1 = clock64();
        float acc = low_half(sum);
#pragma unroll
        for (int i = 0; i < 32; ++i) acc += low_half(h[i]) + s[2 * i];
        out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
        if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
        return;
    }
    constexpr bool kSoftmax = kMode == 1;
    float s[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) s[i] = 0.001f * (threadIdx.x + i);
    float sum0 = 0.0f, sum1 = 0.0f, m = 0.5f;
    const long long t0 = clock64();
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int i = 0; i < 64; ++i) {
            float p;
            if (kSoftmax) {
                const float t = fmaf(s[i], scale, -m);
                asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(p) : "f"(t));
                if (i % 2) sum1 += p; else sum0 += p;
            } else {
                asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(p) : "f"(s[i]));
            }
            s[i] = p;
        }
        m += 1e-7f;
    }
    const long long t1 = clock64();
    float acc = sum0 + sum1;
#pragma unroll
    for (int i = 0; i < 64; ++i) acc += s[i];
    out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
    if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}
"""


def main():
    names = ["ex2_probe<0>", "ex2_probe<1>", "ex2_probe<2>", "ex2_probe<3>"]
    module = cupy.RawModule(code=SOURCE, options=("-std=c++17",), name_expressions=names)
    dev = cupy.cuda.Device()
    sms = dev.attributes["MultiProcessorCount"]
    print(cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), f"{sms} SMs")
    iters = 2000
    for name in names:
        f = module.get_function(name)
        for warps_per_smsp in (1, 2, 3, 4):
            threads = 128 * warps_per_smsp
            out = cupy.empty(sms * threads, np.float32)
            cycles = cupy.empty(sms, np.int64)
            args = (out, np.int32(iters), np.float32(0.9), cycles)
            f((sms,), (threads,), args)
            f((sms,), (threads,), args)
            dev.synchronize()
            c = float(cupy.median(cycles.astype(np.float64)))
            per_clock = threads * iters * 64 / c
            phase = c / iters  # cycles of one 64-score pass of every warp on its SMSP
            print(f"{name:18s} {warps_per_smsp} warps/SMSP: {per_clock:5.2f} ex2 per clock per SM, "
                  f"{phase:6.0f} cycles per 64-score pass ({phase / warps_per_smsp:5.0f} per warp)", flush=True)


if __name__ == "__main__":
    main()
