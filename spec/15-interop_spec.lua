-- The CUDA Array Interface (v3). Every cudalua array that kernels can reach answers the
-- __cuda_array_interface metafield; any Lua value whose metatable has __cuda_array_interface (a
-- table, or a function giving one) is taken wherever a device array is, through a view made
-- without copying (cuda.as_cuda_array). Parsing errors are raised before any GPU call; the
-- pointer itself is validated with the driver.
local H = require "spec.helper"
local C = require "spec.check"
local cuda = H.cuda
local gpu = H.gpu(it, pending)
local nogpu = C.nogpu(it, pending)
local f32 = C.f32
local NO_DRIVER = "no CUDA driver found" -- (the library path follows)

local function cai(a) return getmetatable(a).__cuda_array_interface(a) end

-- a foreign object describing memory with the interface, as a table or through a function
local function foreign(desc, as_function)
  local mt = {}
  if as_function then
    mt.__cuda_array_interface = function(self) return self.desc end
    return setmetatable({ desc = desc }, mt)
  end
  mt.__cuda_array_interface = desc
  return setmetatable({}, mt)
end

-- a valid description of n float32 at ptr, with fields replaced by `changes`
local function desc(ptr, changes)
  local d = { data = { ptr, false }, shape = { 4, 3 }, typestr = "<f4", strides = { 12, 4 }, version = 3 }
  for k, v in pairs(changes or {}) do d[k] = v end
  return d
end

local SRC = [[
#include <cudalua/grid.cuh>
extern "C" __global__ void affine(float *y, const float *x, float a, float b, long long n) {
  long long i = grid(1);
  if (i < n) y[i] = a * x[i] + b;
}
extern "C" __global__ void bump(float *x, long long n) {
  long long i = grid(1);
  if (i < n) x[i] += 1.0f;
}
#include <cudalua/time.cuh>
__device__ unsigned long long now_ns() { return cudalua_globaltimer(); }
extern "C" __global__ void slow_fill(int *x, int v, long long n, long long ns) {
  if (grid(1) != 0) return;   // one thread waits and writes: see spec 04's late_fill
  unsigned long long t0 = now_ns();
  while (now_ns() - t0 < (unsigned long long)ns) {}
  for (long long i = 0; i < n; i++) x[i] = v;
}
]]
local mod
local function K(name)
  mod = mod or cuda.compile(SRC, { name = "interop.cu" })
  return mod:get(name)
end

it("the kernels of this file compile", function()
  assert.same({ "affine", "bump", "slow_fill" }, cuda.compile(SRC, { arch = "sm_90", name = "interop.cu" }):kernels())
end)

