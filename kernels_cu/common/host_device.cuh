// CUPYFLASH_HD: the qualifiers of functions that are host and device code alike (dropout's generator,
// the operations of generated score functions), which the tests also build as host C++.
#pragma once

#if defined(__CUDACC__)
#define CUPYFLASH_HD __host__ __device__ __forceinline__
#else
#define CUPYFLASH_HD inline
#endif
