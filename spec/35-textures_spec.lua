-- CUDA arrays, texture and surface objects (issue 27 item 2): cuda.cuda_array, cuda.texture,
-- cuda.surface, passed to kernels as cudaTextureObject_t / cudaSurfaceObject_t. Every fetch is
-- compared with the CPU computing what the CUDA C++ Programming Guide's "Texture Fetching"
-- appendix says the hardware does (addressing, point and linear filtering with 8-bit fractions).
local H = require "spec.helper"
local C = require "spec.check"
local cuda = H.cuda
local gpu = H.gpuonly(it, pending, "textures")
local f32 = C.f32

local SRC = [[
extern "C" __global__ void fetch1(float *out, cudaTextureObject_t t, const float *x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = tex1D<float>(t, x[i]);
}
extern "C" __global__ void fetch2(float *out, cudaTextureObject_t t, const float *x, const float *y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = tex2D<float>(t, x[i], y[i]);
}
extern "C" __global__ void fetch3(float *out, cudaTextureObject_t t, const float *x, const float *y,
                                  const float *z, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = tex3D<float>(t, x[i], y[i], z[i]);
}
extern "C" __global__ void fetch1l(float *out, cudaTextureObject_t t, const float *x, const int *l, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = tex1DLayered<float>(t, x[i], l[i]);
}
extern "C" __global__ void fetch2l(float *out, cudaTextureObject_t t, const float *x, const float *y,
                                   const int *l, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = tex2DLayered<float>(t, x[i], y[i], l[i]);
}
extern "C" __global__ void fetch2i(int *out, cudaTextureObject_t t, const float *x, const float *y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = tex2D<int>(t, x[i], y[i]);
}
extern "C" __global__ void fetchlin(float *out, cudaTextureObject_t t, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = tex1Dfetch<float>(t, i);
}
// surfaces address x in bytes
extern "C" __global__ void surf_scale(cudaSurfaceObject_t s, float a, float b, int w, int h) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x < w && y < h) {
    float v = surf2Dread<float>(s, x * 4, y);
    surf2Dwrite(__fadd_rn(__fmul_rn(a, v), b), s, x * 4, y);   // no fused multiply-add: the CPU rounds twice
  }
}
]]
local mod
local function K(name)
  mod = mod or cuda.compile(SRC)
  return mod[name]
end
local function blocks(n) return (n + 127) // 128 end

-- random values a dtype holds exactly (float16: small integers and halves)
local RANGE = { int8 = { -128, 127 }, uint8 = { 0, 255 }, int16 = { -32768, 32767 }, uint16 = { 0, 65535 },
  int32 = { -2 ^ 31, 2 ^ 31 - 1 }, uint32 = { 0, 2 ^ 32 - 1 } }
local function values(dtype, n)
  local t = {}
  for i = 1, n do
    local r = RANGE[dtype]
    if r then t[i] = math.random(math.tointeger(r[1]), math.tointeger(r[2]))
    elseif dtype == "float16" then t[i] = math.random(-2000, 2000) / 2
    else t[i] = f32(math.random() * 200 - 100) end
  end
  return t
end

local function prod(shape, c)
  local n = c or 1
  for _, e in ipairs(shape) do n = n * e end
  return n
end

local function same_values(a, b, n)
  for i = 1, n do
    if a[i] ~= b[i] then error(("value %d: %s ~= %s"):format(i, tostring(a[i]), tostring(b[i])), 2) end
  end
end

-- the guide's addressing of a normalized coordinate u (wrap and mirror) or of an index
-- (clamp, border): the texel index in [0, n), or nil for the border
local function address(mode, i, n)
  if mode == "clamp" then return math.max(0, math.min(n - 1, i)) end
  if mode == "border" then return (i >= 0 and i < n) and i or nil end
  if mode == "wrap" then return i % n end
  local m = i % (2 * n)                  -- mirror: the texels repeat reflected every 2n
  return m < n and m or 2 * n - 1 - m
end

-- point filtering of coordinate x (unnormalized, or u * n when normalized)
local function point_index(mode, x, n) return address(mode, math.floor(x), n) end

-- linear filtering in one dimension: the two texels and the 8-bit fraction
local function lin(mode, x, n)
  local xb = x - 0.5
  local i = math.floor(xb)
  local a = math.floor((xb - i) * 256 + 0.5) / 256
  return address(mode, i, n), address(mode, i + 1, n), a
end

