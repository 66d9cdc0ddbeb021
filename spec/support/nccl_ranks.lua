-- spec/support/nccl_ranks.lua: starts a job of 2 to 4 NCCL ranks on this machine as if each
-- were a machine of its own: its own NCCL_HOSTID, NCCL's socket transport over the loopback
-- (P2P, shared memory and InfiniBand off: the path between machines), and the variables a
-- cluster launcher sets (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT). One GPU is
-- enough: every rank uses it. Each rank runs spec/support/nccl_worker.lua under a time limit
-- (`timeout -s KILL`), so a hang ends as a failed run, never as a hung test.
--   local ranks = require "spec.support.nccl_ranks"
--   local res = ranks.run("collective_kill", 3, { victim = 2, timeout = 3, seed = 7 })
--   res[r].status (137: killed), res[r].lines, res[r].failed = {op =, after =, msg =}, ...
local H = require "spec.helper"
local M = {}

M.socket_env = "NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_NET=Socket NCCL_SOCKET_IFNAME=lo"

-- a port for rank 0 to listen on (and the next one, for a re-initialisation): drawn per run,
-- below Linux's ephemeral ports (32768 up), which NCCL's own connections take
local draws = 0
function M.port(seed)
  draws = draws + 1
  local f = io.open("/proc/self/stat")
  local pid = f:read("n")
  f:close()
  return 20000 + ((seed or 0) * 7919 + pid * 31 + draws * 104729 + os.time()) % 12000
end

M.now = H.cuda.time   -- seconds, a wall clock

-- run(case, n, {victim =, timeout =, delay =, seed =, limit =, lua =, env = "K=V ..."}) -> a list (rank + 1) of
-- {status =, out =, lines =, ok =, failed = {op, after, msg}, usable =, reinit =}, and the
-- wall time of the whole job
function M.run(case, n, o)
  o = o or {}
  local lua = o.lua or H.LUA
  local port = o.port or M.port(o.seed)
  local limit = o.limit or 120
  local procs = {}
  local start = M.now()
  for r = 0, n - 1 do
    local env = ("%s NCCL_HOSTID=host%d RANK=%d WORLD_SIZE=%d LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=%d "
      .. "VICTIM=%d TIMEOUT=%s DELAY=%s SEED=%d %s"):format(M.socket_env, r, r, n, port, o.victim or -1,
      o.timeout or 5, o.delay or 0.2, o.seed or 1, o.env or "")
    local cmd = ("env %s timeout -s KILL %d %s spec/support/nccl_worker.lua %s 2>&1; echo \"EXIT $?\"")
      :format(env, limit, H.q(lua), H.q(case))
    procs[r + 1] = io.popen(cmd)
  end
  local res = {}
  for r = 1, n do
    local out = procs[r]:read("a")
    procs[r]:close()
    local x = { out = out, lines = {} }
    for line in out:gmatch("[^\n]+") do x.lines[#x.lines + 1] = line end
    x.status = tonumber(out:match("EXIT (%d+)%s*$"))
    x.ok = out:match("\nOK ([^\n]*)") or out:match("^OK ([^\n]*)")
    local op, after, msg = out:match("FAILED ([^\n]-) after=([%d.]+) msg=([^\n]*)")
    if op then x.failed = { op = op, after = tonumber(after), msg = msg } end
    x.usable = out:match("USABLE ([^\n]*)")
    x.reinit = out:match("REINIT ([^\n]*)")
    res[r] = x
  end
  return res, M.now() - start
end

return M
