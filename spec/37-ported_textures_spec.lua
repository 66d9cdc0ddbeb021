-- CUDA arrays, texture and surface objects: tests written for other libraries, ported to
-- cudalua's cuda.cuda_array / cuda.texture / cuda.surface. The facts (shapes, dtypes, channel
-- counts, descriptors, what each kernel computes) are the originals'; the code is ours, and
-- every expected value is computed here on the CPU from seeded random data.
--   CuPy tests/cupy_tests/cuda_tests/test_texture.py (cupy/cupy): TestCUDAarray, TestTexture,
--     TestTextureVectorType, TestSurface
--   cuda.core cuda_core/tests/test_texture_surface.py (NVIDIA/cuda-python): the OpaqueArray,
--     TextureObject, SurfaceObject and descriptor tests cudalua has a counterpart for
-- Shapes: CuPy and cuda.core give (width, height, depth); cudalua takes C order, {depth,
-- height, width}.
local H = require "spec.helper"
local C = require "spec.check"
local cuda = H.cuda
local gpu = H.gpuonly(it, pending, "textures")
local f32 = C.f32

before_each(function() math.randomseed(3727) end)
after_each(function() math.randomseed() end)

local SRC = [[
extern "C" {
// CuPy's source_texobj: each thread copies the texel at its own integer coordinates
__global__ void cp_fetch1(float *out, cudaTextureObject_t t, int w) {
  int x = blockIdx.x * blockDim.x + threadIdx.x;
  if (x < w) out[x] = tex1Dfetch<float>(t, x);
}
__global__ void cp_tex1(float *out, cudaTextureObject_t t, int w) {
  int x = blockIdx.x * blockDim.x + threadIdx.x;
  if (x < w) out[x] = tex1D<float>(t, (float)x);
}
__global__ void cp_tex2(float *out, cudaTextureObject_t t, int w, int h) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x < w && y < h) out[y * w + x] = tex2D<float>(t, (float)x, (float)y);
}
__global__ void cp_tex3(float *out, cudaTextureObject_t t, int w, int h, int d) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  int z = blockIdx.z * blockDim.z + threadIdx.z;
  if (x < w && y < h && z < d) out[(z * h + y) * w + x] = tex3D<float>(t, (float)x, (float)y, (float)z);
}
__global__ void cp_tex3_4ch(float *ox, float *oy, float *oz, float *ow, cudaTextureObject_t t, int w, int h, int d) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  int z = blockIdx.z * blockDim.z + threadIdx.z;
  if (x < w && y < h && z < d) {
    float4 v = tex3D<float4>(t, (float)x, (float)y, (float)z);
    int i = (z * h + y) * w + x;
    ox[i] = v.x; oy[i] = v.y; oz[i] = v.z; ow[i] = v.w;
  }
}
// CuPy's source_surfobj: each element becomes 3 times its row-major index (x in bytes)
__global__ void cp_surf1(cudaSurfaceObject_t s, int w) {
  int x = blockIdx.x * blockDim.x + threadIdx.x;
  if (x < w) surf1Dwrite(3.0f * (float)x, s, x * 4);
}
__global__ void cp_surf2(cudaSurfaceObject_t s, int w, int h) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x < w && y < h) surf2Dwrite(3.0f * (float)(y * w + x), s, x * 4, y);
}
__global__ void cp_surf3(cudaSurfaceObject_t s, int w, int h, int d) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  int z = blockIdx.z * blockDim.z + threadIdx.z;
  if (x < w && y < h && z < d) surf3Dwrite(3.0f * (float)((z * h + y) * w + x), s, x * 4, y, z);
}
// for the cuda.core ports: samples at given coordinates, a uint32 linear fetch, uint8 x4 texels packed
__global__ void at2(float *out, cudaTextureObject_t t, const float *x, const float *y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = tex2D<float>(t, x[i], y[i]);
}
__global__ void at3(float *out, cudaTextureObject_t t, const float *x, const float *y, const float *z, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = tex3D<float>(t, x[i], y[i], z[i]);
}
__global__ void fetch1u(unsigned int *out, cudaTextureObject_t t, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = tex1Dfetch<unsigned int>(t, i);
}
__global__ void fetch2u8x4(unsigned int *out, cudaTextureObject_t t, int w, int h) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x < w && y < h) {
    uchar4 v = tex2D<uchar4>(t, (float)x, (float)y);
    out[y * w + x] = (unsigned int)v.x | (unsigned int)v.y << 8 | (unsigned int)v.z << 16 | (unsigned int)v.w << 24;
  }
}
}
]]
local KERNELS = { "at2", "at3", "cp_fetch1", "cp_surf1", "cp_surf2", "cp_surf3", "cp_tex1", "cp_tex2", "cp_tex3",
  "cp_tex3_4ch", "fetch1u", "fetch2u8x4" }