describe("cuda.cuda_array without a GPU", function()
  it("checks its arguments before the driver", function()
    C.raises("cuda.cuda_array: dtype float64 cannot be sampled", cuda.cuda_array, { 4, 4 }, "float64")
    C.raises("cuda.cuda_array: dtype int64 cannot be sampled", cuda.cuda_array, { 4 }, "int64")
    C.raises("cuda.cuda_array: dtype complex64 cannot be sampled", cuda.cuda_array, { 4 }, "complex64")
    C.raises("cuda.cuda_array: dtype bool cannot be sampled", cuda.cuda_array, { 4 }, "bool")
    C.raises("channels must be 1, 2 or 4, got 3", cuda.cuda_array, { 4, 4 }, "float32", { channels = 3 })
    C.raises("channels must be an integer", cuda.cuda_array, { 4, 4 }, "float32", { channels = "2" })
    C.raises("a layered array has 2 or 3 extents", cuda.cuda_array, { 4 }, "float32", { layered = true })
    C.raises("a CUDA array has 1, 2 or 3 extents, got 4", cuda.cuda_array, { 2, 2, 2, 2 }, "float32")
    C.raises("extent 2 must be at least 1, got 0", cuda.cuda_array, { 2, 0 }, "float32")
    C.raises("unknown option 'chanels'", cuda.cuda_array, { 4 }, "float32", { chanels = 2 })
    C.raises("cuda.cuda_array: surface must be a boolean", cuda.cuda_array, { 4 }, "float32", { surface = 1 })
    C.raises("cuda.cuda_array: argument 3: options table expected", cuda.cuda_array, { 4 }, "float32", 2)
  end)

  it("cuda.texture and cuda.surface check options and data before the driver", function()
    local i32 = cuda.array(H.rand_table(8, -9, 9, true), "int32")
    C.raises("cuda.texture: filter must be 'point' or 'linear', got cubic", cuda.texture, i32, { filter = "cubic" })
    C.raises("cuda.texture: address must be 'clamp', 'wrap', 'mirror' or 'border'", cuda.texture, i32, { address = "repeat" })
    C.raises("cuda.texture: address lists 1 to 3 modes, got 4", cuda.texture, i32, { address = { "clamp", "clamp", "clamp", "clamp" } })
    C.raises("cuda.texture: read must be 'element' or 'normalized_float'", cuda.texture, i32, { read = "float" })
    C.raises("cuda.texture: unknown option 'filtre'", cuda.texture, i32, { filtre = "point" })
    C.raises("cuda.texture: border[2] must be a number", cuda.texture, i32, { border = { 1, "x" } })
    C.raises("linear filtering needs float results: int32 read as elements", cuda.texture, i32, { filter = "linear" })
    C.raises("read = 'normalized_float' takes 8- and 16-bit integers, not int32", cuda.texture, i32, { read = "normalized_float" })
    C.raises("address 'wrap' needs normalized = true", cuda.texture, i32, { address = "wrap" })
    C.raises("address 'mirror' needs normalized = true", cuda.texture, i32, { address = { "clamp", "mirror" } })
    C.raises("srgb takes uint8 data read as 'normalized_float'", cuda.texture, i32, { srgb = true })
    C.raises("cuda.texture: dtype float64 cannot be sampled", cuda.texture, cuda.array({ 1.5 }, "float64"))
    C.raises("cuda.texture: channels must be 1, 2 or 4, got 3", cuda.texture, cuda.array({ 1, 2, 3 }, "float32"), { channels = 3 })
    C.raises("cuda.texture: argument 1: cuda_array or device array expected, got nil", cuda.texture, nil)
    local f = cuda.array(H.rand_table(8), "float32")
    C.raises("takes no filtering and no normalized coordinates", cuda.texture, f, { filter = "linear" })
    C.raises("not a pageable host array", cuda.texture, f)
    local closed = cuda.array({ 1 }, "float32"); closed:close()
    C.raises("cuda.texture: the array is closed", cuda.texture, closed)
    C.raises("cuda.surface: argument 1: cuda_array expected, got an array", cuda.surface, f)
    C.raises("cuda.surface: argument 1: cuda_array expected, got nil", cuda.surface, nil)
  end)
end)

describe("signatures name texture and surface objects", function()
  it("as 8-byte handles (m:get(name, sig)), no GPU needed", function()
    local M = require "cudalua.module"
    for _, t in ipairs { "cudaTextureObject_t", "cudaSurfaceObject_t", "CUtexObject", "CUsurfObject" } do
      assert.equal("Lp", (M.parse_signature(t .. " t, float *o")))
    end
  end)
end)

