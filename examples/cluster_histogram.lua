-- cluster_histogram.lua: thread block clusters and distributed shared memory (Hopper, compute
-- capability 9.0+), after the CUDA programming guide's cluster histogram: the bins are spread
-- over the shared memory of the blocks of a cluster; every thread adds to the bin wherever it
-- lives (cluster.map_shared_rank), then each block adds its slice to the global histogram.
-- Launched with cluster = {2, 1, 1}; a kernel declaring __cluster_dims__ needs no option.
package.cpath = "./?.so;" .. package.cpath
local cuda = require "cudalua"

local dev = cuda.gpus.current:info()
if dev.compute_capability[1] < 9 then
  print("cluster_histogram: skipped: clusters need compute capability 9.0; this device has " ..
        table.concat(dev.compute_capability, "."))
  os.exit(77, true)   -- counted as skipped by examples/run.sh, not as passed
end

local SRC = [[
#include <cooperative_groups.h>
namespace cg = cooperative_groups;

__device__ void histogram(int *bins, int nbins, int per_block, const int *input, int n) {
  extern __shared__ int smem[];
  cg::cluster_group cluster = cg::this_cluster();
  unsigned rank = cluster.block_rank();
  for (int i = threadIdx.x; i < per_block; i += blockDim.x) smem[i] = 0;
  cluster.sync();                                   // every block's bins are zero
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    int bin = input[i];
    int *dst = cluster.map_shared_rank(smem, bin / per_block);   // a bin in another block
    atomicAdd(dst + bin % per_block, 1);
  }
  cluster.sync();                                   // all adds landed before anyone reads
  for (int i = threadIdx.x; i < per_block; i += blockDim.x)
    atomicAdd(&bins[rank * per_block + i], smem[i]);
}

extern "C" __global__ void cluster_hist(int *bins, int nbins, int per_block, const int *input, int n) {
  histogram(bins, nbins, per_block, input, n);
}

extern "C" __global__ void __cluster_dims__(2, 1, 1)
declared_hist(int *bins, int nbins, int per_block, const int *input, int n) {
  histogram(bins, nbins, per_block, input, n);
}]]
local mod = cuda.compile(SRC)
local CLUSTER, NBINS = 2, 4096
local per_block = NBINS // CLUSTER
local n = 1 << 20
local host = cuda.array(n, "int32")
local cpu = {}
for b = 0, NBINS - 1 do cpu[b] = 0 end
for i = 1, n do
  local v = math.random(0, NBINS - 1)
  host[i] = v
  cpu[v] = cpu[v] + 1
end
local d_in = cuda.to_device(host)

local function check(label, run)
  local bins = cuda.device_array(NBINS, "int32")
  bins:fill(0)
  run(bins)
  local got, bad = bins:copy_to_host(), 0
  for b = 0, NBINS - 1 do if got[b + 1] ~= cpu[b] then bad = bad + 1 end end
  print(("cluster histogram (%s): %d bins over %d values, %d mismatches"):format(label, NBINS, n, bad))
  if bad > 0 then error("cluster_histogram: mismatch") end
end

local shared = per_block * 4
check("cluster = {2, 1, 1}", function(bins)
  mod.cluster_hist:launch({ grid = 132, block = 256, shared = shared, cluster = { CLUSTER, 1, 1 } },
                          bins, NBINS, per_block, d_in, n)
end)
check("__cluster_dims__(2, 1, 1)", function(bins)
  mod.declared_hist[{ 132, 256, 0, shared }](bins, NBINS, per_block, d_in, n)
end)
local ok, e = pcall(mod.cluster_hist.launch, mod.cluster_hist,
  { grid = 133, block = 256, shared = shared, cluster = CLUSTER }, cuda.device_array(NBINS, "int32"), NBINS, per_block, d_in, n)
print("a grid that is not a whole number of clusters is refused: " .. tostring(not ok and e:match("not a multiple[^\n]*")))
if ok then error("cluster_histogram: a bad grid was accepted") end
