-- Strided views (issue 31, part 1): a:sub on any axis with a step, a:transpose / a:T,
-- a:squeeze, a.strides, a:is_contiguous, a:copy; copies, fills and element access through
-- them; the CUDA Array Interface's strides both ways; what needs a contiguous array says so.
-- Facts carried over from Numba's tests (numba/cuda/tests/cudadrv/test_cuda_ndarray.py:
-- test_devicearray_transpose_T, arange(12) as {3, 4}; test_contigous_3d, arange(20) as
-- {2, 5, 2} is C-contiguous and its Fortran-order twin is not; cudapy/test_transpose.py's
-- shapes {5, 6} float64, {128, 128} complex128, {1025, 512} float64) and CuPy's
-- (cupy_tests/core_tests/test_ndarray_copy_and_view.py: a transposed array's copy is
-- C-contiguous with the values of the transpose); the data are random, the expected values
-- computed here on the CPU.
local H = require "spec.helper"
local C = require "spec.check"
local cuda = H.cuda
local gpu = H.gpu(it, pending)

-- a host array of shape with random values (integers, so every dtype holds them exactly)
local function random_array(shape, dtype, seed)
  math.randomseed(seed)
  local a = cuda.zeros(shape, dtype)
  for i = 1, #a do a[i] = math.random(-1000, 1000) end
  return a
end

-- the row-major index list of a shape
local function each_index(shape, fn)
  local idx = {}
  for d = 1, #shape do idx[d] = 1 end
  local n = 1
  for d = 1, #shape do n = n * shape[d] end
  for _ = 1, n do
    fn(idx)
    for d = #shape, 1, -1 do
      idx[d] = idx[d] + 1
      if idx[d] <= shape[d] then break end
      idx[d] = 1
    end
  end
end

local function get(a, idx) return a:get(table.unpack(idx)) end

-- the expected element of a selection: sel per axis as a:sub takes it, idx of the view
local function source_index(shape, sel, idx)
  local out, k = {}, 1
  for d = 1, #shape do
    local s = sel[d]
    if s == nil or s == true then out[d] = idx[k]; k = k + 1
    elseif type(s) == "number" then out[d] = s < 0 and s + shape[d] + 1 or s
    else
      local first = s[1] or 1
      if first < 0 then first = first + shape[d] + 1 end
      out[d] = first + (idx[k] - 1) * (s[3] or 1); k = k + 1
    end
  end
  return out
end

local function assert_view(view, src, sel)
  each_index(view.shape, function(idx)
    local want = get(src, source_index(src.shape, sel, idx))
    local got = get(view, idx)
    if got ~= want then
      error(("element {%s}: %s, expected %s"):format(table.concat(idx, ", "), tostring(got), tostring(want)))
    end
  end)
end

