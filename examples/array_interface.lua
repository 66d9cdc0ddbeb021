-- array_interface.lua: seed 004's CUDA Array Interface. A foreign object (here a small Lua
-- "tensor" class that is not a cudalua array) exposes __cuda_array_interface; cudalua passes
-- it to a kernel and wraps it without copying, and a cudalua array is viewed the same way.
package.cpath = "./?.so;" .. package.cpath
local cuda = require "cudalua"

-- a foreign library's type: it owns device memory and describes it with the interface. The
-- description is built once, with the tensor: cudalua reads it on every launch, and a function
-- that made four new tables each time would cost more than reading them.
local Tensor = {}
Tensor.__index = Tensor
Tensor.__cuda_array_interface = function(t) return t.cai end
local function tensor(rows, cols)
  local storage = cuda.device_array(rows * cols, cuda.float32)  -- any device allocation
  local ptr = storage:ptr()
  return setmetatable({ storage = storage, ptr = ptr, rows = rows, cols = cols,
    cai = { data = { ptr, false }, shape = { rows, cols }, typestr = "<f4",
            strides = { cols * 4, 4 }, version = 3 } }, Tensor)
end

local k = cuda.kernel([[
#include <cudalua/grid.cuh>
extern "C" __global__ void fill_index(float *m, int rows, int cols) {
  auto p = grid(2);
  if (p.x < cols && p.y < rows) m[p.y * cols + p.x] = p.y * 1000.0f + p.x;
}]], "fill_index")

local rows, cols = 37, 53
local t = tensor(rows, cols)
k[{ { (cols + 15) // 16, (rows + 15) // 16 }, { 16, 16 } }](t, rows, cols)   -- passed as it is

local view = cuda.as_cuda_array(t)                                           -- no copy
print(("foreign %s -> %s, same memory: %s"):format(getmetatable(t) == Tensor and "Tensor" or "?",
  tostring(view):match("^[^{]*"), tostring(view:ptr() == t.ptr)))
local host = view:copy_to_host()
local bad = 0
for r = 1, rows do
  for c = 1, cols do
    if host:get(r, c) ~= (r - 1) * 1000 + (c - 1) then bad = bad + 1 end
  end
end

-- writes through the view are seen by the foreign object's memory, and a reduction takes it
view:fill(2.5)
local sum = cuda.reduce("a + b")(t)
print(("sum over the foreign tensor after fill: %g (expected %g)"):format(sum, 2.5 * rows * cols))

-- a cudalua array answers the same interface, so other libraries can take it
local d = cuda.to_device({ 1, 2, 3, 4, 5, 6 }, cuda.int32):reshape(2, 3)
local cai = getmetatable(d).__cuda_array_interface(d)
print(("cudalua array: data {0x%x, %s}, shape {%d, %d}, typestr %s, strides {%d, %d}, version %d"):format(
  cai.data[1], tostring(cai.data[2]), cai.shape[1], cai.shape[2], cai.typestr, cai.strides[1],
  cai.strides[2], cai.version))
local again = cuda.as_cuda_array(setmetatable({}, { __cuda_array_interface = cai }))
print("round trip: " .. tostring(again:copy_to_host()))

local ok = bad == 0 and view:ptr() == t.ptr and sum == 2.5 * rows * cols and again:ptr() == d:ptr()
print(("array_interface: %d mismatches, %s"):format(bad, ok and "ok" or "WRONG"))
if not ok then os.exit(1, true) end
