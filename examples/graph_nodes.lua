-- graph_nodes.lua: the two examples of seed 001 (a CUDA graph API proposal for Numba) written
-- the seed's way: nodes that belong to no graph until node:build(), their args and deps lists
-- changed until then, and g:launch() for instantiate + launch. examples/graph.lua builds the
-- same graphs with the bound form (g:kernel(...)).
package.cpath = "./?.so;" .. package.cpath
local cuda = require "cudalua"
local G = cuda.graph

local mod = cuda.compile(assert(io.open("examples/cuda/seed001.cu")):read("a"), { name = "examples/cuda/seed001.cu" })

-- 1. KernelNode(k1, [arr]); KernelNode(k2, [arr], [n1]); n3 = KernelNode(k2), then
--    n3.args.append(arr), n3.deps.append(n2): (1 + 2) * 3 * 3 = 27
local arr = cuda.to_device({ 1.0 }, cuda.float64)
local n1 = G.kernel[{ 1, 1 }](mod.k1, { arr })
local n2 = G.kernel[{ 1, 1 }](mod.k2, { arr }, { n1 })
local n3 = G.kernel[{ 1, 1 }](mod.k2)
n3.args[#n3.args + 1] = arr
n3.deps[#n3.deps + 1] = n2
local g = n3:build()
g:launch()
cuda.synchronize()
local first = arr:copy_to_host()[1]
print("first graph: " .. first)
g:close()

-- 2. MemcpyHtoDNode, KernelNode[4, 1], MemcpyDtoHNode, HostNode(h1, [host_arr], [n2])
local host_arr = cuda.pinned_array(1, cuda.float64)
host_arr[1] = 1
local dev_arr = cuda.device_array_like(host_arr)
local seen
local m0 = G.memcpy(dev_arr, host_arr)
local m1 = G.kernel[{ 4, 1 }](mod.k3, { dev_arr }, { m0 })
local m2 = G.memcpy(host_arr, dev_arr, { m1 })
local m3 = G.host(function(a)
  seen = a[1]
  print("this runs on host and a[0] = " .. seen)
end, { host_arr }, { m2 })
local s = cuda.stream()
m3:build():launch(s)
s:synchronize()   -- the host node runs here, on the Lua thread
print("second graph: " .. tostring(seen))

local ok = first == 27 and seen == 9 and host_arr[1] == 9
print(("graph_nodes: %s"):format(ok and "ok" or "WRONG"))
if not ok then os.exit(1, true) end
