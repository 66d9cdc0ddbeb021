-- Module variables (Module:get_global): tests written for CuPy, ported to cudalua. The facts
-- (the source, the variable's type and size, what the kernel computes, the launch) are CuPy's;
-- the code is ours, and every expected value is computed here on the CPU from seeded random data.
--   CuPy tests/cupy_tests/core_tests/test_raw.py (cupy/cupy): TestRaw.test_const_memory, the
--     one test there that uses RawModule.get_global (run there for each backend: NVRTC and
--     nvcc, with and without the in-memory and on-disk caches, with and without Jitify)
local H = require "spec.helper"
local C = require "spec.check"
local cuda = H.cuda
local gpu = H.gpu(it, pending)
local modules = require "cudalua.module"

before_each(function() math.randomseed(3827) end)
after_each(function() math.randomseed() end)

-- ported from cupy tests/cupy_tests/core_tests/test_raw.py test_const_mem (the source of
-- test_const_memory): a 100-float constant array scales x in place
local SRC = [[
extern "C" {
__constant__ float some_array[100];

__global__ void multiply_by_const(float *x, int N) {
  int id = threadIdx.x + blockIdx.x * blockDim.x;
  if (id < N) x[id] *= some_array[id];
}
}
]]

local function randoms(n)
  local t = {}
  for i = 1, n do t[i] = C.f32(math.random() * 200 - 100) end
  return t
end

describe("CuPy test_const_memory, without a GPU", function()
  it("its source compiles and the declaration in extern \"C\" { } is read as float32 x {100} (arch = sm_90)", function()
    local m = cuda.compile(SRC, { arch = "sm_90", cache = false })
    assert.same({ "multiply_by_const" }, m:kernels())
    assert.same({ symbol = "some_array", dtype = "float32", dims = { 100 } }, modules.fields(m).globals.some_array)
  end)
end)

-- ported from cupy tests/cupy_tests/core_tests/test_raw.py TestRaw.test_const_memory: the
-- constant array is set from a device array (CuPy's const_arr[...] = data, data a CuPy array),
-- then multiply_by_const runs on one block of 100 threads. CuPy multiplies ones, so the output
-- is the data; here x is random too and the CPU computes the float32 products.
describe("CuPy test_const_memory", function()
  -- the view as CuPy wraps the pointer, cupy.ndarray((100,), cupy.float32, mem_ptr), the
  -- data copied in, the kernel run and its output checked
  local function const_memory(view)
    assert.same({ 100 }, view.shape)
    assert.equal("float32", view.dtype.name)
    local data, x = randoms(100), randoms(100)
    cuda.copy(view, cuda.to_device(cuda.array(data, "float32")))
    local d_x = cuda.to_device(cuda.array(x, "float32"))
    return data, x, d_x
  end
  local function check(data, x, d_x)
    local got = d_x:copy_to_host()
    for i = 1, 100 do
      local want = C.f32(x[i] * data[i])   -- both float32: the double product is exact, rounded once
      assert(got[i] == want, ("element %d: %s, the CPU %s"):format(i, tostring(got[i]), tostring(want)))
    end
  end

  gpu("compiled with the cache (CuPy's in-memory and on-disk caches)", function()
    local m = cuda.compile(SRC)
    local view = m:get_global("some_array")
    local data, x, d_x = const_memory(view)
    m.multiply_by_const[{ 1, 100 }](d_x, 100)
    check(data, x, d_x)
    local back = view:copy_to_host()          -- the variable reads back as it was set
    for i = 1, 100 do assert.equal(data[i], back[i]) end
  end)

  gpu("compiled again, no cache (CuPy's clean_up: the memo cleared)", function()
    local m = cuda.compile(SRC, { cache = false })
    local data, x, d_x = const_memory(m:get_global("some_array"))
    m.multiply_by_const[{ 1, 100 }](d_x, 100)
    check(data, x, d_x)
  end)

  -- the pointer wrapped with a dtype and shape given, as CuPy's test does: here a module loaded
  -- from the cubin, whose source cudalua does not have
  H.gpuonly(it, pending, "cubins")("a module loaded from its cubin: the dtype and shape given", function()
    local m = cuda.load_module(cuda.compile(SRC):cubin())
    C.raises("module:get_global: the type of 'some_array' is not known", m.get_global, m, "some_array")
    local data, x, d_x = const_memory(m:get_global("some_array", cuda.float32, { 100 }))
    m:get("multiply_by_const", "float*, int")[{ 1, 100 }](d_x, 100)
    check(data, x, d_x)
    assert.equal(100, #m:get_global("some_array", "float32"))   -- the shape from the size
  end)
end)
