-- grid_sync.lua: a cooperative launch (cooperative = true): every block writes its partial
-- sum of squares, the whole grid waits at this_grid().sync(), then every thread scales its
-- elements by the global norm, all in one kernel. The grid is sized to what can be resident
-- at once (k:max_blocks_per_sm x multiprocessors); a larger one is refused with that limit.
package.cpath = "./?.so;" .. package.cpath
local cuda = require "cudalua"
if cuda.devices()[1].kind == "cpu" then   -- counted as skipped by examples/run.sh
  print("grid_sync: skipped: cooperative groups' grid synchronisation runs on a GPU only, not on cudalua's CPU device")
  os.exit(77, true)
end

local normalize = cuda.kernel([[
#include <cooperative_groups.h>
namespace cg = cooperative_groups;

extern "C" __global__ void normalize(float *x, float *partial, int n) {
  cg::grid_group grid = cg::this_grid();
  cg::thread_block block = cg::this_thread_block();
  __shared__ float s[256];
  float v = 0;
  for (int i = grid.thread_rank(); i < n; i += grid.size()) v += x[i] * x[i];
  s[threadIdx.x] = v;
  block.sync();
  for (int k = blockDim.x / 2; k > 0; k /= 2) {
    if (threadIdx.x < k) s[threadIdx.x] += s[threadIdx.x + k];
    block.sync();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = s[0];
  grid.sync();                       // every block's partial sum is written
  float total = 0;
  for (int b = 0; b < gridDim.x; b++) total += partial[b];
  float inv = rsqrtf(total);
  for (int i = grid.thread_rank(); i < n; i += grid.size()) x[i] *= inv;
}]], "normalize")

local dev = cuda.gpus.current:info()
local per_sm = normalize:max_blocks_per_sm(256)
local blocks = per_sm * dev.multiprocessors
local n = 1 << 20
local host = cuda.array(n, "float32")
local sq = 0
for i = 1, n do host[i] = math.random() * 2 - 1; sq = sq + host[i] * host[i] end
local d_x = cuda.to_device(host)
local partial = cuda.device_array(blocks, "float32")
normalize:launch({ grid = blocks, block = 256, cooperative = true }, d_x, partial, n)
local out = d_x:copy_to_host()
local inv, worst = 1 / math.sqrt(sq), 0
for i = 1, n do worst = math.max(worst, math.abs(out[i] - host[i] * inv)) end
print(("grid-synchronised normalize: %d blocks (%d per SM x %d SMs), max error %.2e"):format(
  blocks, per_sm, dev.multiprocessors, worst))
if worst > 1e-6 then error("grid_sync: mismatch") end
local ok, e = pcall(normalize.launch, normalize, { grid = blocks + dev.multiprocessors, block = 256, cooperative = true }, d_x, partial, n)
print("a grid too large for one wave is refused: " .. tostring(not ok and e:match("more than can be resident[^:]*")))
if ok then error("grid_sync: an oversized cooperative grid was accepted") end
