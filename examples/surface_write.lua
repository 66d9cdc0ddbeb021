-- surface_write.lua: a kernel writes a transformed image into a CUDA array through a surface
-- (surf2Dwrite), as NVIDIA's cuda-samples simpleSurfaceWrite does; the array is read back, and
-- read again through a texture over the same array, and both compared exactly with the CPU.
package.cpath = "./?.so;" .. package.cpath
local cuda = require "cudalua"
if cuda.devices()[1].kind == "cpu" then   -- counted as skipped by examples/run.sh
  print("surface_write: skipped: surfaces runs on a GPU only, not on cudalua's CPU device")
  os.exit(77, true)
end

local m = cuda.compile([[
extern "C" __global__ void write_inverted(cudaSurfaceObject_t surf, const float *in, int width, int height) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x < width && y < height) surf2Dwrite(1.0f - in[y * width + x], surf, x * 4, y);   // x in bytes
}
extern "C" __global__ void read_back(float *out, cudaTextureObject_t tex, int width, int height) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x < width && y < height) out[y * width + x] = tex2D<float>(tex, x + 0.5f, y + 0.5f);
}]])

local function f32(x) return (string.unpack("<f", string.pack("<f", x))) end

local W, H = 300, 200
local img = cuda.array(W * H, cuda.float32)
for i = 1, W * H do img[i] = math.random() end
local d_img = cuda.to_device(img)
local ca = cuda.cuda_array({ H, W }, cuda.float32, { surface = true })
local surf = cuda.surface(ca)
local cfg = { { (W + 15) // 16, (H + 15) // 16 }, { 16, 16 } }
m.write_inverted[cfg](surf, d_img, W, H)
local back = ca:copy_to_host()

local tex = cuda.texture(ca)
local d_out = cuda.device_array(W * H, cuda.float32)
m.read_back[cfg](d_out, tex, W, H)
local fetched = d_out:copy_to_host()

local bad = 0
for i = 1, W * H do
  local want = f32(1 - img[i])
  if back[i] ~= want or fetched[i] ~= want then bad = bad + 1 end
end
print(("surface_write: %dx%d image inverted through a surface, read back by copy and by texture, %d mismatches")
  :format(W, H, bad))
surf:close(); tex:close(); ca:close()
if bad > 0 then error("surface_write: the CUDA array holds other values than the CPU computed") end