local mod
local function K(name)
  mod = mod or cuda.compile(SRC)
  return mod[name]
end
local function blocks(n) return (n + 127) // 128 end

local function prod(shape) local n = 1; for _, e in ipairs(shape) do n = n * e end; return n end

-- CuPy's data: float32 from random() in [0, 1) (kept as float32 values), integers randint(100)
local function floats(n)
  local t = {}
  for i = 1, n do t[i] = f32(math.random()) end
  return t
end

local function same(want, got, n, what)
  for i = 1, n do
    if want[i] ~= got[i] then
      error(("%s: value %d is %s, expected %s"):format(what or "", i, tostring(got[i]), tostring(want[i])), 2)
    end
  end
end

-- CuPy's launches: blocks of (4,), (4, 4) or (4, 4, 2) over the texels; after the arguments
-- given, the kernel takes the extents (width, height, depth)
local function launch(name, shape, ...)
  local nd = #shape
  local w, h, d = shape[nd], shape[nd - 1], shape[nd - 2]
  local args = table.pack(...)
  local cfg
  if nd == 1 then cfg = { (w + 3) // 4, 4 }
  elseif nd == 2 then cfg = { { (w + 3) // 4, (h + 3) // 4 }, { 4, 4 } }
  else cfg = { { (w + 3) // 4, (h + 3) // 4, (d + 1) // 2 }, { 4, 4, 2 } } end
  for _, e in ipairs { w, h, d } do args.n = args.n + 1; args[args.n] = e end
  K(name)[cfg](table.unpack(args, 1, args.n))
end

-- a device copy of host array h at an address textures take (TEXTURE_ALIGNMENT: 512 bytes,
-- while the pool promises 256): each miss is held, with a spacer of 256 bytes more each time
-- (a copy of 256 bytes plus a fixed spacer would land on the same remainder every time)
local function texture_ready(h)
  local held = {}
  for i = 1, 32 do
    local d = cuda.to_device(h)
    if d:ptr() % 512 == 0 then return d end
    held[#held + 1] = d
    held[#held + 1] = cuda.device_array(256 * i, "uint8")
  end
  error("no 512-byte aligned device array in 32 tries")
end

it("the kernels of this file compile (no GPU: arch = sm_90)", function()
  assert.same(KERNELS, cuda.compile(SRC, { arch = "sm_90", cache = false }):kernels())
end)

-- ported from cupy tests/cupy_tests/cuda_tests/test_texture.py TestCUDAarray (test_array_gen_cpy):
-- every dtype, 1, 2 and 4 channels, from and to host (numpy) and device (cupy) arrays, with and
-- without a stream, for the dimensions (68, 0, 0), (68, 19, 0), (68, 19, 31). The host and
-- device arrays hold width times channels values in their last extent, as CuPy's do. (Its
-- non-contiguous sources, arr[..., ::2], have no counterpart: cudalua has no strided views.)
describe("CuPy TestCUDAarray", function()
  local DTYPES = { "float16", "float32", "int8", "int16", "int32", "uint8", "uint16", "uint32" }
  local function round_trips(shape)
    local cells = prod(shape)
    local ints, fls = {}, floats(4 * cells)
    for i = 1, 4 * cells do ints[i] = math.random(0, 99) end
    for _, dt in ipairs(DTYPES) do
      for _, ch in ipairs { 1, 2, 4 } do
        local n = cells * ch
        local flat = shape[#shape] * ch
        local src_shape = table.move(shape, 1, #shape - 1, 1, {})
        src_shape[#shape] = flat
        local h = cuda.array(table.move(dt:find("float") and fls or ints, 1, n, 1, {}), dt):reshape(src_shape)
        for _, xp in ipairs { "numpy", "cupy" } do
          for _, with_stream in ipairs { false, true } do
            local what = ("%s x%d, %s, %s"):format(dt, ch, xp, with_stream and "stream" or "no stream")
            local s = with_stream and cuda.stream() or nil
            local src = xp == "cupy" and cuda.to_device(h, s) or h
            local dst = xp == "cupy" and cuda.device_array(src_shape, dt, s) or cuda.zeros(src_shape, dt)
            local ca = cuda.cuda_array(shape, dt, { channels = ch })
            ca:copy_to_device(src, s)
            ca:copy_to_host(dst, s)
            if s then s:synchronize() end
            same(h, xp == "cupy" and dst:copy_to_host() or dst, n, what)
            ca:close()
          end
        end
      end
    end
  end
  gpu("test_array_gen_cpy, 1-D (68)", function() round_trips { 68 } end)
  gpu("test_array_gen_cpy, 2-D (68, 19)", function() round_trips { 19, 68 } end)
  gpu("test_array_gen_cpy, 3-D (68, 19, 31)", function() round_trips { 31, 19, 68 } end)
end)

-- ported from cupy tests/cupy_tests/cuda_tests/test_texture.py TestTexture (test_fetch_float_texture):
-- float32 data in [0, 1), one channel; the descriptor clamp, point filtering, element reads;
-- dimensions (64, 0, 0), (64, 32, 0), (64, 32, 19) over a CUDA array, (64,) over linear
-- memory (tex1Dfetch), (64, 32) over pitched memory (rows of 256 bytes, CuPy's hand-picked pitch)
describe("CuPy TestTexture", function()
  local DESC = { address = "clamp", filter = "point", read = "element" }

  gpu("mem_type CUDAarray: tex1D, tex2D and tex3D at each texel give it back", function()
    for _, shape in ipairs { { 64 }, { 32, 64 }, { 19, 32, 64 } } do
      local n = prod(shape)
      local h = cuda.array(floats(n), "float32"):reshape(shape)
      local ca = cuda.cuda_array(shape, "float32"):copy_to_device(h)
      local expected = cuda.device_array(shape, "float32")
      ca:copy_to_host(expected)                      -- CuPy checks the copy both ways too
      same(h, expected:copy_to_host(), n, #shape .. "-D copy")
      local out = cuda.zeros(n, "float32")
      launch("cp_tex" .. #shape, shape, out, cuda.texture(ca, DESC))
      same(h, out, n, #shape .. "-D fetch")
    end
  end)

  gpu("mem_type linear: tex1Dfetch over a 1-D device array (64,)", function()
    local h = cuda.array(floats(64), "float32")
    local tex = cuda.texture(texture_ready(h), DESC)
    local out = cuda.zeros(64, "float32")
    launch("cp_fetch1", { 64 }, out, tex)
    same(h, out, 64)
  end)

  gpu("mem_type pitch2D: tex2D over a 2-D device array (64, 32), rows of 256 bytes", function()
    local h = cuda.array(floats(64 * 32), "float32"):reshape { 32, 64 }
    local tex = cuda.texture(texture_ready(h), DESC)
    local out = cuda.zeros(64 * 32, "float32")
    launch("cp_tex2", { 32, 64 }, out, tex)
    same(h, out, 64 * 32)
  end)
end)

-- ported from cupy tests/cupy_tests/cuda_tests/test_texture.py TestTextureVectorType
-- (test_fetch_float4_texture): a (47, 39, 11) CUDA array of float32 x4 read as float4 by tex3D
describe("CuPy TestTextureVectorType", function()
  gpu("test_fetch_float4_texture: the four channels of a 3-D float32 x4 texture", function()
    local shape = { 11, 39, 47 }
    local cells = prod(shape)
    local data = floats(4 * cells)
    local ca = cuda.cuda_array(shape, "float32", { channels = 4 })
    ca:copy_to_device(cuda.array(data, "float32"):reshape { 11, 39, 4 * 47 })
    local tex = cuda.texture(ca, { address = "clamp", filter = "point", read = "element" })
    local outs = {}
    for c = 1, 4 do outs[c] = cuda.zeros(cells, "float32") end
    launch("cp_tex3_4ch", shape, outs[1], outs[2], outs[3], outs[4], tex)
    for c = 1, 4 do                                 -- channel c is tex_data[..., c-1::4]
      local want = {}
      for k = 1, cells do want[k] = data[4 * (k - 1) + c] end
      same(want, outs[c], cells, "channel " .. c)
    end
  end)
end)

-- ported from cupy tests/cupy_tests/cuda_tests/test_texture.py TestSurface (test_write_float_surface):
-- float32 CUDA arrays made for surface loads and stores, (64, 0, 0), (64, 32, 0), (64, 32, 32);
-- the kernel writes 3 times each element's index. CuPy starts from zeros; here the arrays start
-- random, so an element left unwritten shows.
describe("CuPy TestSurface", function()
  gpu("test_write_float_surface: surf1Dwrite, surf2Dwrite, surf3Dwrite", function()
    for _, shape in ipairs { { 64 }, { 32, 64 }, { 32, 32, 64 } } do
      local n = prod(shape)
      local ca = cuda.cuda_array(shape, "float32", { surface = true })
      ca:copy_to_device(cuda.array(floats(n), "float32"))
      launch("cp_surf" .. #shape, shape, cuda.surface(ca))
      local back = ca:copy_to_host()
      local want = {}
      for k = 1, n do want[k] = 3 * (k - 1) end
      same(want, back, n, #shape .. "-D")
    end
  end)
end)

-- ported from cuda.core cuda_core/tests/test_texture_surface.py: the checks on arguments,
-- which cudalua makes before the driver
describe("cuda.core test_texture_surface, without a GPU", function()
  -- test_array_rejects_bad_channels, test_array_rejects_bad_rank,
  -- test_array_rejects_unsupported_dtype_format, test_array_from_descriptor_rejects_bad_format,
  -- test_array_from_descriptor_rejects_zero_dim
  it("a CUDA array's channels, rank, dtype and extents are checked", function()
    C.raises("cuda.cuda_array: channels must be 1, 2 or 4, got 3", cuda.cuda_array, { 8 }, "uint8", { channels = 3 })
    C.raises("cuda.cuda_array: a CUDA array has 1, 2 or 3 extents, got 4", cuda.cuda_array, { 2, 2, 2, 2 }, "uint8")
    C.raises("cuda.cuda_array: dtype float64 cannot be sampled", cuda.cuda_array, { 8 }, "float64")
    C.raises('cuda.cuda_array: argument 2: dtype (cuda.float32, "float32", ...) expected, got number',
      cuda.cuda_array, { 8 }, 0)
    -- cuda.core's shape (8, 0) is width 8, height 0: {0, 8} here
    C.raises("cuda.cuda_array: extent 1 must be at least 1, got 0", cuda.cuda_array, { 0, 8 }, "uint8")
  end)

  -- test_resource_descriptor_from_linear_rejects_non_buffer, *_from_pitch2d_rejects_non_buffer,
  -- test_texture_object_rejects_non_resource_descriptor, *_non_texture_descriptor,
  -- *_bad_filter_mode, *_bad_read_mode, *_bad_border_color_length; the mipmap and anisotropy
  -- fields cudalua does not have are refused as unknown options, not ignored
  it("a texture's source and options are checked", function()
    local f = cuda.array(H.rand_table(64), "float32")
    C.raises("cuda.texture: argument 1: cuda_array or device array expected, got table", cuda.texture, {})
    C.raises("cuda.texture: argument 2: options table expected, got string", cuda.texture, f, "nope")
    C.raises("cuda.texture: filter must be 'point' or 'linear', got 0", cuda.texture, f, { filter = 0 })
    C.raises("cuda.texture: read must be 'element' or 'normalized_float', got 0", cuda.texture, f, { read = 0 })
    C.raises("cuda.texture: unknown option 'mipmap_filter_mode'", cuda.texture, f, { mipmap_filter_mode = "point" })
    C.raises("cuda.texture: unknown option 'max_anisotropy'", cuda.texture, f, { max_anisotropy = -1 })
    -- cuda.core wants 4 border values; cudalua takes 1 to 4 (one per channel)
    C.raises("cuda.texture: border must be a list of 1 to 4 numbers", cuda.texture, f, { border = { 0, 0, 0, 0, 0 } })
    C.raises("cuda.texture: border must be a list of 1 to 4 numbers", cuda.texture, f, { border = {} })
  end)

  -- test_address_mode_rejects_non_addressmode_scalar, *_empty_tuple, *_too_long_tuple,
  -- *_non_addressmode_entry; test_address_mode_normalization's (WRAP, CLAMP) without
  -- normalized coordinates, which cudalua refuses (CUDA would clamp)
  it("address modes are checked; wrap needs normalized coordinates", function()
    local f = cuda.array(H.rand_table(64), "float32")
    C.raises("cuda.texture: address must be 'clamp', 'wrap', 'mirror' or 'border' (or a list of them, one per dimension), got number",
      cuda.texture, f, { address = 42 })
    C.raises("cuda.texture: address lists 1 to 3 modes, got 0", cuda.texture, f, { address = {} })
    C.raises("cuda.texture: address lists 1 to 3 modes, got 4", cuda.texture, f, { address = { "wrap", "wrap", "wrap", "wrap" } })
    C.raises("one per dimension), got bad", cuda.texture, f, { address = { "wrap", "bad", "clamp" } })
    C.raises("cuda.texture: address 'wrap' needs normalized = true", cuda.texture, f, { address = { "wrap", "clamp" } })
  end)
end)

-- ported from cuda.core cuda_core/tests/test_texture_surface.py: the tests that need a GPU
describe("cuda.core test_texture_surface", function()
  -- test_array_2d_create_and_properties, test_array_3d_with_surface_flag,
  -- test_array_accepts_numpy_dtype_format, test_array_accepts_str_format
  gpu("CUDA arrays say their shape, dtype, channels and flags; dtypes as objects or names", function()
    local arr = cuda.cuda_array({ 16, 32 }, "float32")          -- cuda.core's (32, 16)
    assert.same({ 16, 32 }, arr.shape)
    assert.equal("float32", arr.dtype.name)
    assert.equal(1, arr.channels)
    assert.is_false(arr.surface)
    assert.is_true(math.type(arr.handle) == "integer" and arr.handle ~= 0)
    local arr3 = cuda.cuda_array({ 4, 8, 8 }, "uint8", { channels = 4, surface = true })   -- (8, 8, 4)
    assert.same({ 4, 8, 8 }, arr3.shape)
    assert.is_true(arr3.surface)
    assert.equal(4, arr3.channels * arr3.dtype.itemsize)        -- element_bytes
    for _, c in ipairs { { cuda.float32, "float32" }, { "float16", "float16" }, { cuda.uint8, "uint8" }, { "i4", "int32" } } do
      assert.equal(c[2], cuda.cuda_array({ 8, 8 }, c[1]).dtype.name)
    end
  end)

  -- test_array_roundtrip_copy, test_array_copy_to_returns_dst: a (16,) uint32 array on a stream
  gpu("a uint32 round trip on a stream leaves the source alone; copy_to_host returns the destination", function()
    local vals = H.rand_table(16, 0, 2 ^ 32 - 1, true)
    local s = cuda.stream()
    local arr = cuda.cuda_array(16, "uint32")
    local src, dst = cuda.array(vals, "uint32"), cuda.zeros(16, "uint32")
    assert.equal(arr, arr:copy_to_device(src, s))
    assert.is_true(rawequal(dst, arr:copy_to_host(dst, s)))
    s:synchronize()
    same(vals, dst, 16, "copied")
    same(vals, src, 16, "source")
  end)

  -- test_array_copy_rejects_undersized_host_buffer, *_undersized_device_buffer, test_array_copy_rejects_non_stream
  gpu("copies refuse smaller host and device arrays, and a stream that is not one", function()
    local arr = cuda.cuda_array(16, "uint32")
    for _, small in ipairs { cuda.zeros(8, "uint32"), cuda.device_array(8, "uint32") } do
      C.raises("cuda_array:copy_to_device: size mismatch (the array has 8 values, the CUDA array 16", arr.copy_to_device, arr, small)
      C.raises("cuda_array:copy_to_host: size mismatch (the array has 8 values, the CUDA array 16", arr.copy_to_host, arr, small)
    end
    local buf = cuda.zeros(16, "uint32")
    C.raises("cuda_array:copy_to_device: expected a stream, got string", arr.copy_to_device, arr, buf, "not-a-stream")
    C.raises("cuda_array:copy_to_host: expected a stream, got string", arr.copy_to_host, arr, buf, "not-a-stream")
  end)

  -- test_array_copy_accepts_graph_builder: both copies captured into a graph (here also run)
  gpu("copies in and out of a CUDA array are captured into a graph", function()
    local vals = H.rand_table(16, 0, 2 ^ 32 - 1, true)
    local s = cuda.stream()
    local arr = cuda.cuda_array(16, "uint32")
    local d_in = cuda.to_device(cuda.array(vals, "uint32"), s)
    local d_out = cuda.device_array(16, "uint32", s)
    s:synchronize()
    s:begin_capture()
    local ok, err = pcall(function() arr:copy_to_device(d_in, s); arr:copy_to_host(d_out, s) end)
    local g = s:end_capture()
    assert(ok, err)
    g:instantiate():launch(s)
    s:synchronize()
    same(vals, d_out:copy_to_host(), 16)
  end)

  -- test_texture_object_create: (32, 16) float32, clamp, linear filtering, element reads,
  -- normalized coordinates; sampled here at the texel centres, where linear filtering weighs
  -- one texel only
  gpu("a linear-filtered texture with normalized coordinates returns each texel at its centre", function()
    local w, h = 32, 16
    local data = floats(w * h)
    local arr = cuda.cuda_array({ h, w }, "float32"):copy_to_device(data)
    local tex = cuda.texture(arr, { address = "clamp", filter = "linear", read = "element", normalized = true })
    assert.is_true(math.type(tex.handle) == "integer" and tex.handle ~= 0)
    local xs, ys = {}, {}
    for k = 1, w * h do xs[k] = ((k - 1) % w + 0.5) / w; ys[k] = ((k - 1) // w + 0.5) / h end
    local out = cuda.zeros(w * h, "float32")
    K("at2")[{ blocks(w * h), 128 }](out, tex, cuda.array(xs, "float32"), cuda.array(ys, "float32"), w * h)
    for k = 1, w * h do assert.near(data[k], out[k], 1e-6) end
  end)

  -- test_surface_object_create, test_surface_requires_ldst_flag: (8, 8) uint8 x4
  gpu("a surface over a surface array; an array made without the flag is refused", function()
    local surf = cuda.surface(cuda.cuda_array({ 8, 8 }, "uint8", { channels = 4, surface = true }))
    assert.is_true(math.type(surf.handle) == "integer" and surf.handle ~= 0)
    C.raises("cuda.surface: the CUDA array was made without surface = true", cuda.surface,
      cuda.cuda_array({ 8, 8 }, "uint8", { channels = 4 }))
  end)

  -- test_address_mode_normalization: (WRAP, CLAMP) on an (8, 8, 4) float32 array. cudalua needs
  -- normalized coordinates for wrap; the third dimension, not listed, clamps (cuda.core repeats
  -- the last mode listed: clamp as well)
  gpu("address {'wrap', 'clamp'} with normalized coordinates: x wraps, y and z clamp", function()
    local D, Hh, W = 4, 8, 8
    local data = floats(D * Hh * W)
    local arr = cuda.cuda_array({ D, Hh, W }, "float32"):copy_to_device(data)
    C.raises("cuda.texture: address 'wrap' needs normalized = true", cuda.texture, arr, { address = { "wrap", "clamp" } })
    local tex = cuda.texture(arr, { address = { "wrap", "clamp" }, normalized = true })
    -- coordinates up to two sizes outside, away from texel edges (floor is the same on both sides)
    local function coords(n, size)
      local t = {}
      for i = 1, n do t[i] = f32((math.random(-2 * size, 3 * size - 1) + 0.5 + (math.random() - 0.5) * 0.8) / size) end
      return t
    end
    local n = 400
    local xs, ys, zs = coords(n, W), coords(n, Hh), coords(n, D)
    local out = cuda.zeros(n, "float32")
    K("at3")[{ blocks(n), 128 }](out, tex, cuda.array(xs, "float32"), cuda.array(ys, "float32"), cuda.array(zs, "float32"), n)
    local function clamp(i, size) return math.max(0, math.min(size - 1, i)) end
    for k = 1, n do
      local i = math.floor(xs[k] * W) % W
      local j, l = clamp(math.floor(ys[k] * Hh), Hh), clamp(math.floor(zs[k] * D), D)
      local want = data[(l * Hh + j) * W + i + 1]
      assert(out[k] == want, ("at (%g, %g, %g): %g, the CPU %g"):format(xs[k], ys[k], zs[k], out[k], want))
    end
  end)

  -- test_texture_object_from_linear (1024 float32), test_resource_descriptor_from_linear_defaults_size
  -- and *_size_override (2048 of a 4096-byte uint32 buffer: here a slice, the first 512 elements)
  gpu("linear textures over a whole device array and over a slice of one", function()
    local h = cuda.array(floats(1024), "float32")
    local out = cuda.zeros(1024, "float32")
    launch("cp_fetch1", { 1024 }, out, cuda.texture(texture_ready(h)))
    same(h, out, 1024, "float32")
    local vals = H.rand_table(1024, 0, 2 ^ 32 - 1, true)
    local u = texture_ready(cuda.array(vals, "uint32"))
    local tex = cuda.texture(u:slice(1, 512))
    local got = cuda.zeros(512, "uint32")
    K("fetch1u")[{ blocks(512), 128 }](got, tex, 512)
    same(vals, got, 512, "uint32 slice")
  end)

  -- test_resource_descriptor_from_linear_rejects_bad_channels, *_rejects_non_multiple
  gpu("linear textures refuse 3 channels and an extent that is not whole texels", function()
    C.raises("cuda.texture: channels must be 1, 2 or 4, got 3", cuda.texture, cuda.device_array(1024, "uint8"), { channels = 3 })
    C.raises("cuda.texture: the last extent (5) is not a multiple of channels (2)", cuda.texture,
      cuda.device_array(5, "uint32"), { channels = 2 })
  end)

  -- test_texture_object_from_pitch2d: uint8 x4 texels, 16 rows of 256 bytes. cuda.core binds 32
  -- texels in a padded pitch; cudalua's pitch is the row itself, so the rows hold 64 texels
  gpu("a pitched uint8 x4 texture read as uchar4", function()
    local w, h = 64, 16
    local bytes = H.rand_table(w * h * 4, 0, 255, true)
    local tex = cuda.texture(texture_ready(cuda.array(bytes, "uint8"):reshape { h, w * 4 }), { channels = 4 })
    local out = cuda.zeros(w * h, "uint32")
    launch("fetch2u8x4", { h, w }, out, tex)
    for k = 1, w * h do
      local b = 4 * (k - 1)
      local want = bytes[b + 1] | bytes[b + 2] << 8 | bytes[b + 3] << 16 | bytes[b + 4] << 24
      assert(out[k] == want, ("texel %d: %d, the CPU %d"):format(k, out[k], want))
    end
  end)

  -- test_surface_rejects_linear_and_pitch2d
  gpu("surfaces refuse linear and pitched device memory", function()
    C.raises("cuda.surface: argument 1: cuda_array expected, got an array", cuda.surface, cuda.device_array(1024, "uint32"))
    C.raises("cuda.surface: argument 1: cuda_array expected, got an array", cuda.surface, cuda.device_array({ 8, 32 }, "uint8"))
  end)

  -- test_texture_surface_close_is_idempotent: a second close is a no-op. cuda.core reads the
  -- handle of a closed object as 0; cudalua raises
  gpu("closing twice is fine; a closed object's handle raises", function()
    local arr = cuda.cuda_array({ 8, 8 }, "uint8")
    arr:close(); arr:close()
    assert.is_true(arr.closed)
    C.raises("cuda_array.handle: the CUDA array is closed", function() return arr.handle end)
    local surf_arr = cuda.cuda_array({ 8, 8 }, "uint8", { channels = 4, surface = true })
    local surf = cuda.surface(surf_arr)
    surf:close(); surf:close()
    assert.is_true(surf.closed)
    C.raises("surface.handle: closed", function() return surf.handle end)
    surf_arr:close()
    local tex = cuda.texture(cuda.cuda_array({ 8, 8 }, "float32"))
    tex:close(); tex:close()
    assert.is_true(tex.closed)
    C.raises("texture.handle: closed", function() return tex.handle end)
  end)

  -- test_texture_object_keeps_backing_array_alive, test_surface_object_keeps_backing_array_alive:
  -- with the array collected, a surface still writes it and a texture still reads it
  gpu("a surface and a texture keep their CUDA array alive", function()
    local w, h = math.random(8, 40), math.random(8, 40)
    local arr = cuda.cuda_array({ h, w }, "float32", { surface = true }):copy_to_device(floats(w * h))
    local surf, tex = cuda.surface(arr), cuda.texture(arr)
    arr = nil
    collectgarbage(); collectgarbage()
    launch("cp_surf2", { h, w }, surf)
    local out = cuda.zeros(w * h, "float32")
    launch("cp_tex2", { h, w }, out, tex)
    for k = 1, w * h do assert.equal(3 * (k - 1), out[k]) end
  end)
end)
