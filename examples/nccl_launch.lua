-- nccl_launch.lua: the same Monte-Carlo pi with one process per GPU, the shape of a multi-node
-- job. This launcher makes NCCL's unique id, hands it over through a file, starts one worker
-- per GPU (examples/nccl/pi_rank.lua RANK NRANKS IDFILE) and checks what they report: every
-- rank holds the same all_reduce total, and it is the sum of the ranks' own counts (gathered
-- with all_gather). On several machines a job launcher starts the workers instead.
package.cpath = "./?.so;" .. package.cpath
local cuda = require "cudalua"
local nccl = require "cudalua.nccl"

local ok, why = nccl.is_available()
if not ok then print("nccl_launch: skipped: " .. why); os.exit(77, true) end
local n = #cuda.gpus
if n < 1 then error("nccl_launch: no GPU") end
local idfile = os.tmpname()
local f = assert(io.open(idfile, "w"))
f:write(nccl.unique_id())
f:close()
local lua = arg[-1] or "lua5.4"
-- a rank that dies leaves the others waiting in comm_init_rank: a time limit ends them
-- (CUDALUA_WORKER_LIMIT seconds, default 300; a run under compute-sanitizer needs longer)
local seconds = math.tointeger(tonumber(os.getenv("CUDALUA_WORKER_LIMIT") or 300)) or 300
local limit = os.execute("command -v timeout >/dev/null 2>&1") and ("timeout %d "):format(seconds) or ""
-- CUDALUA_WORKER_WRAP: a command each worker runs under (make sanitize: a compute-sanitizer per rank)
local wrap = os.getenv("CUDALUA_WORKER_WRAP") or ""
if wrap ~= "" then wrap = wrap .. " " end
local workers = {}
for r = 0, n - 1 do
  workers[r] = io.popen(("%s%s%s examples/nccl/pi_rank.lua %d %d %s 2>&1"):format(limit, wrap, lua, r, n, idfile))
end
local totals, sums, bad = {}, {}, 0
for r = 0, n - 1 do
  local out = workers[r]:read("a")
  local done, _, code = workers[r]:close()
  if code == 124 then out = out .. ("rank %d: ended by the %d s time limit\n"):format(r, seconds) end
  local rank, total, gathered, pi = out:match("rank (%d+): total (%d+), sum of gathered counts (%d+), pi ~ (%S+)")
  if not done or not rank then bad = bad + 1
  else
    totals[#totals + 1], sums[#sums + 1] = tonumber(total), tonumber(gathered)
    if math.abs(tonumber(pi) - math.pi) > 2e-3 then bad = bad + 1 end
  end
  io.write(out)
end
os.remove(idfile)
for i = 1, #totals do
  if totals[i] <= 0 or totals[i] ~= totals[1] or sums[i] ~= totals[1] then bad = bad + 1 end
end
print(("nccl_launch: %d worker process%s, %d problems"):format(n, n == 1 and "" or "es", bad))
if bad > 0 then error("nccl_launch: mismatch") end
