// cudalua/nvrtc/std.h: NVRTC ships no C or C++ standard library headers. cudalua hands NVRTC
// small stand-ins named like them (<cstdint>, <cmath>, <type_traits>, ...; see
// lua/cudalua/compile.lua), each including libcu++'s <cuda/std/...> counterpart and this file,
// so that kernels written for nvcc compile unchanged: std:: names find cuda::std's.
#pragma once
namespace cuda { namespace std {} }
namespace std { using namespace ::cuda::std; }
