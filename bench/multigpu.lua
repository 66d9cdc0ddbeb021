-- multigpu.lua: copies between GPUs and NCCL collectives through cudalua, next to the raw calls
-- in the same process (bench/rawloop.c): 256 MiB peer copies (cuMemcpyPeerAsync), a 256 MiB
-- float32 all_reduce (bus bandwidth, as nccl-tests count it: PyTorch's is bench/nccl_torch.py)
-- and an 8-byte all_reduce (latency). Needs 2 GPUs; prints a "# ..." line otherwise.
package.cpath = "./?.so;" .. package.cpath
local cuda = require "cudalua"
local nccl = require "cudalua.nccl"
package.path = "bench/?.lua;" .. package.path
local B = require "common"
local REPS, out = B.REPS, B.out
local function section(name, f) B.section("multigpu.lua", name, f) end

local g = cuda.is_available() and #cuda.gpus or 0
if g < 2 then
  B.note(("multigpu.lua: %d GPU%s here, the multi-GPU rows need 2"):format(g, g == 1 and "" or "s"))
  os.exit(0)
end
-- B.interleaved's sync here: each round is timed to the end of all work on every GPU
local function sync_all() for d = 0, g - 1 do cuda.gpus[d]:synchronize() end end

section("info", function()
  local d = cuda.devices()
  print(("info_multigpu %d x %s, peer access 0->1 %s, NCCL %s"):format(g, d[1].name,
    tostring(cuda.can_access_peer(0, 1)), nccl.is_available() and nccl.version() or "none"))
end)

section("peer copies", function()
  local bytes = 256 << 20
  -- with peer access on (both ways): copies go over NVLink or PCIe directly, not through the host
  if cuda.can_access_peer(0, 1) and cuda.can_access_peer(1, 0) then
    cuda.enable_peer_access(0, 1)
    cuda.enable_peer_access(1, 0)
  end
  local d0 = cuda.gpus[0]:run(cuda.device_array, bytes // 4, "float32")
  local d1 = cuda.gpus[1]:run(cuda.device_array, bytes // 4, "float32")
  d0:fill(1)
  local s1 = cuda.gpus[1]:run(cuda.stream)
  local bodies = { cudalua = function(m) for _ = 1, m do cuda.copy(d1, d0, s1) end end }
  local rawloop, why = B.rawloop()
  if rawloop then
    local p1, p0, h = d1:ptr(), d0:ptr(), s1:handle()
    bodies.raw = function(m) rawloop.peer_copy(p1, 1, p0, 0, bytes, m, h) end
  else B.note("no raw loop: " .. why) end
  local r = B.interleaved(bodies, 4, REPS * 2, sync_all)
  out("peer_copy_256MiB_gbs", bytes / r.cudalua / 1e3)   -- bytes per µs / 1e3: GB/s
  if r.raw then out("inproc_peer_copy_256MiB_gbs", bytes / r.raw / 1e3) end
end)
collectgarbage()

section("nccl all_reduce", function()
  local comms = nccl.comm_init_all()
  local function buffers(n)
    local send, recv = {}, {}
    for d = 1, g do
      send[d] = cuda.gpus[d - 1]:run(cuda.device_array, n, "float32")
      recv[d] = cuda.gpus[d - 1]:run(cuda.device_array, n, "float32")
      send[d]:fill(d)
    end
    return send, recv
  end
  local function all_reduce(send, recv)
    local function each() for d = 1, g do comms[d]:all_reduce(send[d], recv[d], "sum") end end
    return function(m)
      for _ = 1, m do nccl.group(each) end
    end
  end
  -- 256 MiB: bus bandwidth = bytes / time * 2 (n - 1) / n
  local big = (256 << 20) // 4
  local bs, br = buffers(big)
  local t = B.interleaved({ cudalua = all_reduce(bs, br) }, 10, REPS, sync_all)
  out("nccl_allreduce_256MiB_busbw_gbs", big * 4 / t.cudalua / 1e3 * 2 * (g - 1) / g)
  local h = br[1]:copy_to_host()
  if h[1] ~= g * (g + 1) / 2 then error("all_reduce gave " .. h[1]) end
  bs, br = nil, nil
  collectgarbage()
  -- 8 bytes: latency of one group of all_reduces, against the same calls from C
  local ss, sr = buffers(2)
  local bodies = { cudalua = all_reduce(ss, sr) }
  local rawloop, why = B.rawloop()
  if rawloop then
    local hc, hs, hr = {}, {}, {}
    for d = 1, g do hc[d], hs[d], hr[d] = comms[d]:handle(), ss[d]:ptr(), sr[d]:ptr() end
    bodies.raw = function(m) rawloop.nccl_all_reduce(hc, hs, hr, 2, m) end
  else B.note("no raw loop: " .. why) end
  local r = B.interleaved(bodies, 2000, REPS * 2, sync_all)
  out("nccl_allreduce_8B_us", r.cudalua)
  if r.raw then out("inproc_nccl_allreduce_8B_us", r.raw) end
  comms:close()
end)
