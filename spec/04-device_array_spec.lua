-- Device arrays and page-locked/managed host arrays: allocation, copies both ways, views,
-- fill, ptr, <close> and __gc, and pinned/mapped/managed memory used by kernels.
local H = require "spec.helper"
local C = require "spec.check"
local cuda = H.cuda
local gpu = H.gpu(it, pending)
local f32 = C.f32
local N = 1037 -- not a multiple of any block size

local SRC = [[
#include <cudalua/time.cuh>
__device__ unsigned long long now_ns() { return cudalua_globaltimer(); }
extern "C" __global__ void affine(int *y, const int *x, int a, int b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + b;
}
// waits ns nanoseconds, then writes v everywhere: work still queued when the host moves on.
// One thread waits and writes (threads that each waited would run one after another on the
// CPU device, where a block's threads take turns)
extern "C" __global__ void late_fill(int *x, int v, int n, long long ns) {
  if (blockIdx.x + threadIdx.x != 0) return;
  unsigned long long t0 = now_ns();
  while (now_ns() - t0 < (unsigned long long)ns) {}
  for (int i = 0; i < n; i++) x[i] = v;
}
]]
local mod
local function kernels()
  mod = mod or cuda.compile(SRC)
  return mod
end

local function blocks(n, b) return (n + b - 1) // b end

it("the kernels of this file compile", function()
  assert.same({ "affine", "late_fill" }, cuda.compile(SRC, { arch = "sm_90" }):kernels())
end)

