-- Kernels after NVIDIA's cuda-samples, on a GPU and on cudalua's CPU device (the #gpu pass of
-- make test runs them there without a GPU), checked against Lua on random data:
--   Samples/0_Introduction/simpleVoteIntrinsics (simpleVote_kernel.cuh): __any_sync and
--   __all_sync over whole warps, and the directed test across three warps and within a half warp;
--   Samples/2_Concepts_and_Techniques/shfl_scan (shfl_scan.cu): a block's scan from
--   __shfl_up_sync, whose second level scans the warp totals with a mask of only the first
--   blockDim/32 lanes and a width of blockDim/32, then a uniform add of the blocks' carries.
-- The kernels are written here from the samples' algorithms (their facts, not their code).
local H = require "spec.helper"
local cuda = H.cuda
local gpu = H.gpu(it, pending)

local SRC = [[
extern "C" __global__ void vote_any(const unsigned *in, unsigned *out) {
  out[threadIdx.x] = __any_sync(0xffffffffu, in[threadIdx.x]);
}
extern "C" __global__ void vote_all(const unsigned *in, unsigned *out) {
  out[threadIdx.x] = __all_sync(0xffffffffu, in[threadIdx.x]);
}
// three flags a thread: any over its warp of "past one and a half warps", the predicate itself,
// and all over its warp of the same (set only where it holds)
extern "C" __global__ void vote_directed(bool *info) {
  int t = threadIdx.x;
  bool past = t >= 48;
  info[t * 3] = __any_sync(0xffffffffu, past);
  info[t * 3 + 1] = past;
  if (__all_sync(0xffffffffu, past)) info[t * 3 + 2] = true;
}
// a block's inclusive scan in place; the block's total into totals[blockIdx.x] when given
extern "C" __global__ void block_scan(int *data, int *totals) {
  extern __shared__ int warp_sums[];
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  int v = data[blockIdx.x * blockDim.x + threadIdx.x];
  for (int d = 1; d <= 32; d *= 2) {
    int up = __shfl_up_sync(0xffffffffu, v, d, 32);
    if (lane >= d) v += up;
  }
  if (lane == 31) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0 && lane < nwarps) {   // only the first nwarps lanes: their mask, their width
    int s = warp_sums[lane];
    unsigned mask = nwarps == 32 ? 0xffffffffu : (1u << nwarps) - 1;   // (a shift by 32 is undefined)
    for (int d = 1; d <= nwarps; d *= 2) {
      int up = __shfl_up_sync(mask, s, d, nwarps);
      if (lane >= d) s += up;
    }
    warp_sums[lane] = s;
  }
  __syncthreads();
  if (warp > 0) v += warp_sums[warp - 1];
  data[blockIdx.x * blockDim.x + threadIdx.x] = v;
  if (totals && threadIdx.x == blockDim.x - 1) totals[blockIdx.x] = v;
}
// every block but the first gets the scanned total of the blocks before it
extern "C" __global__ void uniform_add(int *data, const int *carry, int n) {
  __shared__ int c;
  int id = (blockIdx.x + 1) * blockDim.x + threadIdx.x;
  if (threadIdx.x == 0) c = carry[blockIdx.x];
  __syncthreads();
  if (id < n) data[id] += c;
}
]]

local mod
local function K(name)
  mod = mod or cuda.compile(SRC, { name = "samples.cu" })
  return mod[name]
end

describe("cuda-samples simpleVoteIntrinsics", function()
  gpu("any and all over each warp of random predicates, and the directed three-warp test", function()
    local n = 32 * math.random(1, 8)
    local ins = {}
    for w = 0, n // 32 - 1 do   -- each warp: all zero, all set, or mixed, as the sample's inputs
      local kind = math.random(1, 3)
      for l = 1, 32 do ins[w * 32 + l] = kind == 1 and 0 or kind == 2 and math.random(1, 9) or math.random(0, 1) end
    end
    local din, out = cuda.to_device(cuda.array(ins, "uint32")), cuda.zeros(n, "uint32")
    for _, which in ipairs { "any", "all" } do
      K("vote_" .. which)[{ 1, n }](din, out)
      local h = out:copy_to_host()
      for w = 0, n // 32 - 1 do
        local any, all = false, true
        for l = 1, 32 do local set = ins[w * 32 + l] ~= 0; any = any or set; all = all and set end
        local want = (which == "any" and any or which == "all" and all) and 1 or 0
        for l = 1, 32 do
          assert.equal(want, h[w * 32 + l] ~= 0 and 1 or 0, ("%s: warp %d lane %d"):format(which, w, l - 1))
        end
      end
    end
    local info = cuda.zeros(96 * 3, "bool")
    K("vote_directed")[{ 1, 96 }](info)
    local h = info:copy_to_host()
    for t = 0, 95 do   -- the sample's check: warp 0 false everywhere; warp 1 any only; warp 2 all three
      local w = t // 32
      assert.same({ w >= 1, t >= 48, w == 2 }, { h[t * 3 + 1], h[t * 3 + 2], h[t * 3 + 3] }, "thread " .. t)
    end
  end)
end)

describe("cuda-samples shfl_scan", function()
  gpu("scans random integers in blocks of 64 to 1024 threads, then adds the blocks' carries", function()
    local threads = 32 << math.random(1, 5)
    local blocks = math.random(2, threads)   -- the carries fit one block
    local n = threads * blocks
    local xs = {}
    for i = 1, n do xs[i] = math.random(-1000, 1000) end
    local d = cuda.to_device(cuda.array(xs, "int32"))
    local totals = cuda.zeros(threads, "int32")   -- (a whole block: the scan of them reads them all)
    local shared = threads // 32 * 4
    K("block_scan")[{ blocks, threads, 0, shared }](d, totals)
    K("block_scan")[{ 1, threads, 0, shared }](totals, nil)
    K("uniform_add")[{ blocks - 1, threads }](d, totals, n)
    local h, sum = d:copy_to_host(), 0
    for i = 1, n do
      sum = sum + xs[i]
      if h[i] ~= sum then assert.equal(sum, h[i], ("element %d of %d (%d threads a block)"):format(i, n, threads)) end
    end
  end)
end)
