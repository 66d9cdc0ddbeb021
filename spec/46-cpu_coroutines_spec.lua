-- The CPU device's coroutine twins (issue 29): a kernel whose barriers and warp operations are
-- all in its own body runs each CUDA thread as a C++ coroutine instead of a fiber. Each case
-- runs in children on the CPU device, with the twins (the default) and without them
-- (CUDALUA_CPU_COROUTINES=0: fibers), and checks both against Lua on random data; k:attributes()
-- says which way a kernel's threads ran.
local H = require "spec.helper"

local function has_cxx()
  local p = io.popen("(c++ --version || g++ --version) 2>/dev/null")
  local v = p:read("a")
  p:close()
  return v ~= ""
end
local cpu = has_cxx() and it or pending

-- the child's last line, on the CPU device, with coroutines or fibers
local function on_cpu(code, fibers, env)
  local vars = { CUDALUA_DEVICE = "cpu", CUDALUA_CACHE = "0", CUDALUA_CPU_COROUTINES = fibers and "0" or nil }
  for k, v in pairs(env or {}) do vars[k] = v end
  local out, ok = H.child(code, vars, "timeout 300")
  assert(ok, out)
  return out:match("([^\n]*)\n*$"), out
end

-- the same code both ways: the same last line, and the way each kernel ran as `modes` says
local function both(code, modes, env)
  local seed = tostring(math.random(1, 1 << 30))
  local prelude = "math.randomseed(" .. seed .. ")\n"
  local co, out_co = on_cpu(prelude .. code, false, env)
  local fib, out_fib = on_cpu(prelude .. code, true, env)
  assert.equal(co, fib, out_co .. "\n----\n" .. out_fib)
  for k, how in pairs(modes) do
    assert.matches("mode " .. k .. " " .. how, out_co, 1, true)
    assert.matches("mode " .. k .. " " .. (how == "loop" and "loop" or "fibers"), out_fib, 1, true)
  end
  return co
end

