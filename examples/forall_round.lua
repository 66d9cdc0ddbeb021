-- forall_round.lua: seed 004: round 10 random values to 3 decimals with a device function,
-- launched with forall (the launch configuration comes from the occupancy calculator).
package.cpath = "./?.so;" .. package.cpath
local cuda = require "cudalua"

local k = cuda.kernel([[
#include <cudalua/grid.cuh>
__device__ double round3(double x) { return round(x * 1000.0) / 1000.0; }
extern "C" __global__ void round_all(double *out, const double *x, int n) {
  int i = grid(1);
  if (i < n) out[i] = round3(x[i]);
}]], "round_all")

local n = 10
local x = cuda.array(n, cuda.float64)
for i = 1, n do x[i] = math.random() * 20 - 10 end
local d_x, d_out = cuda.to_device(x), cuda.device_array(n, cuda.float64)
local launcher = k:forall(n)
print("forall(" .. n .. "): " .. tostring(launcher))
launcher(d_out, d_x, n)
local out = d_out:copy_to_host()

local bad = 0
for i = 1, n do
  local v = x[i] * 1000.0
  local r = (v >= 0 and math.floor(v + 0.5) or math.ceil(v - 0.5)) / 1000.0  -- half away from zero, as C's round
  print(("%12.6f -> %9.3f"):format(x[i], out[i]))
  if out[i] ~= r then bad = bad + 1 end
end
print(("forall_round: %d values, %d mismatches"):format(n, bad))
if bad > 0 then os.exit(1, true) end
