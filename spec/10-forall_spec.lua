-- k:forall(n [, {stream=, shared=}]): a launcher covering n threads whose block size comes from
-- the occupancy calculator (k:occupancy()) and whose grid is ceil(n / block), as Numba's forall.
local H = require "spec.helper"
local C = require "spec.check"
local cuda = H.cuda
local gpu = H.gpu(it, pending)
local f32 = C.f32

local SRC = [[
#include <cudalua/grid.cuh>
__device__ double round3(double x) { return round(x * 1000.0) / 1000.0; }
extern "C" __global__ void round_all(double *out, const double *x, long long n) {
  long long i = grid(1);
  if (i < n) out[i] = round3(x[i]);
}
// the launch configuration as the kernel sees it, and one count per covered index
extern "C" __global__ void shape(long long *cfg, unsigned long long *hits, long long n) {
  long long i = grid(1);
  if (i == 0) { cfg[0] = gridDim.x; cfg[1] = blockDim.x; cfg[2] = gridDim.y * gridDim.z * blockDim.y * blockDim.z; }
  if (i < n) atomicAdd(hits, 1ULL);
}
// dynamic shared memory: each element plus its right neighbour within the block
extern "C" __global__ void through_shared(float *out, const float *x, int n) {
  extern __shared__ float buf[];
  int t = threadIdx.x;
  long long i = grid(1);
  buf[t] = i < n ? x[i] : 0.0f;
  __syncthreads();
  if (i < n) out[i] = buf[t] + buf[(t + 1) % blockDim.x];
}
extern "C" __global__ void __launch_bounds__(64) bounded(int *out, int n) {
  int i = grid(1);
  if (i < n) out[i] = i * 3 + 1;
}
]]
local mod
local function K(name)
  mod = mod or cuda.compile(SRC, { name = "forall.cu" })
  return mod:get(name)
end

local function ceil_div(a, b) return (a + b - 1) // b end

-- C's round: half away from zero
local function round3(x)
  local v = x * 1000.0
  return (v >= 0 and math.floor(v + 0.5) or math.ceil(v - 0.5)) / 1000.0
end

it("the kernels of this file compile", function()
  assert.same({ "bounded", "round_all", "shape", "through_shared" },
              cuda.compile(SRC, { arch = "sm_90", name = "forall.cu" }):kernels())
end)

