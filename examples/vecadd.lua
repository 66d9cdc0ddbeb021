-- vecadd.lua: z = x + y on 1000 random float64 values (seed 002, "Using Numba for GPUs").
package.cpath = "./?.so;" .. package.cpath
local cuda = require "cudalua"

local vecadd = cuda.kernel([[
#include <cudalua/grid.cuh>
extern "C" __global__ void vecadd(double *z, const double *x, const double *y, int n) {
  int i = grid(1);
  if (i >= n) return;
  z[i] = x[i] + y[i];
}]], "vecadd")

-- set up the host vectors
local N = 1000
local x, y = cuda.array(N, cuda.float64), cuda.array(N, cuda.float64)
for i = 1, N do x[i], y[i] = math.random(), math.random() end

-- copy and allocate data on the device
local d_x, d_y = cuda.to_device(x), cuda.to_device(y)
local d_z = cuda.device_array_like(x)

-- 128-thread blocks, enough blocks to cover N
local block_size = 128
local num_blocks = (N + block_size - 1) // block_size
vecadd[{num_blocks, block_size}](d_z, d_x, d_y, N)

-- copy back the result and validate it
local res = d_z:copy_to_host()
local bad = 0
for i = 1, N do
  if math.abs(res[i] - (x[i] + y[i])) > 1e-12 then bad = bad + 1 end
end
print(("vecadd: %d blocks x %d threads, %d values, %d mismatches"):format(num_blocks, block_size, N, bad))
if bad > 0 then os.exit(1, true) end
