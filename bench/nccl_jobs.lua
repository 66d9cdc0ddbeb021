-- nccl_jobs.lua: what issue 30's non-blocking communicators cost, and a job's start through
-- cudalua-run. Needs one GPU and NCCL; prints "# ..." lines otherwise.
--   nccl_socket_allreduce_8B_{blocking,nonblocking}_us  8-byte all_reduce + stream sync, 2 ranks,
--       each a "machine" of its own over NCCL's socket transport (NCCL_HOSTID, P2P/SHM off)
--   nccl_single_allreduce_8B_{blocking,nonblocking}_us  the same on 1 rank, default transports
--       (2 ranks on one GPU need separate hosts: the socket rows are the 2-rank ones)
--   run4_total_s      cudalua-run -n 4: start, nccl.init, one all_reduce, close, exit (wall)
--   run4_launcher_s   that wall time less the slowest rank's own (the launcher's part)
-- The two modes of a row alternate in rounds in the same processes; each keeps its best round.
-- Modes: lua bench/nccl_jobs.lua [rank ADDR PORT | job4]
package.cpath = "./?.so;" .. package.cpath
package.path = "./?.lua;" .. package.path
local cuda = require "cudalua"
local nccl = require "cudalua.nccl"
-- rounds of M collectives: 2 ranks on one GPU take turns on it (time slices of milliseconds),
-- so the socket rows' collectives take ms; 1 rank's take us (rounds of about 0.2 s each)
local ROUNDS = tonumber(os.getenv("BENCH_REPS")) or 7
local M = { nccl_socket = 50, nccl_single = 20000 }
local function out(k, v) io.write(("%s %.4f\n"):format(k, v)); io.flush() end
local function note(s) io.write("# " .. s .. "\n"); io.flush() end
local SOCKET = "NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_NET=Socket NCCL_SOCKET_IFNAME=lo"
local lua = arg[-1] or "lua5.4"

-- one rank: a blocking and a non-blocking communicator of the same ranks, timed in turns
local function rank_main(prefix, port)
  local b = nccl.init { blocking = true, addr = "127.0.0.1:" .. port }
  local nb = nccl.init { addr = "127.0.0.1:" .. (port + 1) }
  local s = cuda.stream()
  local x, y = cuda.device_array(2, "float32"), cuda.device_array(2, "float32")
  local best = { blocking = math.huge, nonblocking = math.huge }
  local comms = { blocking = b, nonblocking = nb }
  -- (in the same order on every rank: each waits for the others' same collective)
  for _, mode in ipairs { "blocking", "nonblocking" } do
    for _ = 1, 5 do comms[mode]:all_reduce(x, y, "sum", s); s:synchronize() end
  end
  for round = 1, ROUNDS do
    local order = round % 2 == 1 and { "blocking", "nonblocking" } or { "nonblocking", "blocking" }
    for _, mode in ipairs(order) do
      local c = comms[mode]
      local t0 = cuda.time()
      for _ = 1, M[prefix] do c:all_reduce(x, y, "sum", s); s:synchronize() end
      local us = (cuda.time() - t0) / M[prefix] * 1e6
      best[mode] = math.min(best[mode], us)
      if b:rank() == 0 then note(("%s round %d %s: %.1f us"):format(prefix, round, mode, us)) end
    end
  end
  if b:rank() == 0 then
    out(prefix .. "_allreduce_8B_blocking_us", best.blocking)
    out(prefix .. "_allreduce_8B_nonblocking_us", best.nonblocking)
  end
  b:close(); nb:close()
end

-- n ranks of rank_main, each its own host over sockets (n > 1); rank 0's rows
local function job(prefix, n)
  local port = 20000 + (os.time() * 7 + n * 131) % 12000
  local procs = {}
  for r = 0, n - 1 do
    local env = n > 1 and ("%s NCCL_HOSTID=host%d"):format(SOCKET, r) or ""
    procs[r] = io.popen(("env %s RANK=%d WORLD_SIZE=%d timeout 200 %s bench/nccl_jobs.lua rank %s %d 2>&1")
      :format(env, r, n, lua, prefix, port))
  end
  for r = 0, n - 1 do
    local o = procs[r]:read("a")
    local ok, _, status = procs[r]:close()
    if r == 0 or not ok then io.write(o) end
    if not ok then note(("nccl_jobs.lua: rank %d of the %s job failed (status %s)"):format(r, prefix, tostring(status))) end
  end
end

-- a 4-rank job through cudalua-run: every rank reports its own time from its start
local function job4_main()
  local t0 = cuda.time()
  local c = nccl.init { timeout = 60 }
  local x, y = cuda.device_array(2, "float32"), cuda.device_array(2, "float32")
  x:fill(c:rank())
  c:all_reduce(x, y)
  local s = y:copy_to_host()[1]
  assert(s == 6, "the 4 ranks' all_reduce gave " .. s)
  c:close()
  io.write(("own %.4f\n"):format(cuda.time() - t0))
end

local function run4()
  local launcher = "build/cudalua-run"
  if not io.open(launcher) then note("no build/cudalua-run: the launcher rows left out"); return end
  -- each rank its own host (one GPU): a wrapper sets NCCL_HOSTID from the rank cudalua-run gives
  local wrap = os.tmpname()
  local f = assert(io.open(wrap, "w"))
  f:write(("#!/bin/sh\nexport %s NCCL_HOSTID=host$RANK\nexec %s \"$@\"\n"):format(SOCKET, lua))
  f:close()
  os.execute("chmod +x " .. wrap)
  local t0 = cuda.time()
  local p = io.popen(("%s -n 4 --lua %s bench/nccl_jobs.lua job4 2>&1"):format(launcher, wrap))
  local o = p:read("a")
  local ok = p:close()
  local wall = cuda.time() - t0
  os.remove(wrap)
  if not ok then io.write(o); note("nccl_jobs.lua: the cudalua-run job failed"); return end
  local slowest = 0
  for v in o:gmatch("own ([%d.]+)") do slowest = math.max(slowest, tonumber(v)) end
  out("run4_total_s", wall)
  out("run4_launcher_s", wall - slowest)
end

if arg[1] == "rank" then rank_main(arg[2], tonumber(arg[3])); os.exit(0) end
if arg[1] == "job4" then job4_main(); os.exit(0) end
local ok, why = nccl.is_available()
if not ok or not cuda.is_available() then note("nccl_jobs.lua: no NCCL or no GPU: " .. tostring(why or cuda.driver_error())); os.exit(0) end
note(("nccl_jobs.lua: NCCL %d, %d rounds of %d (sockets) and %d (1 rank)"):format(nccl.version(), ROUNDS, M.nccl_socket, M.nccl_single))
job("nccl_socket", 2)
job("nccl_single", 1)
run4()
