-- nccl_recover.lua: a job that loses a rank and finishes without it. Three ranks (one GPU is
-- enough: each rank is a "machine" of its own, NCCL_HOSTID, over NCCL's socket transport)
-- add up f(i) = i mod 97 for i = 1..N, each its share, with all_reduce. Rank 2 dies (SIGKILL)
-- in the second round. The other two see it as a Lua error from the round's wait within the
-- communicators' timeout (3 s here; CUDALUA_NCCL_TIMEOUT, 600 s by default), never a hang:
-- cudalua aborted the communicator. They meet again as a job of two (nccl.init at the next
-- port), share rank 2's part out between them, and finish: the total must be the sum over
-- 1..N, which this launcher checks against Lua's own. examples/nccl/recover_rank.lua is a rank.
package.cpath = "./?.so;" .. package.cpath
local cuda = require "cudalua"
local nccl = require "cudalua.nccl"

local ok, why = nccl.is_available()
if not ok then print("nccl_recover: skipped: " .. why); os.exit(77, true) end
if not cuda.is_available() then print("nccl_recover: skipped: no GPU"); os.exit(77, true) end
local N = 3000000
local want = 0
for i = 1, N do want = want + i % 97 end

local lua = arg[-1] or "lua5.4"
local port = 20000 + os.time() % 12000
local socket = "NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_NET=Socket NCCL_SOCKET_IFNAME=lo"
local ranks = {}
for r = 0, 2 do
  ranks[r] = io.popen(("env %s NCCL_HOSTID=host%d RANK=%d WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=%d "
    .. "CUDALUA_NCCL_TIMEOUT=3 timeout 120 %s examples/nccl/recover_rank.lua %d 2>&1"):format(socket, r, r, port, lua, N))
end
local bad = 0
for r = 0, 2 do
  local out = ranks[r]:read("a")
  local done, _, code = ranks[r]:close()
  io.write(out)
  if r == 2 then
    if code ~= 137 then bad = bad + 1; print("rank 2 should have been killed, exit " .. tostring(code)) end
  else
    local total = tonumber(out:match("total (%d+)"))
    if not done or total ~= want then bad = bad + 1; print(("rank %d: total %s, want %d"):format(r, tostring(total), want)) end
  end
end
print(("nccl_recover: the 2 survivors finished the job of 3 (want %d), %d problems"):format(want, bad))
if bad > 0 then error("nccl_recover: mismatch") end