describe("the CPU device's coroutines", function()
  -- Numba's warp operation tests (numba-cuda, numba/cuda/tests/cudapy/test_warp_ops.py:
  -- test_useful_syncwarp, test_shfl_sync_idx/up/down/xor with idx 4, delta 4 and xor 16,
  -- test_shfl_sync_types, test_vote_sync_all/any/ballot and test_independent_scheduling), their
  -- inputs and expected values carried over, the kernels written here in CUDA C++
  cpu("pass Numba's warp operation tests, as the fibers do", function()
    local last = both([[
      local m = cuda.compile([=[
      extern "C" __global__ void useful_syncwarp(int *a) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i == 0) a[0] = 42;
        __syncwarp(0xffffffffu);
        a[i] = a[0];
      }
      extern "C" __global__ void shfl_idx(int *a, int idx) { int i = threadIdx.x; a[i] = __shfl_sync(0xffffffffu, i, idx); }
      extern "C" __global__ void shfl_up(int *a, int d) { int i = threadIdx.x; a[i] = __shfl_up_sync(0xffffffffu, i, d); }
      extern "C" __global__ void shfl_down(int *a, int d) { int i = threadIdx.x; a[i] = __shfl_down_sync(0xffffffffu, i, d); }
      extern "C" __global__ void shfl_xor(int *a, int x) { int i = threadIdx.x; a[i] = __shfl_xor_sync(0xffffffffu, i, x); }
      extern "C" __global__ void shfl_ll(long long *a, long long v) { a[threadIdx.x] = __shfl_sync(0xffffffffu, v, 0); }
      extern "C" __global__ void shfl_d(double *a, double v) { a[threadIdx.x] = __shfl_sync(0xffffffffu, v, 0); }
      extern "C" __global__ void vote_all(const int *in, int *out) { out[threadIdx.x] = __all_sync(0xffffffffu, in[threadIdx.x]); }
      extern "C" __global__ void vote_any(const int *in, int *out) { out[threadIdx.x] = __any_sync(0xffffffffu, in[threadIdx.x]); }
      extern "C" __global__ void ballot(unsigned *a) { a[threadIdx.x] = __ballot_sync(0xffffffffu, 1); }
      extern "C" __global__ void independent(unsigned *a) {
        unsigned i = threadIdx.x, b;
        if (i % 4 == 0) b = __ballot_sync(0x11111111u, 1);
        else if (i % 4 == 1) b = __ballot_sync(0x22222222u, 1);
        else if (i % 4 == 2) b = __ballot_sync(0x44444444u, 1);
        else b = __ballot_sync(0x88888888u, 1);
        a[i] = b;
      }]=])
      for _, k in ipairs{"useful_syncwarp", "shfl_idx", "shfl_xor", "independent"} do print("mode " .. k .. " " .. m[k]:attributes().cpu_threads) end
      local function run(k, t, ...) local a = cuda.device_array(32, t); m[k][{ 1, 32 }](a, ...); return a:copy_to_host() end
      local bad = {}
      local function want(name, got, f) for i = 1, 32 do if got[i] ~= f(i - 1) then bad[#bad + 1] = name .. "[" .. (i - 1) .. "]=" .. tostring(got[i]) return end end end
      want("syncwarp", run("useful_syncwarp", "int32"), function() return 42 end)
      want("idx", run("shfl_idx", "int32", 4), function() return 4 end)
      want("up", run("shfl_up", "int32", 4), function(i) return i >= 4 and i - 4 or i end)
      want("down", run("shfl_down", "int32", 4), function(i) return i < 28 and i + 4 or i end)
      want("xor", run("shfl_xor", "int32", 16), function(i) return i ~ 16 end)
      want("int64", run("shfl_ll", "int64", 1 << 42), function() return 1 << 42 end)
      want("float64", run("shfl_d", "float64", math.pi), function() return math.pi end)
      local ones, out = {}, cuda.device_array(32, "int32")
      for i = 1, 32 do ones[i] = 1 end
      m.vote_all[{ 1, 32 }](cuda.to_device(cuda.array(ones, "int32")), out)
      want("all 1", out:copy_to_host(), function() return 1 end)
      ones[32] = 0
      m.vote_all[{ 1, 32 }](cuda.to_device(cuda.array(ones, "int32")), out)
      want("all 0", out:copy_to_host(), function() return 0 end)
      local z = {}
      for i = 1, 32 do z[i] = 0 end
      m.vote_any[{ 1, 32 }](cuda.to_device(cuda.array(z, "int32")), out)
      want("any 0", out:copy_to_host(), function() return 0 end)
      z[3], z[6] = 1, 1
      m.vote_any[{ 1, 32 }](cuda.to_device(cuda.array(z, "int32")), out)
      want("any 1", out:copy_to_host(), function() return 1 end)
      want("ballot", run("ballot", "uint32"), function() return 0xffffffff end)
      local masks = { 0x11111111, 0x22222222, 0x44444444, 0x88888888 }
      want("independent", run("independent", "uint32"), function(i) return masks[i % 4 + 1] end)
      print("bad " .. #bad .. " " .. table.concat(bad, " "))
    ]], { useful_syncwarp = "coroutines", shfl_idx = "coroutines", shfl_xor = "coroutines", independent = "coroutines" })
    assert.equal("bad 0 ", last)
  end)

  cpu("agree with Lua on random data: a block reduction, barrier counts, warp scans of a width, an early return, a barrier in a loop's condition", function()
    local last = both([[
      local m = cuda.compile([=[
      extern "C" __global__ void blocks(const int *x, int *sum, int *votes, int *scan, int *late, int *rounds, const int *c) {
        __shared__ int s[1024];
        unsigned t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
        int v = x[i];
        s[t] = v;
        __syncthreads();
        for (unsigned k = blockDim.x / 2; k > 0; k /= 2) {
          if (t < k) s[t] += s[t + k];
          __syncthreads();
        }
        if (t == 0) sum[blockIdx.x] = s[0];
        int n = __syncthreads_count(v > 0), a = __syncthreads_and(v > -90), o = __syncthreads_or(v > 95);
        if (t == 0) { votes[3 * blockIdx.x] = n; votes[3 * blockIdx.x + 1] = a; votes[3 * blockIdx.x + 2] = o; }
        int w = v;   /* an inclusive scan in segments of 16 lanes (cuda-samples' shfl_scan, its warp step) */
        for (int d = 1; d < 16; d *= 2) {
          int u = __shfl_up_sync(0xffffffffu, w, d, 16);
          if ((int)(t % 16) >= d) w += u;
        }
        scan[i] = w + __shfl_xor_sync(0xffffffffu, 0, 1, 8);
        int left = c[i], r = 0;
        while (__syncthreads_or(left > 0)) { if (left > 0) left--; r++; }
        if (t == 0) rounds[blockIdx.x] = r;
        if (v < 0) return;
        late[i] = v * 2;
      }]=])
      print("mode blocks " .. m.blocks:attributes().cpu_threads)
      local B, T = math.random(3, 9), 32 << math.random(0, 5)   -- (the tree wants a power of two)
      local n = B * T
      local tx, tc = {}, {}
      for i = 1, n do tx[i] = math.random(-100, 100); tc[i] = math.random(0, 12) end
      local sum, votes, scan = cuda.device_array(B, "int32"), cuda.device_array(3 * B, "int32"), cuda.device_array(n, "int32")
      local late, rounds = cuda.device_array(n, "int32"), cuda.device_array(B, "int32")
      late:fill(-1)
      m.blocks[{ B, T }](cuda.to_device(cuda.array(tx, "int32")), sum, votes, scan, late, rounds, cuda.to_device(cuda.array(tc, "int32")))
      local hs, hv, hc, hl, hr = sum:copy_to_host(), votes:copy_to_host(), scan:copy_to_host(), late:copy_to_host(), rounds:copy_to_host()
      local bad = 0
      for b = 0, B - 1 do
        local s, cnt, all, any, most = 0, 0, 1, 0, 0
        for t = 0, T - 1 do
          local v = tx[b * T + t + 1]
          s = s + v
          if v > 0 then cnt = cnt + 1 end
          if not (v > -90) then all = 0 end
          if v > 95 then any = 1 end
          most = math.max(most, tc[b * T + t + 1])
        end
        if hs[b + 1] ~= s or hv[3 * b + 1] ~= cnt or hv[3 * b + 2] ~= all or hv[3 * b + 3] ~= any or hr[b + 1] ~= most then bad = bad + 1 end
        for t = 0, T - 1 do
          local i, acc = b * T + t + 1, 0
          for u = t - t % 16, t do acc = acc + tx[b * T + u + 1] end
          if hc[i] ~= acc then bad = bad + 1 end
          if hl[i] ~= (tx[i] < 0 and -1 or 2 * tx[i]) then bad = bad + 1 end
        end
      end
      print("wrong " .. bad)
    ]], { blocks = "coroutines" })
    assert.equal("wrong 0", last)
  end)

  cpu("are left to fibers where the reading cannot be sure: a lambda, a helper that syncs, a local class", function()
    local last = both([[
      local m = cuda.compile([=[
      __device__ int total(int v) { for (int o = 16; o > 0; o /= 2) v += __shfl_down_sync(0xffffffffu, v, o); return v; }
      extern "C" __global__ void helper(const int *x, int *out) { int v = total(x[threadIdx.x]); if (threadIdx.x == 0) *out = v; }
      extern "C" __global__ void lambda(const int *x, int *out) {
        auto f = [](int v) { for (int o = 16; o > 0; o /= 2) v += __shfl_down_sync(0xffffffffu, v, o); return v; };
        int v = f(x[threadIdx.x]);
        if (threadIdx.x == 0) *out = v;
      }
      extern "C" __global__ void local_class(const int *x, int *out) {
        struct S { static int go(int v) { return v + __shfl_xor_sync(0xffffffffu, v, 1); } };
        out[threadIdx.x] = S::go(x[threadIdx.x]);
      }
      extern "C" __global__ void plain(const int *x, int *out) { out[threadIdx.x] = x[threadIdx.x] + 1; }
      /* (a kernel calling itself as a function: the CPU device's own case, spec 40's stack overflow) */
      extern "C" __global__ void rec(const int *x, int *out) { if (x[0] > 0) rec(x + 1, out); __syncthreads(); out[0] += 1; }]=])
      for _, k in ipairs{"helper", "lambda", "local_class", "plain", "rec"} do print("mode " .. k .. " " .. m[k]:attributes().cpu_threads) end
      local t, s = {}, 0
      for i = 1, 32 do t[i] = math.random(-1000, 1000); s = s + t[i] end
      local x, out = cuda.to_device(cuda.array(t, "int32")), cuda.device_array(32, "int32")
      local bad = 0
      for _, k in ipairs{"helper", "lambda"} do
        m[k][{ 1, 32 }](x, out)
        if out:copy_to_host()[1] ~= s then bad = bad + 1 end
      end
      m.local_class[{ 1, 32 }](x, out)
      local h = out:copy_to_host()
      for i = 1, 32 do if h[i] ~= t[i] + t[((i - 1) ~ 1) + 1] then bad = bad + 1 end end
      local depth = math.random(0, 5)
      local steps = {}
      for i = 1, depth + 1 do steps[i] = depth + 1 - i end
      out:fill(0)
      m.rec[{ 1, 2 }](cuda.to_device(cuda.array(steps, "int32")), out)   -- (two threads: barriers between them)
      if out:copy_to_host()[1] ~= 2 * (depth + 1) then bad = bad + 1 end
      print("wrong " .. bad)
    ]], { helper = "fibers", lambda = "fibers", local_class = "fibers", plain = "loop", rec = "fibers" })
    assert.equal("wrong 0", last)
  end)

  -- Numba's test_lanemask_lt (numba-cuda, test_warp_ops.py: lane i reads 2^i - 1); a block run
  -- as a loop steps each thread's rank only, and the lane comes from it
  cpu("a block run as a loop: Numba's lanemask_lt over a block of two dimensions", function()
    local last = on_cpu([[
      local m = cuda.compile([=[
      extern "C" __global__ void masks(unsigned *lt) { lt[threadIdx.x + threadIdx.y * blockDim.x] = __lanemask_lt(); }]=])
      local X, Y = math.random(1, 16), math.random(2, 8)
      local T = X * Y
      local lt = cuda.device_array(T, "uint32")
      m.masks[{ 1, { X, Y } }](lt)
      local hl, bad = lt:copy_to_host(), 0
      for r = 0, T - 1 do if hl[r + 1] ~= (1 << (r % 32)) - 1 then bad = bad + 1 end end
      print(m.masks:attributes().cpu_threads, "wrong " .. bad)
    ]])
    assert.equal("loop\twrong 0", last)
  end)

  -- (found by a review: each of these gave a wrong answer, a crash or a lost device before)
  cpu("agree with the fibers where C++ evaluates around a co_await: two in one expression, a function reading the thread, a barrier the preprocessor drops", function()
    local last = both([[
      local m = cuda.compile([=[
      __device__ unsigned tid() { return threadIdx.x; }
      extern "C" __global__ void two(int *a, const int *x) {
        int i = threadIdx.x, r = x[i] & 1;
        a[4 * i] = __shfl_down_sync(~0u, i, 1) + 1000 * __shfl_xor_sync(~0u, i + 100, 2);
        a[4 * i + 1] = __syncthreads_count(x[i] > 0) * 1000 + __syncthreads_count(x[i] > 50);
        a[4 * i + 2] = r ? __shfl_xor_sync(~0u, x[i], 1) : __shfl_xor_sync(~0u, x[i], 2) * 3;
        a[4 * i + 3] = tid() + 100 * __syncthreads_count(1);
      }
      extern "C" __global__ void compact(const int *x, int *pos) {
        int i = threadIdx.x;
        pos[i] = __popc(__lanemask_lt() & __ballot_sync(~0u, x[i] > 0));
      }
      extern "C" __global__ void dropped(int *a) {
      #if __CUDA_ARCH__ >= 9000
        __syncwarp();
      #endif
        a[threadIdx.x] = threadIdx.x + 1;
      }]=])
      for _, k in ipairs{"two", "compact", "dropped"} do print("mode " .. k .. " " .. m[k]:attributes().cpu_threads) end
      local T = 32 * math.random(1, 4)
      local t = {}
      for i = 1, T do t[i] = math.random(-100, 100) end
      local x, a = cuda.to_device(cuda.array(t, "int32")), cuda.device_array(4 * T, "int32")
      m.two[{ 1, T }](a, x)
      local pos, d = cuda.device_array(T, "int32"), cuda.device_array(T, "int32")
      m.compact[{ 1, T }](x, pos)
      m.dropped[{ 1, T }](d)
      local h, hp, hd, bad = a:copy_to_host(), pos:copy_to_host(), d:copy_to_host(), 0
      local pos_cnt, big = 0, 0
      for i = 1, T do if t[i] > 0 then pos_cnt = pos_cnt + 1 end; if t[i] > 50 then big = big + 1 end end
      for i = 0, T - 1 do
        local lane, w0 = i % 32, i - i % 32
        local down = lane + 1 < 32 and i + 1 or i
        local want1 = down + 1000 * ((i ~ 2) + 100)
        local odd = t[i + 1] & 1 == 1
        local want3 = odd and t[(i ~ 1) + 1] or t[(i ~ 2) + 1] * 3
        local before = 0
        for j = w0, i - 1 do if t[j + 1] > 0 then before = before + 1 end end
        if h[4 * i + 1] ~= want1 or h[4 * i + 2] ~= pos_cnt * 1000 + big or h[4 * i + 3] ~= want3
          or h[4 * i + 4] ~= i + 100 * T or hp[i + 1] ~= before or hd[i + 1] ~= i + 1 then bad = bad + 1 end
      end
      print("wrong " .. bad)
    ]], { two = "coroutines", compact = "coroutines", dropped = "coroutines" })
    assert.equal("wrong 0", last)
  end)

  cpu("are left to fibers when a header the reading has not read is included, and say a stack overflow as the fibers do", function()
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. dir))
    local f = assert(io.open(dir .. "/red.h", "w"))
    f:write("__device__ int warp_sum(int v) { for (int o = 16; o > 0; o /= 2) v += __shfl_down_sync(~0u, v, o); return v; }\n")
    f:close()
    local last, out = on_cpu(([[
      local m = cuda.compile('#include "%s/red.h"\nextern "C" __global__ void k(const int *x, int *out) {\n'
        .. '  __syncthreads();\n  int v = warp_sum(x[threadIdx.x]);\n  if (threadIdx.x == 0) *out = v;\n}', { name = "hdr.cu" })
      local o = cuda.compile('__device__ int deep(int d) { volatile char buf[4096]; buf[0] = d; return d > 0 ? deep(d - 1) + buf[0] : 0; }\n'
        .. 'extern "C" __global__ void over(int *x, int d) {\n  __syncthreads();\n  x[threadIdx.x] = deep(d);\n}', { name = "deep.cu" })
      local t, s = {}, 0
      for i = 1, 32 do t[i] = math.random(-50, 50); s = s + t[i] end
      local out = cuda.device_array(1, "int32")
      m.k[{ 1, 32 }](cuda.to_device(cuda.array(t, "int32")), out)
      print("mode k " .. m.k:attributes().cpu_threads, "mode over " .. o.over:attributes().cpu_threads)
      print(select(2, pcall(function() o.over[{ 1, 32 }](cuda.device_array(32, "int32"), 100000); cuda.synchronize() end)))
      m.k[{ 1, 32 }](cuda.to_device(cuda.array(t, "int32")), out)
      print(out:copy_to_host()[1] == s and "sum ok" or "sum wrong")
    ]]):format(dir))
    os.execute("rm -rf " .. dir)
    assert.equal("sum ok", last, out)
    assert.matches("mode k fibers\tmode over coroutines", out, 1, true)
    assert.matches("a thread's stack overflowed", out, 1, true)
  end)

  cpu("keep the checks: an assert, threads at different barriers, and a warp operation no lane can join are errors naming the line", function()
    local last, out = on_cpu([[
      local m = cuda.compile('extern "C" __global__ void chk(const int *x) {\n  __syncthreads();\n  assert(x[threadIdx.x] < 5);\n}\n'
        .. 'extern "C" __global__ void two(int *x) {\n  if (threadIdx.x % 2) { x[threadIdx.x] = 1; __syncthreads(); }\n'
        .. '  else { __syncthreads(); x[threadIdx.x] = 2; }\n}\n'
        .. 'extern "C" __global__ void bad(int *x) {\n  if (threadIdx.x < 16) x[threadIdx.x] = __shfl_sync(0xffffffffu, threadIdx.x, 0); else __syncthreads();\n}',
        { name = "co.cu" })
      print("mode chk " .. m.chk:attributes().cpu_threads, "mode two " .. m.two:attributes().cpu_threads)
      local t = {}
      for i = 1, 64 do t[i] = 0 end
      local k = math.random(1, 64)
      t[k] = 9
      print(select(2, pcall(function() m.chk[{ 1, 64 }](cuda.to_device(cuda.array(t, "int32"))); cuda.synchronize() end)))
      print("want thread (" .. (k - 1) .. ", 0, 0)")
      print(select(2, pcall(function() m.two[{ 1, 32 }](cuda.device_array(32, "int32")); cuda.synchronize() end)))
      print(select(2, pcall(function() m.bad[{ 1, 32 }](cuda.device_array(32, "int32")); cuda.synchronize() end)))
      t[k] = 0
      m.chk[{ 1, 64 }](cuda.to_device(cuda.array(t, "int32")))
      cuda.synchronize()
      print("then ok")
    ]], false, { CUDALUA_CPU_CHECK = "1" })
    assert.equal("then ok", last, out)
    assert.matches("mode chk coroutines\tmode two coroutines", out, 1, true)
    local want = out:match("want (thread %(%d+, 0, 0%))")
    assert.matches("assertion failed: x[threadIdx.x] < 5 (co.cu:3), in block (0, 0, 0) " .. want, out, 1, true)
    assert.matches("CUDALUA_CPU_CHECK: threads of the block wait at different __syncthreads (co.cu:", out, 1, true)
    assert.matches("co.cu:6", out, 1, true)
    assert.matches("co.cu:7", out, 1, true)
    assert.matches("a warp operation (co.cu:10)", out, 1, true)
  end)

  cpu("give a race-free kernel the same result under every seeded schedule", function()
    local last = on_cpu([[
      local m = cuda.compile([=[
      extern "C" __global__ void rev(const int *x, int *y) {
        __shared__ int s[256];
        s[threadIdx.x] = x[blockIdx.x * 256 + threadIdx.x];
        __syncthreads();
        y[blockIdx.x * 256 + threadIdx.x] = s[255 - threadIdx.x] + __shfl_xor_sync(0xffffffffu, (int)threadIdx.x, 5);
      }]=])
      local t = {}
      for i = 1, 1024 do t[i] = math.random(-1e6, 1e6) end
      local y = cuda.device_array(1024, "int32")
      m.rev[{ 4, 256 }](cuda.to_device(cuda.array(t, "int32")), y)
      local h, bad = y:copy_to_host(), 0
      for i = 1, 1024 do
        local b, r = (i - 1) // 256, (i - 1) % 256
        if h[i] ~= t[b * 256 + 255 - r + 1] + (r ~ 5) then bad = bad + 1 end
      end
      print(m.rev:attributes().cpu_threads, "wrong " .. bad)
    ]], false, { CUDALUA_CPU_SCHEDULE = tostring(math.random(1, 1 << 30)) })
    assert.equal("coroutines\twrong 0", last)
  end)
end)
