-- normalize.lua: seed 004's "rewrite NumPy array operations as loops" exercise: normalise
-- every row of a 32x3 float32 matrix to unit length, one thread per row.
package.cpath = "./?.so;" .. package.cpath
local cuda = require "cudalua"

local normalize = cuda.kernel([[
#include <cudalua/grid.cuh>
extern "C" __global__ void normalize(float *m, int rows, int cols) {
  int r = grid(1);
  if (r >= rows) return;
  float s = 0.0f;
  for (int c = 0; c < cols; c++) s += m[r * cols + c] * m[r * cols + c];
  float norm = sqrtf(s);
  for (int c = 0; c < cols; c++) m[r * cols + c] /= norm;
}]], "normalize")

local rows, cols = 32, 3
local t = {}
for r = 1, rows do
  t[r] = {}
  for c = 1, cols do t[r][c] = math.random() * 20 - 10 end
end
local m = cuda.array(t, cuda.float32)
local d = cuda.to_device(m)
normalize[{1, 32}](d, rows, cols)
local res = d:copy_to_host()

local worst = 0
for r = 1, rows do
  local s = 0
  for c = 1, cols do s = s + m:get(r, c) ^ 2 end
  local norm = math.sqrt(s)
  for c = 1, cols do
    worst = math.max(worst, math.abs(res:get(r, c) - m:get(r, c) / norm))
  end
end
print(("normalize: %dx%d, largest difference from the CPU %.2e"):format(rows, cols, worst))
if worst > 1e-6 then os.exit(1, true) end