describe("__cuda_array_interface of cudalua arrays", function()
  it("is refused by pageable host arrays, which have no device address", function()
    local a = cuda.array(H.rand_table(4), "float32")
    C.raises("__cuda_array_interface: a pageable host array has no device address (use a pinned, mapped, managed or device array)",
             cai, a)
    C.raises("a pageable host array has no device address", cai, cuda.zeros({ 2, 2 }, "int8"))
  end)

  gpu("describes device, pinned, mapped and managed arrays: data, shape, typestr, C strides, version", function()
    local TYPESTR = { float32 = "<f4", float64 = "<f8", float16 = "<f2", int8 = "|i1", int16 = "<i2", int32 = "<i4",
                      int64 = "<i8", uint8 = "|u1", uint16 = "<u2", uint32 = "<u4", uint64 = "<u8", bool = "|b1" }
    for dt, ts in pairs(TYPESTR) do
      local size = cuda.dtype(dt).itemsize
      for _, make in ipairs { cuda.device_array, cuda.pinned_array, cuda.mapped_array, cuda.managed_array } do
        local a = make({ 2, 3, 5 }, dt)
        local c = cai(a)
        assert.equal("integer", math.type(c.data[1]))
        assert.equal(a:ptr(), c.data[1])
        assert.is_false(c.data[2])
        assert.same({ 2, 3, 5 }, c.shape)
        assert.equal(ts, c.typestr, dt)
        assert.same({ 15 * size, 5 * size, size }, c.strides, dt)
        assert.equal(3, c.version)
      end
    end
    -- views: the pointer moves, the shape is the view's
    local d = cuda.device_array({ 10, 4 }, "float64")
    local v = cai(d:slice(3, 7))
    assert.equal(d:ptr() + 2 * 4 * 8, v.data[1])
    assert.same({ 5, 4 }, v.shape)
    assert.same({ 32, 8 }, v.strides)
    assert.same({ 8 }, cai(d:reshape(40)).strides)
  end)

  gpu("names the stream that last used the array, while queued work may use it", function()
    local s = cuda.stream()
    local d = cuda.device_array(16, "float32", s) -- made on s: used by s
    assert.equal(s:handle(), cai(d).stream)
    local l = cuda.device_array(16, "float32") -- made on the legacy stream: 1
    assert.equal(1, cai(l).stream)
    local p = cuda.pinned_array(16, "float32") -- nothing queued has touched it
    assert.is_nil(cai(p).stream)
  end)

  gpu("round-trips through as_cuda_array without a copy", function()
    local t = H.rand_table(12, -100, 100, true)
    local d = cuda.to_device(t, "int32"):reshape(3, 4)
    local again = cuda.as_cuda_array(foreign(cai(d)))
    assert.equal(d:ptr(), again:ptr())
    assert.same(d.shape, again.shape)
    assert.equal("int32", tostring(again.dtype))
    assert.same(d:copy_to_host():totable(), again:copy_to_host():totable())
    -- a cudalua array is its own view
    assert.equal(d, cuda.as_cuda_array(d))
  end)
end)

