// cudalua/time.cuh: the global timer, in nanoseconds, for kernels that wait or measure time,
// on a GPU (PTX's %globaltimer) and on cudalua's CPU device (the host's monotonic clock), so
// the same source runs on both (inline PTX does not run on the CPU device).
//   #include <cudalua/time.cuh>
//   unsigned long long t0 = cudalua_globaltimer();
#pragma once

#ifdef __CUDALUA_CPU__
__device__ inline unsigned long long cudalua_globaltimer() { return __globaltimer(); }
#else
__device__ __forceinline__ unsigned long long cudalua_globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#endif
