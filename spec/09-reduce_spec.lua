-- cuda.reduce: Numba's reduce. cuda.reduce(expr | {body=, preamble=} [, {init=}]) gives a
-- reducer; reducer(array [, {init=, res=, stream=}]) returns op(init, x1 op x2 op ... op xn), or
-- leaves it in res[1] and returns res. Every result is compared with a CPU fold of random
-- integer-valued data, chosen so that the sums are exact in the dtype (integer dtypes wrap as
-- the GPU's C arithmetic does).
local H = require "spec.helper"
local C = require "spec.check"
local cuda = H.cuda
local gpu = H.gpu(it, pending)
local nogpu = C.nogpu(it, pending)
local NO_DRIVER = "no CUDA driver found" -- (the library path follows)

local DTYPES = { "float32", "float64", "float16", "int8", "int16", "int32", "int64", "uint8", "uint16",
                 "uint32", "uint64" }
-- value ranges that keep every partial sum exact (floats) or defined (integers)
local RANGE = {
  float32 = { -8, 8 }, float64 = { -1000, 1000 }, float16 = { -8, 8 },
  int8 = { -100, 100 }, int16 = { -30000, 30000 }, int32 = { -10000, 10000 }, int64 = { -(1 << 40), 1 << 40 },
  uint8 = { 1, 200 }, uint16 = { 1, 60000 }, uint32 = { 1, 4294967295 }, uint64 = { 1, 1 << 40 },
}
local BITS = { int8 = 8, int16 = 16, int32 = 32, int64 = 64, uint8 = 8, uint16 = 16, uint32 = 32, uint64 = 64 }
local function is_float(dt) return dt:match("^float") ~= nil end

-- v as the dtype holds it (two's complement wrap-around)
local function wrap(dt, v)
  local b = BITS[dt]
  if b == 64 then return v end
  local m = 1 << b
  v = v % m
  if dt:sub(1, 1) == "i" and v >= m // 2 then v = v - m end
  return v
end

-- op(init, x1 + ... + xn) on the CPU, as the dtype computes it
local function cpu_sum(dt, t, init, first, last)
  first, last = first or 1, last or #t
  local s = init or 0
  if is_float(dt) then s = s + 0.0 end
  for i = first, last do s = s + t[i] end
  return is_float(dt) and s or wrap(dt, s)
end

local function data(dt, n)
  local r = RANGE[dt]
  return H.rand_table(n, r[1], r[2], true)
end

-- the same value and the same Lua number subtype (integer or float)
local function same(want, got, what)
  assert.equal(want, got, what)
  assert.equal(math.type(want), math.type(got), (what or "") .. ": number subtype")
end

local function host_of(d) return d:copy_to_host():totable() end

local sum = cuda.reduce("a + b")

describe("cuda.reduce", function()
  it("makes reducers from an expression or a function body", function()
    assert.equal("cudalua.reducer<a + b>", tostring(sum))
    assert.equal("cudalua.reducer<fmax(a, b)>", tostring(cuda.reduce("fmax(a, b)", { init = -math.huge })))
    assert.equal("cudalua.reducer<function>", tostring(cuda.reduce { body = "return a + b;" }))
    assert.equal("cudalua.reducer<function>",
                 tostring(cuda.reduce { preamble = "__device__ int two() { return 2; }", body = "return a + b;" }))
  end)

  it("rejects what is not an expression of a and b", function()
    C.raises("cuda.reduce: expected a CUDA C expression of a and b, got number", cuda.reduce, 42)
    C.raises("cuda.reduce: expected a CUDA C expression of a and b, got nil", cuda.reduce)
    C.raises('cuda.reduce: the expression "1 + 2" uses neither a nor b', cuda.reduce, "1 + 2")
    C.raises('cuda.reduce: the expression "alpha + beta" uses neither a nor b', cuda.reduce, "alpha + beta")
    C.raises('cuda.reduce: the expression "" uses neither a nor b', cuda.reduce, "")
    -- the position is the line that called cuda.reduce (its frame is not lost to a tail call)
    local ok, e = pcall(function() local r = cuda.reduce("1 + 2"); return r end)
    assert.is_false(ok)
    assert.matches("09%-reduce_spec%.lua:%d+: cudalua: cuda%.reduce: ", e)
    C.raises('cuda.reduce: a table argument needs body = "...; return ...;"', cuda.reduce, {})
    C.raises("cuda.reduce: a table argument needs body =", cuda.reduce, { body = 5 })
    C.raises("cuda.reduce: preamble must be a string of CUDA C", cuda.reduce, { body = "return a;", preamble = 5 })
  end)

  it("rejects bad options", function()
    C.raises("cuda.reduce: options must be a table, got number", cuda.reduce, "a + b", 5)
    C.raises("cuda.reduce: options must be a table, got string", cuda.reduce, "a + b", "init=0")
    C.raises("cuda.reduce: init must be a number", cuda.reduce, "a + b", { init = "0" })
    C.raises("cuda.reduce: init must be a number", cuda.reduce, "a + b", { init = {} })
    C.raises("cuda.reduce: init must be a number, got boolean", cuda.reduce, "a + b", { init = true })
  end)

  it("rejects unknown options", function()
    -- as cuda.compile and create_xoroshiro128p_states do: a typo such as `inti` loses the init
    C.raises("unknown option 'inti'", cuda.reduce, "a + b", { inti = 5 })
  end)
end)

describe("a reducer", function()
  it("gives init for an empty host array, as a float for float dtypes", function()
    for _, dt in ipairs(DTYPES) do
      local e = cuda.array(0, dt)
      same(is_float(dt) and 0.0 or 0, sum(e), dt)
      same(is_float(dt) and 7.0 or 7, sum(e, { init = 7 }), dt)
      same(is_float(dt) and -3.0 or -3, cuda.reduce("a + b", { init = -3 })(e), dt)
    end
    same(2.5, sum(cuda.array(0, "float64"), { init = 2.5 }))
  end)

  it("rejects what is not an array", function()
    C.raises("reduce: expected an array, got number", sum, 42)
    C.raises("reduce: expected an array, got nil", sum, nil)
    C.raises("reduce: expected an array, got string", sum, "1,2,3")
    C.raises("reduce: expected an array, got a table (make one with cuda.array(t, dtype))", sum, { 1, 2, 3 })
    local closed = cuda.array({ 1, 2 }, "float32")
    closed:close()
    C.raises("closed array", sum, closed)
  end)

  it("rejects bad init values and options", function()
    local f = cuda.array(H.rand_table(10), "float32")
    local i = cuda.array(H.rand_table(10, -9, 9, true), "int32")
    C.raises("reduce: options must be a table {init=, res=, stream=}, got string", sum, f, "init")
    C.raises("reduce: init must be a number, got string", sum, f, { init = "1" })
    C.raises("reduce: init must be a number, got table", sum, i, { init = {} })
    C.raises("reduce: init must be an integer for int32, got 0.5", sum, i, { init = 0.5 })
    C.raises("reduce: init must be an integer for int32, got 0.5", cuda.reduce("a + b", { init = 0.5 }), i)
  end)

  it("rejects bad res arrays", function()
    local f = cuda.array(H.rand_table(10), "float32")
    C.raises("reduce: res must be an array, got number", sum, f, { res = 1 })
    C.raises("reduce: res must be an array, got table", sum, f, { res = {} })
    C.raises("reduce: res has dtype float64, the input float32", sum, f, { res = cuda.array(1, "float64") })
    C.raises("reduce: res is empty", sum, f, { res = cuda.array(0, "float32") })
    C.raises("reduce: res must be a device (or pinned/mapped/managed) array", sum, f, { res = cuda.array(1, "float32") })
  end)

  it("rejects unknown options and streams that are not streams", function()
    -- (a typo such as `ress` must not be ignored: the result would come back instead of
    -- being left in res; a stream that is not a stream must not reach cuda.to_device as a dtype)
    local f = cuda.array(H.rand_table(10), "float32")
    C.raises("unknown option 'ress'", sum, f, { ress = cuda.array(1, "float32") })
    local e = C.raises("got string", sum, f, { stream = "x" })
    assert.matches("reduce: [^\n]*stream[^\n]*got string", e)
    assert.is_nil(e:find("dtype", 1, true), e)
  end)

  nogpu("needs the driver for a non-empty array, and says so", function()
    -- not "the reduction does not compile ... give opts.arch": reduce takes no arch
    local e = C.raises(NO_DRIVER, sum, cuda.array(H.rand_table(10), "float32"))
    assert.is_nil(e:find("does not compile", 1, true), e)
    assert.is_nil(e:find("opts.arch", 1, true), e)
  end)
end)

-- the reduction kernel (kernels/cudalua/reduce.cuh) as reduce.lua instantiates it
describe("cudalua/reduce.cuh", function()
  local CT = { float32 = "float", float64 = "double", float16 = "__half", int8 = "signed char",
    int16 = "short", int32 = "int", int64 = "long long", uint8 = "unsigned char",
    uint16 = "unsigned short", uint32 = "unsigned int", uint64 = "unsigned long long" }
  it("compiles for every dtype, vectorised and not, keeping the order or not", function()
    for _, dt in ipairs(DTYPES) do
      local ct = CT[dt]
      local v = 16 // cuda.dtype(dt).itemsize
      local src = table.concat({ "#include <cudalua/reduce.cuh>", ct == "__half" and "#include <cuda_fp16.h>" or "",
        "struct cudalua_op { typedef " .. ct .. " T; __device__ __forceinline__ T operator()(T a, T b) const { return (a + b); } };" }, "\n")
      local exprs = { ("cudalua::reduce_kernel<%s, cudalua_op, %d, 4, false>"):format(ct, v),
                      ("cudalua::reduce_kernel<%s, cudalua_op, 1, 4, false>"):format(ct),
                      ("cudalua::reduce_kernel<%s, cudalua_op, %d, 8, true>"):format(ct, v),
                      ("cudalua::reduce_kernel<%s, cudalua_op, 1, 8, true>"):format(ct) }
      local mod = cuda.compile(src, { arch = "sm_90", name = "reduce_" .. dt .. ".cu", name_expressions = exprs })
      table.sort(exprs)
      assert.same(exprs, mod:kernels(), dt)
    end
  end)
end)

describe("reducer:precompile", function()
  it("checks its argument before anything else", function()
    local r = cuda.reduce("a * b")
    C.raises("reducer:precompile: expected a list of dtypes, got string", r.precompile, r, "float32")
    C.raises("reducer:precompile: dtypes[2]: unknown dtype float77", r.precompile, r, { "int32", "float77" })
  end)

  -- (issue 28: the dtypes' kernels compiled at once, through cuda.compile_all)
  gpu("compiles the kernels of several dtypes at once; the calls then compile nothing", function()
    local r = cuda.reduce(("a + b + %d * 0"):format(math.random(1, 1e6)))   -- a sum, a source of its own
    local dts = { "float32", "float64", "int32", "int64", "uint16" }
    assert.equal(r, r:precompile(dts))
    local runs = cuda.compile_stats().nvrtc_runs
    for _, dt in ipairs(dts) do
      local t = data(dt, math.random(1, 5000))
      same(cpu_sum(dt, t), r(cuda.array(t, dt)), dt)
    end
    assert.equal(runs, cuda.compile_stats().nvrtc_runs)
    -- bitwise xor compiles for integers only: the int32 kernel is kept, float32's failure reported
    local x = cuda.reduce(("a ^ b ^ (%d & 0)"):format(math.random(1, 1e6)))
    C.raises('reducer:precompile: the reduction "a ^ b ^', x.precompile, x, { "int32", "float32" })
    runs = cuda.compile_stats().nvrtc_runs
    local t = data("int32", 777)
    local want = 0
    for _, v in ipairs(t) do want = want ~ v end
    assert.equal(want, x(cuda.array(t, "int32")))
    assert.equal(runs, cuda.compile_stats().nvrtc_runs)
  end)
end)

describe("a reducer on the GPU", function()
  gpu("sums every numeric dtype exactly: integers as Lua integers, floats as floats", function()
    for _, dt in ipairs(DTYPES) do
      local sizes = dt == "float16" and { 1, 2, 33, 200 } or { 1, 2, 31, 33, 1023, 100003 }
      for _, n in ipairs(sizes) do
        local t = data(dt, n)
        local a = cuda.array(t, dt)
        local d = cuda.to_device(a)
        local what = ("%s[%d]"):format(dt, n)
        same(cpu_sum(dt, t), sum(d), what .. " device")
        same(cpu_sum(dt, t), sum(a), what .. " host")
        same(cpu_sum(dt, t, nil, 2), sum(d:slice(2)), what .. " unaligned (slice from 2)")
        same(cpu_sum(dt, t, 5), sum(d, { init = 5 }), what .. " init 5")
      end
    end
  end)

  gpu("sums 0, 1, 31, 32, 33, 1023 and 2^20 + 7 elements from device, pageable and pinned arrays", function()
    for _, dt in ipairs { "float64", "int64", "float32" } do
      for _, n in ipairs { 0, 1, 31, 32, 33, 1023, (1 << 20) + 7 } do
        local t = data(dt, n)
        local a = cuda.array(t, dt)
        local d = cuda.to_device(a)
        local p = cuda.pinned_array(n, dt)
        a:copy_to_host(p) -- host to host: the pinned array filled from the pageable one
        local want = cpu_sum(dt, t)
        local what = ("%s[%d]"):format(dt, n)
        same(want, sum(d), what .. " device")
        same(want, sum(a), what .. " pageable")
        same(want, sum(p), what .. " pinned")
        if n > 2 then
          same(cpu_sum(dt, t, nil, 2, n - 1), sum(d:slice(2, n - 1)), what .. " unaligned view")
        end
      end
    end
  end)

  H.gpuonly(it, pending, "2 GiB of memory; make test gives it 1")("sums 2^28 float32 ones and 2^28 uint32 values exactly", function()
    local n = 1 << 28
    local ones = cuda.device_array(n, "float32")
    ones:fill(1)
    same(2.0 ^ 28, sum(ones), "float32 ones")
    local r = cuda.device_array(1, "float32")
    assert.equal(r, sum(ones, { res = r, init = 64 }))
    same(2.0 ^ 28 + 64, r[1], "float32 ones into res") -- exact: a multiple of float32's step there
    ones:close()
    local pattern = cuda.kernel([[
extern "C" __global__ void pattern(unsigned int *x, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    x[i] = (unsigned int)(i % 97 + 1);
}]], "pattern")
    local x = cuda.device_array(n, "uint32")
    pattern[{ 4096, 256 }](x, n)
    local q, rem = n // 97, n % 97
    local want = (q * (97 * 98 // 2) + rem * (rem + 1) // 2) % (1 << 32)
    same(want, sum(x), "uint32 pattern")
    same(97, cuda.reduce("a > b ? a : b")(x), "uint32 max")
    x:close()
  end)

  gpu("init is applied as op(init, total), default 0, as Numba does", function()
    local t = H.rand_table(1000, 1, 1000, true)
    local d = cuda.to_device(t, "int32")
    local lo, hi = math.huge, -math.huge
    for _, v in ipairs(t) do lo, hi = math.min(lo, v), math.max(hi, v) end
    local min = cuda.reduce("a < b ? a : b")
    same(0, min(d), "min of positive data with init 0")
    same(lo, min(d, { init = 2147483647 }), "min with a large init")
    same(lo, cuda.reduce("a < b ? a : b", { init = 2147483647 })(d), "min with the reducer's init")
    same(lo - 1, min(d, { init = lo - 1 }), "init smaller than every element")
    local neg = {}
    for i, v in ipairs(t) do neg[i] = -v end
    local dneg = cuda.to_device(neg, "float64")
    same(0.0, cuda.reduce("fmax(a, b)")(dneg), "max of negative data with init 0")
    same(-lo + 0.0, cuda.reduce("fmax(a, b)", { init = -math.huge })(dneg), "max with init -inf")
    -- the call's init takes the place of the reducer's
    local s10 = cuda.reduce("a + b", { init = 10 })
    same(cpu_sum("int32", t, 10), s10(d))
    same(cpu_sum("int32", t, -4), s10(d, { init = -4 }))
  end)

  gpu("max and min expressions match the CPU for floats and integers", function()
    for _, n in ipairs { 1, 33, 1023, 100003 } do
      local t = H.rand_table(n, -1e6, 1e6)
      local lo, hi = math.huge, -math.huge
      for _, v in ipairs(t) do lo, hi = math.min(lo, v), math.max(hi, v) end
      local d64 = cuda.to_device(t, "float64")
      same(hi, cuda.reduce("fmax(a, b)", { init = -math.huge })(d64), "fmax float64")
      same(lo, cuda.reduce("a < b ? a : b", { init = math.huge })(d64), "min float64")
      local d32 = cuda.to_device(t, "float32")
      same(C.f32(hi), cuda.reduce("fmaxf(a, b)", { init = -math.huge })(d32), "fmaxf float32")
      local ti = H.rand_table(n, -128, 127, true)
      local ilo, ihi = 127, -128
      for _, v in ipairs(ti) do ilo, ihi = math.min(ilo, v), math.max(ihi, v) end
      local d8 = cuda.to_device(ti, "int8")
      same(ihi, cuda.reduce("a > b ? a : b", { init = -128 })(d8), "max int8")
      same(ilo, cuda.reduce("a < b ? a : b", { init = 127 })(d8:slice(1)), "min int8")
    end
  end)

  gpu("keeps the order of the elements for operations that do not commute", function()
    local last, first = cuda.reduce("b"), cuda.reduce("a")
    for _, n in ipairs { 1, 2, 31, 33, 1023, 100003, (1 << 20) + 7 } do
      local t = H.rand_table(n)
      local d = cuda.to_device(t, "float64")
      same(t[n], last(d), "b: the last element of " .. n)
      same(7.5, first(d, { init = 7.5 }), "a with init: init")
      same(0.0, first(d), "a: the default init")
      if n > 2 then
        same(t[n - 1], last(d:slice(2, n - 1)), "b on an unaligned view")
        same(C.f32(t[n]), last(cuda.to_device(t, "float32"):slice(2)), "b on an unaligned float32 view")
      end
    end
  end)

  gpu("commuting expressions (a + b, b + a, a * b, bitwise) fold each lane's elements first: CPU folds agree", function()
    -- these take the kernel whose lanes fold their own columns; "(a + b)" takes the ordered one
    local function fold(t, f, first, last)
      local s = t[first]
      for i = first + 1, last do s = f(s, t[i]) end
      return s
    end
    local ops = {
      { "b + a", "int32", function(a, b) return wrap("int32", a + b) end, 0 },
      { "a * b", "uint32", function(a, b) return (a * b) & 0xffffffff end, 1 }, -- wraps, as C does
      { "a*b", "float64", function(a, b) return a * b end, 1 },
      { "a ^ b", "int64", function(a, b) return a ~ b end, 0 },
      { "b | a", "uint32", function(a, b) return a | b end, 0 },
      { "a & b", "int16", function(a, b) return a & b end, -1 },
    }
    for _, o in ipairs(ops) do
      local expr, dt, f, init = o[1], o[2], o[3], o[4]
      local r = cuda.reduce(expr, { init = init })
      for _, n in ipairs { 1, 33, 4097, 100003, (1 << 20) + 7 } do
        local t
        if dt == "float64" then -- products of +-1 and a few powers of two: exact in any order
          t = {}
          for i = 1, n do t[i] = (math.random(2) == 1 and -1.0 or 1.0) * (i % 5000 == 0 and 2.0 or 1.0) end
        else
          local lo, hi = table.unpack(dt == "int16" and { -30000, 30000 } or RANGE[dt] or { -(1 << 40), 1 << 40 })
          t = H.rand_table(n, lo, hi, true)
          if expr:find("*", 1, true) then for i = 1, n do t[i] = (t[i] % 3) * 2 + 1 end end -- odd: a product that is not 0
        end
        local d = cuda.to_device(t, dt)
        local what = ("%s on %s[%d]"):format(expr, dt, n)
        local want = f(init, fold(t, f, 1, n))
        if dt == "float64" then want = want + 0.0 end
        same(want, r(d), what)
        if n > 2 then same(f(init, fold(t, f, 2, n - 1)), r(d:slice(2, n - 1)), what .. ", unaligned view") end
      end
    end
    -- the same data through both kernels: integer sums agree exactly
    local t = H.rand_table((1 << 20) + 7, -(1 << 40), 1 << 40, true)
    local d = cuda.to_device(t, "int64")
    same(cuda.reduce("(a + b)")(d), cuda.reduce("a + b")(d), "ordered and commuting int64 sums")
  end)

  gpu("the body form takes statements and a preamble: composing affine maps in order", function()
    -- x -> m*x + c (mod P) packed as m << 32 | c; op(a, b) applies a, then b: associative, not
    -- commutative, so any reordering of the elements changes the result
    local P = 1000003
    local compose = cuda.reduce {
      preamble = "__device__ __forceinline__ long long modulus() { return 1000003LL; }",
      body = [[
        long long P = modulus();
        long long ma = a >> 32, ca = a & 0xffffffffLL, mb = b >> 32, cb = b & 0xffffffffLL;
        return (((mb * ma) % P) << 32) | ((mb * ca + cb) % P);]],
    }
    local function op(a, b)
      local ma, ca, mb, cb = a >> 32, a & 0xffffffff, b >> 32, b & 0xffffffff
      return (((mb * ma) % P) << 32) | ((mb * ca + cb) % P)
    end
    local ID = 1 << 32 -- x -> x
    for _, n in ipairs { 1, 2, 33, 1023, 100003, (1 << 20) + 7 } do
      local t = {}
      for i = 1, n do t[i] = (math.random(1, P - 1) << 32) | math.random(0, P - 1) end
      local acc = t[1]
      for i = 2, n do acc = op(acc, t[i]) end
      local d = cuda.to_device(t, "int64")
      same(op(ID, acc), compose(d, { init = ID }), "compose " .. n)
      same(op(0, acc), compose(d), "compose with init 0: " .. n) -- the constant part only
      if n > 2 then
        local part = t[2]
        for i = 3, n do part = op(part, t[i]) end
        same(part, compose(d:slice(2), { init = ID }), "compose an unaligned view of " .. n)
      end
    end
  end)

  gpu("leaves the result in res and returns res, for device, pinned, mapped and managed res", function()
    for _, n in ipairs { 1, 1023, (1 << 20) + 7 } do
      local t = data("float64", n)
      local d = cuda.to_device(t, "float64")
      local r = cuda.device_array(3, "float64")
      r:fill(-1.5)
      assert.equal(r, sum(d, { res = r }))
      assert.same({ cpu_sum("float64", t), -1.5, -1.5 }, host_of(r))
      assert.equal(r, sum(d, { res = r, init = 2 }))
      same(cpu_sum("float64", t, 2), r[1])
      for _, kind in ipairs { "pinned_array", "mapped_array", "managed_array" } do
        local hr = cuda[kind](1, "float64")
        assert.equal(hr, sum(d, { res = hr }))
        cuda.synchronize()
        same(cpu_sum("float64", t), hr[1], kind .. " res, " .. n)
      end
      local ri = cuda.device_array(1, "int64")
      local ti = data("int64", n)
      sum(cuda.to_device(ti, "int64"), { res = ri })
      same(cpu_sum("int64", ti), ri[1], "int64 res")
    end
    -- an empty input leaves init there
    local r = cuda.device_array(2, "float32")
    r:fill(9)
    assert.equal(r, sum(cuda.device_array(0, "float32"), { res = r, init = 4 }))
    assert.same({ 4.0, 9.0 }, host_of(r))
  end)

  gpu("runs on a stream, with and without res, and on two streams at once", function()
    local s1, s2 = cuda.stream(), cuda.stream(true)
    for _, n in ipairs { 33, 100003, (1 << 20) + 7 } do
      local t1, t2 = data("int64", n), data("int64", n)
      local d1, d2 = cuda.to_device(t1, "int64", s1), cuda.to_device(t2, "int64", s2)
      same(cpu_sum("int64", t1), sum(d1, { stream = s1 }), "stream, " .. n)
      local r1, r2 = cuda.device_array(1, "int64", s1), cuda.device_array(1, "int64", s2)
      assert.equal(r1, sum(d1, { stream = s1, res = r1 }))
      assert.equal(r2, sum(d2, { stream = s2, res = r2, init = 1 }))
      s1:synchronize()
      s2:synchronize()
      same(cpu_sum("int64", t1), r1[1], "stream 1 res, " .. n)
      same(cpu_sum("int64", t2, 1), r2[1], "stream 2 res, " .. n)
      same(cpu_sum("int64", t2), sum(cuda.array(t2, "int64"), { stream = s2 }), "host array on a stream")
    end
  end)

  gpu("never modifies its input", function()
    for _, n in ipairs { 33, (1 << 20) + 7 } do
      local t = data("float32", n)
      local a = cuda.array(t, "float32")
      local d = cuda.to_device(a)
      sum(d); sum(a); sum(d:slice(2)); cuda.reduce("b")(d); sum(d, { res = cuda.device_array(1, "float32") })
      local back = d:copy_to_host()
      for i = 1, n do
        if back[i] ~= C.f32(t[i]) or a[i] ~= C.f32(t[i]) then
          assert.equal(C.f32(t[i]), back[i], "device element " .. i)
          assert.equal(C.f32(t[i]), a[i], "host element " .. i)
        end
      end
    end
  end)

  gpu("one reducer serves several dtypes, and an empty device array gives init", function()
    local r = cuda.reduce("a + b", { init = 1 })
    for _, dt in ipairs { "float32", "int16", "float64", "uint8", "float32" } do
      local t = data(dt, 999)
      same(cpu_sum(dt, t, 1), r(cuda.to_device(t, dt)), dt)
    end
    same(1.0, r(cuda.device_array(0, "float64")))
    same(1, r(cuda.device_array(0, "int32")))
    local d = cuda.to_device(data("float64", 10), "float64")
    same(1.0, r(d:slice(11)))
  end)

  gpu("raises for an expression that does not compile, naming it and with NVRTC's message", function()
    local d = cuda.to_device(H.rand_table(100), "float32")
    local e = C.raises('cuda.reduce: the reduction "a +* b" does not compile for float32', cuda.reduce("a +* b"), d)
    assert.matches("error", e, 1, true)
    e = C.raises('cuda.reduce: the reduction "return a + ;" does not compile for float64',
                 cuda.reduce { body = "return a + ;" }, cuda.to_device(H.rand_table(10), "float64"))
    -- (NVRTC's words; on the CPU device, the host C++ compiler's)
    assert.matches(H.cpu_device and "expected primary-expression" or "expected an expression", e, 1, true)
    C.raises('the reduction "no_such_function(a, b)" does not compile for int32',
             cuda.reduce("no_such_function(a, b)"), cuda.to_device(H.rand_table(10, 1, 9, true), "int32"))
    -- reducers that compile still work
    local t = H.rand_table(100, -50, 50, true)
    same(cpu_sum("float32", t), sum(cuda.to_device(t, "float32")))
  end)

  gpu("rejects res arrays of the wrong kind on the GPU", function()
    local d = cuda.to_device(H.rand_table(100), "float32")
    C.raises("reduce: res has dtype int32, the input float32", sum, d, { res = cuda.device_array(1, "int32") })
    C.raises("reduce: res is empty", sum, d, { res = cuda.device_array(0, "float32") })
    C.raises("reduce: res is empty", sum, d, { res = cuda.device_array(4, "float32"):slice(5) })
  end)

  gpu("leaks no globals", function()
    -- BUG: reduce.lua's kernels() assigns `ks` without `local`: a global appears after the
    -- first reduction of a dtype
    local G = debug.getregistry()[2] -- the global table the Lua parts run in
    cuda.reduce("a * b")(cuda.to_device(H.rand_table(10, 1, 3, true), "int16"))
    assert.is_nil(rawget(G, "ks"))
  end)
end)
