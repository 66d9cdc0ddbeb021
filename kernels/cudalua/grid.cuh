// cudalua/grid.cuh: Numba's cuda.grid(ndim) and cuda.gridsize(ndim) for CUDA C.
//   int i = grid(1);                  // blockIdx.x * blockDim.x + threadIdx.x
//   auto p = grid(2);  p.x, p.y       // absolute position in a 2-d grid
//   for (long long i = grid(1); i < n; i += gridsize(1)) ...   // grid-stride loop
#pragma once

struct cudalua_pos {
  long long x, y, z;
  // grid(1) converts to the 1-d index, as Numba's grid(1) is a plain integer
  __device__ __forceinline__ operator long long() const { return x; }
};

__device__ __forceinline__ cudalua_pos grid(int ndim) {
  cudalua_pos p;
  p.x = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  p.y = ndim > 1 ? (long long)blockIdx.y * blockDim.y + threadIdx.y : 0;
  p.z = ndim > 2 ? (long long)blockIdx.z * blockDim.z + threadIdx.z : 0;
  return p;
}

__device__ __forceinline__ cudalua_pos gridsize(int ndim) {
  cudalua_pos p;
  p.x = (long long)gridDim.x * blockDim.x;
  p.y = ndim > 1 ? (long long)gridDim.y * blockDim.y : 1;
  p.z = ndim > 2 ? (long long)gridDim.z * blockDim.z : 1;
  return p;
}
