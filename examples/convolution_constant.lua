-- A separable convolution as in NVIDIA cuda-samples' convolutionSeparable: a 17-tap filter
-- (KERNEL_RADIUS 8) in __constant__ memory set from the host (the samples' cudaMemcpyToSymbol,
-- here m:get_global), rows then columns, pixels outside the image counted as 0 (the samples'
-- CPU reference); checked against the CPU on a random image.
package.cpath = "./?.so;" .. package.cpath
local cuda = require "cudalua"

local SRC = [[
#define KERNEL_RADIUS 8
__constant__ float c_Kernel[2 * KERNEL_RADIUS + 1];
extern "C" __global__ void rows(float *dst, const float *src, int w, int h) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x >= w || y >= h) return;
  float sum = 0;
  for (int k = -KERNEL_RADIUS; k <= KERNEL_RADIUS; k++) {
    int d = x + k;
    if (d >= 0 && d < w) sum += src[y * w + d] * c_Kernel[KERNEL_RADIUS - k];
  }
  dst[y * w + x] = sum;
}
extern "C" __global__ void columns(float *dst, const float *src, int w, int h) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x >= w || y >= h) return;
  float sum = 0;
  for (int k = -KERNEL_RADIUS; k <= KERNEL_RADIUS; k++) {
    int d = y + k;
    if (d >= 0 && d < h) sum += src[d * w + x] * c_Kernel[KERNEL_RADIUS - k];
  }
  dst[y * w + x] = sum;
}
]]
local R, W, H = 8, 384, 256
math.randomseed(os.time())
local m = cuda.compile(SRC)
local filter, image = cuda.array(2 * R + 1, cuda.float32), cuda.array(W * H, cuda.float32)
for i = 1, 2 * R + 1 do filter[i] = math.random() end
for i = 1, W * H do image[i] = math.random() * 16 end
-- the macro's extent is not read: dtype given, the shape is the variable's size / 4
m:get_global("c_Kernel", "float32"):copy_to_device(filter)
local d_in, d_tmp, d_out = cuda.to_device(image), cuda.device_array(W * H, cuda.float32), cuda.device_array(W * H, cuda.float32)
local grid, block = { (W + 15) // 16, (H + 15) // 16 }, { 16, 16 }
m.rows[{ grid, block }](d_tmp, d_in, W, H)
m.columns[{ grid, block }](d_out, d_tmp, W, H)
local got = d_out:copy_to_host()

-- the CPU: the samples' convolutionRowCPU then convolutionColumnCPU, in double
local function conv(src, along_x)
  local dst = {}
  for y = 0, H - 1 do
    for x = 0, W - 1 do
      local sum = 0
      for k = -R, R do
        local dx, dy = along_x and x + k or x, along_x and y or y + k
        if dx >= 0 and dx < W and dy >= 0 and dy < H then sum = sum + src[dy * W + dx + 1] * filter[R - k + 1] end
      end
      dst[y * W + x + 1] = sum
    end
  end
  return dst
end
local want = conv(conv(image, true), false)
local worst = 0
for i = 1, W * H do worst = math.max(worst, math.abs(got[i] - want[i]) / math.max(1, math.abs(want[i]))) end
if worst > 1e-4 then error(("convolution differs from the CPU: relative error %g"):format(worst)) end
print(("convolution_constant: %dx%d image, 17-tap filter in __constant__ memory, rows then columns; "
  .. "max rel. error %.1e"):format(W, H, worst))
