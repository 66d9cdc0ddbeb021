-- tools/nccl_faults.lua [RUNS [SEED [TIMEOUT]]]: seeded fault runs of NCCL jobs on this machine
-- (GPU machine, one GPU is enough): each run draws a job of 2 to 4 ranks and a fault (a rank
-- killed with SIGKILL during the init, during a collective or inside a group; a rank that
-- never joins), starts it with spec/support/nccl_ranks.lua, and checks every survivor: it
-- raised within the timeout + 5 s naming the failure, stayed usable (arrays and a kernel),
-- made a new communicator with the other survivors, and exited cleanly. Prints one line per
-- run and a tally; exits 1 on any problem. A hang is a run ended by its time limit (counted).
package.path = "./?.lua;" .. package.path
local ranks = require "spec.support.nccl_ranks"
local RUNS, SEED, TIMEOUT = tonumber(arg[1]) or 50, tonumber(arg[2]) or 1, tonumber(arg[3]) or 3
local CASES = { "init_kill", "collective_kill", "group_kill", "never_join" }

local function check_survivor(x, r, n)
  if x.status == 137 then return ("rank %d killed by its time limit (a hang)"):format(r) end
  if x.status ~= 0 then return ("rank %d exited with %s"):format(r, tostring(x.status)) end
  if not x.failed then return ("rank %d never raised"):format(r) end
  if x.failed.after > TIMEOUT + 5 then return ("rank %d raised after %.1f s"):format(r, x.failed.after) end
  if not x.failed.msg:match("rank %d+ of %d+") and not x.failed.msg:match("aborted") then
    return ("rank %d's message names no rank: %s"):format(r, x.failed.msg)
  end
  if x.usable ~= "yes" then return ("rank %d not usable after: %s"):format(r, tostring(x.usable)) end
  local want = (n - 2) * (n - 1) // 2   -- the sum of the survivors' new ranks
  if tonumber(x.reinit) ~= want then return ("rank %d's new communicator: %s (want %d)"):format(r, tostring(x.reinit), want) end
  return nil
end

math.randomseed(SEED)
local tally = { runs = 0, bad = 0, hangs = 0, crashes = 0, survivors = 0, worst = 0 }
for run = 1, RUNS do
  local case = CASES[math.random(#CASES)]
  local n = math.random(2, 4)
  local victim = math.random(0, n - 1)
  local delay = math.random() * 0.8
  local res, wall = ranks.run(case, n, { victim = victim, timeout = TIMEOUT, delay = delay, seed = run, limit = 4 * TIMEOUT + 40 })
  local problems, worst = {}, 0
  for r = 0, n - 1 do
    local x = res[r + 1]
    if r == victim then
      if case ~= "never_join" and x.status ~= 137 then problems[#problems + 1] = ("victim exited %s"):format(tostring(x.status)) end
    else
      local p = check_survivor(x, r, n)
      if p then problems[#problems + 1] = p end
      if x.status == 137 then tally.hangs = tally.hangs + 1 end
      if x.status and x.status > 128 and x.status ~= 137 then tally.crashes = tally.crashes + 1 end
      if x.failed then worst = math.max(worst, x.failed.after) end
      tally.survivors = tally.survivors + 1
    end
  end
  tally.runs = tally.runs + 1
  tally.worst = math.max(tally.worst, worst)
  if #problems > 0 then tally.bad = tally.bad + 1 end
  io.write(("run %2d %-16s ranks %d victim %d delay %.2f: %s, slowest detection %.2f s, job %.1f s\n")
    :format(run, case, n, victim, delay, #problems == 0 and "ok" or table.concat(problems, "; "), worst, wall))
  if #problems > 0 then
    for r = 1, n do io.write(("  [rank %d] %s\n"):format(r - 1, res[r].out:gsub("\n", "\n  [rank " .. (r - 1) .. "] "))) end
  end
  io.flush()
end
io.write(("nccl faults: %d runs, %d with problems, %d survivors, %d hangs, %d crashes, slowest detection %.2f s (timeout %d s)\n")
  :format(tally.runs, tally.bad, tally.survivors, tally.hangs, tally.crashes, tally.worst, TIMEOUT))
os.exit(tally.bad == 0 and 0 or 1)