describe("cuda.device_array", function()
  gpu("allocates an array of a length or a shape on the device", function()
    local d = cuda.device_array(N, "float32")
    assert.equal("device_array", d.kind)
    assert.equal(N, #d)
    assert.same({ N }, d.shape)
    assert.equal(cuda.float32, d.dtype)
    assert.equal(4 * N, d.nbytes)
    local m = cuda.device_array({ 7, 9 }, cuda.int16)
    assert.same({ 7, 9 }, m.shape)
    assert.equal(63, m.size)
    assert.equal(cuda.float64, cuda.device_array(5).dtype)
    assert.equal(("cudalua.device_array<float32>[%d]"):format(N), tostring(d))
  end)

  gpu("allocates on a stream", function()
    local s = cuda.stream()
    local d = cuda.device_array({ N }, cuda.float32, s)
    local t = H.rand_table(N)
    d:copy_to_device(cuda.array(t, "float32"), s)
    s:synchronize()
    local h = d:copy_to_host()
    for i = 1, N do assert.equal(f32(t[i]), h[i]) end
  end)

  gpu("allows empty arrays", function()
    local d = cuda.device_array(0, "int32")
    assert.equal(0, #d)
    assert.same({}, d:copy_to_host():totable())
  end)

  it("rejects bad shapes, dtypes and streams", function()
    C.raises("cuda.device_array: shape[1] is negative (-5)", cuda.device_array, -5)
    C.raises("cuda.device_array: shape must be an integer, got 2.5", cuda.device_array, 2.5)
    C.raises("cuda.device_array: shape needs 1 to 8 dimensions, got 9", cuda.device_array, { 1, 1, 1, 1, 1, 1, 1, 1, 1 })
    C.raises("unknown dtype 'float31'", cuda.device_array, 3, "float31")
    C.raises("cuda.device_array: expected a stream, got string", cuda.device_array, 3, "float32", "s")
  end)

  gpu("rejects a closed stream", function()
    local s = cuda.stream()
    s:close()
    C.raises("cuda.device_array: closed stream", cuda.device_array, 3, "float32", s)
  end)

  gpu("reports an allocation the device cannot hold #cudaerror", function()
    local _, total = cuda.mem_info()
    C.raises("CUDA_ERROR_OUT_OF_MEMORY", cuda.device_array, total // 4 * 2, "float32")
  end)
end)

describe("cuda.device_array_like", function()
  gpu("has the shape and dtype of a host or device array", function()
    local x = cuda.zeros({ 5, 7 }, "uint16")
    local d = cuda.device_array_like(x)
    assert.equal("device_array", d.kind)
    assert.same({ 5, 7 }, d.shape)
    assert.equal(cuda.uint16, d.dtype)
    local d2 = cuda.device_array_like(d, cuda.stream())
    assert.same({ 5, 7 }, d2.shape)
    assert.equal(cuda.uint16, d2.dtype)
  end)

  it("rejects what is not an open array, and bad streams", function()
    C.raises("cudalua array expected, got number", cuda.device_array_like, 5)
    C.raises("cudalua array expected, got table", cuda.device_array_like, { 1, 2 })
    local a = cuda.array(3)
    C.raises("cuda.device_array_like: expected a stream, got boolean", cuda.device_array_like, a, true)
    a:close()
    C.raises("closed array", cuda.device_array_like, a)
  end)
end)

describe("cuda.to_device", function()
  gpu("copies a host array", function()
    local t = H.rand_table(N)
    local d = cuda.to_device(cuda.array(t))
    assert.equal("device_array", d.kind)
    assert.equal(cuda.float64, d.dtype)
    assert.same(t, d:copy_to_host():totable())
  end)

  gpu("copies a table, with a dtype or an inferred one", function()
    local t = H.rand_table(N)
    local d = cuda.to_device(t, "float32")
    assert.equal(cuda.float32, d.dtype)
    local h = d:copy_to_host()
    for i = 1, N do assert.equal(f32(t[i]), h[i]) end
    local ti = H.rand_table(N, -1000, 1000, true)
    local di = cuda.to_device(ti, cuda.int32)
    assert.same(ti, di:copy_to_host():totable())
    assert.equal(cuda.int64, cuda.to_device(ti).dtype)
    assert.same(ti, cuda.to_device(ti):copy_to_host():totable())
  end)

  gpu("keeps the shape of N-d arrays", function()
    local t = { H.rand_table(5), H.rand_table(5), H.rand_table(5) }
    local d = cuda.to_device(t)
    assert.same({ 3, 5 }, d.shape)
    assert.same(t, d:copy_to_host():totable())
  end)

  gpu("copies on a stream from pinned memory and from tables", function()
    local s = cuda.stream()
    local t = H.rand_table(N, -1e6, 1e6, true)
    local p = cuda.pinned_array(N, "int32")
    for i = 1, N do p[i] = t[i] end
    local d = cuda.to_device(p, s)
    local d2 = cuda.to_device(t, "int32", s)
    s:synchronize()
    assert.same(t, d:copy_to_host():totable())
    assert.same(t, d2:copy_to_host():totable())
  end)

  gpu("copies a device array into a new one", function()
    local t = H.rand_table(N)
    local d = cuda.to_device(t)
    local d2 = cuda.to_device(d)
    d:fill(1.5)
    assert.same(t, d2:copy_to_host():totable())
  end)

  it("rejects bad sources, dtypes and streams", function()
    C.raises("array or table expected, got string", cuda.to_device, "1, 2, 3")
    C.raises("dtype differs from the array's (no conversion is done)", cuda.to_device, cuda.array({ 1.5 }), "int32")
    C.raises("unknown dtype 'nope'", cuda.to_device, { 1, 2 }, "nope")
    C.raises("element 2: expected a number for int64, got string", cuda.to_device, { 1, "2" })
    C.raises("cuda.to_device: expected a stream, got string", cuda.to_device, { 1, 2 }, "float32", "s")
    C.raises("cuda.to_device: expected a stream, got number", cuda.to_device, { 1, 2 }, 3)
    local a = cuda.array(3)
    a:close()
    C.raises("closed array", cuda.to_device, a)
  end)
end)

describe("copy_to_host", function()
  gpu("makes a new host array with the same shape and dtype", function()
    local t = { H.rand_table(4, -99, 99, true), H.rand_table(4, -99, 99, true) }
    local d = cuda.to_device(t, "int16")
    local h = d:copy_to_host()
    assert.equal("array", h.kind)
    assert.equal(cuda.int16, h.dtype)
    assert.same({ 2, 4 }, h.shape)
    assert.same(t, h:totable())
  end)

  gpu("copies into a given host array and returns it", function()
    local t = H.rand_table(N)
    local d = cuda.to_device(t)
    local into = cuda.array(N, "float64")
    assert.equal(into, d:copy_to_host(into))
    assert.same(t, into:totable())
    local view = cuda.array(N + 10, "float64"):slice(6, N + 5)
    d:copy_to_host(view)
    assert.same(t, view:totable())
  end)

  gpu("copies on a stream, into pinned memory or a new array", function()
    local s = cuda.stream()
    local t = H.rand_table(N)
    local d = cuda.to_device(t, "float64", s)
    local p = cuda.pinned_array(N, "float64")
    d:copy_to_host(p, s)
    local h = d:copy_to_host(nil, s)
    s:synchronize()
    assert.same(t, p:totable())
    assert.same(t, h:totable())
  end)

  gpu("rejects destinations of another size, dtype or kind, and bad streams", function()
    local d = cuda.device_array(N, "float32")
    C.raises(("copy_to_host: size mismatch (%d elements into 10)"):format(N), d.copy_to_host, d, cuda.array(10, "float32"))
    C.raises("copy_to_host: dtype mismatch (float32 into float64)", d.copy_to_host, d, cuda.array(N, "float64"))
    C.raises("destination must be a host array", d.copy_to_host, d, cuda.device_array(N, "float32"))
    C.raises("copy_to_host: expected a stream, got string", d.copy_to_host, d, "stream")
    local s = cuda.stream()
    s:close()
    C.raises("copy_to_host: closed stream", d.copy_to_host, d, cuda.array(N, "float32"), s)
    local into = cuda.array(N, "float32")
    into:close()
    C.raises("closed array", d.copy_to_host, d, into)
    d:close()
    C.raises("closed array", d.copy_to_host, d)
  end)
end)

describe("copy_to_device", function()
  gpu("copies a host array or a table into the device array, and returns it", function()
    local d = cuda.device_array(N, "int32")
    local t = H.rand_table(N, -1e6, 1e6, true)
    assert.equal(d, d:copy_to_device(cuda.array(t, "int32")))
    assert.same(t, d:copy_to_host():totable())
    local t2 = H.rand_table(N, -1e6, 1e6, true)
    d:copy_to_device(t2) -- a table takes the array's dtype
    assert.same(t2, d:copy_to_host():totable())
  end)

  gpu("copies on a stream", function()
    local s = cuda.stream()
    local d = cuda.device_array(N, "float64", s)
    local t = H.rand_table(N)
    local p = cuda.pinned_array(N, "float64")
    for i = 1, N do p[i] = t[i] end
    d:copy_to_device(p, s)
    s:synchronize()
    assert.same(t, d:copy_to_host():totable())
  end)

  gpu("copies into a view only", function()
    local d = cuda.to_device(cuda.zeros(20, "int32"))
    d:slice(11, 15):copy_to_device({ 1, 2, 3, 4, 5 })
    assert.same({ 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 0, 0, 0, 0, 0 }, d:copy_to_host():totable())
  end)

  gpu("rejects sources of another size or dtype, bad values and bad streams", function()
    local d = cuda.device_array(N, "float32")
    C.raises(("copy_to_device: size mismatch (10 elements into %d)"):format(N), d.copy_to_device, d, cuda.array(10, "float32"))
    C.raises(("copy_to_device: size mismatch (3 elements into %d)"):format(N), d.copy_to_device, d, { 1, 2, 3 })
    C.raises("copy_to_device: dtype mismatch (float64 into float32)", d.copy_to_device, d, cuda.array(N, "float64"))
    C.raises("copy_to_device: expected a stream, got number", d.copy_to_device, d, cuda.array(N, "float32"), 7)
    local d8 = cuda.device_array(2, "int8")
    local e = C.raises("does not fit int8", d8.copy_to_device, d8, { 1, 300 })
    assert.matches("element 2", e, 1, true)
    C.raises("cudalua array expected, got string", d.copy_to_device, d, "data")
  end)
end)

describe("element access on device arrays", function()
  gpu("a[i], get and set read and write single elements", function()
    local t = H.rand_table(N)
    local d = cuda.to_device(t, "float64")
    for _, i in ipairs { 1, 2, N // 2, N } do assert.equal(t[i], d[i]) end
    d[3] = 0.75
    assert.equal(0.75, d[3])
    local m = cuda.device_array({ 3, 4 }, "int32")
    m:fill(0)
    m:set(2, 3, 23)
    assert.equal(23, m:get(2, 3))
    assert.equal(23, m[7])
    assert.same({ { 0, 0, 0, 0 }, { 0, 0, 23, 0 }, { 0, 0, 0, 0 } }, m:totable())
  end)

  gpu("rejects indices out of range and values that do not fit", function()
    local d = cuda.device_array(N, "float32")
    C.raises(("index %d out of range (1..%d)"):format(N + 1, N), function() return d[N + 1] end)
    C.raises("value 1e+39 does not fit float32", function() d[1] = 1e39 end)
    d:close()
    C.raises("cudalua: array[i]: closed array", function() return d[1] end)
  end)
end)

describe("element access after queued work", function()
  -- the element copy runs on the legacy stream, which does not wait for non-blocking streams:
  -- it waits for the stream that last used the array (a late write was read as the old value)
  gpu("sees the work a non-blocking stream queued on the array", function()
    local s = cuda.stream(true)
    local v = math.random(1, 1 << 30)
    local y = cuda.device_array(N, "int32", s)
    y:fill(0, s)
    kernels().late_fill[{ 4, 128, s }](y, v, N, 50 * 1000000)
    assert.equal(v, y[N])
    kernels().late_fill[{ 4, 128, s }](y, v + 1, N, 50 * 1000000)
    y[1] = 5 -- after the kernel, not overwritten by it
    assert.same({ 5, v + 1 }, { y[1], y[2] })
  end)
end)

describe("slice on device arrays", function()
  gpu("is a view with no copy", function()
    local t = H.rand_table(N)
    local d = cuda.to_device(t)
    local part = d:slice(11, 20)
    assert.equal("device_array", part.kind)
    assert.same({ 10 }, part.shape)
    assert.equal(d:ptr() + 10 * 8, part:ptr())
    local h = part:copy_to_host()
    for i = 1, 10 do assert.equal(t[10 + i], h[i]) end
    part:fill(-1)
    local all = d:copy_to_host()
    for i = 1, N do assert.equal((i >= 11 and i <= 20) and -1 or t[i], all[i]) end
  end)

  gpu("keeps the memory alive after the parent is closed or collected", function()
    local t = H.rand_table(N)
    local d = cuda.to_device(t)
    local a, b = d:slice(11, 20), d:slice(N - 9)
    d:close()
    collectgarbage()
    collectgarbage()
    -- other allocations must not reuse the viewed memory
    for _ = 1, 10 do cuda.device_array(N, "float64"):fill(0) end
    local ha, hb = a:copy_to_host(), b:copy_to_host()
    for i = 1, 10 do
      assert.equal(t[10 + i], ha[i])
      assert.equal(t[N - 10 + i], hb[i])
    end
    local v
    do
      local parent = cuda.to_device(t)
      v = parent:slice(101, 200)
    end
    collectgarbage()
    collectgarbage()
    for _ = 1, 10 do cuda.device_array(N, "float64"):fill(0) end
    local hv = v:copy_to_host()
    for i = 1, 100 do assert.equal(t[100 + i], hv[i]) end
  end)

  gpu("rejects bounds out of range", function()
    local d = cuda.device_array(N, "int8")
    C.raises(("slice: start 0 out of range (1..%d)"):format(N + 1), d.slice, d, 0)
    C.raises(("slice: stop %d out of range (5..%d)"):format(N + 1, N), d.slice, d, 6, N + 1)
  end)
end)

describe("fill on device arrays", function()
  -- dtype, value; covering elements of 1, 2, 4 and 8 bytes
  local function cases()
    local r = function(lo, hi) return H.rand_table(1, lo, hi, true)[1] end
    return {
      { "int8", r(-128, 127) }, { "uint8", r(1, 255) }, { "bool", true },
      { "int16", r(-32768, 32767) }, { "uint16", r(1, 65535) }, { "float16", r(-2048, 2048) },
      { "int32", r(-2147483648, 2147483647) }, { "uint32", r(1, 4294967295) },
      { "float32", f32(H.rand_table(1)[1]) },
      { "int64", r(math.mininteger, math.maxinteger) }, { "int64", 0x123456789ABCDEF0 },
      { "uint64", 2 ^ 63 + 2 ^ 40 }, { "uint64", r(1, math.maxinteger) },
      { "float64", H.rand_table(1)[1] }, { "float64", -1 / 3 },
    }
  end

  gpu("sets every element, for 1-, 2-, 4- and 8-byte dtypes", function()
    for _, c in ipairs(cases()) do
      local d = cuda.device_array(N, c[1])
      assert.equal(d, d:fill(c[2]))
      local h = d:copy_to_host()
      for i = 1, N do assert.equal(c[2], h[i], c[1] .. " " .. tostring(c[2])) end
    end
  end)

  gpu("fills only a view's elements", function()
    for _, c in ipairs(cases()) do
      local d = cuda.to_device(cuda.zeros(N, c[1]))
      d:slice(11, 20):fill(c[2])
      local h = d:copy_to_host()
      local zero = 0
      if c[1] == "bool" then zero = false end
      for i = 1, N do assert.equal((i >= 11 and i <= 20) and c[2] or zero, h[i], c[1] .. " at " .. i) end
    end
  end)

  gpu("fills on a stream", function()
    local s = cuda.stream()
    local d = cuda.device_array(N, "float64", s)
    local v = H.rand_table(1)[1]
    d:fill(v, s)
    s:synchronize()
    local h = d:copy_to_host()
    for i = 1, N do assert.equal(v, h[i]) end
  end)

  gpu("rejects values that do not fit and bad streams", function()
    local d = cuda.device_array(N, "uint8")
    C.raises("fill: value 300 does not fit uint8", d.fill, d, 300)
    C.raises("fill: expected a stream, got table", d.fill, d, 1, {})
    local s = cuda.stream()
    s:close()
    C.raises("fill: closed stream", d.fill, d, 1, s)
  end)
end)

describe("ptr", function()
  gpu("gives device addresses of device, pinned, mapped and managed arrays", function()
    local arrays = { cuda.device_array(N, "float32"), cuda.pinned_array(N, "float32"),
                     cuda.mapped_array(N, "float32"), cuda.managed_array(N, "float32") }
    local seen = {}
    for _, a in ipairs(arrays) do
      local p = a:ptr()
      assert.equal("integer", math.type(p))
      assert.is_true(p ~= 0)
      assert.is_nil(seen[p])
      seen[p] = true
      assert.equal(p + 4 * 6, a:slice(7):ptr())
    end
  end)

  it("rejects closed arrays", function()
    local a = cuda.array(4)
    a:close()
    C.raises("closed array", a.ptr, a)
  end)
end)

describe("view on device arrays", function()
  gpu("a kernel sees the viewed array's elements", function()
    local t = H.rand_table(64, -32768, 32767, true)
    local d = cuda.to_device(t, "int16"):reshape(8, 8)
    local v = d:view("int32")
    assert.same({ 8, 4 }, v.shape)
    local k = cuda.kernel([[extern "C" __global__ void neg(int *x, int n) { int i = threadIdx.x; if (i < n) x[i] = -x[i]; }]], "neg")
    k[{ 1, 32 }](v, 32)
    local back = d:reshape(64):copy_to_host():totable()
    for i = 1, 32 do
      local lo, hi = string.unpack("<i2i2", string.pack("<i4", -string.unpack("<i4", string.pack("<i2i2", t[2 * i - 1], t[2 * i]))))
      assert.same({ lo, hi }, { back[2 * i - 1], back[2 * i] })
    end
  end)
end)

-- a free that fails is said: through Lua's warnings where a state is at hand, else on stderr
-- (before, a cached block freed as its stream went away said nothing). A kernel that writes to
-- address 16 leaves the context failed: every later free fails.
describe("failed frees", function()
  gpu("are reported, also where no Lua state is at hand #cudaerror", function()
    local out = H.child([==[
warn("@on")
local s = cuda.stream()
local d = cuda.device_array(256, "float32", s)
d:fill(1, s)
s:synchronize()
d:close()                      -- its block is kept in the cache for s
local e = cuda.device_array(512, "float32", s)
e:fill(1, s)
s:synchronize()
local bad = cuda.kernel('extern "C" __global__ void bad(long long a) { *(int *)a = 1; }', "bad")
bad[{ 1, 1 }](16)                 -- on the legacy stream: no launcher holds s
print(pcall(cuda.synchronize))
e:close()                      -- to the cache as well
io.stderr:write("-- stream close\n")
s:close()                      -- its cached blocks are freed, with no state at hand
io.stderr:write("-- done\n")
]==], nil, "timeout 60")
    assert.matches("false\tcudalua: cuda.synchronize: CUDA_ERROR_ILLEGAL_ADDRESS", out, 1, true)
    local after = out:match("%-%- stream close\n(.*)%-%- done")
    assert(after, out)
    assert.matches("cudalua: cuMemFreeAsync failed while freeing memory: CUDA_ERROR_ILLEGAL_ADDRESS", after, 1, true)
  end)
end)

describe("<close> and __gc", function()
  gpu("a <close> device array is freed at the end of its block", function()
    local keep
    do
      local tmp <close> = cuda.device_array(N, "float32")
      tmp:fill(1)
      keep = tmp
    end
    assert.is_true(keep.closed)
    C.raises("closed array", keep.copy_to_host, keep)
    C.raises("closed array", keep.fill, keep, 1)
  end)

  gpu("closed and collected arrays give their memory back", function()
    local free = cuda.mem_info()
    local n = math.floor(free * 0.4) // 4
    for i = 1, 10 do -- ten times 40% of the free memory: only fits if each is freed
      local d <close> = cuda.device_array(n, "float32")
      d:fill(i)
    end
    for i = 1, 10 do
      local d = cuda.device_array(n, "float32")
      d:fill(i)
      d = nil
      collectgarbage()
      collectgarbage()
    end
  end)

  gpu("memory is not reused while queued work still uses it", function()
    local k = kernels().late_fill
    local s = cuda.stream()
    local d = cuda.device_array(N, "int32")
    k[{ 4, 128, s }](d, 42, N, 200000000) -- writes 42 after 200 ms
    d:close()
    local e = cuda.device_array(N, "int32")
    e:fill(7)
    s:synchronize()
    cuda.synchronize()
    local h = e:copy_to_host()
    for i = 1, N do assert.equal(7, h[i]) end
  end)
end)

describe("arrays used on several streams", function()
  gpu("are not reused while a non-blocking stream's work on them is queued", function()
    local k = kernels().late_fill
    local nb, s = cuda.stream(true), cuda.stream()
    local d = cuda.device_array(N, "int32")
    k[{ 4, 128, nb }](d, 42, N, 200000000) -- writes 42 after 200 ms, not ordered by the legacy stream
    local h = cuda.pinned_array(N, "int32")
    d:copy_to_host(h, s)                    -- a later use on a blocking stream
    d:close()
    local e = cuda.device_array(N, "int32")
    e:fill(7)
    cuda.synchronize()
    local back = e:copy_to_host()
    for i = 1, N do assert.equal(7, back[i]) end
  end)
end)

describe("the block cache", function()
  before_each(function()
    collectgarbage() -- arrays other specs dropped would come into the cache meanwhile
    collectgarbage()
    cuda.empty_cache()
  end)

  gpu("a freed block goes to the next array of its size on its stream", function()
    local base = cuda.block_cache()
    local d = cuda.device_array(N, "float32")
    local p = d:ptr()
    d:close()
    assert.equal(base + N * 4, (cuda.block_cache()))
    local e <close> = cuda.device_array(N, "float32")
    assert.equal(p, e:ptr())
    assert.equal(base, (cuda.block_cache()))
  end)

  gpu("a reused block waits for the queued work that used it", function()
    local k = kernels().late_fill
    local s = cuda.stream()
    local d = cuda.device_array(N, "int32", s)
    local p = d:ptr()
    k[{ 4, 128, s }](d, 42, N, 200000000) -- writes 42 after 200 ms
    d:close()
    local e = cuda.device_array(N, "int32", s)
    assert.equal(p, e:ptr())          -- the same block, in the stream's order
    e:fill(7, s)
    local h = e:copy_to_host(nil, s)
    s:synchronize()
    for i = 1, N do assert.equal(7, h[i]) end
    -- on another stream the block is not taken: the late write would land after
    local f = cuda.device_array(N, "int32", s)
    k[{ 4, 128, s }](f, 42, N, 200000000)
    local q = f:ptr()
    f:close()
    local g = cuda.device_array(N, "int32")
    assert.are_not.equal(q, g:ptr())
    s:synchronize()
  end)

  gpu("a stream's blocks are freed with the stream", function()
    local base = cuda.block_cache()
    local s = cuda.stream()
    cuda.device_array(N, "float32", s):close()
    assert.equal(base + N * 4, (cuda.block_cache()))
    s:close() -- the last reference: nothing else used the stream
    assert.equal(base, (cuda.block_cache()))
  end)

  gpu("keeps blocks up to an eighth of its limit, and no more bytes than the limit", function()
    local _, limit = cuda.block_cache()
    finally(function() cuda.block_cache(limit) end)
    assert.equal(limit, select(2, cuda.block_cache(8 * 4096))) -- gives the limit it replaces
    assert.equal(8 * 4096, select(2, cuda.block_cache()))
    cuda.device_array(1025, "float32"):close()   -- 4100 bytes: over an eighth
    assert.equal(0, (cuda.block_cache()))
    for _ = 1, 10 do
      local a <close> = cuda.device_array(1024, "float32")
      local b <close> = cuda.device_array(1024, "float32")
      local c <close> = cuda.device_array(1024, "float32")
    end
    assert.equal(3 * 4096, (cuda.block_cache()))
    local keep = {}
    for i = 1, 12 do keep[i] = cuda.device_array(1024, "float32") end
    for i = 1, 12 do keep[i]:close() end
    assert.equal(8 * 4096, (cuda.block_cache()))
    cuda.block_cache(0)
    assert.equal(0, (cuda.block_cache()))
    cuda.device_array(1024, "float32"):close()
    assert.equal(0, (cuda.block_cache()))
  end)

  gpu("is emptied when an allocation runs out of memory #cudaerror", function()
    local _, limit = cuda.block_cache()
    finally(function() cuda.block_cache(limit) end)
    local free = cuda.mem_info()
    local n = math.floor(free * 0.1) // 4
    cuda.block_cache(8 * n * 4)
    for _ = 1, 5 do
      local a = {}
      for i = 1, 5 do a[i] = cuda.device_array(n, "float32") end
      for i = 1, 5 do a[i]:close() end
    end
    assert.equal(5 * n * 4, (cuda.block_cache()))
    local big <close> = cuda.device_array(math.floor(free * 0.8) // 4, "float32")
    big:fill(1)
    assert.equal(0, (cuda.block_cache()))
  end)

  it("block_cache rejects a bad limit; both work without a GPU", function()
    local cached, limit = cuda.block_cache()
    assert.is_true(math.type(cached) == "integer" and math.type(limit) == "integer")
    C.raises("cuda.block_cache: max_bytes must be an integer >= 0, got -1", cuda.block_cache, -1)
    C.raises("cuda.block_cache: max_bytes must be an integer >= 0, got 1.5", cuda.block_cache, 1.5)
    C.raises("cuda.block_cache: max_bytes must be an integer >= 0, got lots", cuda.block_cache, "lots")
    assert.equal(limit, select(2, cuda.block_cache()))
    cuda.empty_cache()
    assert.equal(0, (cuda.block_cache()))
  end)
end)

describe("pinned, mapped and managed arrays", function()
  gpu("are zero-filled host arrays with device addresses", function()
    for _, make in ipairs { cuda.pinned_array, cuda.mapped_array, cuda.managed_array } do
      local a = make({ 3, N }, "int32")
      assert.same({ 3, N }, a.shape)
      for i = 1, 3 * N, 97 do assert.equal(0, a[i]) end
      local t = H.rand_table(3 * N, -1000, 1000, true)
      for i = 1, 3 * N do a[i] = t[i] end
      assert.equal(t[3 * N], a:get(3, N))
    end
    assert.equal("pinned_array", cuda.pinned_array(1).kind)
    assert.equal("mapped_array", cuda.mapped_array(1).kind)
    assert.equal("managed_array", cuda.managed_array(1).kind)
  end)

  gpu("are used by kernels in place, with no copy", function()
    local k = kernels().affine
    local t = H.rand_table(N, -1000, 1000, true)
    local a, b = H.rand_table(1, -9, 9, true)[1], H.rand_table(1, -9, 9, true)[1]
    for _, make in ipairs { cuda.pinned_array, cuda.mapped_array, cuda.managed_array } do
      local x, y = make(N, "int32"), make(N, "int32")
      for i = 1, N do x[i] = t[i] end
      k[{ blocks(N, 128), 128 }](y, x, a, b, N)
      cuda.synchronize()
      for i = 1, N do assert.equal(a * t[i] + b, y[i]) end
    end
  end)

  gpu("a managed array is written by a kernel and read by the host", function()
    local k = kernels().affine
    local t = H.rand_table(N, -1000, 1000, true)
    local m = cuda.managed_array(N, "int32")
    for i = 1, N do m[i] = t[i] end
    k[{ blocks(N, 256), 256 }](m, m, 3, -1, N)
    cuda.synchronize()
    for i = 1, N do assert.equal(3 * t[i] - 1, m[i]) end
  end)

  it("reject bad shapes and dtypes", function()
    C.raises("cuda.pinned_array: shape[1] is negative (-1)", cuda.pinned_array, -1)
    C.raises("cuda.mapped_array: shape must be an integer or a table of integers, got string", cuda.mapped_array, "4")
    C.raises("unknown dtype 'int128'", cuda.managed_array, 4, "int128")
  end)
end)
