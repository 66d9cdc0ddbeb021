/* cudalua/cpu/cuda_std.h: libcu++'s cuda::std is the host's std on the CPU device; the
   CPU device's <cuda/std/X> headers include <X> and this */
#ifndef CUDALUA_CPU_CUDA_STD_H
#define CUDALUA_CPU_CUDA_STD_H
namespace cuda { namespace std = ::std; }
#endif
