-- bfloat16, complex64 and complex128: host arrays, copies, kernels, fills, graph memsets, the
-- CUDA Array Interface and reduce, each against a computation in Lua on random data.
-- Complex elements are pairs {re, im} on the Lua side (cuComplex's layout on the device);
-- a number stands for {number, 0}.
local H = require "spec.helper"
local C = require "spec.check"
local cuda = H.cuda
local gpu = H.gpu(it, pending)

-- x rounded to float32, then to bfloat16 (nearest even), as the device rounds it
local function bf16(x)
  if x ~= x then return x end
  local u = string.unpack("<I4", string.pack("<f", x))
  u = ((u + 0x7fff + ((u >> 16) & 1)) & 0xffffffff) & 0xffff0000
  return (string.unpack("<f", string.pack("<I4", u)))
end
local f32 = C.f32

local function rand_pairs(n)
  local t = {}
  for i = 1, n do t[i] = { math.random() * 200 - 100, math.random() * 200 - 100 } end
  return t
end

describe("bfloat16", function()
  it("rounds to nearest even on the way in and reads back as a number", function()
    local t = H.rand_table(1000, -1e4, 1e4)
    t[#t + 1] = 1 + 2 ^ -8          -- a tie: rounds to even (1)
    t[#t + 1] = 1 + 3 * 2 ^ -8      -- a tie: rounds to even (1 + 2^-6)
    local a = cuda.array(t, "bfloat16")
    assert.equal(2, a.dtype.itemsize)
    for i = 1, #t do assert.equal(bf16(t[i]), a[i], "element " .. i) end
    assert.equal(1, a[#t - 1])
    assert.equal(1 + 2 ^ -6, a[#t])
    a[1] = 1e38
    assert.equal(bf16(1e38), a[1])
    assert.is_true(a.dtype.is_float)
    assert.equal("<V2", a.dtype.typestr)
    assert.equal("__nv_bfloat16", a.dtype.ctype)
  end)

  it("refuses what does not fit, naming the element", function()
    C.raises("cuda.array: element 2: value 1e+39 does not fit bfloat16", cuda.array, { 1, 1e39 }, "bfloat16")
    C.raises("does not fit bfloat16", cuda.array, { 3.4e38 }, "bfloat16")   -- rounds past the largest
    C.raises("expected a number for bfloat16, got string", cuda.array, { "1" }, "bfloat16")
  end)
end)

describe("complex64 and complex128", function()
  it("take pairs and numbers, and give pairs back", function()
    for _, dt in ipairs { "complex64", "complex128" } do
      local round = dt == "complex64" and f32 or function(x) return x end
      local t = rand_pairs(500)
      t[#t + 1] = 7   -- a real number: {7, 0}
      local a = cuda.array(t, dt)
      assert.same({ #t }, a.shape)
      assert.equal(dt == "complex64" and 8 or 16, a.dtype.itemsize)
      for i = 1, #t - 1 do
        assert.same({ round(t[i][1]), round(t[i][2]) }, a[i], dt .. " element " .. i)
      end
      assert.same({ 7, 0 }, a[#t])
      a:set(3, { -1.5, 2.25 })
      assert.same({ -1.5, 2.25 }, a:get(3))
      local tt = a:totable()
      assert.same({ -1.5, 2.25 }, tt[3])
      a:fill({ 0.5, -0.25 })
      assert.same({ 0.5, -0.25 }, a[#t])
      assert.matches("{0.5-0.25i, 0.5-0.25i", tostring(a), 1, true)
      assert.is_true(a.dtype.is_complex)
      assert.is_false(a.dtype.is_float)
    end
  end)

  it("make N-d arrays from nested tables of pairs", function()
    local a = cuda.array({ { { 1, 2 }, { 3, 4 } }, { { 5, 6 }, { 7, 8 } } }, "complex128")
    assert.same({ 2, 2 }, a.shape)
    assert.same({ 7, 8 }, a:get(2, 2))
    local z = cuda.zeros({ 3, 2 }, "complex64")
    assert.same({ 0, 0 }, z:get(3, 2))
  end)

  it("refuse other values, naming the element", function()
    C.raises("cuda.array: element 2: expected a number or a pair {re, im} for complex64, got another table",
             cuda.array, { { 1, 2 }, { 1, "x" } }, "complex64")
    C.raises("expected a number or a pair {re, im} for complex128, got string", cuda.array, { "1" }, "complex128")
    local a = cuda.array({ 1 }, "complex64")
    C.raises("fill: expected a number or a pair {re, im} for complex64, got boolean", a.fill, a, true)
    C.raises("value {1e+39, 0.0} does not fit complex64", a.set, a, 1, { 1e39, 0 })
  end)
end)

describe("the new dtypes on the GPU", function()
  gpu("copy to the device and back unchanged, and fill there", function()
    for _, dt in ipairs { "bfloat16", "complex64", "complex128" } do
      local t = dt == "bfloat16" and H.rand_table(3001) or rand_pairs(3001)
      local h = cuda.array(t, dt)
      local d = cuda.to_device(h)
      local back = d:copy_to_host()
      for i = 1, #t do assert.same(h[i], back[i], dt .. " element " .. i) end
      local v = dt == "bfloat16" and bf16(math.random() * 10) or { math.random(), -math.random() }
      d:fill(v)
      back = d:copy_to_host()
      local want = dt == "complex64" and { f32(v[1]), f32(v[2]) } or v
      for i = 1, #t do assert.same(want, back[i], dt .. " filled element " .. i) end
    end
  end)

  gpu("go through kernels: cuComplex arithmetic, bfloat16 arithmetic, complex by value", function()
    local m = cuda.compile([[
#include <cuComplex.h>
#include <cuda_bf16.h>
extern "C" __global__ void cmul(cuFloatComplex *z, const cuFloatComplex *x, cuFloatComplex s, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) z[i] = cuCmulf(x[i], s);
}
extern "C" __global__ void zadd(cuDoubleComplex *z, const cuDoubleComplex *x, cuDoubleComplex s, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) z[i] = cuCadd(x[i], s);
}
extern "C" __global__ void bmul(__nv_bfloat16 *z, const __nv_bfloat16 *x, __nv_bfloat16 s, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) z[i] = __hmul(x[i], s);
}]])
    local n = 1000
    local tx = rand_pairs(n)
    local x = cuda.to_device(cuda.array(tx, "complex64"))
    local z = cuda.device_array(n, "complex64")
    local s = { f32(math.random() * 2), f32(-math.random()) }
    m.cmul[{ 4, 256 }](z, x, s, n)
    local hz = z:copy_to_host()
    for i = 1, n do
      local a, b = f32(tx[i][1]), f32(tx[i][2])
      local re, im = a * s[1] - b * s[2], a * s[2] + b * s[1]
      assert(math.abs(hz[i][1] - re) <= 1e-4 * (1 + math.abs(re)) and math.abs(hz[i][2] - im) <= 1e-4 * (1 + math.abs(im)),
             ("cmul element %d: {%s, %s}, CPU {%s, %s}"):format(i, hz[i][1], hz[i][2], re, im))
    end
    local dx = cuda.to_device(cuda.array(tx, "complex128"))
    local dz = cuda.device_array(n, "complex128")
    m.zadd[{ 4, 256 }](dz, dx, { 0.5, -2 }, n)
    local hdz = dz:copy_to_host()
    for i = 1, n do assert.same({ tx[i][1] + 0.5, tx[i][2] - 2 }, hdz[i], "zadd element " .. i) end
    m.zadd[{ 4, 256 }](dz, dx, 3, n)   -- a number is {3, 0}
    assert.same({ tx[n][1] + 3, tx[n][2] }, dz:copy_to_host()[n])
    C.raises("expected a number or a pair {re, im}", m.zadd[{ 4, 256 }], dz, dx, "3", n)
    local tb = H.rand_table(n, -50, 50)
    local bx = cuda.to_device(cuda.array(tb, "bfloat16"))
    local bz = cuda.device_array(n, "bfloat16")
    local bs = bf16(math.random() * 4)
    m.bmul[{ 4, 256 }](bz, bx, bs, n)
    local hb = bz:copy_to_host()
    for i = 1, n do assert.equal(bf16(bf16(tb[i]) * bs), hb[i], "bmul element " .. i) end
    -- a bfloat16 argument follows the elements' range rule: what rounds to the largest fits
    local one = cuda.to_device(cuda.array({ 1 }, "bfloat16"))
    m.bmul[{ 1, 1 }](bz, one, 3.39e38, 1)
    assert.equal(cuda.array({ 3.39e38 }, "bfloat16")[1], bz:copy_to_host()[1])
    C.raises("value out of range", m.bmul[{ 1, 1 }], bz, one, 3.4e38, 1)
  end)

  gpu("carry their typestrs through the CUDA Array Interface", function()
    for dt, ts in pairs { bfloat16 = "<V2", complex64 = "<c8", complex128 = "<c16" } do
      local d = cuda.to_device(cuda.array(dt == "bfloat16" and { 1.5, 2.5 } or { { 1, 2 }, { 3, 4 } }, dt))
      local cai = getmetatable(d).__cuda_array_interface(d)
      assert.equal(ts, cai.typestr)
      local v = cuda.as_cuda_array(setmetatable({}, { __cuda_array_interface = cai }))   -- a foreign view of it
      assert.equal(dt, v.dtype.name)
      local want = dt == "bfloat16" and 2.5 or { 3, 4 }
      assert.same(want, d:copy_to_host()[2])
      assert.same(want, v:copy_to_host()[2])
    end
  end)

  gpu("are reduced: bfloat16 and complex sums match the CPU's", function()
    local sum = cuda.reduce("a + b")
    -- bfloat16 adds in bfloat16 (8 significant bits): a few multiples of 0.5 among zeros, at
    -- most 128 in all, so that every partial sum is exact in any order
    local tb = {}
    for i = 1, 4096 do tb[i] = 0 end
    for _ = 1, 60 do tb[math.random(1, 4096)] = math.random(1, 4) / 2 end
    local got = sum(cuda.to_device(cuda.array(tb, "bfloat16")))
    local want = 0
    for _, v in ipairs(tb) do want = want + v end
    assert.equal(want, got)
    -- the largest of random bfloat16 values: exact whatever the order
    local tr = H.rand_table(100003, -1e3, 1e3)
    local big = -math.huge
    for _, v in ipairs(tr) do big = math.max(big, bf16(v)) end
    assert.equal(big, cuda.reduce("a > b ? a : b")(cuda.to_device(cuda.array(tr, "bfloat16"))))
    for _, dt in ipairs { "complex64", "complex128" } do
      local t = {}
      for i = 1, 100003 do t[i] = { math.random(-8, 8), math.random(-8, 8) } end
      local r = sum(cuda.to_device(cuda.array(t, dt)), { init = { 1, -1 } })
      local re, im = 1, -1
      for _, p in ipairs(t) do re, im = re + p[1], im + p[2] end
      assert.same({ re, im }, r, dt)
    end
  end)

  gpu("fill through graph memset nodes, 16-byte elements included", function()
    local d = cuda.device_array(777, "complex128")
    local g = cuda.graph()
    g:memset(d, { 1.25, -3.5 })
    g:instantiate():launch()
    cuda.synchronize()
    local h = d:copy_to_host()
    for i = 1, #h do assert.same({ 1.25, -3.5 }, h[i], "element " .. i) end
  end)
end)
