-- linked.lua: separate compilation. A kernel in one source calls device functions defined in
-- another; both are compiled with relocatable = true (nvcc's -rdc=true) and linked by
-- nvJitLink into one module. The same with lto = true links LTO-IR, optimised across the
-- two sources. Checked against the CPU.
package.cpath = "./?.so;" .. package.cpath
local cuda = require "cudalua"
if cuda.devices()[1].kind == "cpu" then   -- counted as skipped by examples/run.sh
  print("linked: skipped: device-code linking (nvJitLink) runs on a GPU only, not on cudalua's CPU device")
  os.exit(77, true)
end

local KERNEL = [[
extern __device__ float poly(float x);          // defined in poly.cu
extern __device__ int calls;
extern "C" __global__ void apply(float *y, const float *x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) { y[i] = poly(x[i]); atomicAdd(&calls, 1); }
}
extern "C" __global__ void read_calls(int *out) { *out = calls; }]]
local POLY = [[
__device__ int calls = 0;
__device__ float poly(float x) { return (3.0f * x - 2.0f) * x + 0.5f; }]]

local n = 100000
local host = cuda.array(n, "float32")
for i = 1, n do host[i] = math.random() * 4 - 2 end
local d_x = cuda.to_device(host)

for _, flag in ipairs { "relocatable", "lto" } do
  local linked = cuda.link {
    cuda.compile(KERNEL, { name = "apply.cu", [flag] = true }),
    cuda.compile(POLY, { name = "poly.cu", [flag] = true }),
  }
  local d_y, d_calls = cuda.device_array(n, "float32"), cuda.device_array(1, "int32")
  linked.apply[{ (n + 255) // 256, 256 }](d_y, d_x, n)
  linked.read_calls[{ 1, 1 }](d_calls)
  local y, worst = d_y:copy_to_host(), 0
  for i = 1, n do
    local x = host[i]
    worst = math.max(worst, math.abs(y[i] - ((3 * x - 2) * x + 0.5)))
  end
  local calls = d_calls:copy_to_host()[1]
  print(("two sources linked (%s = true): kernels %s, max error %.2e, %d calls counted in the other unit's variable")
    :format(flag, table.concat(linked:kernels(), ", "), worst, calls))
  if worst > 1e-5 or calls ~= n then error("linked: mismatch") end
end