describe("cuda.as_cuda_array", function()
  gpu("views a foreign object's memory, given as a table or by a function, without copying", function()
    for _, as_function in ipairs { false, true } do
      local t = H.rand_table(12)
      local owner = cuda.to_device(t, "float32")
      local obj = foreign(desc(owner:ptr()), as_function)
      local v = cuda.as_cuda_array(obj)
      assert.equal("foreign_array", v.kind)
      assert.equal(owner:ptr(), v:ptr())
      assert.same({ 4, 3 }, v.shape)
      assert.equal("float32", tostring(v.dtype))
      local h = v:copy_to_host()
      for i = 1, 12 do assert.equal(f32(t[i]), h[i]) end
      assert.equal(f32(t[4]), h:get(2, 1))
      -- write through the view, read through the original, and the other way round
      v:fill(-2.5)
      assert.same({ -2.5, -2.5 }, { owner[1], owner[12] })
      local t2 = H.rand_table(12)
      owner:copy_to_device(cuda.array(t2, "float32"))
      assert.equal(f32(t2[7]), v[7])
      -- asked again, the same view
      assert.equal(v, cuda.as_cuda_array(obj))
    end
  end)

  gpu("takes the other spellings of the interface: no strides, C strides, 0-d, \"=\" and 1-byte types", function()
    local owner = cuda.to_device(H.rand_table(24, -100, 100, true), "int16")
    local p = owner:ptr()
    assert.same({ 24 }, cuda.as_cuda_array(foreign { data = { p, false }, shape = { 24 }, typestr = "<i2", version = 3 }).shape)
    assert.same({ 2, 3, 4 }, cuda.as_cuda_array(foreign { data = { p }, shape = { 2, 3, 4 }, typestr = "=i2", version = 2,
                                                          strides = { 24, 8, 2 } }).shape)
    assert.same({ 1 }, cuda.as_cuda_array(foreign { data = { p }, shape = {}, typestr = "<i2", version = 1 }).shape)
    -- dimensions of size 1 may have any stride
    assert.same({ 1, 24 }, cuda.as_cuda_array(foreign { data = { p }, shape = { 1, 24 }, typestr = "<i2", version = 3,
                                                        strides = { 999, 2 } }).shape)
    local b = cuda.as_cuda_array(foreign { data = { p }, shape = { 48 }, typestr = "|u1", version = 3 })
    assert.equal("uint8", tostring(b.dtype))
    assert.equal(48, #b)
    local e = cuda.as_cuda_array(foreign { data = { 0, false }, shape = { 0 }, typestr = "<f4", version = 3 })
    assert.equal(0, #e)
  end)

  gpu("respects read-only data", function()
    local t = H.rand_table(12, -100, 100, true) -- integers: exact in float32, however computed
    local owner = cuda.to_device(t, "float32")
    local ro = foreign(desc(owner:ptr(), { data = { owner:ptr(), true } }))
    local v = cuda.as_cuda_array(ro)
    assert.is_true(cai(v).data[2])
    local n = 12
    local out = cuda.device_array(n, "float32")
    K("affine")[{ 1, 32 }](out, ro, 2, 1, n) -- a const parameter takes it
    local h = out:copy_to_host()
    for i = 1, n do assert.equal(2 * t[i] + 1, h[i]) end
    C.raises("cudalua: kernel 'bump' argument 1 (float*): expected a writable array (the parameter is not const)",
             K("bump")[{ 1, 32 }], ro, n)
    C.raises("fill: array is read-only", v.fill, v, 1)
    C.raises("copy_to_device: destination is read-only", v.copy_to_device, v, cuda.array(t, "float32"))
    C.raises("cudalua: array[i] =: array is read-only", function() v[1] = 5 end)
    C.raises("argument 1 (float*): expected a writable array", K("affine")[{ 1, 32 }], ro, owner, 1, 1, n)
    -- nothing changed it
    h = owner:copy_to_host()
    for i = 1, n do assert.equal(f32(t[i]), h[i]) end
  end)

  gpu("waits for the producer's stream before the data is used", function()
    local s = cuda.stream(true) -- not ordered with the legacy stream
    local n = 64
    local owner = cuda.device_array(n, "int32", s)
    K("slow_fill")[{ 1, 64, s }](owner, 42, n, 200000000) -- 0.2 s
    local obj = foreign { data = { owner:ptr(), false }, shape = { n }, typestr = "<i4", version = 3, stream = s:handle() }
    local v = cuda.as_cuda_array(obj)
    assert.is_true(s:query()) -- as_cuda_array returned only once s was done
    assert.equal(42, v[n])
  end)

  it("rejects objects without the interface or with a broken one, before any GPU call", function()
    local P = 4096 -- never reached: the description is refused first
    local A = cuda.as_cuda_array
    C.raises("as_cuda_array: the object has no __cuda_array_interface (got table)", A, {})
    C.raises("as_cuda_array: the object has no __cuda_array_interface (got number)", A, 42)
    C.raises("as_cuda_array: the object has no __cuda_array_interface (got nil)", A, nil)
    C.raises("as_cuda_array: __cuda_array_interface must be a table or give one, got number",
             A, setmetatable({}, { __cuda_array_interface = 5 }))
    C.raises("as_cuda_array: __cuda_array_interface must be a table or give one, got nil",
             A, setmetatable({}, { __cuda_array_interface = function() end }))
    local cases = {
      { "unsupported version nil (1 to 3)", { version = false } },
      { "unsupported version 4 (1 to 3)", { version = 4 } },
      { "unsupported version 0 (1 to 3)", { version = 0 } },
      { "data must be {ptr, readonly}, got nil", { data = false } },
      { "data must be {ptr, readonly}, got number", { data = P } },
      { "data[1] (the pointer) must be an integer, got x", { data = { "x", false } } },
      { "data[1] (the pointer) must be an integer, got 1.5", { data = { 1.5, false } } },
      { "data[1] (the pointer) must be an integer, got nil", { data = {} } },
      { "data[2] (read-only) must be a boolean", { data = { P, "yes" } } },
      { "unsupported typestr '<c4'", { typestr = "<c4" } },
      { "unsupported typestr '>f4'", { typestr = ">f4" } },
      { "unsupported typestr '<f16'", { typestr = "<f16" } },
      { "unsupported typestr nil", { typestr = false } },
      { "(supported: <f2 <f4 <f8 |i1 <i2 <i4 <i8 |u1 <u2 <u4 <u8 |b1 <V2 (bfloat16) <c8 <c16)", { typestr = "float32" } },
      { "shape must be a table of integers, got nil", { shape = false } },
      { "shape must be a table of integers, got number", { shape = 12 } },
      { "shape[2] must be an integer, got 1.5", { shape = { 4, 1.5 } } },
      { "shape[1] is negative (-4)", { shape = { -4, 3 } } },
      { "more than 8 dimensions", { shape = { 1, 1, 1, 1, 1, 1, 1, 1, 1 } } },
      { "masked arrays are not supported", { mask = { P, false } } },
      -- (Fortran order and other positive strides are views: spec 49)
      { "strides[2] is 0: cudalua's views step forwards (strides > 0)", { strides = { 4, 0 } } },
      { "strides[1] is -16: cudalua's views step forwards (strides > 0)", { strides = { -16, 4 } } },
      { "strides must be nil or one integer per dimension", { strides = { 4 } } },
      { "strides must be nil or one integer per dimension", { strides = "C" } },
      { "stream 0 is not allowed by the interface (use 1 for the legacy stream)", { stream = 0 } },
      { "stream must be an integer handle, got x", { stream = "x" } },
      { "stream must be an integer handle, got 1.5", { stream = 1.5 } },
    }
    for _, c in ipairs(cases) do
      local d = desc(P)
      for k, v in pairs(c[2]) do
        if v == false then d[k] = nil else d[k] = v end -- false: the field is left out
      end
      for _, as_function in ipairs { false, true } do
        local e = H.err(A, foreign(d, as_function))
        assert(e, "no error for: " .. c[1])
        assert.matches("as_cuda_array: ", e, 1, true)
        assert.matches(c[1], e, 1, true)
      end
    end
    C.alive()
  end)

  it("raises the same errors where kernels, copies and reductions take such objects", function()
    local bad = foreign(desc(4096, { typestr = "<c4" }))
    C.raises("unsupported typestr '<c4'", cuda.reduce("a + b"), bad)
    C.raises("unsupported typestr '<c4'", cuda.device_array_like, bad)
  end)

  nogpu("needs the driver to check a well-formed description's pointer", function()
    C.raises(NO_DRIVER, cuda.as_cuda_array, foreign(desc(4096)))
    C.raises(NO_DRIVER, cuda.as_cuda_array, foreign(desc(4096, { stream = 1 })))
  end)

  gpu("rejects pointers the driver does not know, and allocations that are too small #cudaerror", function()
    C.raises("as_cuda_array: 0x3039 is not memory the CUDA driver knows", cuda.as_cuda_array, foreign(desc(12345)))
    -- pageable host memory (a Lua table's address) is not memory the driver knows either
    local host_ptr = tonumber(string.format("%p", {}))
    C.raises("is not memory the CUDA driver knows", cuda.as_cuda_array, foreign(desc(host_ptr)))
    C.raises("as_cuda_array: null data pointer for 48 bytes", cuda.as_cuda_array, foreign(desc(0)))
    local p = cuda.pinned_array(1 << 18, "float32") -- 1 MiB of pinned memory
    C.raises("allocation ends", cuda.as_cuda_array,
             foreign(desc(p:ptr(), { shape = { 1 << 20, 3 }, strides = { 12, 4 } })))
    -- the end of the allocation itself is fine
    assert.equal(1, #cuda.as_cuda_array(foreign(desc(p:ptr() + (1 << 20) - 4, { shape = { 1 }, strides = { 4 } }))))
  end)

  gpu("rejects a view past the end of a device array's allocation", function()
    -- if this fails while the pinned case above passes: the driver's range of a stream-ordered
    -- (pool) allocation is the pool's, and the check does not see past the array
    local d = cuda.device_array(12, "float32")
    C.raises("allocation ends", cuda.as_cuda_array,
             foreign(desc(d:ptr(), { shape = { 1 << 20, 3 }, strides = { 12, 4 } })))
  end)
end)

describe("foreign objects", function()
  gpu("are taken by kernels as they are", function()
    local n = 12
    local t = H.rand_table(n, -100, 100, true)
    local xo, yo = cuda.to_device(t, "float32"), cuda.device_array(n, "float32")
    local x, y = foreign(desc(xo:ptr())), foreign(desc(yo:ptr()), true)
    K("affine")[{ 1, 32 }](y, x, 3, -1, n)
    K("bump"):launch({ grid = 1, block = 32 }, y, n)
    K("bump"):forall(n)(y, n)
    local h = yo:copy_to_host()
    for i = 1, n do assert.equal(3 * t[i] + 1, h[i]) end
  end)

  gpu("are copied by to_device and copy_to_device", function()
    local n = 12
    local t = H.rand_table(n)
    local owner = cuda.to_device(t, "float32")
    local obj = foreign(desc(owner:ptr()))
    -- BUG: cuda.to_device and copy_to_device take a foreign object that is a Lua table for a
    -- table of values: to_device(obj) gives an empty float64 array, copy_to_device(obj)
    -- raises "size mismatch (0 elements into 12)"
    local copy = cuda.to_device(obj)
    assert.same({ 4, 3 }, copy.shape)
    assert.equal("float32", tostring(copy.dtype))
    assert.are_not.equal(owner:ptr(), copy:ptr())
    local h = copy:copy_to_host()
    for i = 1, n do assert.equal(f32(t[i]), h[i]) end
    local other = cuda.device_array({ 4, 3 }, "float32")
    other:copy_to_device(obj)
    assert.same(h:totable(), other:copy_to_host():totable())
  end)

  gpu("are read through their views by copy_to_host and device_array_like", function()
    local n = 12
    local t = H.rand_table(n)
    local owner = cuda.to_device(t, "float32")
    local obj = foreign(desc(owner:ptr()))
    local like = cuda.device_array_like(obj)
    assert.same({ 4, 3 }, like.shape)
    assert.equal("float32", tostring(like.dtype))
    local into = cuda.pinned_array({ 4, 3 }, "float32")
    cuda.as_cuda_array(obj):copy_to_host(into)
    for i = 1, n do assert.equal(f32(t[i]), into[i]) end
    like:copy_to_device(cuda.as_cuda_array(obj))
    assert.same(into:totable(), like:copy_to_host():totable())
  end)

  gpu("are reduced by cuda.reduce", function()
    local t = H.rand_table(12, -50, 50, true)
    local owner = cuda.to_device(t, "float32")
    local s = 0
    for _, v in ipairs(t) do s = s + v end
    assert.equal(s + 0.0, cuda.reduce("a + b")(foreign(desc(owner:ptr()))))
    assert.equal(s + 0.0, cuda.reduce("a + b")(foreign(desc(owner:ptr()), true)))
  end)

  gpu("are kernel arguments of graph kernel nodes", function()
    local n = 12
    local t = H.rand_table(n, -100, 100, true)
    local xo, yo = cuda.to_device(t, "float32"), cuda.device_array(n, "float32")
    local g = cuda.graph()
    local a = g:kernel(K("affine"), { 1, 32 }, { foreign(desc(yo:ptr())), foreign(desc(xo:ptr())), 2, 0.5, n })
    g:kernel(K("bump"), { 1, 32 }, { foreign(desc(yo:ptr()), true), n }, { a })
    g:instantiate():launch()
    cuda.synchronize()
    local h = yo:copy_to_host()
    for i = 1, n do assert.equal(2 * t[i] + 1.5, h[i]) end
  end)
end)
