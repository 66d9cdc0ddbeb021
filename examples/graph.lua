-- graph.lua: the two examples of seed 001 (a CUDA graph API proposal for Numba), with
-- cudalua's graphs: nodes with dependencies, built into a graph, instantiated and launched.
package.cpath = "./?.so;" .. package.cpath
local cuda = require "cudalua"

local mod = cuda.compile(assert(io.open("examples/cuda/seed001.cu")):read("a"), { name = "examples/cuda/seed001.cu" })

-- 1. k1, k2, k2 on one array: (1 + 2) * 3 * 3 = 27
local arr = cuda.to_device({ 1.0 }, cuda.float64)
local g = cuda.graph()
local n1 = g:kernel(mod.k1, { 1, 1 }, { arr })
local n2 = g:kernel(mod.k2, { 1, 1 }, { arr }, { n1 })
g:kernel(mod.k2, { 1, 1 }, { arr }, { n2 })
g:instantiate():launch()
cuda.synchronize()
local first = arr:copy_to_host()[1]
print("first graph: " .. first)

-- 2. host -> device copy, a kernel on 4 blocks, device -> host copy, a host node
local host_arr = cuda.array({ 1.0 }, cuda.float64)
local dev_arr = cuda.device_array_like(host_arr)
local seen
local g2 = cuda.graph()
local m0 = g2:memcpy(dev_arr, host_arr)
local m1 = g2:kernel(mod.k3, { 4, 1 }, { dev_arr }, { m0 })
local m2 = g2:memcpy(host_arr, dev_arr, { m1 })
g2:host(function()
  seen = host_arr[1]
  print("this runs on host and a[0] = " .. seen)
end, { m2 })
local exec = g2:instantiate()
local s = cuda.stream()
exec:launch(s)
s:synchronize()   -- the host node runs here, on the Lua thread
print("second graph: " .. tostring(seen))

local ok = first == 27 and seen == 9 and host_arr[1] == 9
print(("graph: %s"):format(ok and "ok" or "WRONG"))
if not ok then os.exit(1, true) end
