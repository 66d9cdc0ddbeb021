-- Reductions along axes (issue 31, part 2): cuda.reduction (CuPy's ReductionKernel) and
-- cuda.reduce(expr) with {axis =}, on contiguous arrays and strided views, against sums
-- computed here on random data. Carried over from CuPy: the L2 norm ReductionKernel of its
-- user guide ("T x", "T y", "x * x", "a + b", "y = sqrt(a)", "0", used with axis=1) and
-- cupy_tests/core_tests/test_userkernel.py / test_reduction.py (sum along each axis and along
-- lists of axes, keepdims shapes, an axis of extent 0 giving the identity); elementwise's raw
-- arguments and index from CuPy's ElementwiseKernel (raw T, i).
local H = require "spec.helper"
local C = require "spec.check"
local cuda = H.cuda
local gpu = H.gpu(it, pending)

local function random_array(shape, dtype, seed, lo, hi)
  math.randomseed(seed)
  local a = cuda.zeros(shape, dtype)
  for i = 1, #a do a[i] = math.random(lo or -1000, hi or 1000) end
  return a
end

-- the CPU's fold of f over the axes in `fold` (1-based set) of host array h: a table keyed by
-- the kept index string, and the kept shape
local function cpu_fold(h, fold, f, init)
  local shape, res = h.shape, {}
  local idx = {}
  for d = 1, #shape do idx[d] = 1 end
  for _ = 1, #h do
    local key = {}
    for d = 1, #shape do if not fold[d] then key[#key + 1] = idx[d] end end
    local k = table.concat(key, ",")
    res[k] = f(res[k] == nil and init or res[k], h:get(table.unpack(idx)))
    for d = #shape, 1, -1 do
      idx[d] = idx[d] + 1
      if idx[d] <= shape[d] then break end
      idx[d] = 1
    end
  end
  return res
end

-- compares result array r (contiguous, the kept axes in order) with the CPU's table
local function compare(r, want, tol)
  local h = r:copy_to_host()
  local shape = h.shape
  local idx = {}
  for d = 1, #shape do idx[d] = 1 end
  for _ = 1, #h do
    local key = {}
    for d = 1, #shape do if shape[d] ~= 1 or #shape == 1 then key[#key + 1] = idx[d] end end
    local k = table.concat(key, ",")
    local got, exp = h:get(table.unpack(idx)), want[k]
    if exp == nil and #h == 1 then exp = want[""] end
    if math.abs(got - exp) > (tol or 0) * math.max(1, math.abs(exp)) then
      error(("result {%s}: %s, the CPU %s"):format(table.concat(idx, ", "), tostring(got), tostring(exp)))
    end
    for d = #shape, 1, -1 do
      idx[d] = idx[d] + 1
      if idx[d] <= shape[d] then break end
      idx[d] = 1
    end
  end
end

local function add(a, b) return a + b end

describe("cuda.reduction", function()
  it("refuses what it cannot build, naming itself", function()
    C.raises("cuda.reduction: parameter name a is the reduction's own", cuda.reduction, "float32 a", "float32 y", "a", "a + b", "y = a", "0")
    C.raises("cuda.reduction: give at least one output parameter", cuda.reduction, "float32 x", "", "x", "a + b", "y = a", "0")
    C.raises("cuda.reduction: reduce_expr must be a string of CUDA C++, got nil", cuda.reduction, "float32 x", "float32 y", "x")
    C.raises("cuda.reduction: identity must be a string of CUDA C++, got an empty one", cuda.reduction, "float32 x", "float32 y", "x", "a + b", "y = a", " ")
    C.raises("cuda.reduction: input x: raw parameters are elementwise's", cuda.reduction, "raw float32 x", "float32 y", "x", "a + b", "y = a", "0")
    C.raises("cuda.reduction: reduce_type: unknown dtype float7", cuda.reduction, "float32 x", "float32 y", "x", "a + b", "y = a", "0", { reduce_type = "float7" })
    C.raises("cuda.reduction: takes at most 7 arguments, got 8", cuda.reduction, "float32 x", "float32 y", "x", "a + b", "y = a", "0", "n", 1)
  end)

  gpu("the L2 norm of CuPy's user guide, along each axis (float32, float64)", function()
    for k, dt in ipairs({ "float32", "float64" }) do
      -- (CuPy's "T x" is a type placeholder; cudalua's parameters name their dtype)
      local l2 = cuda.reduction(dt .. " x", dt .. " y", "x * x", "a + b", "y = sqrt(a)", "0", "l2norm")
      local h = random_array({ 37, 300 }, dt, 40 + k, -50, 50)
      local d = cuda.to_device(h)
      for axis = 1, 2 do
        local sq = cpu_fold(h, { [axis] = true }, function(s, x) return s + x * x end, 0)
        for key, v in pairs(sq) do sq[key] = math.sqrt(v) end
        compare(l2(d, { axis = axis }), sq, dt == "float32" and 1e-5 or 1e-12)
      end
    end
  end)

  gpu("integer sums along every axis and list of axes of a 3-D array, exact; keepdims", function()
    local sum = cuda.reduction("int64 x", "int64 y", "x", "a + b", "y = a", "0", "sum")
    local h = random_array({ 7, 9, 11 }, "int64", 50)
    local d = cuda.to_device(h)
    for _, axes in ipairs({ { 1 }, { 2 }, { 3 }, { 1, 2 }, { 1, 3 }, { 2, 3 }, { 3, 1 }, { 1, 2, 3 }, { -1 } }) do
      local fold = {}
      for _, a in ipairs(axes) do fold[a < 0 and a + 4 or a] = true end
      local want = cpu_fold(h, fold, add, 0)
      local r = sum(d, { axis = #axes == 1 and axes[1] or axes })
      compare(r, want, 0)
      local kd = sum(d, { axis = axes, keepdims = true })
      for dd = 1, 3 do assert.equal(fold[dd] and 1 or h.shape[dd], kd.shape[dd]) end
    end
    local all = sum(d)
    assert.same({ 1 }, all.shape)
    compare(all, cpu_fold(h, { true, true, true }, add, 0), 0)
    -- rows enough for a warp per row on every multiprocessor (the warp-per-output kernel)
    local sms = cuda.devices()[1].multiprocessors
    local tall = random_array({ sms * 32 + 5, 70 }, "int64", 51)
    compare(sum(cuda.to_device(tall), { axis = 2 }), cpu_fold(tall, { [2] = true }, add, 0), 0)
    compare(sum(cuda.to_device(tall), { axis = 1 }), cpu_fold(tall, { [1] = true }, add, 0), 0)
  end)

  gpu("strided views in: a transpose, a stepped block, a column (the layouts pick the block's shape)", function()
    local mean = cuda.reduction("float64 x", "float64 y", "x", "a + b", "y = a / _count", "0", "mean")
    local h = random_array({ 64, 48 }, "float64", 60)
    local d = cuda.to_device(h)
    local hv = h:T()
    for axis = 1, 2 do
      local want = cpu_fold(hv, { [axis] = true }, add, 0)
      for key, v in pairs(want) do want[key] = v / hv.shape[axis] end
      compare(mean(d:T(), { axis = axis }), want, 1e-12)
    end
    local blk = d:sub({ 3, 64, 5 }, { 2, 48, 3 })
    local hb = blk:copy_to_host()
    for axis = 1, 2 do
      local want = cpu_fold(hb, { [axis] = true }, add, 0)
      for key, v in pairs(want) do want[key] = v / hb.shape[axis] end
      compare(mean(blk, { axis = axis }), want, 1e-12)
    end
    local col = d:sub(nil, 7)
    local s = 0
    for i = 1, 64 do s = s + h:get(i, 7) end
    assert.near(s / 64, mean(col):copy_to_host()[1], 1e-12)
  end)

  gpu("several inputs, a broadcast number, a wider fold type, complex values, a stream and an out array", function()
    local h1, h2 = random_array({ 20, 30 }, "float32", 70, -9, 9), random_array({ 20, 30 }, "float32", 71, -9, 9)
    local dot = cuda.reduction("float32 x, float32 w, float32 c", "float64 y", "(double)x * w * c", "a + b", "y = a", "0",
      { name = "dot", reduce_type = "float64" })
    local s = cuda.stream()
    local out = cuda.device_array(20, "float64")
    local r = dot(cuda.to_device(h1), cuda.to_device(h2), 0.5, { axis = 2, out = out, stream = s })
    assert.equal(out, r)
    s:synchronize()
    local got = out:copy_to_host()
    for i = 1, 20 do
      local want = 0
      for j = 1, 30 do want = want + h1:get(i, j) * h2:get(i, j) * 0.5 end
      assert.near(want, got[i], 1e-9)
    end
    local zc = cuda.zeros({ 6, 5 }, "complex128")
    math.randomseed(72)
    for i = 1, #zc do zc[i] = { math.random(-9, 9), math.random(-9, 9) } end
    local csum = cuda.reduction("complex128 z", "complex128 y", "z", "a + b", "y = a", "0", "csum")
    local cr = csum(cuda.to_device(zc), { axis = 1 }):copy_to_host()
    for j = 1, 5 do
      local re, im = 0, 0
      for i = 1, 6 do local v = zc:get(i, j); re, im = re + v[1], im + v[2] end
      assert.same({ re, im }, cr:get(j))
    end
  end)

  gpu("an axis of extent 0 gives the identity through post_map; kept axes of extent 0 give nothing", function()
    local sum = cuda.reduction("float32 x", "float32 y", "x", "a + b", "y = a + 1", "0", "sum1")
    local d = cuda.device_array({ 4, 0 }, "float32")
    assert.same({ 1, 1, 1, 1 }, sum(d, { axis = 2 }):copy_to_host():totable())
    assert.same({ 0 }, sum(d, { axis = 1 }).shape)
  end)

  gpu("misuse of a call names the reduction and what is wrong", function()
    local sum = cuda.reduction("float32 x, float32 w", "float32 y", "x * w", "a + b", "y = a", "0", "wsum")
    local d = cuda.device_array({ 3, 4 }, "float32")
    d:fill(1)
    C.raises("reduction 'wsum': axis 3 out of range (1..2, or -1..-2)", sum, d, d, { axis = 3 })
    C.raises("reduction 'wsum': axis 0 out of range", sum, d, d, { axis = 0 })
    C.raises("reduction 'wsum': axis -1 is named twice", sum, d, d, { axis = { 2, -1 } })
    C.raises("reduction 'wsum': input w has shape {4, 3}, x has {3, 4}", sum, d, d:T(), { axis = 1 })
    C.raises("reduction 'wsum': output y has 4 elements, the result 3", sum, d, d, { axis = 2, out = cuda.device_array(4, "float32") })
    C.raises("reduction 'wsum': output y is a strided view", sum, d, d, { axis = 2, out = cuda.device_array({ 3, 2 }, "float32"):sub(nil, 1) })
    C.raises("reduction 'wsum': input x is a pageable host array", sum, cuda.zeros({ 3, 4 }, "float32"), d)
    C.raises("reduction 'wsum': input w is float64, the parameter float32", sum, d, cuda.device_array({ 3, 4 }, "float64"))
    C.raises("reduction 'wsum': 1 inputs given, it takes 2 (w)", sum, d)
    C.raises("reduction 'wsum': unknown option 'axes'", sum, d, d, { axes = 1 })
    local bad = cuda.reduction("float32 x", "float32 y", "x", "a +* b", "y = a", "0", "bad")
    C.raises("reduction 'bad': its code does not compile", bad, d)
    assert.same({ 4, 4, 4 }, sum(d, d, { axis = 2 }):copy_to_host():totable())
  end)
end)

describe("cuda.reduction and cuda.reduce errors", function()
  gpu("point at the caller's line: the constructor, a call's options and outputs, a code that does not compile", function()
    local d = cuda.device_array({ 3, 4 }, "float32")
    local r = cuda.reduction("float32 x", "float32 y", "x", "a + b", "y = a", "0", "at")
    local bad = cuda.reduction("float32 x", "float32 y", "x", "a +* b", "y = a", "0", "bad_at")
    local s = cuda.reduce("a + b")
    local function line_of(f)
      local ok, e = pcall(f)
      assert.is_false(ok)
      return tonumber(tostring(e):match("50%-reduction_spec%.lua:(%d+):"))
    end
    local here = debug.getinfo(1, "l").currentline
    assert.equal(here + 1, line_of(function() cuda.reduction("float32 x", "", "x", "a + b", "y = a", "0") end))
    assert.equal(here + 2, line_of(function() r(d, { axis = 5 }) end))
    assert.equal(here + 3, line_of(function() r(d, { axis = 2, out = cuda.device_array(7, "float32") }) end))
    assert.equal(here + 4, line_of(function() bad(d) end))
    assert.equal(here + 5, line_of(function() s(d, { axis = 5 }) end))
    assert.equal(here + 6, line_of(function() s(d, { axis = 2, res = cuda.device_array(7, "float32") }) end))
  end)
end)

describe("cuda.reduce along axes", function()
  gpu("{axis =} gives an array; init starts each result; a strided view's whole reduction", function()
    local h = random_array({ 12, 17 }, "int32", 80)
    local d = cuda.to_device(h)
    local mx = cuda.reduce("max(a, b)")
    local want = cpu_fold(h, { [1] = true }, math.max, -100000)
    compare(mx(d, { axis = 1, init = -100000 }), want, 0)
    local plus = cuda.reduce("a + b")
    compare(plus(d, { axis = 2, init = 5 }), cpu_fold(h, { [2] = true }, add, 5), 0)
    local total = 0
    for i = 1, #h do total = total + h[i] end
    assert.equal(total, plus(d:T()))
    local sub = d:sub({ 1, 12, 2 })
    local s = 0
    for i = 1, 12, 2 do for j = 1, 17 do s = s + h:get(i, j) end end
    assert.equal(s, plus(sub))
    local body = cuda.reduce({ body = "return a > b ? a : b;" })
    compare(body(d, { axis = { 1, 2 }, init = -100000 }), { [""] = math.max(table.unpack((function()
      local t = {} for i = 1, #h do t[i] = h[i] end return t end)())) }, 0)
    C.raises("cuda.reduce: res with a strided view: give axis", plus, d:T(), { res = cuda.device_array(1, "int32") })
  end)
end)

describe("elementwise raw inputs and _i", function()
  gpu("the tutorial's normalize: rows divided by their norms, no hand-written kernel", function()
    local h = random_array({ 9, 130 }, "float32", 90, 1, 100)
    local d = cuda.to_device(h)
    local norm = cuda.reduction("float32 x", "float32 y", "x * x", "a + b", "y = sqrtf(a)", "0", "l2")
    local div = cuda.elementwise("float32 x, raw float32 n, int64 cols", "float32 y", "y = x / n[_i / cols]", "rowdiv")
    local out = div(d, norm(d, { axis = 2 }), 130):copy_to_host()
    for i = 1, 9 do
      local s = 0
      for j = 1, 130 do s = s + h:get(i, j) ^ 2 end
      for j = 1, 130 do assert.near(h:get(i, j) / math.sqrt(s), out:get(i, j), 1e-6) end
    end
    C.raises("elementwise 'rowdiv': raw input n is float64, the parameter float32", div, d, cuda.device_array(9, "float64"), 130)
    C.raises("cuda.elementwise: output y: raw outputs are not supported", cuda.elementwise, "float32 x", "raw float32 y", "y[0] = x")
  end)
end)
