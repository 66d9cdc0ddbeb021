-- caching.lua: seed 004's "the first call compiles, later calls reuse": the first compile runs
-- NVRTC, the next is served from the process, and a fresh process gets it from the disk cache
-- (CUDALUA_CACHE_DIR, default ~/.cache/cudalua).
package.cpath = "./?.so;" .. package.cpath
local cuda = require "cudalua"
local cache = require "cudalua.cache"

local function source(nonce)
  return ([[
#include <cudalua/grid.cuh>
// example run %s
extern "C" __global__ void vecadd(float *z, const float *x, const float *y, int n) {
  int i = grid(1);
  if (i < n) z[i] = x[i] + y[i];
}]]):format(nonce)
end

local function timed_kernel(src)
  local t = cuda.time()
  local k = cuda.kernel(src, "vecadd")
  return k, (cuda.time() - t) * 1000
end

if arg[1] == "--child" then -- a fresh process: the context first, then time the compile
  cuda.synchronize()
  local _, ms = timed_kernel(source(arg[2]))
  print(("%.3f %d %d"):format(ms, cache.stats.disk_hits, cache.stats.misses))
  os.exit(0, true)
end

cuda.synchronize()
local nonce = ("%d-%d"):format(os.time(), math.random(1, 1 << 30))
local src = source(nonce)
local k1, cold = timed_kernel(src)
local k2, warm = timed_kernel(src)
print(("first call (NVRTC): %8.3f ms"):format(cold))
print(("second call (process cache): %8.3f ms, same kernel object: %s"):format(warm, tostring(k1 == k2)))

local lua = arg[-1] or "lua5.4"
local p = assert(io.popen(("%s %s --child %s"):format(lua, arg[0], nonce)))
local line = p:read("l") or ""
p:close()
local ms, hits, misses = line:match("^(%S+) (%d+) (%d+)$")
if cache.dir() then
  print(("fresh process (disk cache %s): %8.3f ms, disk hits %s, misses %s"):format(cache.dir(), tonumber(ms) or -1, hits, misses))
else
  print("disk cache is off (CUDALUA_CACHE=0): fresh process " .. tostring(ms) .. " ms")
end

-- the cached kernel works
local n = 1000
local x, y = cuda.array(n, cuda.float32), cuda.array(n, cuda.float32)
for i = 1, n do x[i], y[i] = math.random(), math.random() end
local d_z = cuda.device_array(n, cuda.float32)
k2[{(n + 127) // 128, 128}](d_z, cuda.to_device(x), cuda.to_device(y), n)
local z, bad = d_z:copy_to_host(), 0
for i = 1, n do if math.abs(z[i] - (x[i] + y[i])) > 1e-5 then bad = bad + 1 end end
print(("caching: %d mismatches"):format(bad))
local disk_ok = not cache.dir() or (hits == "1" and misses == "0")
if k1 ~= k2 or bad > 0 or not disk_ok or not ms then os.exit(1, true) end
