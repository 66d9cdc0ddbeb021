-- pi.lua: seed 004's Monte-Carlo pi with cudalua.random's xoroshiro128+ states (the same
-- streams as numba.cuda.random): the tutorial's 24x64 threads, then a size that fills the GPU.
package.cpath = "./?.so;" .. package.cpath
local cuda = require "cudalua"

local compute_pi = cuda.kernel([[
#include <cudalua/grid.cuh>
#include <cudalua/random.cuh>
extern "C" __global__ void compute_pi(xoroshiro128p_state *states, float *out, int iterations, int n) {
  int i = grid(1);
  if (i >= n) return;
  int inside = 0;
  for (int j = 0; j < iterations; j++) {
    float x = xoroshiro128p_uniform_float32(states, i);
    float y = xoroshiro128p_uniform_float32(states, i);
    if (x * x + y * y <= 1.0f) inside++;
  }
  out[i] = 4.0f * inside / iterations;
}]], "compute_pi")
local mean = cuda.reduce("a + b")

local function run(blocks, threads, iterations, seed)
  local n = blocks * threads
  local t0 = cuda.time()
  local states = cuda.random.create_xoroshiro128p_states(n, { seed = seed })
  local out = cuda.device_array(n, cuda.float32)
  local e0, e1 = cuda.event(), cuda.event()
  e0:record()
  compute_pi[{blocks, threads}](states, out, iterations, n)
  e1:record()
  e1:synchronize()
  local pi = mean(out) / n
  local ms = e0:elapsed_time(e1)
  local samples = n * iterations
  print(("pi: %d x %d threads, %d iterations: %.6f (error %.2e), %.1f ms, %.1f G samples/s, %.1f ms total"):format(
    blocks, threads, iterations, pi, math.abs(pi - math.pi), ms, samples / (ms * 1e-3) / 1e9,
    (cuda.time() - t0) * 1000))
  return pi
end

local ok = true
local p1 = run(24, 64, 10000, 1)  -- the tutorial's size
ok = ok and math.abs(p1 - math.pi) < 0.01
local sms = cuda.gpus.current:info().multiprocessors
local p2 = run(sms * 16, 128, 2000, 2)  -- fills the GPU
ok = ok and math.abs(p2 - math.pi) < 0.01
if not ok then os.exit(1, true) end
