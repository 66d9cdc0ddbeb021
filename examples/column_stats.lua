-- column_stats.lua: statistics of columns of a matrix through strided views, no copy of the
-- matrix. A kernel takes a column view (its first element) and the view's stride, and writes
-- the column's mean and standard deviation; every other column is pulled to the host as one
-- 2-D copy of a strided view; the columns are checked against the CPU.
package.cpath = "./?.so;" .. package.cpath
local cuda = require "cudalua"

local stats = cuda.kernel([[
extern "C" __global__ void col_stats(const float *col, long long stride, int n, float *out) {
  __shared__ double s[256], q[256];
  double a = 0.0, b = 0.0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) { double v = col[i * stride]; a += v; b += v * v; }
  s[threadIdx.x] = a; q[threadIdx.x] = b;
  __syncthreads();
  for (int k = blockDim.x / 2; k > 0; k /= 2) {
    if (threadIdx.x < k) { s[threadIdx.x] += s[threadIdx.x + k]; q[threadIdx.x] += q[threadIdx.x + k]; }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    double mean = s[0] / n;
    out[0] = (float)mean;
    out[1] = (float)sqrt(q[0] / n - mean * mean);
  }
}]], "col_stats")

local rows, cols = 1000, 12
math.randomseed(42)
local m = cuda.zeros({ rows, cols }, cuda.float32)
for r = 1, rows do
  for c = 1, cols do m:set(r, c, c + (math.random() - 0.5) * c) end
end
local d = cuda.to_device(m)

local worst = 0
local out = cuda.device_array(2, cuda.float32)
for c = 1, cols do
  local col = d:sub(nil, c)                       -- a view: shape {rows}, stride one row
  stats[{ 1, 256 }](col, col.strides[1] // col.itemsize, rows, out)
  local got = out:copy_to_host()
  local s, q = 0, 0
  for r = 1, rows do local v = m:get(r, c); s = s + v; q = q + v * v end
  local mean = s / rows
  local sd = math.sqrt(q / rows - mean * mean)
  worst = math.max(worst, math.abs(got[1] - mean) / mean, math.abs(got[2] - sd) / sd)
end

-- every other column, as one strided copy to the host (cuMemcpy2DAsync, not a loop)
local odd = d:sub(nil, { 1, cols, 2 }):copy_to_host()
local wrong = 0
for r = 1, rows do
  for k = 1, cols // 2 do
    if odd:get(r, k) ~= m:get(r, 2 * k - 1) then wrong = wrong + 1 end
  end
end
print(("column_stats: %dx%d, largest relative difference from the CPU %.2e; odd columns %s"):format(
  rows, cols, worst, wrong == 0 and "equal" or wrong .. " wrong"))
if worst > 1e-5 or wrong > 0 then os.exit(1, true) end
