-- ipc.lua: two Lua processes share one device buffer. This process makes an array that can
-- be shared (ipc = true), fills it and records an interprocess event; a second process (this
-- script run with "child") opens the array and the event by their handles, waits for the
-- event, scales the data in place with a kernel and exits; this one then checks the result
-- against the CPU. With two GPUs the second process works from the other one (peer access).
package.cpath = "./?.so;" .. package.cpath
local cuda = require "cudalua"
if cuda.devices()[1].kind == "cpu" then   -- counted as skipped by examples/run.sh
  print("ipc: skipped: CUDA IPC (memory shared between processes) runs on a GPU only, not on cudalua's CPU device")
  os.exit(77, true)
end

local SCALE = [[
extern "C" __global__ void scale(float *x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= a;
}]]

if arg[1] == "child" then
  local dev = tonumber(arg[2])
  cuda.select_device(dev)
  local n = tonumber(arg[5])
  local x = cuda.open_ipc_array(arg[3], n, "float32")
  local ready = cuda.open_ipc_event(arg[4])
  local s = cuda.stream()
  s:wait_event(ready)                       -- the producer's fill is done first
  cuda.kernel(SCALE, "scale")[{ (n + 255) // 256, 256, s }](x, 3, n)
  s:synchronize()
  print(("ipc: the second process, on device %d, opened %d floats and scaled them by 3"):format(dev, n))
  os.exit(0, true)
end

local n = 1 << 20
local host = cuda.array(n, "float32")
for i = 1, n do host[i] = math.random(-1000, 1000) end
local shared = cuda.device_array(n, "float32", { ipc = true })
local s = cuda.stream()
shared:copy_to_device(host, s)
local ready = cuda.event { interprocess = true }
ready:record(s)
local child_dev = #cuda.gpus > 1 and cuda.can_access_peer(1, 0) and 1 or 0
local lua = arg[-1] or "lua5.4"
local cmd = ("%s %s child %d %s %s %d"):format(lua, arg[0], child_dev, shared:ipc_handle(), ready:ipc_handle(), n)
local ok = os.execute(cmd)
if not ok then error("ipc: the child process failed") end
local back = shared:copy_to_host()
local bad = 0
for i = 1, n do if back[i] ~= 3 * host[i] then bad = bad + 1 end end
print(("ipc: %d floats shared with a second process on device %d, %d mismatches"):format(n, child_dev, bad))
if bad > 0 then error("ipc: mismatch") end
