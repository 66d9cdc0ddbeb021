-- warp_scan.lua: an inclusive prefix sum built from warp shuffles (__shfl_up_sync), the way
-- the CUDA samples' shfl_scan does it: each warp scans its 32 values, warp totals are scanned
-- by the first warp through shared memory, and a second kernel adds every block's carry.
-- Checked against a CPU scan of random integers.
package.cpath = "./?.so;" .. package.cpath
local cuda = require "cudalua"

local mod = cuda.compile([[
__device__ int warp_inclusive(int v) {
  const int lane = threadIdx.x & 31;
  for (int d = 1; d < 32; d <<= 1) {
    int up = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= d) v += up;
  }
  return v;
}

extern "C" __global__ void block_scan(const int *in, int *out, int *block_sums, int n) {
  __shared__ int warp_sums[32];
  const int i = blockIdx.x * blockDim.x + threadIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int v = i < n ? in[i] : 0;
  v = warp_inclusive(v);
  if (lane == 31) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    int w = threadIdx.x < blockDim.x / 32 ? warp_sums[lane] : 0;
    warp_sums[lane] = warp_inclusive(w);
  }
  __syncthreads();
  if (warp > 0) v += warp_sums[warp - 1];
  if (i < n) out[i] = v;
  if (threadIdx.x == blockDim.x - 1) block_sums[blockIdx.x] = v;
}

extern "C" __global__ void add_carry(int *out, const int *block_sums_scanned, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (blockIdx.x > 0 && i < n) out[i] += block_sums_scanned[blockIdx.x - 1];
}]])

local n, threads = 1000003, 1024
local blocks = (n + threads - 1) // threads   -- 977 blocks: one more block_scan level covers them
local host = cuda.array(n, "int32")
for i = 1, n do host[i] = math.random(-1000, 1000) end
local d_in, d_out = cuda.to_device(host), cuda.device_array(n, "int32")
local sums, sums_scanned, top = cuda.device_array(blocks, "int32"), cuda.device_array(blocks, "int32"), cuda.device_array(1, "int32")
mod.block_scan[{ blocks, threads }](d_in, d_out, sums, n)
mod.block_scan[{ 1, threads }](sums, sums_scanned, top, blocks)
mod.add_carry[{ blocks, threads }](d_out, sums_scanned, n)
local out = d_out:copy_to_host()

local run, bad = 0, 0
for i = 1, n do
  run = run + host[i]
  if out[i] ~= run then bad = bad + 1 end
end
print(("warp-shuffle inclusive scan of %d ints: last %d (CPU %d), %d mismatches"):format(n, out[n], run, bad))
if bad > 0 then error("warp_scan: mismatch") end