describe("CUDA arrays", function()
  -- found by review: the copy (parked: it waits behind s) let the helper thread run a host
  -- function that closed the CUDA array, and the copy then read the record it had dropped
  gpu("a host function closing a CUDA array or its texture's source meanwhile: no crash", function()
    local rows = math.random(1, 4) << 8                 -- (a 1-D CUDA array is at most 131072 wide)
    local n = rows * 1024
    local ca = cuda.cuda_array({ rows, 1024 }, "float32")
    local h = cuda.zeros(n, "float32")                 -- pageable: the copy waits
    local s = cuda.stream()                            -- blocking: the legacy stream waits for it
    s:launch_host_func(function() ca:close() end)
    local ok, err = pcall(ca.copy_to_device, ca, h)
    assert(ok or tostring(err):find("closed", 1, true), tostring(err))
    s:synchronize()
    assert.is_true(ca.closed)
    local ca2 = cuda.cuda_array({ 64, 64 }, "float32")
    s:launch_host_func(function() ca2:close() end)
    local t
    ok, err = pcall(function() t = cuda.texture(ca2) end)
    assert(ok or tostring(err):find("closed", 1, true), tostring(err))
    s:synchronize()
    if t then t:close() end
    assert.is_true(ca2.closed)
  end)

  gpu("round-trip every sampled dtype with 1, 2 and 4 channels, in 1-D, 2-D, 3-D and layered shapes", function()
    local shapes = { { { math.random(1, 300) } }, { { math.random(1, 40), math.random(1, 40) } },
      { { math.random(1, 9), math.random(1, 9), math.random(1, 9) } },
      { { math.random(1, 5), math.random(1, 50) }, true }, { { math.random(1, 4), math.random(1, 9), math.random(1, 9) }, true } }
    for _, dt in ipairs { "int8", "int16", "int32", "uint8", "uint16", "uint32", "float16", "float32" } do
      for _, ch in ipairs { 1, 2, 4 } do
        local sh = shapes[math.random(#shapes)]
        local shape, layered = sh[1], sh[2] or false
        local n = prod(shape, ch)
        local h = cuda.array(values(dt, n), dt)
        local ca = cuda.cuda_array(shape, dt, { channels = ch, layered = layered })
        assert.equal(ca, ca:copy_to_device(h))
        local back = ca:copy_to_host()
        assert.equal(n, back.size)
        assert.equal(ch > 1 and #shape + 1 or #shape, back.ndim)
        same_values(h, back, n)
        -- through a device array and back, on a stream
        local s = cuda.stream()
        local d = cuda.device_array(n, dt)
        ca:copy_to_host(d, s)
        local ca2 = cuda.cuda_array(shape, dt, { channels = ch, layered = layered })
        ca2:copy_to_device(d, s)
        local into = cuda.pinned_array(n, dt)
        ca2:copy_to_host(into, s)
        s:synchronize()
        same_values(h, into, n)
        ca:close(); ca2:close()
      end
    end
  end)

  gpu("says its shape, dtype and channels; copies check dtype and size", function()
    local ca = cuda.cuda_array({ 3, 5 }, "uint16", { channels = 2, surface = true })
    assert.same({ 3, 5 }, ca.shape)
    assert.equal("uint16", ca.dtype.name)
    assert.equal(2, ca.channels)
    assert.is_true(ca.surface)
    assert.is_false(ca.layered)
    assert.matches("cuda_array<uint16 x2>%[3, 5%]", tostring(ca))
    C.raises("cuda_array:copy_to_device: dtype mismatch (the array is int16, the CUDA array uint16)",
      ca.copy_to_device, ca, cuda.zeros(30, "int16"))
    C.raises("cuda_array:copy_to_device: size mismatch (the array has 15 values, the CUDA array 30",
      ca.copy_to_device, ca, cuda.zeros(15, "uint16"))
    ca:copy_to_device(values("uint16", 30))            -- a table takes the array's dtype
    C.raises("cuda_array:copy_to_host: size mismatch", ca.copy_to_host, ca, cuda.zeros(29, "uint16"))
    ca:close()
    assert.is_true(ca.closed)
    ca:close()                                         -- twice is fine
    C.raises("cuda_array:copy_to_host: the CUDA array is closed", ca.copy_to_host, ca)
    C.raises("cuda.texture: the CUDA array is closed", cuda.texture, ca)
    C.raises("cuda.surface: the CUDA array is closed", cuda.surface, ca)
  end)
end)

-- a 2-D float texture of random data, its values and coordinates kept for the CPU
local function image(w, h)
  local t = values("float32", w * h)
  local ca = cuda.cuda_array({ h, w }, "float32"):copy_to_device(cuda.array(t, "float32"))
  return ca, function(i, j) return i and j and t[j * w + i + 1] or 0 end
end

local function fetch2(tex, xs, ys)
  local n = #xs
  local out = cuda.zeros(n, "float32")
  K("fetch2")[{ blocks(n), 128 }](out, tex, cuda.array(xs, "float32"), cuda.array(ys, "float32"), n)
  return out
end

local function coords(n, size, normalized, spread)
  -- away from texel edges (point filtering's floor is then the same on both sides)
  local t = {}
  for i = 1, n do
    local x = math.random(-spread, size - 1 + spread) + 0.5 + (math.random() - 0.5) * 0.8
    t[i] = f32(normalized and x / size or x)
  end
  return t
end

describe("texture fetches", function()
  -- a view's memory may be another object's (a module's variable): the texture keeps it
  gpu("a texture over a module variable keeps the module loaded", function()
    local n = math.random(100, 1024)
    local vals = H.rand_table(n, -100, 100)
    local t
    do
      -- (the driver does not always honour __align__(512) for a module's variables: the
      -- texture reads a slice that starts on a 512-byte boundary)
      local m = cuda.compile(("__device__ __align__(512) float lut[%d];"):format(n + 128))
      local whole = m:get_global("lut")
      local k = (512 - whole:ptr() % 512) % 512 // 4
      local v = whole:slice(k + 1, k + n)
      v:copy_to_device(cuda.array(vals, "float32"))
      t = cuda.texture(v)
    end
    collectgarbage(); collectgarbage()
    local out = cuda.device_array(n, "float32")
    K("fetchlin")[{ blocks(n), 128 }](out, t, n)
    local h = out:copy_to_host()
    for i = 1, n do assert.equal(C.f32(vals[i]), h[i]) end
    t:close()
  end)

  gpu("point filtering with every address mode (and short lists of them) on coordinates outside the texture", function()
    local w, h = math.random(5, 40), math.random(5, 40)
    local ca, T = image(w, h)
    for _, mode in ipairs { "clamp", "border", "wrap", "mirror" } do
      local normalized = mode == "wrap" or mode == "mirror" or math.random() < 0.5
      local tex = cuda.texture(ca, { address = mode, normalized = normalized })
      local n = 500
      local xs, ys = coords(n, w, normalized, 2 * w), coords(n, h, normalized, 2 * h)
      local out = fetch2(tex, xs, ys)
      for k = 1, n do
        local x, y = xs[k] * (normalized and w or 1), ys[k] * (normalized and h or 1)
        local want = T(point_index(mode, x, w), point_index(mode, y, h))
        assert(out[k] == f32(want), ("%s at (%g, %g): %g, the CPU %g"):format(mode, x, y, out[k], want))
      end
      tex:close()
    end
    -- a list shorter than the dimensions: the rest take its last mode (cuda.core's rule)
    local modes = { { "wrap" }, { "mirror", "wrap" }, { "clamp" } }
    for _, list in ipairs(modes) do
      local tex = cuda.texture(ca, { address = list, normalized = true })
      local n = 300
      local xs, ys = coords(n, w, true, 2 * w), coords(n, h, true, 2 * h)
      local out = fetch2(tex, xs, ys)
      local my = list[2] or list[1]
      for k = 1, n do
        local want = T(point_index(list[1], xs[k] * w, w), point_index(my, ys[k] * h, h))
        assert(out[k] == f32(want), ("%s at (%g, %g): %g, the CPU %g"):format(table.concat(list, "/"), xs[k], ys[k], out[k], want))
      end
      tex:close()
    end
  end)

  gpu("linear filtering with normalized coordinates, clamp and wrap, as the guide's 8-bit fractions", function()
    local w, h = math.random(4, 30), math.random(4, 30)
    local ca, T = image(w, h)
    for _, mode in ipairs { "clamp", "wrap", "border" } do
      local tex = cuda.texture(ca, { filter = "linear", address = mode, normalized = true })
      local n = 400
      local xs, ys = {}, {}
      for k = 1, n do xs[k] = f32(math.random() * 3 - 1); ys[k] = f32(math.random() * 3 - 1) end
      local out = fetch2(tex, xs, ys)
      for k = 1, n do
        local i0, i1, a = lin(mode, xs[k] * w, w)
        local j0, j1, b = lin(mode, ys[k] * h, h)
        local t00, t10, t01, t11 = T(i0, j0), T(i1, j0), T(i0, j1), T(i1, j1)
        local want = (1 - a) * (1 - b) * t00 + a * (1 - b) * t10 + (1 - a) * b * t01 + a * b * t11
        local spread = math.max(t00, t10, t01, t11) - math.min(t00, t10, t01, t11)
        -- the weights' rounding (nearest or truncated) moves each by at most 1/256: the result by 2/256 of the spread
        assert(math.abs(out[k] - want) <= spread / 128 + 1e-4,
          ("%s at (%g, %g): %g, the CPU %g"):format(mode, xs[k], ys[k], out[k], want))
      end
    end
  end)

  gpu("1-D, 3-D and layered textures, point filtering", function()
    local n = 300
    local w = math.random(2, 100)
    local t1 = values("float32", w)
    local tex1 = cuda.texture(cuda.cuda_array(w, "float32"):copy_to_device(t1))
    local xs = coords(n, w, false, 0)
    local out = cuda.zeros(n, "float32")
    K("fetch1")[{ blocks(n), 128 }](out, tex1, cuda.array(xs, "float32"), n)
    for k = 1, n do assert.equal(t1[math.floor(xs[k]) + 1], out[k]) end

    local d, hh, ww = math.random(2, 8), math.random(2, 8), math.random(2, 8)
    local t3 = values("float32", d * hh * ww)
    local tex3 = cuda.texture(cuda.cuda_array({ d, hh, ww }, "float32"):copy_to_device(t3))
    local x, y, z = coords(n, ww, false, 0), coords(n, hh, false, 0), coords(n, d, false, 0)
    K("fetch3")[{ blocks(n), 128 }](out, tex3, cuda.array(x, "float32"), cuda.array(y, "float32"), cuda.array(z, "float32"), n)
    for k = 1, n do
      local i, j, l = math.floor(x[k]), math.floor(y[k]), math.floor(z[k])
      assert.equal(t3[(l * hh + j) * ww + i + 1], out[k])
    end

    local layers = math.random(2, 6)
    local tl = values("float32", layers * ww)
    local texl = cuda.texture(cuda.cuda_array({ layers, ww }, "float32", { layered = true }):copy_to_device(tl))
    local ls = {}
    for k = 1, n do ls[k] = math.random(0, layers - 1) end
    K("fetch1l")[{ blocks(n), 128 }](out, texl, cuda.array(x, "float32"), cuda.array(ls, "int32"), n)
    for k = 1, n do assert.equal(tl[ls[k] * ww + math.floor(x[k]) + 1], out[k]) end

    local t2l = values("float32", layers * hh * ww)
    local tex2l = cuda.texture(cuda.cuda_array({ layers, hh, ww }, "float32", { layered = true }):copy_to_device(t2l))
    K("fetch2l")[{ blocks(n), 128 }](out, tex2l, cuda.array(x, "float32"), cuda.array(y, "float32"), cuda.array(ls, "int32"), n)
    for k = 1, n do
      assert.equal(t2l[(ls[k] * hh + math.floor(y[k])) * ww + math.floor(x[k]) + 1], out[k])
    end
  end)

  gpu("read = 'normalized_float' maps uint8 and int16 to [0, 1] and [-1, 1]; int32 elements come as ints", function()
    local w, h, n = math.random(3, 20), math.random(3, 20), 300
    for _, dt in ipairs { "uint8", "int16" } do
      local t = values(dt, w * h)
      local ca = cuda.cuda_array({ h, w }, dt):copy_to_device(t)
      local tex = cuda.texture(ca, { read = "normalized_float" })
      local xs, ys = coords(n, w, false, 0), coords(n, h, false, 0)
      local out = fetch2(tex, xs, ys)
      for k = 1, n do
        local v = t[math.floor(ys[k]) * w + math.floor(xs[k]) + 1]
        local want = dt == "uint8" and v / 255 or math.max(v / 32767, -1)
        assert(math.abs(out[k] - want) <= 1e-6, ("%s %d: %g, the CPU %g"):format(dt, v, out[k], want))
      end
    end
    local t = values("int32", w * h)
    local tex = cuda.texture(cuda.cuda_array({ h, w }, "int32"):copy_to_device(t))
    local xs, ys = coords(n, w, false, 0), coords(n, h, false, 0)
    local out = cuda.zeros(n, "int32")
    K("fetch2i")[{ blocks(n), 128 }](out, tex, cuda.array(xs, "float32"), cuda.array(ys, "float32"), n)
    for k = 1, n do assert.equal(t[math.floor(ys[k]) * w + math.floor(xs[k]) + 1], out[k]) end
  end)

  -- a device array at an address textures take (TEXTURE_ALIGNMENT, 512 bytes on NVIDIA GPUs;
  -- the pool promises 256): allocations, with spacers between them growing by 256 bytes (a fixed
  -- one could land every try on the same remainder), are kept until one is
  local function aligned(t, shape)
    local held = {}
    for i = 1, 16 do
      local d = cuda.to_device(cuda.array(t, "float32")):reshape(shape)
      if d:ptr() % 512 == 0 then return d end
      held[#held + 1] = d
      held[#held + 1] = cuda.device_array(64 * i, "float32")
    end
    error(("no 512-byte aligned device array in %d tries"):format(#held // 2))
  end

  gpu("textures over linear and pitched device memory", function()
    local n = math.random(1, 5000)
    local t = values("float32", n)
    local d = aligned(t, n)
    local tex = cuda.texture(d)
    local out = cuda.zeros(n, "float32")
    K("fetchlin")[{ blocks(n), 128 }](out, tex, n)
    same_values(t, out, n)
    -- pitched: rows of 256 float32 (1024 bytes: a multiple of every device's pitch alignment)
    local w, h = 256, math.random(2, 20)
    local t2 = values("float32", w * h)
    local d2 = aligned(t2, { h, w })
    local tex2 = cuda.texture(d2)
    local xs, ys = coords(300, w, false, 0), coords(300, h, false, 0)
    local o2 = fetch2(tex2, xs, ys)
    for k = 1, 300 do assert.equal(t2[math.floor(ys[k]) * w + math.floor(xs[k]) + 1], o2[k]) end
    C.raises("not a multiple of the device's pitch alignment", cuda.texture, cuda.device_array({ 4, 3 }, "float32"))
  end)
end)

describe("surfaces", function()
  gpu("surf2Dread and surf2Dwrite change the CUDA array in place", function()
    local w, h = math.random(1, 70), math.random(1, 70)
    local t = values("float32", w * h)
    local ca = cuda.cuda_array({ h, w }, "float32", { surface = true }):copy_to_device(t)
    local s = cuda.surface(ca)
    local a, b = f32(math.random() * 4 - 2), f32(math.random() * 10)
    K("surf_scale")[{ { (w + 15) // 16, (h + 15) // 16 }, { 16, 16 } }](s, a, b, w, h)
    local back = ca:copy_to_host()
    for k = 1, w * h do assert.equal(f32(f32(a * t[k]) + b), back[k]) end
    C.raises("the CUDA array was made without surface = true", cuda.surface, cuda.cuda_array({ 2, 2 }, "float32"))
  end)
end)

-- src/cuarray.c's spares: a closed object's driver handle goes to the next one alike
describe("a closed texture's or surface's driver object", function()
  gpu("is the next one's over the same CUDA array with the same description; queued fetches read the same", function()
    local w, h = math.random(3, 40), math.random(3, 40)
    local ca, T = image(w, h)
    local function check(out, xs, ys, what)
      for k = 1, #xs do
        local want = T(address("border", math.floor(xs[k]), w), address("border", math.floor(ys[k]), h))
        assert(out[k] == f32(want), ("%s at (%g, %g): %g, the CPU %g"):format(what, xs[k], ys[k], out[k], want))
      end
    end
    local tex = cuda.texture(ca, { address = "border" })
    local first = tex.handle
    local xs, ys = coords(300, w, false, w), coords(300, h, false, h)
    local out1 = fetch2(tex, xs, ys)          -- queued, not waited for
    tex:close()
    -- another description first: a new object. (Without the spare, the driver would hand the
    -- freed handle to this one, and the next could not have it)
    local other = cuda.texture(ca, { address = "clamp" })
    assert.are_not.equal(first, other.handle)
    local again = cuda.texture(ca, { address = "border" })
    assert.equal(first, again.handle)
    local out2 = fetch2(again, xs, ys)
    check(out1:copy_to_host(), xs, ys, "before the close")
    check(out2:copy_to_host(), xs, ys, "after it")
    -- collected rather than closed: the same
    again = nil                               -- luacheck: ignore
    collectgarbage(); collectgarbage()
    local third = cuda.texture(ca, { address = "border" })
    assert.equal(first, third.handle)
    check(fetch2(third, xs, ys):copy_to_host(), xs, ys, "after a collection")
    -- the array's close lets its spares go; the open textures still read it
    third:close()
    ca:close()
    C.raises("cuda.texture: the CUDA array is closed", cuda.texture, ca, { address = "border" })
    local out3 = fetch2(other, xs, ys):copy_to_host()
    for k = 1, #xs do
      assert.equal(f32(T(address("clamp", math.floor(xs[k]), w), address("clamp", math.floor(ys[k]), h))), out3[k])
    end
    other:close()
  end)

  gpu("four descriptions made together, closed, and made again in another order: each gets its own back", function()
    local ca = image(math.random(3, 30), math.random(3, 30))
    local opts = { { address = "clamp" }, { address = "border" }, { filter = "linear" }, { filter = "linear", address = "border" } }
    local handles, texs = {}, {}
    for i, o in ipairs(opts) do texs[i] = cuda.texture(ca, o); handles[i] = texs[i].handle end
    for i = 1, 4 do texs[i]:close() end
    -- (an order neither a first-in-first-out nor a last-in-first-out free list would give back)
    for _, i in ipairs { 2, 4, 1, 3 } do
      local t = cuda.texture(ca, opts[i])
      assert.equal(handles[i], t.handle)
      t:close()
    end
    ca:close()
  end)

  gpu("an options table whose metamethod closes the CUDA array once 'channels' was read is not read twice", function()
    local ca = image(4, 4)
    local reads = 0   -- (the options are read once; a second read after the closed check crashed)
    local opts = setmetatable({}, { __index = function(_, k)
      if k == "channels" then
        reads = reads + 1
        if reads == 2 then ca:close() end
      end
    end })
    local t = cuda.texture(ca, opts)
    assert.is_false(ca.closed)
    t:close()
    ca:close()
  end)

  gpu("a surface's too; five descriptions in turn outrun the four spares", function()
    local w, h = math.random(1, 50), math.random(1, 50)
    local t = values("float32", w * h)
    local ca = cuda.cuda_array({ h, w }, "float32", { surface = true }):copy_to_device(t)
    local s = cuda.surface(ca)
    local first = s.handle
    s:close()
    s = cuda.surface(ca)
    assert.equal(first, s.handle)
    local a, b = f32(math.random() * 4 - 2), f32(math.random() * 10)
    K("surf_scale")[{ { (w + 15) // 16, (h + 15) // 16 }, { 16, 16 } }](s, a, b, w, h)
    local back = ca:copy_to_host()
    for k = 1, w * h do assert.equal(f32(f32(a * t[k]) + b), back[k]) end
    s:close()
    -- textures over it (a surface array samples too) in five descriptions, each closed at once:
    -- every one reads right whether its object was new or a spare
    local opts = { { address = "clamp" }, { address = "border" }, { filter = "linear" },
      { filter = "linear", address = "border" }, { address = { "clamp", "border" } } }
    for i = 1, 12 do
      local o = opts[i % 5 + 1]
      local tex = cuda.texture(ca, o)
      local xs, ys = coords(50, w, false, 0), coords(50, h, false, 0)
      local out = fetch2(tex, xs, ys)
      tex:close()
      local got = out:copy_to_host()
      local mx = type(o.address) == "table" and o.address[1] or o.address or "clamp"
      local my = type(o.address) == "table" and o.address[2] or mx
      local function B(x, y) return x and y and back[y * w + x + 1] or 0 end
      for k = 1, 50 do
        local want, spread
        if o.filter then   -- the guide's linear filtering with 8-bit fractions, as above
          local i0, i1, fa = lin(mx, xs[k], w)
          local j0, j1, fb = lin(my, ys[k], h)
          local t00, t10, t01, t11 = B(i0, j0), B(i1, j0), B(i0, j1), B(i1, j1)
          want = (1 - fa) * (1 - fb) * t00 + fa * (1 - fb) * t10 + (1 - fa) * fb * t01 + fa * fb * t11
          spread = math.max(t00, t10, t01, t11) - math.min(t00, t10, t01, t11)
        else
          want, spread = B(point_index(mx, xs[k], w), point_index(my, ys[k], h)), 0
        end
        assert(math.abs(got[k] - want) <= spread / 128 + 1e-4,
          ("%d (%s, %s): %g, the CPU %g"):format(i, o.filter or "point", mx .. "/" .. my, got[k], want))
      end
    end
    ca:close()
  end)
end)

describe("textures and surfaces as kernel arguments", function()
  gpu("in a graph kernel node and through exec:set_args", function()
    local w, h = math.random(3, 30), math.random(3, 30)
    local ca, T = image(w, h)
    local ca2, T2 = image(w, h)
    local n = 200
    local xs, ys = coords(n, w, false, 0), coords(n, h, false, 0)
    local dx, dy = cuda.to_device(cuda.array(xs, "float32")), cuda.to_device(cuda.array(ys, "float32"))
    local out = cuda.device_array(n, "float32")
    local tex = cuda.texture(ca)
    local g = cuda.graph()
    local node = g:kernel(K("fetch2"), { grid = blocks(n), block = 128 }, { out, tex, dx, dy, n })
    tex:close()                            -- the graph holds it: its handle stays good
    ca:close()
    local exec = g:instantiate()
    exec:launch()
    local o = out:copy_to_host()
    for k = 1, n do assert.equal(T(math.floor(xs[k]), math.floor(ys[k])), o[k]) end
    exec:set_args(node, out, cuda.texture(ca2), dx, dy, n)
    exec:launch()
    o = out:copy_to_host()
    for k = 1, n do assert.equal(T2(math.floor(xs[k]), math.floor(ys[k])), o[k]) end
  end)

  -- closing what captured work uses before end_capture frees nothing the graph reads: the
  -- capture holds the blocks themselves (the objects let go of them at close)
  gpu("a texture, its CUDA array and an array closed inside the capture that uses them stay the graph's", function()
    local w, h = math.random(3, 30), math.random(3, 30)
    local ca, T = image(w, h)
    local n = math.random(100, 300)
    local xs, ys = coords(n, w, false, 0), coords(n, h, false, 0)
    local s = cuda.stream()
    -- the blocks the test counts used on s only (the cache keeps those per stream)
    local dx, dy = cuda.device_array(n, "float32", s), cuda.to_device(cuda.array(ys, "float32"))
    dx:copy_to_device(cuda.array(xs, "float32"), s)
    local out = cuda.device_array(n, "float32")
    local back, src2 = cuda.cuda_array({ h, w }, "float32"), cuda.device_array(w * h, "float32", s):fill(3, s)
    local tex = cuda.texture(ca)
    collectgarbage(); collectgarbage()   -- (earlier tests' arrays would reach the cache meanwhile)
    cuda.synchronize()
    cuda.empty_cache()
    local cached = cuda.block_cache()
    s:begin_capture()
    K("fetch2")[{ blocks(n), 128, s }](out, tex, dx, dy, n)
    back:copy_to_device(src2, s)
    tex:close(); ca:close(); dx:close(); back:close(); src2:close()
    local g = s:end_capture()
    collectgarbage(); collectgarbage()
    assert.equal(cached, (cuda.block_cache()))   -- dx's and src2's blocks are the graph's, not the cache's
    -- blocks (on s: a block last used on s is reused there first) and texture objects made now
    -- would take the places of anything freed too early
    local others, texs = {}, {}
    local fives = cuda.device_array(w * h, "float32"):fill(-5)
    local c2 = cuda.cuda_array({ h, w }, "float32"):copy_to_device(fives)
    for i = 1, 6 do others[i] = cuda.device_array(n, "float32", s):fill(-1, s) end
    for i = 1, 32 do texs[i] = cuda.texture(c2) end
    out:fill(0)
    for _ = 1, 3 do g:launch(s) end
    s:synchronize()
    local o = out:copy_to_host()
    for k = 1, n do assert.equal(T(math.floor(xs[k]), math.floor(ys[k])), o[k]) end
    for i = 1, 6 do
      local v = others[i]:copy_to_host()
      for k = 1, n do assert.equal(-1, v[k]) end
    end
    for i = 1, 32 do texs[i]:close() end
    g:close()
  end)

  gpu("a closed texture is an error; a CUDA array collected while a texture reads it stays alive", function()
    local w, h = 16, 8
    local ca, T = image(w, h)
    local tex = cuda.texture(ca, { address = "border" })
    ca = nil                                 -- luacheck: ignore
    collectgarbage(); collectgarbage()
    local xs, ys = coords(100, w, false, 0), coords(100, h, false, 0)
    local out = fetch2(tex, xs, ys)
    for k = 1, 100 do assert.equal(T(math.floor(xs[k]), math.floor(ys[k])), out[k]) end
    tex:close()
    assert.is_true(tex.closed)
    C.raises("kernel 'fetch2' argument 2 (unsigned long long): expected an open texture, got a closed texture",
      fetch2, tex, xs, ys)
    C.raises("texture.handle: closed", function() return tex.handle end)
    local ca4 = image(4, 4)
    local ok = cuda.texture(ca4)
    assert.is_true(math.type(ok.handle) == "integer")
    -- a texture given for a float parameter is no number
    C.raises("kernel 'surf_scale' argument 2 (float): expected a number, got a texture",
      function() K("surf_scale")[{ 1, 1 }](cuda.surface(cuda.cuda_array({ 1, 1 }, "float32", { surface = true })), ok, 1, 1, 1) end)
  end)
end)
