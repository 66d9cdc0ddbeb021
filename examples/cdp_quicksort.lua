-- cdp_quicksort.lua: dynamic parallelism. A recursive quicksort whose kernel partitions its
-- range and launches itself on the two halves (CDP2, as NVIDIA's cuda-samples
-- cdpSimpleQuicksort does; this code is our own): relocatable = true is all it needs, cuda.kernel
-- links the CUDA device runtime itself. Children go to fire-and-forget streams; the parent
-- grid completes only once all its descendants have. Checked against table.sort.
package.cpath = "./?.so;" .. package.cpath
local cuda = require "cudalua"
if cuda.devices()[1].kind == "cpu" then   -- counted as skipped by examples/run.sh
  print("cdp_quicksort: skipped: dynamic parallelism (launches from device code) runs on a GPU only, not on cudalua's CPU device")
  os.exit(77, true)
end

local SRC = [[
#define MAX_DEPTH 16   // deeper ranges are sorted in place (CUDA allows 24 levels)
#define SMALL 32       // so are short ones
__device__ void selection_sort(int *a, int lo, int hi) {
  for (int i = lo; i <= hi; i++) {
    int m = i;
    for (int j = i + 1; j <= hi; j++) if (a[j] < a[m]) m = j;
    int t = a[i]; a[i] = a[m]; a[m] = t;
  }
}
extern "C" __global__ void quicksort(int *a, int lo, int hi, int depth) {
  if (depth >= MAX_DEPTH || hi - lo < SMALL) { selection_sort(a, lo, hi); return; }
  int pivot = a[lo + (hi - lo) / 2], i = lo, j = hi;
  while (i <= j) {
    while (a[i] < pivot) i++;
    while (a[j] > pivot) j--;
    if (i <= j) { int t = a[i]; a[i] = a[j]; a[j] = t; i++; j--; }
  }
  if (lo < j) quicksort<<<1, 1, 0, cudaStreamFireAndForget>>>(a, lo, j, depth + 1);
  if (i < hi) quicksort<<<1, 1, 0, cudaStreamFireAndForget>>>(a, i, hi, depth + 1);
}]]

-- every launch not yet finished counts against this limit (2048 by default); it is set before
-- code that launches kernels is loaded (cuda.set_limit refuses it after: the driver can hang)
cuda.set_limit("dev_runtime_pending_launch_count", 4096)
local quicksort = cuda.kernel(SRC, "quicksort", { relocatable = true })

local n = 20000
local host = {}
for i = 1, n do host[i] = math.random(-1000000, 1000000) end
local d = cuda.to_device(host, "int32")
quicksort[{ 1, 1 }](d, 0, n - 1, 0)
local sorted = d:copy_to_host()
table.sort(host)
for i = 1, n do
  if sorted[i] ~= host[i] then error(("element %d: GPU %d, CPU %d"):format(i, sorted[i], host[i])) end
end
print(("cdp_quicksort: %d random integers sorted by a kernel launching itself, as table.sort does"):format(n))

-- the same sort as the last node of a graph, whose children and grandchildren the graph's end
-- must wait for (cudalua adds a node after such a kernel: src/gexec.c); each launch sorts a fresh
-- copy of other random data, and only the stream is waited for
local fresh = {}
for i = 1, n do fresh[i] = math.random(-1000000, 1000000) end
local pristine, work = cuda.to_device(fresh, "int32"), cuda.device_array(n, "int32")
local g = cuda.graph()
local reset = g:memcpy(work, pristine)
g:kernel(quicksort, { 1, 1 }, { work, 0, n - 1, 0 }, { reset })
local exec, s = g:instantiate(), cuda.stream()
table.sort(fresh)
for launch = 1, 3 do
  exec:launch(s)
  s:synchronize()
  local got = work:copy_to_host()
  for i = 1, n do
    if got[i] ~= fresh[i] then error(("graph launch %d, element %d: GPU %d, CPU %d"):format(launch, i, got[i], fresh[i])) end
  end
end
print(("cdp_quicksort: the sort as a graph's last node, launched 3 times, waited for on its stream alone: %d sorted each time"):format(n))
