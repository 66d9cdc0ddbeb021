-- reduce.lua: seed 004's reduction: cuda.reduce("a + b") on 1..1234 (= 761995), returned to
-- the host and left on the device; the input stays as it was.
package.cpath = "./?.so;" .. package.cpath
local cuda = require "cudalua"

local sum_reduce = cuda.reduce("a + b")
local a = cuda.array(1234, cuda.float64)
for i = 1, #a do a[i] = i end
local d_a = cuda.to_device(a)

local got = sum_reduce(d_a)                 -- on the host
local d_res = cuda.device_array(1, cuda.float64)
sum_reduce(d_a, { res = d_res })            -- left on the device
local on_device = d_res:copy_to_host()[1]
local from_host = sum_reduce(a)             -- a host array works too

local expect = 1234 * 1235 // 2
print(("reduce: %s (host), %s (device), %s (host input), expected %d"):format(got, on_device, from_host, expect))
local after = d_a:copy_to_host()
local unchanged = true
for i = 1, #a do if after[i] ~= i then unchanged = false end end
print("input unchanged: " .. tostring(unchanged))

-- and random data against the CPU, with max and an integer dtype
local n = 100003
local x = cuda.array(n, cuda.float32)
for i = 1, n do x[i] = math.random() * 200 - 100 end
local max = cuda.reduce("fmaxf(a, b)", { init = -math.huge })
local cpu_max = -math.huge
for i = 1, n do cpu_max = math.max(cpu_max, x[i]) end
local ints = cuda.array(n, cuda.int64)
local cpu_sum = 0
for i = 1, n do ints[i] = math.random(-1000000, 1000000); cpu_sum = cpu_sum + ints[i] end
local isum = sum_reduce(cuda.to_device(ints))
local gpu_max, host_max = max(cuda.to_device(x)), max(x)   -- a device array, and a host one
print(("max %g / %g (CPU %g), int64 sum %d (CPU %d)"):format(gpu_max, host_max, cpu_max, isum, cpu_sum))

if got ~= expect or on_device ~= expect or from_host ~= expect or not unchanged
   or gpu_max ~= cpu_max or host_max ~= cpu_max or isum ~= cpu_sum or math.type(isum) ~= "integer" then
  os.exit(1, true)
end
