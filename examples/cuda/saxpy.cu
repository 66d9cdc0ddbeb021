// saxpy.cu: ordinary CUDA C++ built by nvcc, not by cudalua (see examples/nvcc_cubin.lua).
extern "C" __global__ void saxpy(float a, const float *x, float *y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

// a C++ kernel: its mangled name spells its parameter types
__global__ void scale_offset(double *v, double scale, long long offset, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] = v[i] * scale + (double)offset;
}
