-- nccl_launch.lua: the same Monte-Carlo pi with one process per GPU, the shape of a multi-node
-- job. This launcher makes NCCL's unique id, hands it over through a file, starts one worker
-- per GPU (examples/nccl/pi_rank.lua RANK NRANKS IDFILE) and checks what they report: every
-- rank holds the same all_reduce total, and it is the sum of the ranks' own counts (gathered
-- with all_gather). On several machines a job launcher starts the workers instead.
package.cpath = "./?.so;" .. package.cpath
local cuda = require "cudalua"
local nccl = require "cudalua.nccl"

local ok, why = nccl.is_available()
if not ok then error("nccl_launch: " .. why) end
local n = #cuda.gpus
local idfile = os.tmpname()
local f = assert(io.open(idfile, "w"))
f:write(nccl.unique_id())
f:close()
local lua = arg[-1] or "lua5.4"
local workers = {}
for r = 0, n - 1 do
  workers[r] = io.popen(("%s examples/nccl/pi_rank.lua %d %d %s 2>&1"):format(lua, r, n, idfile))
end
local totals, sums, bad = {}, {}, 0
for r = 0, n - 1 do
  local out = workers[r]:read("a")
  if not workers[r]:close() then bad = bad + 1; io.write(out) end
  local rank, total, gathered = out:match("rank (%d+): total (%d+), sum of gathered counts (%d+)")
  if not rank then bad = bad + 1 else totals[#totals + 1], sums[#sums + 1] = total, gathered end
  io.write(out)
end
os.remove(idfile)
for i = 1, #totals do
  if totals[i] ~= totals[1] or sums[i] ~= totals[1] then bad = bad + 1 end
end
print(("nccl_launch: %d worker process%s, %d problems"):format(n, n == 1 and "" or "es", bad))
if bad > 0 then error("nccl_launch: mismatch") end
