-- graph_memory.lua: a graph that allocates its own temporary (NVIDIA's graphMemoryNodes sample:
-- stream-ordered allocation captured into a graph, and the same built with explicit nodes),
-- replayed 100 times: each launch allocates and frees it, and the results are checked.
package.cpath = "./?.so;" .. package.cpath
local cuda = require "cudalua"

local mod = cuda.compile([[
extern "C" __global__ void square(float *dst, const float *src, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = src[i] * src[i];
}
extern "C" __global__ void add_into(float *acc, const float *x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) acc[i] += x[i];
}
]])
local n = 1 << 16
math.randomseed(tonumber(os.getenv("SEED") or "") or os.time())
local x = {}
for i = 1, n do x[i] = math.random(-64, 64) / 8 end
local src = cuda.to_device(cuda.array(x, "float32"))
local acc = cuda.device_array(n, "float32")
local s = cuda.stream()
local cfg = { n // 256, 256, s }

-- 1. captured: the temporary is made with {stream = s} and closed inside the capture
acc:fill(0)
s:begin_capture()
do
  local tmp <close> = cuda.device_array(n, "float32", { stream = s })   -- an allocation node
  mod.square[cfg](tmp, src, n)
  mod.add_into[cfg](acc, tmp, n)
end                                                                      -- a free node
local captured = s:end_capture()
local exec = captured:instantiate()
for _ = 1, 100 do exec:launch(s) end
s:synchronize()
local h = acc:copy_to_host()
for i = 1, n do assert(h[i] == 100 * x[i] * x[i], "captured graph: wrong sum at " .. i) end
print(("captured graph with memory nodes: %d nodes, 100 launches, sums right"):format(captured:node_count()))

-- 2. explicit: graph:alloc gives the node and the array, graph:free ends it
acc:fill(0)
local g = cuda.graph()
local a, tmp = g:alloc({ n }, "float32")
local k1 = g:kernel(mod.square, { n // 256, 256 }, { tmp, src, n }, { a })
local k2 = g:kernel(mod.add_into, { n // 256, 256 }, { acc, tmp, n }, { k1 })
g:free(tmp, { k2 })
for _ = 1, 100 do g:launch(s) end
s:synchronize()
h = acc:copy_to_host()
for i = 1, n do assert(h[i] == 100 * x[i] * x[i], "explicit graph: wrong sum at " .. i) end
print(("graph:alloc / graph:free: %d nodes, 100 launches, sums right"):format(g:node_count()))
local ok, e = pcall(tmp.copy_to_host, tmp)
assert(not ok, "a graph's array was usable outside its graph")
print("outside its graph the temporary is refused: " .. e)
