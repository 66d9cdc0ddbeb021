// The kernels of seed 001 (a CUDA graph API proposal for Numba), shared by examples/graph.lua
// (bound nodes) and examples/graph_nodes.lua (the seed's unbound nodes).
#include <cudalua/grid.cuh>
extern "C" __global__ void k1(double *a) { a[0] += 2; printf("k1 %g\n", a[0]); }
extern "C" __global__ void k2(double *a) { a[0] *= 3; printf("k2 %g\n", a[0]); }
extern "C" __global__ void k3(double *a) {
  atomicAdd(a, 2.0);
  printf("this runs on device and a[0] = %g, grid = %d\n", a[0], (int)grid(1));
}
