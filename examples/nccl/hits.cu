// Monte-Carlo hits for examples/nccl_pi.lua and examples/nccl/pi_rank.lua: out[i] is how many
// of thread i's `iterations` random points fall inside the quarter circle.
#include <cudalua/grid.cuh>
#include <cudalua/random.cuh>
extern "C" __global__ void hits(xoroshiro128p_state *states, unsigned long long *out, int iterations, int n) {
  int i = grid(1);
  if (i >= n) return;
  unsigned long long inside = 0;
  for (int j = 0; j < iterations; j++) {
    float x = xoroshiro128p_uniform_float32(states, i), y = xoroshiro128p_uniform_float32(states, i);
    inside += x * x + y * y <= 1.0f;
  }
  out[i] = inside;
}
