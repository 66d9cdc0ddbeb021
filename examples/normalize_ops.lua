-- normalize_ops.lua: seed 004's normalize exercise 2, "rewrite the computation in terms of
-- array operations instead of a kernel": each row of x = arange(32 * 3) as float32 {32, 3}
-- divided by its mean (x[i, :] / x[i, :].mean()), as CuPy writes x / x.mean(axis=1)[:, None].
-- The row means come from cuda.reduction along axis 2, the division from cuda.elementwise with
-- the means as a raw input indexed by the element's row; no kernel is written by hand. Then the
-- same for the columns of the transpose (a strided view), checked against the CPU.
package.cpath = "./?.so;" .. package.cpath
local cuda = require "cudalua"

local mean = cuda.reduction("float32 x", "float32 y", "x", "a + b", "y = a / _count", "0", "mean")
local divide_rows = cuda.elementwise("float32 x, raw float32 m, int64 cols", "float32 y",
  "y = x / m[_i / cols]", "divide_rows")

local rows, cols = 32, 3
local x = cuda.zeros({ rows, cols }, cuda.float32)
for i = 1, #x do x[i] = i - 1 end
local d = cuda.to_device(x)

local means = mean(d, { axis = 2 })                 -- {32}: one mean per row
local y = divide_rows(d, means, cols):copy_to_host()

local worst = 0
for r = 1, rows do
  local m = 0
  for c = 1, cols do m = m + x:get(r, c) end
  m = m / cols
  for c = 1, cols do
    local want = m == 0 and 0 / 0 or x:get(r, c) / m
    local got = y:get(r, c)
    if want == want then worst = math.max(worst, math.abs(got - want) / math.abs(want)) end
  end
end

-- the columns' means, read through the transpose (axis 2 of d:T() is axis 1 of d)
local cm = mean(d:T(), { axis = 2 }):copy_to_host()
for c = 1, cols do
  local m = 0
  for r = 1, rows do m = m + x:get(r, c) end
  worst = math.max(worst, math.abs(cm[c] - m / rows) / (m / rows))
end
print(("normalize_ops: %dx%d, row 2 becomes {%g, %g, %g}; largest relative difference from the CPU %.2e"):format(
  rows, cols, y:get(2, 1), y:get(2, 2), y:get(2, 3), worst))
if worst > 1e-6 then os.exit(1, true) end
