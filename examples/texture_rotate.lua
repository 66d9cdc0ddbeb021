-- texture_rotate.lua: rotates an image through a 2-D texture with linear filtering, normalized
-- coordinates and wrap addressing, as NVIDIA's cuda-samples simpleTexture does, and checks every
-- pixel against the CPU doing what the CUDA C++ Programming Guide's "Texture Fetching" appendix
-- says linear filtering is: x_B = x - 0.5, i = floor(x_B), alpha = frac(x_B) held with 8
-- fractional bits, tex = (1-alpha)(1-beta) T[i,j] + alpha(1-beta) T[i+1,j] + ... (texel indices
-- wrapped modulo the extents).
package.cpath = "./?.so;" .. package.cpath
local cuda = require "cudalua"
if cuda.devices()[1].kind == "cpu" then   -- counted as skipped by examples/run.sh
  print("texture_rotate: skipped: textures runs on a GPU only, not on cudalua's CPU device")
  os.exit(77, true)
end

local rotate = cuda.kernel([[
// simpleTexture's transformKernel, with cos and sin given (the CPU must see the same
// coordinates: cosf differs between host and device) and no fused multiply-adds
extern "C" __global__ void rotate(float *out, int width, int height, float c, float s,
                                  cudaTextureObject_t tex) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x >= width || y >= height) return;
  float u = __fsub_rn((float)x, (float)width / 2), v = __fsub_rn((float)y, (float)height / 2);
  float tu = __fsub_rn(__fmul_rn(u, c), __fmul_rn(v, s));
  float tv = __fadd_rn(__fmul_rn(v, c), __fmul_rn(u, s));
  tu = __fdiv_rn(tu, (float)width); tv = __fdiv_rn(tv, (float)height);
  out[y * width + x] = tex2D<float>(tex, __fadd_rn(tu, 0.5f), __fadd_rn(tv, 0.5f));
}]], "rotate")

local function f32(x) return (string.unpack("<f", string.pack("<f", x))) end

local W, H = 256, 192
local img = cuda.array(W * H, cuda.float32)
for i = 1, W * H do img[i] = math.random() end
local ca = cuda.cuda_array({ H, W }, cuda.float32):copy_to_device(img)
local tex = cuda.texture(ca, { filter = "linear", address = "wrap", normalized = true })

local angle = 0.5                              -- simpleTexture's angle, in radians
local c, s = f32(math.cos(angle)), f32(math.sin(angle))
local d_out = cuda.device_array(W * H, cuda.float32)
rotate[{ { (W + 15) // 16, (H + 15) // 16 }, { 16, 16 } }](d_out, W, H, c, s, tex)
local out = d_out:copy_to_host()

local function T(i, j) return img[(j % H) * W + (i % W) + 1] end
-- one dimension: the two texel indices and the weight with 8 fractional bits
local function taps(coord, n)
  local xb = coord * n - 0.5
  local i = math.floor(xb)
  return i, math.floor((xb - i) * 256 + 0.5) / 256
end

local bad, worst = 0, 0
for y = 0, H - 1 do
  for x = 0, W - 1 do
    local u, v = f32(x - W / 2), f32(y - H / 2)
    local tu = f32(f32(u * c) - f32(v * s))
    local tv = f32(f32(v * c) + f32(u * s))
    tu, tv = f32(f32(tu / W) + 0.5), f32(f32(tv / H) + 0.5)
    local i, a = taps(tu, W)
    local j, b = taps(tv, H)
    local t00, t10, t01, t11 = T(i, j), T(i + 1, j), T(i, j + 1), T(i + 1, j + 1)
    local want = (1 - a) * (1 - b) * t00 + a * (1 - b) * t10 + (1 - a) * b * t01 + a * b * t11
    -- the weights' rounding (to nearest or truncated: 1/256 each) bounds the difference
    local spread = math.max(t00, t10, t01, t11) - math.min(t00, t10, t01, t11)
    local err = math.abs(out[y * W + x + 1] - want)
    worst = math.max(worst, err)
    if err > spread / 128 + 1e-5 then bad = bad + 1 end
  end
end
print(("texture_rotate: %dx%d image rotated by %.1f rad through a linear, wrapped texture; "
  .. "largest difference from the CPU %.2e, %d mismatches"):format(W, H, angle, worst, bad))
tex:close(); ca:close()
if bad > 0 then error("texture_rotate: the GPU's interpolation differs from the CPU's") end
