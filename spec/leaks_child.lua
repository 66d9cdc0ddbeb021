-- spec/leaks_child.lua: run by 08-leaks_spec.lua in a fresh process, so that the memory pools
-- and caches that earlier specs filled cannot hide a leak.
--   lua5.4 spec/leaks_child.lua WHAT N
-- runs the loop WHAT for a warm-up and then N times, a full collection every 1000 iterations,
-- and prints "growth HOST DEVICE": host RSS and device memory in use, in bytes, before and after
-- the N measured iterations.
package.cpath = "./?.so;" .. package.cpath
local cuda = require "cudalua"

local what, n = arg[1], math.tointeger(tonumber(arg[2]))

local PAGE = 4096
do
  local p = io.popen("getconf PAGESIZE 2>/dev/null")
  if p then PAGE = tonumber(p:read("a")) or PAGE; p:close() end
end
local function rss()
  local f = assert(io.open("/proc/self/statm"))
  local resident = tonumber(f:read("l"):match("^%d+%s+(%d+)"))
  f:close()
  return resident * PAGE
end
local function device_used()
  local free, total = cuda.mem_info()
  return total - free
end

local k = cuda.compile([[
extern "C" __global__ void touch(float *x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += 1.0f;
}]]).touch
local s0 = cuda.stream()
local host = cuda.array(1037, "float32"):fill(1.5)
local keep = {}

local loops = {
  device_close = function()
    local d <close> = cuda.device_array(1037, "float32")
  end,
  device_gc = function()
    local d = cuda.device_array(1037, "float32")
    local v = d:slice(2, 100):reshape(99) -- views share the parent's memory
    return v
  end,
  event_close = function()
    local e <close> = cuda.event()
    e:record()
  end,
  event_gc = function()
    local e = cuda.event(false)
    e:record(s0)
  end,
  stream_close = function()
    local s <close> = cuda.stream()
    cuda.device_array(64, "float32", s):fill(1, s) -- its memory outlives the stream object
  end,
  stream_gc = function()
    local s = cuda.stream(true)
    s:query()
  end,
  copies = function()
    local d = cuda.to_device(host)
    d:copy_to_host()
  end,
  launches = function()
    local d = cuda.device_array(1037, "float32", s0)
    k[{ 9, 128, s0 }](d, 1037)
  end,
  host_launches = function()
    k[{ 9, 128 }](host, 1037) -- a pageable array: a temporary device copy each time
  end,
  -- deliberate leaks, to show that the measures see one
  leak_device = function()
    keep[#keep + 1] = cuda.device_array(1 << 18, "float32") -- 1 MiB
  end,
  leak_host = function()
    keep[#keep + 1] = cuda.array(1 << 18, "float32"):fill(1) -- 1 MiB, touched
  end,
}

local body = assert(loops[what], "unknown loop " .. tostring(what))
local function run(count)
  for i = 1, count do
    body(i)
    if i % 1000 == 0 then collectgarbage() end
  end
  collectgarbage()
  collectgarbage()
  cuda.synchronize()
end

if not what:match("^leak_") then run(math.max(n // 5, 2000)) end -- warm-up
local h0, d0 = rss(), device_used()
run(n)
local h1, d1 = rss(), device_used()
print(("growth %d %d"):format(h1 - h0, d1 - d0))
