-- cub_block_sort.lua: CUB's block-wide primitives as its documentation shows them: each block
-- loads 512 keys (128 threads x 4) in a blocked arrangement, sorts them with
-- cub::BlockRadixSort and writes an exclusive prefix sum of its sorted keys with
-- cub::BlockScan. Checked against table.sort and a CPU scan of every block.
package.cpath = "./?.so;" .. package.cpath
local cuda = require "cudalua"
if cuda.devices()[1].kind == "cpu" then   -- counted as skipped by examples/run.sh
  print("cub_block_sort: skipped: CUB runs on a GPU only, not on cudalua's CPU device")
  os.exit(77, true)
end

local THREADS, ITEMS = 128, 4
local sort_scan = cuda.kernel(([[
#include <cub/cub.cuh>
constexpr int THREADS = %d, ITEMS = %d;

extern "C" __global__ void sort_scan(const int *in, int *sorted, int *scanned) {
  using Sort = cub::BlockRadixSort<int, THREADS, ITEMS>;
  using Scan = cub::BlockScan<int, THREADS>;
  __shared__ union { typename Sort::TempStorage sort; typename Scan::TempStorage scan; } tmp;
  int keys[ITEMS];
  const int base = blockIdx.x * THREADS * ITEMS + threadIdx.x * ITEMS;
  for (int i = 0; i < ITEMS; i++) keys[i] = in[base + i];
  Sort(tmp.sort).Sort(keys);
  for (int i = 0; i < ITEMS; i++) sorted[base + i] = keys[i];
  __syncthreads();   // the temporary storage is shared by the two primitives
  int sums[ITEMS];
  Scan(tmp.scan).ExclusiveSum(keys, sums);
  for (int i = 0; i < ITEMS; i++) scanned[base + i] = sums[i];
}]]):format(THREADS, ITEMS), "sort_scan")

local blocks = 64
local per = THREADS * ITEMS
local n = blocks * per
local host = cuda.array(n, "int32")
for i = 1, n do host[i] = math.random(-100000, 100000) end
local d_in = cuda.to_device(host)
local d_sorted, d_scan = cuda.device_array(n, "int32"), cuda.device_array(n, "int32")
sort_scan[{blocks, THREADS}](d_in, d_sorted, d_scan)
local sorted, scanned = d_sorted:copy_to_host(), d_scan:copy_to_host()

local bad = 0
for b = 0, blocks - 1 do
  local t = {}
  for i = 1, per do t[i] = host[b * per + i] end
  table.sort(t)
  local run = 0
  for i = 1, per do
    if sorted[b * per + i] ~= t[i] or scanned[b * per + i] ~= run then bad = bad + 1 end
    run = run + t[i]
  end
end
print(("CUB BlockRadixSort + BlockScan: %d blocks of %d keys, %d mismatches"):format(blocks, per, bad))
if bad > 0 then error("cub_block_sort: mismatch") end
