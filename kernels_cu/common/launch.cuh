// What a kernel checks of its own launch, and the shared-memory reserve of its per-CTA state.
#pragma once

namespace cupyflash {

// Shared memory reserved at the end of a tensor-core kernel's dynamic shared memory for its per-CTA
// state (the sequence, mask and tile queue, read where needed so that registers go to the fragments).
constexpr int kCtaStateBytes = 1024;

// Traps when the launch gave less dynamic shared memory than the traits lay out (a host/traits mismatch
// would otherwise read and write past the allocation).
template <int kBytes>
__device__ __forceinline__ void require_dynamic_smem() {
    unsigned given;
    asm("mov.u32 %0, %%dynamic_smem_size;\n" : "=r"(given));
    if (given < kBytes) __trap();
}

}  // namespace cupyflash