describe("k:forall", function()
  gpu("chooses the occupancy calculator's block size and a grid of ceil(n / block)", function()
    local k = K("shape")
    local _, block = k:occupancy()
    assert.is_true(block >= 32 and block <= k:attributes().max_threads_per_block)
    local cfg = cuda.device_array(3, "int64")
    local hits = cuda.device_array(1, "uint64")
    for _, n in ipairs { 1, block - 1, block, block + 1, 1000, 100003, 3 * block * 1000 + 7 } do
      local l = k:forall(n)
      assert.equal(("cudalua.launcher<grid {%d, 1, 1}, block {%d, 1, 1}, shared 0>"):format(ceil_div(n, block), block),
                   tostring(l))
      hits:fill(0)
      l(cfg, hits, n)
      assert.same({ ceil_div(n, block), block, 1 }, cfg:copy_to_host():totable(), "n = " .. n)
      assert.equal(n, hits[1], "threads below n for n = " .. n)
    end
  end)

  gpu("gives results equal to the CPU's", function()
    local k = K("round_all")
    for _, n in ipairs { 1, 10, 1000, 100003 } do
      local x = H.rand_table(n, -10, 10)
      local dx, dout = cuda.to_device(x, "float64"), cuda.device_array(n, "float64")
      k:forall(n)(dout, dx, n)
      local out = dout:copy_to_host()
      for i = 1, n do
        if out[i] ~= round3(x[i]) then assert.equal(round3(x[i]), out[i], "element " .. i) end
      end
    end
  end)

  gpu("with shared= takes the occupancy for that dynamic shared memory size", function()
    local k = K("through_shared")
    local S = 1024 * 4 -- room for a block of up to 1024 floats
    local _, block = k:occupancy(S)
    for _, n in ipairs { 1, 777, 100003 } do
      local l = k:forall(n, { shared = S })
      assert.equal(("cudalua.launcher<grid {%d, 1, 1}, block {%d, 1, 1}, shared %d>"):format(ceil_div(n, block), block, S),
                   tostring(l))
      local x = H.rand_table(n, -100, 100, true)
      local dx, dout = cuda.to_device(x, "float32"), cuda.device_array(n, "float32")
      l(dout, dx, n)
      local out = dout:copy_to_host()
      for i = 0, n - 1 do
        local t = i % block
        local j = i - t + (t + 1) % block -- the right neighbour within the block
        local right = j < n and f32(x[j + 1]) or 0
        local want = f32(f32(x[i + 1]) + right)
        if out[i + 1] ~= want then assert.equal(want, out[i + 1], "element " .. i + 1) end
      end
    end
    -- the block size without shared memory is asked again, not taken from the cache of S
    local _, b0 = k:occupancy()
    assert.equal(("cudalua.launcher<grid {1, 1, 1}, block {%d, 1, 1}, shared 0>"):format(b0), tostring(k:forall(1)))
  end)

  gpu("with stream= launches on that stream", function()
    local k = K("round_all")
    local s = cuda.stream(true) -- non-blocking: only s orders this work
    local n = 100003
    local x = H.rand_table(n, -10, 10)
    local dx = cuda.to_device(x, "float64", s)
    local dout = cuda.device_array(n, "float64", s)
    local l = k:forall(n, { stream = s })
    l(dout, dx, n)
    l(dout, dout, n) -- rounding twice changes nothing: in order on s
    local out = cuda.pinned_array(n, "float64")
    dout:copy_to_host(out, s)
    s:synchronize()
    for i = 1, n do
      if out[i] ~= round3(x[i]) then assert.equal(round3(x[i]), out[i], "element " .. i) end
    end
  end)

  gpu("respects __launch_bounds__ and covers n = 0 without touching anything", function()
    local k = K("bounded")
    local _, block = k:occupancy()
    assert.is_true(block <= 64)
    local n = 5000
    local out = cuda.device_array(n, "int32")
    out:fill(-7)
    k:forall(n)(out, n)
    local h = out:copy_to_host()
    for i = 1, n do assert.equal((i - 1) * 3 + 1, h[i]) end
    out:fill(-7)
    k:forall(0)(out, 0)
    assert.same({ -7, -7 }, { out[1], out[n] })
  end)

  -- Numba test_forall.py test_forall_no_work: forall(0) does no work and does not raise. Here
  -- a kernel that would write even past n (it is told n = 5): nothing runs (before, one block ran)
  gpu("forall(0) launches nothing, and still checks the arguments", function()
    local cfg, hits = cuda.device_array(3, "int64"), cuda.device_array(1, "uint64")
    cfg:fill(-1); hits:fill(0)
    local l = K("shape"):forall(0)
    assert.matches("grid {0, 1, 1}", tostring(l), 1, true)
    l(cfg, hits, 5)
    cuda.synchronize()
    assert.same({ -1, -1, -1 }, cfg:copy_to_host():totable())
    assert.equal(0, hits[1])
    C.raises("cudalua: kernel 'shape' expects 3 arguments, got 2", l, cfg, hits)
    C.raises("cudalua: kernel 'shape' argument 1", l, 5, hits, 5)
  end)

  gpu("a launcher can be kept and called again", function()
    local k = K("round_all")
    local n = 1000
    local l = k:forall(n)
    for _ = 1, 3 do
      local x = H.rand_table(n, -10, 10)
      local dx, dout = cuda.to_device(x, "float64"), cuda.device_array(n, "float64")
      l(dout, dx, n)
      local out = dout:copy_to_host()
      for i = 1, n do assert.equal(round3(x[i]), out[i]) end
    end
  end)

  gpu("rejects n that is not an integer >= 0", function()
    local k = K("round_all")
    C.raises("cudalua: kernel:forall: n must be an integer >= 0, got -1", k.forall, k, -1)
    C.raises("cudalua: kernel:forall: n must be an integer >= 0, got 1.5", k.forall, k, 1.5)
    C.raises("cudalua: kernel:forall: n must be an integer >= 0, got nil", k.forall, k, nil)
    C.raises("cudalua: kernel:forall: n must be an integer >= 0, got table", k.forall, k, {})
    C.raises("needs too many blocks", k.forall, k, 1 << 45)
    -- the kernel still works
    local x = H.rand_table(10, -10, 10)
    local dx, dout = cuda.to_device(x, "float64"), cuda.device_array(10, "float64")
    k:forall(10)(dout, dx, 10)
    assert.equal(round3(x[10]), dout[10])
  end)

  gpu("rejects bad options", function()
    local k = K("round_all")
    C.raises("table expected, got number", k.forall, k, 10, 5)
    C.raises("table expected, got string", k.forall, k, 10, "stream")
    C.raises("forall: expected a stream, got string", k.forall, k, 10, { stream = "s" })
    C.raises("forall: expected a stream, got table", k.forall, k, 10, { stream = {} })
    local closed = cuda.stream()
    closed:close()
    C.raises("forall: closed stream", k.forall, k, 10, { stream = closed })
    C.raises("cudalua: kernel:forall: shared memory size must be an integer >= 0, got -1", k.forall, k, 10, { shared = -1 })
    C.raises("cudalua: kernel:forall: shared memory size must be an integer >= 0, got 0.5", k.forall, k, 10, { shared = 0.5 })
    C.raises("cudalua: kernel:forall: shared memory size must be an integer >= 0, got big", k.forall, k, 10, { shared = "big" })
  end)

  gpu("rejects unknown options", function()
    -- BUG: unknown option names are ignored silently: {strem = s} launches on the default
    -- stream (cuda.compile and create_xoroshiro128p_states reject unknown options)
    local k = K("round_all")
    C.raises("unknown option 'strem'", k.forall, k, 10, { strem = cuda.stream() })
  end)

  gpu("the launcher checks its arguments as any launch does", function()
    local k = K("round_all")
    local d = cuda.device_array(10, "float64")
    local l = k:forall(10)
    C.raises("cudalua: kernel 'round_all' expects 3 arguments, got 2", l, d, d)
    C.raises("cudalua: kernel 'round_all' argument 3 (long long): expected an integer, got 2.5", l, d, d, 2.5)
    C.raises("cudalua: kernel 'round_all' argument 1 (double*): expected an array, got 1", l, 1, d, 10)
  end)
end)
