-- examples/embed/script.lua: run by examples/embed/host.c. The host gave us `buf` (its own
-- device memory), maybe `stream` (its own stream), `owned` (memory Lua now owns) and `job`.
local cuda = require "cudalua"
local k = cuda.kernel([[
#include <cudalua/grid.cuh>
extern "C" __global__ void affine(float *x, long long n) {
  for (long long i = grid(1); i < n; i += gridsize(1)) x[i] = 2.0f * x[i] + 1.0f;
}]], "affine")
local n = #buf
k[{ 256, 256, stream }](buf, n)
owned:fill(1.5, stream)
local sum = cuda.reduce("a + b")
local total = sum(buf, { stream = stream })
owned = nil -- Lua drops the buffer it owns: the host's release runs when it is collected
collectgarbage()
return total
