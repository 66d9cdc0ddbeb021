-- increment_by_one.lua: a host array passed straight to a kernel (seed 003). cudalua copies it
-- to the device before the launch and back after it, as Numba does for NumPy arrays.
package.cpath = "./?.so;" .. package.cpath
local cuda = require "cudalua"

local increment_by_one = cuda.kernel([[
#include <cudalua/grid.cuh>
extern "C" __global__ void increment_by_one(long long *an_array, int size) {
  int pos = grid(1);
  if (pos < size) an_array[pos] += 1;
}]], "increment_by_one")

local my_array = cuda.array({3, 5, 9, 13, 7, 2, 4, 1}, cuda.int64)
local expected = {}
for i = 1, #my_array do expected[i] = my_array[i] + 1 end

local threadsperblock = 4
local blockspergrid = math.ceil(#my_array / threadsperblock)
increment_by_one[{blockspergrid, threadsperblock}](my_array, #my_array)

print(threadsperblock)
print(blockspergrid)
print("{" .. table.concat(my_array:totable(), ", ") .. "}")
for i = 1, #expected do
  if my_array[i] ~= expected[i] then
    io.stderr:write(("increment_by_one: element %d is %d, expected %d\n"):format(i, my_array[i], expected[i]))
    os.exit(1, true)
  end
end

-- the same on random data, with a grid that leaves threads idle
local n = 1000
local r = cuda.array(n, cuda.int64)
local before = {}
for i = 1, n do r[i] = math.random(-1000000, 1000000); before[i] = r[i] end
increment_by_one[{(n + 127) // 128, 128}](r, n)
for i = 1, n do
  if r[i] ~= before[i] + 1 then
    io.stderr:write(("increment_by_one: random element %d is %d, expected %d\n"):format(i, r[i], before[i] + 1))
    os.exit(1, true)
  end
end
print("increment_by_one: ok")