describe("strided views", function()
  it("a:T and a:transpose permute shape and strides (Numba's test_devicearray_transpose_T)", function()
    local a = cuda.array({ { 0, 1, 2, 3 }, { 4, 5, 6, 7 }, { 8, 9, 10, 11 } }, "int64")
    assert.same({ 32, 8 }, a.strides)
    assert.is_true(a:is_contiguous())
    local t = a:T()
    assert.same({ 4, 3 }, t.shape)
    assert.same({ 8, 32 }, t.strides)
    assert.is_false(t:is_contiguous())
    each_index(t.shape, function(idx) assert.equal(a:get(idx[2], idx[1]), t:get(idx[1], idx[2])) end)
    local r = random_array({ 2, 3, 4 }, "float32", 11)
    local p = r:transpose({ 3, 1, 2 })
    assert.same({ 4, 2, 3 }, p.shape)
    assert.same({ 4, 48, 16 }, p.strides)
    each_index(p.shape, function(i) assert.equal(r:get(i[2], i[3], i[1]), p:get(i[1], i[2], i[3])) end)
    assert.same(r:totable(), r:transpose({ 1, 2, 3 }):totable())
  end)

  it("is_contiguous follows NumPy's rule (Numba's test_contigous_3d)", function()
    local c = cuda.zeros({ 2, 5, 2 }, "int64")
    assert.is_true(c:is_contiguous())
    assert.is_false(c:T():is_contiguous())          -- the Fortran-order twin's layout
    assert.is_true(c:sub(2):is_contiguous())         -- one index of the first axis
    assert.is_false(c:sub(nil, { 1, 5, 2 }):is_contiguous())
    assert.is_true(c:sub({ 1, 1 }, { 2, 2 }):is_contiguous())   -- extents of 1 step anyhow
    assert.is_true(cuda.zeros({ 0, 3 }, "int8"):T():is_contiguous())   -- empty
  end)

  it("a:sub takes nil, an index, or {first, last, step} per axis, negatives from the end", function()
    local a = random_array({ 5, 7, 3 }, "int32", 12)
    local sels = {
      { nil, 4 }, { { 2, 4 }, { 1, -1, 2 } }, { -1 }, { true, { -3, -1 }, { 1, 3, 2 } },
      { { 1, 5, 3 }, 7, 2 }, { { 3, 2 } }, { 2, { 2, 6, 4 } },
    }
    for _, sel in ipairs(sels) do
      local v = a:sub(table.unpack(sel, 1, 3))
      assert_view(v, a, sel)
    end
    local v = a:sub({ 3, 2 })
    assert.same({ 0, 7, 3 }, v.shape)
    assert.equal(0, #v)
    -- a view of a view
    local w = a:sub({ 1, 5, 2 }):sub({ 2, 3 }, nil, 2)
    each_index(w.shape, function(i) assert.equal(a:get(2 * (i[1] + 1) - 1, i[2], 2), w:get(i[1], i[2])) end)
  end)

  it("a:squeeze drops the axes of extent 1", function()
    local a = random_array({ 3, 1, 4, 1 }, "float64", 13)
    local s = a:squeeze()
    assert.same({ 3, 4 }, s.shape)
    each_index(s.shape, function(i) assert.equal(a:get(i[1], 1, i[2], 1), s:get(i[1], i[2])) end)
    assert.same({ 3, 4, 1 }, a:squeeze(2).shape)
    assert.same({ 4 }, a:sub(2):squeeze().shape)
  end)

  it("element access, tostring and totable read through the strides", function()
    local a = random_array({ 4, 6 }, "int16", 14)
    local t = a:T()
    local want = {}
    for j = 1, 6 do want[j] = {} for i = 1, 4 do want[j][i] = a:get(i, j) end end
    assert.same(want, t:totable())
    assert.equal(a:get(3, 2), t[2 * 4 + 3 - 4])   -- flat index 7: row 2, column 3 of the view
    t:set(5, 2, 99)
    assert.equal(99, a:get(2, 5))
    local col = a:sub(nil, 2)
    col[3] = -7
    assert.equal(-7, a:get(3, 2))
    assert.truthy(tostring(col):find(("{%d, %d, -7, %d}"):format(a:get(1, 2), a:get(2, 2), a:get(4, 2)), 1, true))
  end)

  it("misuse names the function and what is wrong", function()
    local a = cuda.zeros({ 3, 4 }, "float32")
    C.raises("array:sub: 3 selectors for an array of 2 dimensions", a.sub, a, 1, 1, 1)
    C.raises("array:sub: axis 1: index 4 out of range (1..3)", a.sub, a, 4)
    C.raises("array:sub: axis 2: first 0 out of range (1..5)", a.sub, a, nil, { 0, 2 })
    C.raises("array:sub: axis 2: last 5 out of range (1..4)", a.sub, a, nil, { 2, 5 })
    C.raises("array:sub: axis 1: step 0 must be >= 1", a.sub, a, { 1, 3, 0 })
    C.raises("array:sub: axis 1: a selector is nil, true, an integer or {first, last, step}, got string", a.sub, a, "x")
    C.raises("array:transpose: the permutation must name each axis 1..2 once (entry 2)", a.transpose, a, { 1, 1 })
    C.raises("array:transpose: the permutation has 3 axes, the array 2", a.transpose, a, { 1, 2, 3 })
    C.raises("array:squeeze: axis 1 has extent 3, not 1", a.squeeze, a, 1)
    C.raises("array:reshape: the array is a strided view (strides {4, 16} bytes): this needs a contiguous array",
      a.reshape, a:T(), 12)
    C.raises("array:view: the array (of another item size) is a strided view", a.view, a:T(), "float64")
    assert.same({ 4, 3 }, a:T():view("int32").shape)   -- the same item size: the same strides
    local e = cuda.elementwise("float32 x", "float32 y", "y = x * 2")
    C.raises("input x is a strided view: this needs a contiguous array", e, a:T())
    C.raises("cuda.reduce: input x is a pageable host array", cuda.reduce("a + b"), a:T())
    C.raises("cuda.copy: shape mismatch ({4, 3} into {3, 4}): a copy to or from a strided view takes one shape",
      cuda.copy, cuda.zeros({ 3, 4 }, "float32"), a:T())
  end)

  it("copies between host views, and a:copy() makes a contiguous array", function()
    local a = random_array({ 6, 5 }, "float64", 15)
    local b = cuda.zeros({ 5, 6 }, "float64")
    cuda.copy(b, a:T())
    each_index(b.shape, function(i) assert.equal(a:get(i[2], i[1]), b:get(i[1], i[2])) end)
    local c = a:sub({ 2, 6, 2 }, { 1, 5, 2 }):copy()
    assert.is_true(c:is_contiguous())
    assert.same({ 3, 3 }, c.shape)
    each_index(c.shape, function(i) assert.equal(a:get(2 * i[1], 2 * i[2] - 1), c:get(i[1], i[2])) end)
    a:sub(nil, 3):fill(0.5)
    for i = 1, 6 do assert.equal(0.5, a:get(i, 3)) end
  end)

  gpu("device views copy to and from the host as 2-D and 3-D copies (Numba's test_transpose shapes)", function()
    for k, case in ipairs({ { 5, 6, "float64" }, { 128, 128, "complex128" }, { 1025, 512, "float64" } }) do
      local h = random_array({ case[2], case[1] }, case[3], 20 + k)
      local d = cuda.to_device(h)
      local t = d:T():copy_to_host()
      assert.same({ case[1], case[2] }, t.shape)
      for _ = 1, 200 do
        local i, j = math.random(case[1]), math.random(case[2])
        assert.same(h:get(j, i), t:get(i, j))
      end
    end
    local h = random_array({ 7, 9, 11 }, "int32", 30)
    local d = cuda.to_device(h)
    local sels = { { { 2, 7, 2 }, nil, { 3, 11, 4 } }, { nil, 5 }, { 3, { 2, 8 } }, { { 1, 7, 3 }, { 9, 9 } } }
    for _, sel in ipairs(sels) do
      assert_view(d:sub(table.unpack(sel, 1, 3)):copy_to_host(), h, sel)
    end
    local p = d:transpose({ 2, 3, 1 }):copy_to_host()
    each_index(p.shape, function(i) assert.equal(h:get(i[3], i[1], i[2]), p:get(i[1], i[2], i[3])) end)
    -- into a caller's array, on a stream
    local s = cuda.stream()
    local into = cuda.pinned_array({ 11, 9, 7 }, "int32")
    d:T():copy_to_host(into, s)
    s:synchronize()
    each_index(into.shape, function(i) assert.equal(h:get(i[3], i[2], i[1]), into:get(i[1], i[2], i[3])) end)
  end)

  gpu("copies into device views, cuda.copy between views, fill of a view", function()
    local h = random_array({ 8, 10 }, "float32", 31)
    local d = cuda.to_device(h)
    local col = random_array({ 8 }, "float32", 32)
    d:sub(nil, 4):copy_to_device(col)
    local blk = random_array({ 3, 5 }, "float32", 33)
    d:sub({ 2, 6, 2 }, { 1, 10, 2 }):copy_to_device(blk)
    d:sub(8, { 2, 10, 3 }):fill(-1.5)
    local e = cuda.device_array({ 10, 8 }, "float32")
    cuda.copy(e, d:T())
    local want = h:copy()
    for i = 1, 8 do want:set(i, 4, col[i]) end
    each_index({ 3, 5 }, function(i) want:set(2 * i[1], 2 * i[2] - 1, blk:get(i[1], i[2])) end)
    for j = 2, 10, 3 do want:set(8, j, -1.5) end
    local got = d:copy_to_host()
    assert.same(want:totable(), got:totable())
    local et = e:copy_to_host()
    each_index(et.shape, function(i) assert.equal(want:get(i[2], i[1]), et:get(i[1], i[2])) end)
    -- a device view's copy: a device array, contiguous
    local c = d:sub(nil, { 2, 9, 7 }):copy()
    assert.equal("device_array", c.kind)
    assert.is_true(c:is_contiguous())
    each_index(c.shape, function(i) assert.equal(want:get(i[1], 7 * i[2] - 5), c:copy_to_host():get(i[1], i[2])) end)
    -- element access on a device view
    assert.equal(want:get(5, 2), d:T():get(2, 5))
  end)

  gpu("a kernel receives a view's first element; strides are the kernel's business", function()
    local k = cuda.kernel([[
      extern "C" __global__ void scale_col(float *col, long long stride, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) col[i * stride] *= 2.0f;
      }]], "scale_col")
    local h = random_array({ 50, 6 }, "float32", 34)
    local d = cuda.to_device(h)
    local col = d:sub(nil, 5)
    k[{ 1, 64 }](col, col.strides[1] // 4, 50)
    local got = d:copy_to_host()
    for i = 1, 50 do
      for j = 1, 6 do assert.equal(j == 5 and 2 * h:get(i, j) or h:get(i, j), got:get(i, j)) end
    end
  end)

  gpu("the CUDA Array Interface gives a view's strides and takes any positive ones", function()
    local h = random_array({ 4, 6 }, "int64", 35)
    local d = cuda.to_device(h)
    local v = d:sub({ 1, 4, 2 }, { 2, 6, 2 })
    local cai = getmetatable(v).__cuda_array_interface(v)
    assert.same({ 2, 3 }, cai.shape)
    assert.same({ 96, 16 }, cai.strides)
    assert.equal(d:ptr() + 8, cai.data[1])
    -- a producer's Fortran-order array and a strided one, as a foreign object gives them
    local f = cuda.to_device(h:T():copy())   -- {6, 4}, C order: as {4, 6} in Fortran order
    local fobj = setmetatable({}, { __cuda_array_interface = {
      version = 3, data = { f:ptr(), false }, shape = { 4, 6 }, typestr = "<i8", strides = { 8, 32 } } })
    local fv = cuda.as_cuda_array(fobj)
    assert.is_false(fv:is_contiguous())
    assert.same(h:totable(), fv:copy_to_host():totable())
    local sobj = setmetatable({}, { __cuda_array_interface = cai })
    assert_view(cuda.as_cuda_array(sobj):copy_to_host(), h, { { 1, 4, 2 }, { 2, 6, 2 } })
    local bad = setmetatable({}, { __cuda_array_interface = {
      version = 3, data = { f:ptr(), false }, shape = { 4, 6 }, typestr = "<i8", strides = { -8, 32 } } })
    C.raises("cuda.as_cuda_array: strides[1] is -8: cudalua's views step forwards", cuda.as_cuda_array, bad)
    local far = setmetatable({}, { __cuda_array_interface = {
      version = 3, data = { f:ptr(), false }, shape = { 4, 6 }, typestr = "<i8", strides = { 8, 64 } } })
    C.raises("cuda.as_cuda_array: the array needs 352 bytes", cuda.as_cuda_array, far)
  end)

  gpu("graph copies take a view that is one 2-D or 3-D copy, and refuse others by name", function()
    local h = random_array({ 6, 8 }, "float32", 36)
    local d = cuda.to_device(h)
    local out = cuda.pinned_array({ 6, 3 }, "float32")
    local g = cuda.graph()
    g:memcpy(out, d:sub(nil, { 2, 4 }))   -- rows of 3 elements 32 bytes apart: one 2-D copy
    g:instantiate():launch()
    cuda.synchronize()
    each_index(out.shape, function(i) assert.equal(h:get(i[1], i[2] + 1), out:get(i[1], i[2])) end)
    C.raises("graph:memcpy: these strided views take more than one 3-D copy", g.memcpy, g,
      cuda.pinned_array({ 8, 6 }, "float32"), d:T())
    C.raises("graph:memset: the array is a strided view", g.memset, g, d:T(), 0)
  end)
end)
