-- cuda.elementwise (lua/cudalua/elementwise.lua): CuPy's ElementwiseKernel, checked against the
-- CPU on random data, for every dtype, with scalars broadcast, outputs given or made, streams,
-- the vector path and the scalar one (a slice whose pointer is not 16-byte aligned).
local H = require "spec.helper"
local C = require "spec.check"
local cuda = H.cuda
local gpu = H.gpu(it, pending)

local f32 = C.f32

describe("cuda.elementwise", function()
  it("reads its parameters and refuses bad ones, naming them", function()
    local ew = cuda.elementwise("float32 x, float32 y, float32 a", "float32 z", "z = a * x + y", "saxpy")
    assert.matches("cudalua.elementwise<saxpy>", tostring(ew), 1, true)
    C.raises("cuda.elementwise: parameter x is named twice", cuda.elementwise, "float32 x, int32 x", "float32 z", "z = x")
    C.raises('cuda.elementwise: parameter z: unknown dtype "floatx"', cuda.elementwise, "float32 x", "floatx z", "z = x")
    C.raises("cuda.elementwise: x is both an input and an output", cuda.elementwise, "float32 x", "float32 x", "x = 1")
    C.raises("cuda.elementwise: parameter name _cl_n is reserved", cuda.elementwise, "float32 _cl_n", "float32 z", "z = 1")
    C.raises('cuda.elementwise: cannot read parameter "float32"', cuda.elementwise, "float32", "float32 z", "z = 1")
    C.raises("cuda.elementwise: give at least one output parameter", cuda.elementwise, "float32 x", "", "x")
    C.raises("cuda.elementwise: the body must be a string of C++ statements", cuda.elementwise, "float32 x", "float32 z", "  ")
    C.raises("cuda.elementwise: parameters must be a string", cuda.elementwise, 5, "float32 z", "z = 1")
    C.raises("elementwise 'saxpy': expected 3 inputs (and optionally 1 outputs), got 1 arguments", ew, cuda.array({ 1 }, "float32"))
    C.raises("elementwise 'saxpy': input x must be a number or an array, got string", ew, "1", 2, 3)
    C.raises("elementwise 'saxpy': no array among the inputs or outputs says how many elements", ew, 1, 2, 3)
    C.raises("elementwise 'saxpy': stream must be a cudalua stream, got number", ew, cuda.array({ 1 }, "float32"), 2, 3, { stream = 1 })
    C.raises("elementwise:precompile: expected a list of input names, got string", ew.precompile, ew, "a")
    C.raises("elementwise:precompile: scalars[2]: q is not an input of elementwise 'saxpy'", ew.precompile, ew, { "a", "q" })
  end)

  -- (issue 28: a signature's kernels compiled at once, through cuda.compile_all)
  gpu("precompiles a scalar pattern's kernels at both vector widths; the calls then compile nothing", function()
    local k = math.random(1, 1e6)   -- a source of its own: nothing from the caches
    local ew = cuda.elementwise("float32 x, float32 y, float32 a", "float32 z", ("z = a * x + y + %d * 0.0f"):format(k), "pre")
    assert.equal(ew, ew:precompile { "a" })
    local stats = cuda.compile_stats()
    local n = 1 << 15
    local tx, ty = H.rand_table(n + 1), H.rand_table(n + 1)
    local x, y = cuda.to_device(cuda.array(tx, "float32")), cuda.to_device(cuda.array(ty, "float32"))
    local a = f32(math.random() * 4 - 2)
    local wide = ew(x, y, a):copy_to_host()                                     -- vector loads
    local one = ew(x:slice(2, n + 1), y:slice(2, n + 1), a):copy_to_host()       -- one at a time
    for i = 1, n do
      local want = f32(f32(a * f32(tx[i])) + f32(ty[i]))
      assert(math.abs(wide[i] - want) <= 1e-5 * math.max(1, math.abs(want)), ("element %d: %s, CPU %s"):format(i, wide[i], want))
      want = f32(f32(a * f32(tx[i + 1])) + f32(ty[i + 1]))
      assert(math.abs(one[i] - want) <= 1e-5 * math.max(1, math.abs(want)), ("offset %d: %s, CPU %s"):format(i, one[i], want))
    end
    assert.same(stats, cuda.compile_stats())
    -- another pattern (every input an array) is still compiled at its first call
    ew(x, y, cuda.to_device(cuda.array(ty, "float32")))
    assert.is_true(cuda.compile_stats().nvrtc_runs > stats.nvrtc_runs)
    local bad = cuda.elementwise("float32 x", "float32 z", "z = nosuch3(x)", "bad")
    C.raises("elementwise:precompile: the code of elementwise 'bad' does not compile", bad.precompile, bad)
  end)

  gpu("computes saxpy like the CPU, with the output made or given, on a stream", function()
    local n = 100003
    local tx, ty = H.rand_table(n), H.rand_table(n)
    local a = f32(math.random() * 4 - 2)
    local x, y = cuda.to_device(cuda.array(tx, "float32")), cuda.to_device(cuda.array(ty, "float32"))
    local ew = cuda.elementwise("float32 x, float32 y, float32 a", "float32 z", "z = a * x + y")
    local z = ew(x, y, a)
    assert.equal("device_array", z.kind)
    assert.equal(n, #z)
    local h = z:copy_to_host()
    local s = cuda.stream()
    local z2 = cuda.device_array(n, "float32")
    assert.equal(z2, ew(x, y, a, z2, { stream = s }))
    s:synchronize()
    local h2 = z2:copy_to_host()
    for i = 1, n do
      local want = f32(f32(a * f32(tx[i])) + f32(ty[i]))
      assert(math.abs(h[i] - want) <= 1e-5 * math.max(1, math.abs(want)), ("element %d: %s, CPU %s"):format(i, h[i], want))
      assert.equal(h[i], h2[i])
    end
  end)

  gpu("takes every dtype, and two outputs", function()
    for _, dt in ipairs { "float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64" } do
      local n = 5000 + math.random(0, 100)
      local lo, hi = 1, (dt:match("8$") and 50 or 1000)   -- doubled, still in range
      local t = H.rand_table(n, lo, hi, true)
      local x = cuda.to_device(cuda.array(t, dt))
      local body = dt == "float16" and "y = __hadd(x, x); c = __half2float(x) > 100.0f"
        or "y = x + x; c = x > 100"
      local ew = cuda.elementwise(dt .. " x", dt .. " y, bool c", body, "double_" .. dt)
      local y, c = ew(x)
      local hy, hc = y:copy_to_host(), c:copy_to_host()
      for i = 1, n do
        assert.equal(t[i] * 2, hy[i], dt .. " element " .. i)
        assert.equal(t[i] > 100, hc[i], dt .. " flag " .. i)
      end
    end
  end)

  it("writes sources NVRTC compiles for bfloat16 and complex, vector path and scalar one", function()
    local ew = require "cudalua.elementwise"
    for _, dt in ipairs { "bfloat16", "complex64", "complex128" } do
      local d = cuda.dtype(dt)
      for _, w in ipairs { 1, 16 // d.itemsize } do
        local src = ew.source({ { dtype = d, name = "x" }, { dtype = d, name = "a", scalar = true } },
          { { dtype = d, name = "z" } }, "z = a * x + x", w)
        local ok, err = pcall(cuda.compile, src, { arch = "sm_90" })
        assert(ok, dt .. " w=" .. w .. ": " .. tostring(err))
      end
    end
    local pair = cuda.elementwise("complex64 x, complex64 a", "complex64 z", "z = a * x", "cmul")
    C.raises("elementwise 'cmul': input x must be a number, a pair {re, im} or an array, got string", pair, "1", { 1, 2 })
  end)

  gpu("takes bfloat16, and complex64/complex128 with scalars as pairs or numbers", function()
    local n = 20000 + math.random(0, 100)
    -- bfloat16: small integers, so that every product and sum is exact in 8 bits
    local tx, ty = H.rand_table(n, -15, 15, true), H.rand_table(n, -15, 15, true)
    local a = math.random(-4, 4)
    local bx, by = cuda.to_device(cuda.array(tx, "bfloat16")), cuda.to_device(cuda.array(ty, "bfloat16"))
    local axpy = cuda.elementwise("bfloat16 x, bfloat16 y, bfloat16 a", "bfloat16 z", "z = a * x + y", "bf16_axpy")
    local hz = axpy(bx, by, a):copy_to_host()
    for i = 1, n do assert.equal(a * tx[i] + ty[i], hz[i], "bfloat16 element " .. i) end
    -- complex: z = a * x + y and m = |z|^2, integers again for complex64 (exact in float32)
    for _, dt in ipairs { "complex64", "complex128" } do
      local exact = dt == "complex64"
      local function r() return exact and math.random(-20, 20) or math.random() * 40 - 20 end
      local x, y = {}, {}
      for i = 1, n do x[i], y[i] = { r(), r() }, { r(), r() } end
      local ca = { r(), r() }
      local dx, dy = cuda.to_device(cuda.array(x, dt)), cuda.to_device(cuda.array(y, dt))
      local k = cuda.elementwise(dt .. " x, " .. dt .. " y, " .. dt .. " a", dt .. " z, float64 m",
        "z = a * x + y; m = cuda::std::norm(z)", "c_axpy")
      for _, scalar in ipairs { ca, ca[1] } do   -- a pair, or a number: {number, 0}
        local sa = type(scalar) == "table" and scalar or { scalar, 0 }
        local z, m = k(dx, dy, scalar, { stream = cuda.stream() })
        local hzc, hm = z:copy_to_host(), m:copy_to_host()
        for i = 1, n do
          local re = sa[1] * x[i][1] - sa[2] * x[i][2] + y[i][1]
          local im = sa[1] * x[i][2] + sa[2] * x[i][1] + y[i][2]
          local got = hzc[i]
          if exact then
            assert.same({ re, im }, got, dt .. " element " .. i)
            assert.equal(re * re + im * im, hm[i], dt .. " norm " .. i)
          else
            assert.is_true(math.abs(got[1] - re) < 1e-12 and math.abs(got[2] - im) < 1e-12, dt .. " element " .. i)
            assert.is_true(math.abs(hm[i] - (re * re + im * im)) < 1e-9, dt .. " norm " .. i)
          end
        end
      end
      C.raises("elementwise 'c_axpy': input y is float32, the parameter " .. dt, k, dx, cuda.device_array(n, "float32"), 1)
    end
  end)

  gpu("gives the same answer through the vector path and the scalar one", function()
    local n = 1 << 16
    local t = H.rand_table(n + 1)
    local whole = cuda.to_device(cuda.array(t, "float32"))
    local ew = cuda.elementwise("float32 x, float32 b", "float32 z", "z = x * x - b")
    local b = f32(math.random())
    local aligned = ew(whole, b):copy_to_host()                    -- 16-byte aligned: vector loads
    local off = ew(whole:slice(2, n + 1), b):copy_to_host()        -- 4 bytes in: one element at a time
    for i = 1, n do
      assert.equal(f32(f32(t[i]) * f32(t[i]) - b), aligned[i], "aligned " .. i)
      assert.equal(f32(f32(t[i + 1]) * f32(t[i + 1]) - b), off[i], "offset " .. i)
    end
  end)

  gpu("refuses arrays of another dtype or size, naming the parameter", function()
    local ew = cuda.elementwise("float32 x, float32 y", "float32 z", "z = x + y", "add")
    local a, b = cuda.device_array(10, "float32"), cuda.device_array(11, "float32")
    C.raises("elementwise 'add': input y has 11 elements, x has 10", ew, a, b)
    C.raises("elementwise 'add': input y is float64, the parameter float32", ew, a, cuda.device_array(10, "float64"))
    C.raises("elementwise 'add': output z has 11 elements, x has 10", ew, a, a, b)
    C.raises("elementwise 'add': unknown option 'grid' (block, stream)", ew, a, a, { grid = 1 })
    C.raises("elementwise 'add': block must be an integer from 1 to 1024", ew, a, a, { block = 2048 })
    C.raises("elementwise 'add': its code does not compile: cuda.compile: add.cu failed", cuda.elementwise("float32 x", "float32 z", "z = nosuch(x)", "add"), a)
    -- the message names the line of the call
    local bad = cuda.elementwise("float32 x", "float32 z", "z = nosuch2(x)", "add")
    local ok, e = pcall(function() local r = bad(a); return r end)
    assert.is_false(ok)
    assert.matches("25%-elementwise_spec%.lua:%d+: cudalua: elementwise 'add': its code does not compile", e)
  end)
end)
