-- nccl/recover_rank.lua N: one rank of examples/nccl_recover.lua (RANK, WORLD_SIZE, MASTER_ADDR,
-- MASTER_PORT as a launcher sets them). Adds up i mod 97 over its share of 1..N on the GPU,
-- in rounds; rank 2 dies in round 2; the survivors go on as a job of two.
package.cpath = "./?.so;" .. package.cpath
local cuda = require "cudalua"
local nccl = require "cudalua.nccl"
local N = tonumber(arg[1])
local rank = tonumber(os.getenv("RANK"))

local part = cuda.kernel([[
extern "C" __global__ void part(long long lo, long long hi, unsigned long long *out) {
  unsigned long long s = 0;
  for (long long i = lo + blockIdx.x * blockDim.x + threadIdx.x; i <= hi; i += (long long)gridDim.x * blockDim.x) s += i % 97;
  atomicAdd(out, s);
}]], "part")
-- the sum over [lo, hi] on this GPU, into a one-element array
local function sum(lo, hi)
  local out = cuda.device_array(1, "uint64")
  out:fill(0)
  if hi >= lo then part[{ 132, 256 }](lo, hi, out) end
  return out
end
-- rounds of [lo, hi] split among `size` ranks: rank r takes the r-th piece of each round
local ROUNDS = 4
local function piece(round, r, size)
  local per = N // ROUNDS
  local lo, hi = (round - 1) * per + 1, round == ROUNDS and N or round * per
  local n = hi - lo + 1
  return lo + n * r // size, lo + n * (r + 1) // size - 1
end

local comm = nccl.init {}
local total, done = 0, 0
local y = cuda.device_array(1, "uint64")
for round = 1, ROUNDS do
  if round == 2 and rank == 2 then os.execute("kill -KILL $PPID") end   -- (the shell's parent: this lua)
  local ok, err = pcall(function()
    comm:all_reduce(sum(piece(round, rank, 3)), y, "sum")
    cuda.synchronize()
  end)
  if not ok then
    print(("rank %d: round %d failed, going on without rank 2: %s"):format(rank, round, err))
    break
  end
  total, done = total + y:copy_to_host()[1], round
end
-- the survivors: a job of two at the next port; the rounds not done, shared out between them
comm:close()
local port = tonumber(os.getenv("MASTER_PORT")) + 1
local two = nccl.init { rank = rank, size = 2, addr = os.getenv("MASTER_ADDR") .. ":" .. port, timeout = 30 }
for round = done + 1, ROUNDS do
  two:all_reduce(sum(piece(round, rank, 2)), y, "sum")
  total = total + y:copy_to_host()[1]
end
print(("rank %d: total %d (rounds 1..%d by three ranks, the rest by two)"):format(rank, total, done))
two:close()
