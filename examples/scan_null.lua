-- An inclusive scan in two passes, as in NVIDIA cuda-samples' scan code: each block scans its
-- part and writes its total to block_sums, a pointer that is NULL when there is one block
-- (passed as nil); a second pass adds the scanned block totals. Checked against the CPU.
package.cpath = "./?.so;" .. package.cpath
local cuda = require "cudalua"

local SRC = [[
#define B 256
extern "C" __global__ void block_scan(int *x, int n, int *block_sums) {
  __shared__ int s[B];
  int i = blockIdx.x * B + threadIdx.x;
  s[threadIdx.x] = i < n ? x[i] : 0;
  __syncthreads();
  for (int off = 1; off < B; off *= 2) {   // Hillis-Steele
    int v = threadIdx.x >= off ? s[threadIdx.x - off] : 0;
    __syncthreads();
    s[threadIdx.x] += v;
    __syncthreads();
  }
  if (i < n) x[i] = s[threadIdx.x];
  if (block_sums && threadIdx.x == B - 1) block_sums[blockIdx.x] = s[B - 1];
}
extern "C" __global__ void add_sums(int *x, int n, const int *scanned_sums) {
  int i = blockIdx.x * B + threadIdx.x;
  if (blockIdx.x > 0 && i < n) x[i] += scanned_sums[blockIdx.x - 1];
}
]]
math.randomseed(os.time())
local m = cuda.compile(SRC)
local function scan(host)
  local n = #host
  local blocks = (n + 255) // 256
  local d = cuda.to_device(host)
  if blocks == 1 then
    m.block_scan[{ 1, 256 }](d, n, nil)        -- one block: no block sums (NULL)
  else
    assert(blocks <= 256, "two levels only")
    local sums = cuda.device_array(blocks, cuda.int32)
    m.block_scan[{ blocks, 256 }](d, n, sums)
    m.block_scan[{ 1, 256 }](sums, blocks, nil)
    m.add_sums[{ blocks, 256 }](d, n, sums)
  end
  return d:copy_to_host()
end
for _, n in ipairs { math.random(1, 256), math.random(257, 65536) } do
  local host = cuda.array(n, cuda.int32)
  for i = 1, n do host[i] = math.random(-1000, 1000) end
  local got, acc = scan(host), 0
  for i = 1, n do
    acc = acc + host[i]
    if got[i] ~= acc then error(("scan of %d: element %d is %d, the CPU says %d"):format(n, i, got[i], acc)) end
  end
end
print("scan_null: inclusive scans of one block (block_sums NULL) and of many, checked against the CPU")
