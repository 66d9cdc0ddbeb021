-- examples/embed/script.lua: run by examples/embed/host.c. The host gave us `buf` (its own
-- device memory), maybe `stream` (its own stream), `owned` (memory Lua now owns), `job`, and
-- `dl_in`, a DLPack tensor cudalua now owns; the host takes `tripled` back as a DLPack tensor.
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
tripled = cuda.elementwise("float32 x", "float32 y", "y = 3.0f * x")(dl_in, { stream = stream })
if stream then stream:synchronize() end
dl_in = nil -- the tensor's deleter runs once it is collected and its queued work is done
owned = nil -- Lua drops the buffer it owns: the host's release runs when it is collected
collectgarbage()
return total
