-- cudalua's CPU device (CUDALUA_DEVICE=cpu, issue 29): the same scripts and CUDA C++ kernels
-- run without a GPU. Each case runs in a child process that chose the CPU device, on random
-- data checked against Lua; it needs a C++ compiler, not a GPU.
local H = require "spec.helper"

local function has_cxx()
  local p = io.popen("(c++ --version || g++ --version) 2>/dev/null")
  local v = p:read("a")
  p:close()
  return v ~= ""
end
local cpu = has_cxx() and it or pending

-- runs code in a child on the CPU device; its last line
local function on_cpu(code)
  local out, ok = H.child(code, { CUDALUA_DEVICE = "cpu", CUDALUA_CACHE = "0" }, "timeout 300")
  assert(ok, out)
  return out:match("([^\n]*)\n*$"), out
end

describe("the CPU device", function()
  cpu("names itself, and runs a grid-stride kernel over random data as the CPU computes it", function()
    local last = on_cpu([[
      local d = cuda.devices()[1]
      assert(cuda.is_available() and d.name:find("cudalua CPU device", 1, true), d.name)
      local m = cuda.compile('extern "C" __global__ void saxpy(float a, const float *x, const float *y, float *z, int n) {'
        .. ' for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) z[i] = a * x[i] + y[i]; }')
      local n = math.random(1000, 100000)
      local tx, ty = {}, {}
      for i = 1, n do tx[i], ty[i] = math.random(-1000, 1000), math.random(-1000, 1000) end
      local z = cuda.device_array(n, "float32")
      m.saxpy[{ 7, 96 }](3, cuda.to_device(cuda.array(tx, "float32")), cuda.to_device(cuda.array(ty, "float32")), z, n)
      local h, bad = z:copy_to_host(), 0
      for i = 1, n do if h[i] ~= 3 * tx[i] + ty[i] then bad = bad + 1 end end
      print("wrong", bad)
    ]])
    assert.equal("wrong\t0", last)
  end)

  cpu("runs barriers, shared memory (static and dynamic), warp shuffles, ballots and atomics", function()
    local last = on_cpu([[
      local m = cuda.compile([=[
      extern "C" __global__ void bsum(const int *x, long long *out, int n) {
        __shared__ int s[256];
        extern __shared__ int flags[];
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        s[threadIdx.x] = i < n ? x[i] : 0;
        flags[threadIdx.x] = i < n && x[i] < 0;
        __syncthreads();
        for (int k = blockDim.x / 2; k >= 32; k /= 2) {
          if (threadIdx.x < k) s[threadIdx.x] += s[threadIdx.x + k];
          __syncthreads();
        }
        if (threadIdx.x < 32) {
          int v = s[threadIdx.x];
          for (int o = 16; o > 0; o /= 2) v += __shfl_down_sync(0xffffffffu, v, o);
          if (threadIdx.x == 0) atomicAdd((unsigned long long *)out, (unsigned long long)(long long)v);
        }
        int negs = __syncthreads_count(flags[threadIdx.x]);
        unsigned b = __ballot_sync(0xffffffffu, flags[threadIdx.x]);
        if (threadIdx.x == 0) atomicAdd((unsigned long long *)out + 1, (unsigned long long)negs);
        if ((threadIdx.x & 31) == 0) atomicAdd((unsigned long long *)out + 2, (unsigned long long)__popc(b));
      }]=])
      local n = math.random(10000, 300000)
      local t, sum, negs = {}, 0, 0
      for i = 1, n do t[i] = math.random(-1000, 1000); sum = sum + t[i]; if t[i] < 0 then negs = negs + 1 end end
      local out = cuda.to_device(cuda.array({ 0, 0, 0 }, "int64"))
      m.bsum[{ (n + 255) // 256, 256, shared = 256 * 4 }](cuda.to_device(cuda.array(t, "int32")), out, n)
      local h = out:copy_to_host()
      print(h[1] == sum, h[2] == negs, h[3] == negs)
    ]])
    assert.equal("true\ttrue\ttrue", last)
  end)

  cpu("an assert is an error naming block, thread and line; the process goes on", function()
    local last, out = on_cpu([[
      local m = cuda.compile('extern "C" __global__ void chk(const int *x) {\n  assert(x[blockIdx.x * blockDim.x + threadIdx.x] < 5);\n}',
        { name = "chk.cu" })
      local t = {}
      for i = 1, 64 do t[i] = 0 end
      local k = math.random(1, 64)
      t[k] = 9
      local x = cuda.to_device(cuda.array(t, "int32"))
      local ok, e = pcall(function() m.chk[{ 2, 32 }](x); cuda.synchronize() end)
      print(e)
      t[k] = 0
      m.chk[{ 2, 32 }](cuda.to_device(cuda.array(t, "int32")))
      cuda.synchronize()
      print(("block (%d, 0, 0) thread (%d, 0, 0)"):format((k - 1) // 32, (k - 1) % 32), "then ok")
    ]])
    local want = last:match("^(.-)\tthen ok$")
    assert.truthy(want, out)
    assert.matches("cuda.synchronize: CUDA_ERROR_LAUNCH_FAILED (the CPU device: assertion failed: x[blockIdx.x * blockDim.x + threadIdx.x] < 5 (chk.cu:2), in "
      .. want, out, 1, true)
  end)

  cpu("a warp operation that lanes waiting at __syncthreads can never join is an error, not a hang", function()
    local last = on_cpu([[
      local m = cuda.compile('extern "C" __global__ void bad(int *x) {\n'
        .. '  if (threadIdx.x < 16) x[threadIdx.x] = __shfl_sync(0xffffffffu, threadIdx.x, 0); else __syncthreads();\n}')
      local ok, e = pcall(function() m.bad[{ 1, 32 }](cuda.device_array(32, "int32")); cuda.synchronize() end)
      print(e)
    ]])
    assert.matches("a barrier or warp operation some live threads of the block can never reach, in block (0, 0, 0)", last, 1, true)
  end)

  cpu("refuses GPU-only code at compile time, naming the construct and the line", function()
    local last = on_cpu([[
      local ok, e = pcall(cuda.compile, '__global__ void k(int *x) {\n  asm("trap;");\n}', { name = "p.cu" })
      print(e)
    ]])
    assert.matches("cuda.compile: p.cu:2 uses inline PTX (asm), which cudalua's CPU device cannot run", last, 1, true)
  end)
end)
