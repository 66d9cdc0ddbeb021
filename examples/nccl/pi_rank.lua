-- nccl/pi_rank.lua RANK NRANKS IDFILE: one rank of examples/nccl_launch.lua. Joins the
-- communicator with the id in IDFILE, counts Monte-Carlo hits on its GPU, all_reduces the
-- count and all_gathers every rank's count, and reports both.
package.cpath = "./?.so;" .. package.cpath
local cuda = require "cudalua"
local nccl = require "cudalua.nccl"

local rank, nranks, idfile = tonumber(arg[1]), tonumber(arg[2]), arg[3]
if not (rank and nranks and idfile) then error("usage: pi_rank.lua RANK NRANKS IDFILE") end
cuda.select_device(rank % #cuda.gpus)
local function read(path)
  local f = assert(io.open(path))
  local s = f:read("a")
  f:close()
  return s
end
local comm = nccl.comm_init_rank(nranks, read(idfile), rank)

local hits = cuda.kernel(read("examples/nccl/hits.cu"), "hits", { name = "examples/nccl/hits.cu" })
local threads, iterations = 132 * 256, 1000
local states = cuda.random.create_xoroshiro128p_states(threads, { seed = 7, subsequence_start = rank * threads })
local per_thread = cuda.device_array(threads, "uint64")
hits[{ (threads + 255) // 256, 256 }](states, per_thread, iterations, threads)
local mine = cuda.device_array(1, "uint64")
cuda.reduce("a + b")(per_thread, { res = mine })
local total = cuda.device_array(1, "uint64")
local all = cuda.device_array(nranks, "uint64")
comm:all_reduce(mine, total, "sum")
comm:all_gather(mine, all)
local t, gathered = total:copy_to_host()[1], 0
for _, v in ipairs(all:copy_to_host():totable()) do gathered = gathered + v end
print(("rank %d: total %d, sum of gathered counts %d, pi ~ %.5f"):format(rank, t, gathered,
  4 * t / (nranks * threads * iterations)))
comm:close()
