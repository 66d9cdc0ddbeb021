-- cg_reduce.lua: the cooperative-groups block reduction of NVIDIA's reduction samples, as a
-- user writes it for nvcc: warps reduce with cg::reduce over a tiled_partition, warp results
-- meet in shared memory, one atomicAdd per block. Checked against a CPU sum of random data.
package.cpath = "./?.so;" .. package.cpath
local cuda = require "cudalua"
if cuda.devices()[1].kind == "cpu" then   -- counted as skipped by examples/run.sh
  print("cg_reduce: skipped: cooperative groups runs on a GPU only, not on cudalua's CPU device")
  os.exit(77, true)
end

local sum_kernel = cuda.kernel([[
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
namespace cg = cooperative_groups;

extern "C" __global__ void block_sum(const float *x, double *out, int n) {
  cg::thread_block block = cg::this_thread_block();
  cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
  __shared__ double partial[32];
  double v = 0;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) v += x[i];
  v = cg::reduce(warp, v, cg::plus<double>());
  if (warp.thread_rank() == 0) partial[warp.meta_group_rank()] = v;
  block.sync();
  if (warp.meta_group_rank() == 0) {
    v = warp.thread_rank() < warp.meta_group_size() ? partial[warp.thread_rank()] : 0.0;
    v = cg::reduce(warp, v, cg::plus<double>());
    if (warp.thread_rank() == 0) atomicAdd(out, v);
  }
}]], "block_sum")

local n = 1 << 22
local x = cuda.pinned_array(n, "float32")
local cpu = 0
for i = 1, n do
  x[i] = math.random() * 2 - 1
  cpu = cpu + x[i]
end
local d_x = cuda.to_device(x)
local d_out = cuda.device_array(1, "float64")
d_out:fill(0)
sum_kernel[{264, 256}](d_x, d_out, n)
local got = d_out:copy_to_host()[1]
local err = math.abs(got - cpu)
print(("cooperative-groups block reduction of %d floats: %.9f (CPU %.9f, |diff| %.2e)"):format(n, got, cpu, err))
if err > 1e-6 * math.max(1, math.abs(cpu)) then error("cg_reduce: mismatch") end
