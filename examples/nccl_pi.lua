-- nccl_pi.lua: Monte-Carlo pi on every GPU of the machine, one process. Each GPU draws its own
-- random streams (cudalua.random, a subsequence of its own), counts the points inside the
-- quarter circle and reduces them to one count on the device; NCCL's all_reduce sums the
-- counts across the GPUs, so every GPU ends with the total. Checked: every GPU's total is the
-- sum of the per-GPU counts read back one by one, and the estimate is near pi.
package.cpath = "./?.so;" .. package.cpath
local cuda = require "cudalua"
local nccl = require "cudalua.nccl"

local ok, why = nccl.is_available()
if not ok then print("nccl_pi: skipped: " .. why); os.exit(77, true) end

local src = assert(io.open("examples/nccl/hits.cu")):read("a")
local mod = cuda.compile(src, { name = "examples/nccl/hits.cu" })
local sum = cuda.reduce("a + b")
local g = #cuda.gpus
local threads, iterations = 132 * 256, 2000
local counts, totals = {}, {}
for d = 0, g - 1 do
  cuda.gpus[d]:run(function()
    local states = cuda.random.create_xoroshiro128p_states(threads, { seed = 42, subsequence_start = d * threads })
    local per_thread = cuda.device_array(threads, "uint64")
    mod.hits[{ (threads + 255) // 256, 256 }](states, per_thread, iterations, threads)
    counts[d + 1] = cuda.device_array(1, "uint64")
    sum(per_thread, { res = counts[d + 1] })
    totals[d + 1] = cuda.device_array(1, "uint64")
  end)
end
local comms = nccl.comm_init_all()
nccl.group(function()
  for d = 1, g do comms[d]:all_reduce(counts[d], totals[d], "sum") end
end)
local expect, mine = 0, {}
for d = 1, g do mine[d] = counts[d]:copy_to_host()[1]; expect = expect + mine[d] end
local samples = g * threads * iterations
local bad = 0
for d = 1, g do
  local t = totals[d]:copy_to_host()[1]
  if t ~= expect then bad = bad + 1 end
end
local pi = 4 * expect / samples
print(("nccl_pi: %d GPU%s, %.2e samples, counts {%s}, all_reduce total %d on every GPU: pi ~ %.6f (error %.1e)")
  :format(g, g == 1 and "" or "s", samples, table.concat(mine, ", "), expect, pi, math.abs(pi - math.pi)))
comms:close()
if bad > 0 or math.abs(pi - math.pi) > 1e-3 then error("nccl_pi: mismatch") end
