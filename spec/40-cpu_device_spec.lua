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

-- runs code in a child on the CPU device (more variables in env); its last line
local function on_cpu(code, env)
  local vars = { CUDALUA_DEVICE = "cpu", CUDALUA_CACHE = "0" }
  for k, v in pairs(env or {}) do vars[k] = v end
  local out, ok = H.child(code, vars, "timeout 300")
  assert(ok, out)
  return out:match("([^\n]*)\n*$"), out
end

-- ThreadSanitizer's runtime, to preload in a child (nil: none, or this process runs under ASan,
-- which the two cannot share)
local function tsan_runtime()
  local p = io.popen("g++ -print-file-name=libtsan.so 2>/dev/null")
  local path = p and p:read("l")
  if p then p:close() end
  local maps = io.open("/proc/self/maps")
  local asan = maps and maps:read("a"):find("asan") ~= nil
  if maps then maps:close() end
  return path and path:find("/") and not asan and path or nil
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

  cpu("the lines after an extern __shared__ declaration keep their numbers in messages, in coroutines and fibers", function()
    for _, fibers in ipairs { false, true } do
      local last = on_cpu([[
        local m = cuda.compile('extern "C" __global__ void k(int *x) {\n  extern __shared__ int s[];\n'
          .. '  s[threadIdx.x] = x[threadIdx.x];\n  __syncthreads();\n  assert(s[threadIdx.x] < 5);\n}\n', { name = "lines.cu" })
        local t = {}
        for i = 1, 32 do t[i] = 0 end
        local k = math.random(1, 32)
        t[k] = 9
        local _, e = pcall(function() m.k[{ 1, 32, shared = 128 }](cuda.to_device(cuda.array(t, "int32"))); cuda.synchronize() end)
        print(e, k - 1)
      ]], { CUDALUA_CPU_COROUTINES = fibers and "0" or nil })
      local e, k = last:match("^(.*)\t(%d+)$")
      assert.matches("assertion failed: s[threadIdx.x] < 5 (lines.cu:5), in block (0, 0, 0) thread (" .. k .. ", 0, 0)", e, 1, true)
    end
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

  cpu("CUDALUA_CPU_CHECK: a __syncthreads some threads of the block exited before is an error naming block, thread and line", function()
    local last = on_cpu([[
      local m = cuda.compile('extern "C" __global__ void early(int *x, int k) {\n'
        .. '  if (threadIdx.x == k) return;\n  x[threadIdx.x] = 1;\n  __syncthreads();\n  x[threadIdx.x] += 1;\n}', { name = "early.cu" })
      local k = math.random(0, 63)
      local ok, e = pcall(function() m.early[{ 3, 64 }](cuda.device_array(64, "int32"), k); cuda.synchronize() end)
      print(k, e)
    ]], { CUDALUA_CPU_CHECK = "1" })
    local k, e = last:match("^(%d+)\t(.*)$")
    assert.truthy(k, last)
    assert.matches("CUDALUA_CPU_CHECK: __syncthreads (early.cu:4) not reached by every thread of the block (thread ("
      .. k .. ", 0, 0) has exited), in block (", e, 1, true)
  end)

  cpu("CUDALUA_CPU_CHECK: threads waiting at different __syncthreads are an error naming both lines", function()
    local last = on_cpu([[
      local m = cuda.compile('extern "C" __global__ void two(int *x) {\n'
        .. '  if (threadIdx.x % 2) { x[threadIdx.x] = 1; __syncthreads(); }\n  else { __syncthreads(); x[threadIdx.x] = 2; }\n}', { name = "two.cu" })
      local ok, e = pcall(function() m.two[{ 1, 32 }](cuda.device_array(32, "int32")); cuda.synchronize() end)
      print(e)
    ]], { CUDALUA_CPU_CHECK = "1" })
    assert.matches("CUDALUA_CPU_CHECK: threads of the block wait at different __syncthreads (two.cu:", last, 1, true)
    assert.matches("two.cu:2", last, 1, true)
    assert.matches("two.cu:3", last, 1, true)
  end)

  cpu("CUDALUA_CPU_CHECK: a warp mask naming a lane that exited, or leaving out the caller, is an error", function()
    local last = on_cpu([[
      local m = cuda.compile('extern "C" __global__ void gone(int *x, int k) {\n'
        .. '  if (threadIdx.x == k) return;\n  x[threadIdx.x] = __shfl_sync(0xffffffffu, (int)threadIdx.x, 0);\n}\n'
        .. 'extern "C" __global__ void self(int *x) {\n  x[threadIdx.x] = __shfl_sync(0xfffffffeu, (int)threadIdx.x, 1);\n}', { name = "w.cu" })
      local k = math.random(0, 31)
      local x = cuda.device_array(32, "int32")
      local _, e1 = pcall(function() m.gone[{ 1, 32 }](x, k); cuda.synchronize() end)
      local _, e2 = pcall(function() m.self[{ 1, 32 }](x); cuda.synchronize() end)
      m.self[{ 1, 32 }](x)   -- without the check (a lane outside the mask reads its own value): no error
      print(k, e1, e2)
    ]], { CUDALUA_CPU_CHECK = "1" })
    local k, e1, e2 = last:match("^(%d+)\t(.-)\t(.*)$")
    assert.truthy(k, last)
    assert.matches("CUDALUA_CPU_CHECK: a warp operation (w.cu:3) whose mask 0xffffffff names lane " .. k .. ", which has exited", e1, 1, true)
    assert.matches("CUDALUA_CPU_CHECK: a warp operation (w.cu:6) whose mask 0xfffffffe leaves out the calling lane 0, in block (0, 0, 0) thread (0, 0, 0)", e2, 1, true)
  end)

  cpu("CUDALUA_CPU_CHECK: a read past an array's end, and a thread's stack overflow, are errors naming the array, block, thread and line", function()
    local last, out = on_cpu([[
      local m = cuda.compile('extern "C" __global__ void over(const float *x, float *y, int n) {\n'
        .. '  int i = blockIdx.x * blockDim.x + threadIdx.x;\n  y[i] = 2 * x[i];\n}\n'
        .. 'extern "C" __global__ void deep(int *x, int d) {\n  volatile char buf[4096];\n  buf[0] = d;\n'
        .. '  if (d > 0) deep(x, d - 1);\n  x[0] = buf[0];\n  __syncthreads();\n}', { name = "oob.cu" })
      local n = math.random(100, 5000)
      local x, y = cuda.device_array(n, "float32"), cuda.device_array(n + 32, "float32")
      local _, e1 = pcall(function() m.over[{ n // 32 + 1, 32 }](x, y, n); cuda.synchronize() end)
      local _, e2 = pcall(function() m.deep[{ 1, 32 }](cuda.device_array(4, "int32"), 100); cuda.synchronize() end)
      m.over[{ n // 32, 32 }](x, y, n)   -- in bounds: runs
      cuda.synchronize()
      print(n, e1, e2)
    ]], { CUDALUA_CPU_CHECK = "1" })
    local n, e1, e2 = last:match("^(%d+)\t(.-)\t(.*)$")
    assert.truthy(n, out)
    n = tonumber(n)
    assert.matches(("CUDALUA_CPU_CHECK: an access past the end of an allocation of %d bytes (its byte %d, the allocation at 0x"):format(4 * n, 4 * n), e1, 1, true)
    assert.matches(("oob%%.cu:3%%), in block %%(%d, 0, 0%%) thread %%(%d, 0, 0%%)"):format(n // 32, n % 32), e1)
    assert.matches("CUDALUA_CPU_CHECK: the thread's stack %(64 KB%) overflowed %([^)]*oob%.cu:%d+%), in block %(0, 0, 0%)", e2)
  end)

  local tsan = tsan_runtime()
  ;(tsan and cpu or pending)("CUDALUA_CPU_SANITIZE=thread reports two threads of a block writing one shared slot, not a kernel with __syncthreads", function()
    local code = [[
      local m = cuda.compile('extern "C" __global__ void racy(int *out) {\n  __shared__ int s[1];\n'
        .. '  if (threadIdx.x < 2) s[0] = threadIdx.x;\n  __syncthreads();\n  if (threadIdx.x == 0) out[blockIdx.x] = s[0];\n}\n'
        .. 'extern "C" __global__ void fine(int *out) {\n  __shared__ int s[1];\n  if (threadIdx.x == 0) s[0] = 7;\n'
        .. '  __syncthreads();\n  out[threadIdx.x] = s[0];\n  __syncthreads();\n  if (threadIdx.x == 1) s[0] = 8;\n}', { name = "race.cu" })
      local out = cuda.device_array(64, "int32")
      m[KERNEL][{ 1, 64 }](out)
      cuda.synchronize()
      print("ran", out:copy_to_host()[1])
      io.stdout:flush()
      os.exit(0)   -- (no lua_close: unloading kernel libraries at exit under a preloaded TSan can crash)
    ]]
    local env = { LD_PRELOAD = tsan, CUDALUA_CPU_SANITIZE = "thread", TSAN_OPTIONS = "exitcode=0" }
    local _, out = on_cpu((code:gsub("KERNEL", '"racy"')), env)
    assert.matches("WARNING: ThreadSanitizer: data race", out, 1, true)
    assert.matches("racy [^\n]*race%.cu:3", out)
    local last, out2 = on_cpu((code:gsub("KERNEL", '"fine"')), env)
    assert.equal("ran\t7", last)
    assert.falsy(out2:find("ThreadSanitizer", 1, true), out2)
  end)

  cpu("CUDALUA_CPU_SANITIZE without the sanitizer's runtime in the process is a clear error, not a crash", function()
    local last = on_cpu([[
      local ok, e = pcall(cuda.compile, 'extern "C" __global__ void k(int *x) { x[0] = 1; }')
      print(e)
    ]], { CUDALUA_CPU_SANITIZE = "thread" })
    assert.matches("CUDALUA_CPU_SANITIZE=thread needs the sanitizer's runtime in the process from its start: "
      .. "run with LD_PRELOAD=$(g++ -print-file-name=libtsan.so)", last, 1, true)
  end)

  cpu("CUDALUA_CPU_SCHEDULE=<seed>: a racy kernel's result changes with the seed, and not for one seed", function()
    local code = [[
      local m = cuda.compile([=[
      extern "C" __global__ void last_writer(int *out) {   // every thread writes one slot, no barrier
        __shared__ int s[1];
        s[0] = threadIdx.x;
        __syncthreads();
        if (threadIdx.x == 0) out[blockIdx.x] = s[0];
      }
      extern "C" __global__ void loop_writer(int *out) { out[blockIdx.x] = threadIdx.x; }]=])
      local a, b = cuda.device_array(8, "int32"), cuda.device_array(8, "int32")
      m.last_writer[{ 8, 64 }](a)
      m.loop_writer[{ 8, 64 }](b)
      print(table.concat(a:copy_to_host():totable(), ",") .. "/" .. table.concat(b:copy_to_host():totable(), ","))
    ]]
    local seed = math.random(1, 1000000)
    local r1 = on_cpu(code, { CUDALUA_CPU_SCHEDULE = tostring(seed) })
    local r2 = on_cpu(code, { CUDALUA_CPU_SCHEDULE = tostring(seed) })
    local r3 = on_cpu(code, { CUDALUA_CPU_SCHEDULE = tostring(seed + 1) })
    local r0 = on_cpu(code)
    assert.equal(r1, r2)
    assert.not_equal(r1, r3)
    assert.equal("63,63,63,63,63,63,63,63/63,63,63,63,63,63,63,63", r0)   -- in order: the last thread wins
    local a, b = r1:match("^(.-)/(.*)$")
    assert.not_equal("63,63,63,63,63,63,63,63", a)
    assert.not_equal("63,63,63,63,63,63,63,63", b)
  end)

  -- (the review of issue 29: lanes that returned, widths, counts over the threads that arrived)
  cpu("warp votes leave out lanes that returned; xor shuffles of a width read earlier segments; __syncthreads_and counts the threads there", function()
    local last = on_cpu([[
      local m = cuda.compile([=[
      struct Twice { __device__ int operator()(int v) const { return 2 * v; } };
      __device__ int block_total(int v, int *s) {   // called from an operator(): its kernel syncs
        s[threadIdx.x] = v;
        __syncthreads();
        int t = 0;
        for (int i = 0; i < blockDim.x; i++) t += s[i];
        __syncthreads();
        return t;
      }
      struct Summed { int *s; __device__ int operator()(int v) const { return block_total(v, s); } };
      template <class Op> __global__ void apply(const int *x, int *y, Op op) { y[threadIdx.x] = op(x[threadIdx.x]); }
      template __global__ void apply<Summed>(const int *, int *, Summed);
      extern "C" __global__ void votes(const int *x, unsigned *out, int live, int w, int lm) {
        unsigned lane = threadIdx.x;
        if ((int)lane >= live) return;
        unsigned b = __ballot_sync(0xffffffffu, x[lane] > 0);
        int sx = __shfl_xor_sync(0xffffffffu, x[lane], lm, w);
        int all = __syncthreads_and(x[lane] != 0);
        out[lane * 3] = b; out[lane * 3 + 1] = (unsigned)sx; out[lane * 3 + 2] = all;
      }]=], { name_expressions = { "apply<Summed>" } })
      local live, w = math.random(1, 32), ({ 2, 4, 8, 16, 32 })[math.random(1, 5)]
      local lm = math.random(1, 31)
      local xs = {}
      for i = 1, 32 do xs[i] = math.random(-50, 50) end
      xs[math.random(live + 1 > 32 and 32 or live + 1, 32)] = 0   -- a zero among the lanes that return
      local out = cuda.zeros(96, "uint32")
      m.votes[{ 1, 32 }](cuda.to_device(cuda.array(xs, "int32")), out, live, w, lm)
      local h, bad = out:copy_to_host(), 0
      local want_b, want_all = 0, 1
      for l = 0, live - 1 do
        if xs[l + 1] > 0 then want_b = want_b | (1 << l) end
        if xs[l + 1] == 0 then want_all = 0 end
      end
      for l = 0, live - 1 do
        local j = l ~ lm   -- PTX's butterfly: a partner past my segment's end gives my own value
        local from = (j <= (l | (w - 1)) and j < live) and j or (j <= (l | (w - 1)) and -1 or l)
        if h[l * 3 + 1] ~= want_b or h[l * 3 + 3] ~= want_all then bad = bad + 1 end
        if from >= 0 and h[l * 3 + 2] ~= (xs[from + 1] & 0xffffffff) then bad = bad + 1 end
      end
      local n = math.random(2, 256)
      local ys = {}
      for i = 1, n do ys[i] = math.random(-1000, 1000) end
      local total = 0
      for i = 1, n do total = total + ys[i] end
      local y = cuda.zeros(n, "int32")
      local k = m:get("apply<Summed>")
      local s = cuda.device_array(n, "int32")
      k[{ 1, n }](cuda.to_device(cuda.array(ys, "int32")), y, string.pack("<I8", s:ptr()))   -- Summed{s}
      for _, v in ipairs(y:copy_to_host():totable()) do if v ~= total then bad = bad + 1 end end
      print("wrong", bad)
    ]])
    assert.equal("wrong\t0", last)
  end)

  cpu("a launch's failure is said by the next synchronize even when an event's destruction waited for it first", function()
    local last = on_cpu([[
      local k = cuda.kernel('extern "C" __global__ void k(int *x, int bad) { x[threadIdx.x] = 1; assert(!bad); }', "k")
      local x = cuda.device_array(32, "int32")
      k[{ 1, 32 }](x, 1)
      local e = cuda.event()
      e:close()   -- (it waits for the launch)
      print(pcall(cuda.synchronize))
    ]])
    assert.matches("^false\tcudalua: cuda.synchronize: CUDA_ERROR_LAUNCH_FAILED", last)
  end)

  cpu("a kernel's bad access in a library call is an illegal address, and launch bounds past 1024 are refused", function()
    local last, out = on_cpu([[
      local m = cuda.compile([=[
      #include <cstring>
      extern "C" __global__ void __launch_bounds__(2048) wide(int *x) { x[threadIdx.x] = 1; }
      extern "C" __global__ void cpy(long long at, int n) { memset((char *)at, 1, n); }]=])
      local x = cuda.device_array(1, "int32")
      print(pcall(function() m.wide[{ 1, 2048 }](x) end))
      m.cpy[{ 1, 1 }](16, 4096)   -- address 16: in the page no process maps
      print(pcall(cuda.synchronize))
      print(pcall(cuda.synchronize))
      print(select(2, pcall(function() return cuda.stream():query() end)) ~= nil)
      print("alive")
    ]])
    assert.equal("alive", last)
    assert.matches("false\tcudalua: kernel 'wide'[^\n]*CUDA_ERROR_INVALID_VALUE", out)
    assert.matches("false\tcudalua: cuda.synchronize: CUDA_ERROR_ILLEGAL_ADDRESS (the CPU device: an illegal memory access", out, 1, true)
    local _, n = out:gsub("CUDA_ERROR_ILLEGAL_ADDRESS", "")
    assert.is_true(n >= 2, out)   -- the device stays lost, as a GPU's context
  end)
end)
