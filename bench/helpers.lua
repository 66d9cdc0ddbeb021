-- helpers.lua: cudalua's helpers measured (reduce, forall, random, progress, compile cache,
-- graphs, the CUDA Array Interface), with the same kernels, sizes and method as
-- bench/raw_helpers.c and compare.py's helper part. Prints one "key value" line per
-- measurement; keys starting with diag_ are pieces timed apart to show where the time goes. A
-- section that fails prints a "# ..." line and the others still run.
-- Env: BENCH_LAUNCHES (default 100000), BENCH_REPS (default 5), CUDALUA_CACHE_DIR
-- Modes: --compile-only (compiles the kernels for sm_90, no GPU needed); the fresh processes the
--        main run starts: --compile-child NONCE, --compile-child-arch NONCE ARCH and
--        --compile-pieces NONCE (disk cache hits), --rng-first and --rng-first-whole (the first
--        RNG call of a process)
package.cpath = "./?.so;" .. package.cpath
local cuda = require "cudalua"
local cache = require "cudalua.cache"

package.path = "bench/?.lua;" .. package.path
local B = require "common"
local N, REPS, now, out, note, median = B.N, B.REPS, B.now, B.out, B.note, B.median
local per_item, interleaved = B.per_item, B.interleaved
local function section(name, f) B.section("helpers.lua", name, f) end

-- keep "empty" and "bump" identical to bench/raw_helpers.c and compare.py
local KSRC = [[
extern "C" __global__ void empty() {}
extern "C" __global__ void bump(float *x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += 1.0f;
}
extern "C" __global__ void touch(float *m, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) m[i] = 1.0f;
}
]]
-- section 10's loop body, as bench/raw_helpers.c's tick (cudalua declares the setter)
local WSRC = [[
extern "C" __global__ void tick(float *x, int *count, int limit, cudaGraphConditionalHandle c) {
  x[threadIdx.x] += 1.0f;
  if (threadIdx.x == 0 && ++*count >= limit) cudaGraphSetConditional(c, 0);
}
// the unrolled body's kernel: one iteration unless the loop is done (the body's kernels after
// the last iteration do nothing)
extern "C" __global__ void tick_n(float *x, int *count, int limit, cudaGraphConditionalHandle c) {
  int n = *count;
  __syncthreads();
  if (n >= limit) return;
  x[threadIdx.x] += 1.0f;
  if (threadIdx.x == 0 && (*count = n + 1) >= limit) cudaGraphSetConditional(c, 0);
}
extern "C" __global__ void tick_flag(float *x, int *count, int limit, int *done) {
  x[threadIdx.x] += 1.0f;
  if (threadIdx.x == 0 && ++*count >= limit) *done = 1;
}
]]
-- examples/pi.lua's kernel
local PI_SRC = [[
#include <cudalua/grid.cuh>
#include <cudalua/random.cuh>
extern "C" __global__ void compute_pi(xoroshiro128p_state *states, float *out, int iterations, int n) {
  int i = grid(1);
  if (i >= n) return;
  int inside = 0;
  for (int j = 0; j < iterations; j++) {
    float x = xoroshiro128p_uniform_float32(states, i);
    float y = xoroshiro128p_uniform_float32(states, i);
    if (x * x + y * y <= 1.0f) inside++;
  }
  out[i] = 4.0f * inside / iterations;
}]]
-- a long kernel that reports progress: per step some arithmetic, then each warp adds its 32
-- threads' step to the counter with one atomic
local SPIN_SRC = [[
extern "C" __global__ void spin(unsigned long long *progress, long long steps, int work, float *sink) {
  float x = (float)threadIdx.x;
  for (long long s = 0; s < steps; s++) {
    for (int j = 0; j < work; j++) x = x * 0.9999999f + 0.5f;
    if ((threadIdx.x & 31) == 0) atomicAdd(progress, 32ULL);
  }
  if (x == -1.0f) *sink = x;
}]]
local VECADD, core = B.VECADD, B.core
local function vecadd_src(nonce) return VECADD .. ("\n// helpers %s\n"):format(nonce) end

---------------------------------------------------------------------------------------------
if arg[1] == "--compile-only" then
  for _, src in ipairs { KSRC, PI_SRC, SPIN_SRC, vecadd_src("x") } do
    local mod = cuda.compile(src, { arch = "sm_90", cache = false })
    print(table.concat(mod:kernels(), ", "))
  end
  os.exit(0)
end

-- a fresh process: the context first, then time cuda.kernel on a source compiled before;
-- --compile-child-arch gives the architecture (cuda.compile then does not ask NVRTC for the
-- ones it supports; the cache key holds the arch as given, so it is an entry of its own)
if arg[1] == "--compile-child" or arg[1] == "--compile-child-arch" then
  cuda.synchronize()
  local t0 = now()
  local k = cuda.kernel(vecadd_src(arg[2]), "vecadd", arg[3] and { arch = arg[3] })
  local ms = (now() - t0) * 1e3
  assert(k)
  print(("%.4f %d %d"):format(ms, cache.stats.disk_hits, cache.stats.misses))
  os.exit(0)
end

-- the same in pieces: loading NVRTC (dlopen), asking it for its architectures (cuda.compile
-- does, to pick -arch for the device), the compile call (key, disk read, decode), then the
-- kernel (loading the module on the device)
if arg[1] == "--compile-pieces" then
  cuda.synchronize()
  local t0 = now()
  if core then core.nvrtc_version() end
  local t1 = now()
  if core then core.nvrtc_archs() end
  local t2 = now()
  local mod = cuda.compile(vecadd_src(arg[2]))
  local t3 = now()
  local k = mod.vecadd
  local t4 = now()
  assert(k)
  print(("diag_compile_disk_child_nvrtc_dlopen_ms %.4f"):format((t1 - t0) * 1e3))
  print(("diag_compile_disk_child_nvrtc_archs_ms %.4f"):format((t2 - t1) * 1e3))
  print(("diag_compile_disk_child_lookup_ms %.4f"):format((t3 - t2) * 1e3))
  print(("diag_compile_disk_child_module_load_ms %.4f"):format((t4 - t3) * 1e3))
  print(("diag_compile_disk_child_pieces_total_ms %.4f"):format((t4 - t0) * 1e3))
  print(("diag_compile_disk_child_hits %d"):format(cache.stats.disk_hits))
  os.exit(0)
end

-- the first RNG call of a process as the main run times it, in a fresh process
if arg[1] == "--rng-first-whole" then
  cuda.synchronize()
  local t0 = now()
  local st = cuda.random.create_xoroshiro128p_states(1 << 20, { seed = 1 })
  cuda.synchronize()
  assert(st)
  print(("diag_rng_first_whole_child_ms %.4f"):format((now() - t0) * 1e3))
  os.exit(0)
end

-- the first RNG call of a process in pieces (a fresh cache directory): loading NVRTC, compiling
-- the init kernel, the jump matrices on the host, then the call with the kernel compiled
if arg[1] == "--rng-first" then
  cuda.synchronize()
  local t0 = now()
  if core then core.nvrtc_version() end
  local t1 = now()
  cuda.compile("#define CUDALUA_RANDOM_INIT\n#include <cudalua/random.cuh>\n", {  -- random.lua's source
    name = "cudalua_random.cu", name_expressions = { "cudalua_xoroshiro128p_init" } })
  local t2 = now()
  if core then core.xoroshiro_jump_matrices(64) end
  local t3 = now()
  local st = cuda.random.create_xoroshiro128p_states(1 << 20, { seed = 1 })
  cuda.synchronize()
  local t4 = now()
  assert(st)
  print(("diag_rng_first_nvrtc_dlopen_ms %.4f"):format((t1 - t0) * 1e3))
  print(("diag_rng_first_compile_ms %.4f"):format((t2 - t1) * 1e3))
  print(("diag_rng_first_jump_matrices_ms %.4f"):format((t3 - t2) * 1e3))
  print(("diag_rng_first_call_after_compile_ms %.4f"):format((t4 - t3) * 1e3))
  os.exit(0)
end

---------------------------------------------------------------------------------------------
-- child processes: lua5.4 running this file with a cache directory of their own
local function tempdir()
  local dir = os.tmpname()
  os.remove(dir)
  assert(os.execute(("mkdir -p '%s'"):format(dir)), "cannot make " .. dir)
  return dir
end

local function child(dir, ...)
  local lua = arg[-1] or "lua5.4"
  local script = arg[0] or "bench/helpers.lua"
  local p = assert(io.popen(("CUDALUA_CACHE_DIR='%s' %s %s %s"):format(dir, lua, script,
    table.concat({ ... }, " "))))
  local text = p:read("a")
  p:close()
  return text
end

cuda.synchronize() -- the context, before anything is timed
local dev = cuda.devices()[cuda.current_device() + 1]
local SMS = dev.multiprocessors

---------------------------------------------------------------------------------------------
-- 4: RNG states for 2^20 threads. First: the first call of the process (compiles the init
-- kernel: the disk cache is empty, and makes the jump matrices; the process's first allocation
-- is timed apart before it); then after a warm-up. Then the first call in fresh processes.
section("random", function()
  local NS = 1 << 20
  -- the process's first device allocation, apart (the step before may have just freed its
  -- memory pool)
  local t0 = now()
  local first = cuda.device_array(16, "uint8")
  cuda.synchronize()
  out("diag_first_alloc_of_process_ms", (now() - t0) * 1e3)
  first:close()
  t0 = now()
  local st = cuda.random.create_xoroshiro128p_states(NS, { seed = 1 })
  cuda.synchronize()
  out("rng_init_first_ms", (now() - t0) * 1e3)
  st:close()
  local t, gpu, alloc = {}, {}, {}
  local e0, e1 = cuda.event(), cuda.event()
  for r = 0, REPS do
    t0 = now()
    st = cuda.random.create_xoroshiro128p_states(NS, { seed = r + 2 })
    cuda.synchronize()
    if r > 0 then t[r] = (now() - t0) * 1e3 end
    st:close()
    -- the pieces: the allocation alone, and the GPU's time of the whole call
    t0 = now()
    local a = cuda.device_array({ NS, 2 }, "uint64")
    cuda.synchronize()
    if r > 0 then alloc[r] = (now() - t0) * 1e3 end
    a:close()
    e0:record()
    st = cuda.random.create_xoroshiro128p_states(NS, { seed = r + 2 })
    e1:record()
    e1:synchronize()
    if r > 0 then gpu[r] = e0:elapsed_time(e1) end
    st:close()
  end
  out("rng_init_ms", median(t))
  out("diag_rng_init_alloc_16MiB_ms", median(alloc))
  out("diag_rng_init_events_ms", median(gpu))
  local dir = tempdir()
  io.write(child(dir, "--rng-first"))
  os.execute(("rm -rf '%s'"):format(dir))
  dir = tempdir()
  io.write(child(dir, "--rng-first-whole"))
  io.flush()
  os.execute(("rm -rf '%s'"):format(dir))
end)
collectgarbage()

---------------------------------------------------------------------------------------------
-- 5: pi, examples/pi.lua's kernel on a grid that fills the GPU; the kernel timed with events
section("pi", function()
  local compute_pi = cuda.kernel(PI_SRC, "compute_pi")
  local blocks, threads, iters = SMS * 16, 128, 4000
  local n = blocks * threads
  local states = cuda.random.create_xoroshiro128p_states(n, { seed = 3 })
  local res = cuda.device_array(n, cuda.float32)
  local l = compute_pi[{ blocks, threads }]
  l(states, res, 10, n) -- warm-up
  cuda.synchronize()
  local e0, e1 = cuda.event(), cuda.event()
  local t = {}
  for r = 1, REPS do
    e0:record()
    l(states, res, iters, n)
    e1:record()
    e1:synchronize()
    t[r] = n * iters / (e0:elapsed_time(e1) * 1e-3) / 1e9
  end
  out("pi_gsamples_s", median(t))
  local pi = cuda.reduce("a + b")(res) / n
  if math.abs(pi - math.pi) > 0.01 then note(("helpers.lua: pi came out as %.6f"):format(pi)) end
  states:close(); res:close()
end)
collectgarbage()

---------------------------------------------------------------------------------------------
-- 1, 2: reductions to the host
-- elementwise: saxpy on 2^28 float32 elements, cuda.elementwise against a hand-written CUDA C
-- grid-stride saxpy launched the usual way (CuPy's ElementwiseKernel: bench/compare.py); each
-- timed with events over K calls, as GB/s of the three arrays
section("elementwise", function()
  local NE = 1 << 28
  local x, y, z = cuda.device_array(NE, "float32"), cuda.device_array(NE, "float32"), cuda.device_array(NE, "float32")
  x:fill(1.5); y:fill(2)
  local ew = cuda.elementwise("float32 x, float32 y, float32 a", "float32 z", "z = a * x + y", "saxpy")
  local hand = cuda.kernel([[
extern "C" __global__ void saxpy(const float *x, const float *y, float a, float *z, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    z[i] = a * x[i] + y[i];
}]], "saxpy")
  local hand_launch = hand[{ SMS * 16, 256 }]   -- made once, as a C program would
  local bodies = {
    cudalua = function() ew(x, y, 2.0, z) end,
    hand = function() hand_launch(x, y, 2.0, z, NE) end,
  }
  local K = 10
  local e0, e1 = cuda.event(), cuda.event()
  local res = { cudalua = {}, hand = {} }
  for _, f in pairs(bodies) do f() end
  cuda.synchronize()
  for r = 1, REPS * 2 do
    for _, name in ipairs(r % 2 == 0 and { "cudalua", "hand" } or { "hand", "cudalua" }) do
      e0:record()
      for _ = 1, K do bodies[name]() end
      e1:record()
      e1:synchronize()
      res[name][#res[name] + 1] = e0:elapsed_time(e1) / K
    end
  end
  -- each side checked on its own (the timing loop ends with either)
  for _, name in ipairs { "cudalua", "hand" } do
    z:fill(0)
    bodies[name]()
    local h = z:slice(NE - 3, NE):copy_to_host()
    if h[4] ~= 5 then note(("helpers.lua: %s saxpy gave %s"):format(name, tostring(h[4]))) end
  end
  out("elementwise_saxpy_gbs", NE * 12 / (median(res.cudalua) * 1e-3) / 1e9)
  out("inproc_saxpy_gbs", NE * 12 / (median(res.hand) * 1e-3) / 1e9)
end)
collectgarbage()

-- means along an axis of an 8192 x 8192 float32 matrix with cuda.reduction: of the rows
-- (axis 2) and of the columns (axis 2 of the transpose, a strided view), each timed with
-- events over K calls; the memory-bandwidth time: half a device-to-device copy of the matrix
-- (it reads and writes the 256 MiB once each). CuPy's x.mean(axis=1), x.T.mean(axis=1):
-- bench/compare.py
section("axis means", function()
  local n = 8192
  local x = cuda.device_array({ n, n }, "float32")
  x:fill(1.5)
  local mean = cuda.reduction("float32 x", "float32 y", "x", "a + b", "y = a / _count", "0", "mean")
  local rows, cols = cuda.device_array(n, "float32"), cuda.device_array(n, "float32")
  local copy = cuda.device_array({ n, n }, "float32")
  local bodies = {
    rows = function() mean(x, { axis = 2, out = rows }) end,
    cols = function() mean(x:T(), { axis = 2, out = cols }) end,
    copy = function() cuda.copy(copy, x, cuda.default_stream()) end,
  }
  local K = 10
  local e0, e1 = cuda.event(), cuda.event()
  local res = { rows = {}, cols = {}, copy = {} }
  for _, f in pairs(bodies) do f() end
  cuda.synchronize()
  for _ = 1, REPS * 2 do
    for _, name in ipairs { "rows", "cols", "copy" } do
      e0:record()
      for _ = 1, K do bodies[name]() end
      e1:record()
      e1:synchronize()
      res[name][#res[name] + 1] = e0:elapsed_time(e1) * 1e3 / K
    end
  end
  local r, c = rows:copy_to_host(), cols:copy_to_host()
  if r[n] ~= 1.5 or c[n] ~= 1.5 then note(("helpers.lua: axis means gave %s and %s"):format(r[n], c[n])) end
  out("mean_rows_us", median(res.rows))
  out("mean_cols_us", median(res.cols))
  out("mean_bandwidth_us", median(res.copy) / 2)
  out("mean_rows_vs_bandwidth", median(res.rows) / (median(res.copy) / 2))
  out("mean_cols_vs_bandwidth", median(res.cols) / (median(res.copy) / 2))
  x:close(); copy:close()
end)
collectgarbage()

section("reduce", function()
  local sum = cuda.reduce("a + b")
  local BIG = 1 << 28
  local x = cuda.device_array(BIG, cuda.float32)
  x:fill(1)
  local v
  for _ = 1, 2 do v = sum(x) end -- warm-up (compiles)
  local t = {}
  for r = 1, REPS do
    local t0 = now()
    v = sum(x)
    t[r] = (now() - t0) * 1e6
  end
  if math.abs(v - BIG) > 0.01 * BIG then note(("helpers.lua: sum of 2^28 ones gave %s"):format(v)) end
  local us = median(t)
  out("reduce_f32_call_us", us)
  out("reduce_f32_gbs", BIG * 4 / (us * 1e-6) / 1e9)
  -- kernel only: K back-to-back reductions left on the device, between two events
  local K = 20
  local res = cuda.device_array(1, cuda.float32)
  local opts = { res = res }
  local e0, e1 = cuda.event(), cuda.event()
  local enq, single = {}, {}
  for r = 1, REPS do
    e0:record()
    local t0 = now()
    for _ = 1, K do sum(x, opts) end
    local t1 = now()
    e1:record()
    e1:synchronize()
    t[r] = e0:elapsed_time(e1) * 1e3 / K
    enq[r] = (t1 - t0) * 1e6 / K
    -- one reduction between two events, the host's time to enqueue it included
    e0:record()
    sum(x, opts)
    e1:record()
    e1:synchronize()
    single[r] = e0:elapsed_time(e1) * 1e3
  end
  us = median(t)
  out("reduce_f32_kernel_us", us)
  out("reduce_f32_kernel_gbs", BIG * 4 / (us * 1e-6) / 1e9)
  out("diag_reduce_f32_enqueue_us", median(enq))
  out("diag_reduce_f32_single_events_us", median(single))
  -- what a stream synchronize costs with nothing queued, and a mapped read
  local ds = cuda.default_stream()
  local m = cuda.mapped_array(1, cuda.float32)
  local ts, tm = {}, {}
  for r = 1, REPS do
    local t0 = now()
    for _ = 1, 1000 do ds:synchronize() end
    ts[r] = (now() - t0) * 1e3
    t0 = now()
    for _ = 1, 1000 do local _ = m[1] end
    tm[r] = (now() - t0) * 1e3
  end
  out("diag_idle_stream_sync_us", median(ts))
  out("diag_mapped_read_us", median(tm))
  x:close()
  collectgarbage()

  local SMALL = 1234
  local xs = cuda.device_array(SMALL, cuda.float64)
  xs:fill(1)
  for _ = 1, 500 do v = sum(xs) end
  local M = 5000
  local ts2 = {}
  for i = 1, M do
    local t0 = now()
    v = sum(xs)
    ts2[i] = (now() - t0) * 1e6
  end
  if v ~= SMALL then note(("helpers.lua: sum of 1234 ones gave %s"):format(v)) end
  out("reduce_small_us", median(ts2))
end)
collectgarbage()

---------------------------------------------------------------------------------------------
local mod = cuda.compile(KSRC)

-- 3: forall vs the plain launch of the same kernel with the same grid and block, taking turns;
-- the launcher a launch makes, timed alone
section("forall", function()
  local bump = mod.bump
  local n = 1 << 16
  local x = cuda.device_array(n, cuda.float32)
  x:fill(0)
  local fl = bump:forall(n)
  local grid = tonumber(tostring(fl):match("grid {(%d+)"))
  local block = tonumber(tostring(fl):match("block {(%d+)"))
  local r = interleaved({
    plain = function(m) for _ = 1, m do bump[{ grid, block }](x, n) end end,
    forall = function(m) for _ = 1, m do bump:forall(n)(x, n) end end,
    launcher = function(m)
      local l = bump:forall(n)
      for _ = 1, m do l(x, n) end
    end,
  }, N // 2)
  out("forall_plain_us", r.plain)
  out("forall_us", r.forall)
  out("forall_launcher_us", r.launcher)
  out("diag_forall_make_launcher_us", (per_item(function(m)
    for _ = 1, m do local l = bump:forall(n) end
  end)))
  out("diag_plain_make_launcher_us", (per_item(function(m)
    for _ = 1, m do local l = bump[{ grid, block }] end
  end)))
  out("diag_forall_block", block)
end)
collectgarbage()

---------------------------------------------------------------------------------------------
-- 9: foreign objects with __cuda_array_interface vs a cudalua device array, through a launcher
-- made once, taking turns. The target's object is examples/array_interface.lua's Tensor: its
-- interface function returns a table the tensor built once. Beside it: a function that builds
-- four new tables on every call (the object's own cost: interface_fn_fresh), and the interface
-- as a table in the metatable.
section("array interface", function()
  local Tensor = {}
  Tensor.__index = Tensor
  Tensor.__cuda_array_interface = function(t) return t.cai end
  local Fresh = {}
  Fresh.__cuda_array_interface = function(t)
    return { data = { t.ptr, false }, shape = { t.rows, t.cols }, typestr = "<f4",
             strides = { t.cols * 4, 4 }, version = 3 }
  end
  local rows, cols = 32, 32
  local n = rows * cols
  local storage = cuda.device_array(n, cuda.float32)
  local fields = { storage = storage, ptr = storage:ptr(), rows = rows, cols = cols }
  local fresh = setmetatable(fields, Fresh)
  local t = setmetatable({ storage = storage, cai = Fresh.__cuda_array_interface(fields) }, Tensor)
  local ts = setmetatable({}, { __cuda_array_interface = Fresh.__cuda_array_interface(fields) })
  local l = mod.touch[{ 1, 32 }]
  local view = cuda.as_cuda_array(t)
  local r = interleaved({
    native = function(m) for _ = 1, m do l(storage, n) end end,
    foreign = function(m) for _ = 1, m do l(t, n) end end,
    fresh = function(m) for _ = 1, m do l(fresh, n) end end,
    view = function(m) for _ = 1, m do l(view, n) end end,
    foreign_table = function(m) for _ = 1, m do l(ts, n) end end,
  }, N // 10, REPS * 8)
  out("cai_native_us", r.native)
  out("cai_foreign_us", r.foreign)
  out("cai_foreign_fresh_us", r.fresh)
  out("diag_cai_view_launch_us", r.view)
  out("diag_cai_foreign_static_table_launch_us", r.foreign_table)
  -- the pieces without launching: cudalua's as_cuda_array on each object, and the fresh
  -- object's own function
  local as, f = cuda.as_cuda_array, Fresh.__cuda_array_interface
  r = interleaved({
    as_cuda_array = function(m) for _ = 1, m do as(t) end end,
    as_cuda_array_fresh = function(m) for _ = 1, m do as(fresh) end end,
    interface_fn_fresh = function(m) for _ = 1, m do f(fresh) end end,
  }, N // 4)
  for name, us in pairs(r) do out("diag_cai_" .. name .. "_us", us) end
end)
collectgarbage()

---------------------------------------------------------------------------------------------
-- 8: a chain of 1000 empty kernels: one by one from Lua, and as a graph
section("graphs", function()
  local CHAIN = 1000
  local empty = mod.empty
  local R = REPS * 4
  local l = empty[{ 1, 1 }]
  local t = {}
  for r = 0, R do
    local t0 = now()
    for _ = 1, CHAIN do l() end
    cuda.synchronize()
    if r > 0 then t[r] = (now() - t0) / CHAIN * 1e6 end
  end
  out("graph_chain_stream_us", median(t))
  local cfg = { 1, 1 }
  local function build()
    local g = cuda.graph()
    local prev
    for _ = 1, CHAIN do prev = g:kernel(empty, cfg, nil, prev and { prev } or nil) end
    return g
  end
  local tb, ti = {}, {}
  t = {}
  for r = 0, REPS do
    collectgarbage()
    local t0 = now()
    local g = build()
    local t1 = now()
    local x = g:instantiate()
    local t2 = now()
    if r > 0 then t[r], tb[r], ti[r] = (t2 - t0) * 1e3, (t1 - t0) * 1e3, (t2 - t1) * 1e3 end
    x:close(); g:close()
  end
  out("graph_build_ms", median(t))
  out("diag_graph_build_nodes_ms", median(tb))
  out("diag_graph_instantiate_ms", median(ti))
  local g = build()
  local x = g:instantiate()
  t = {}
  for r = -1, R do
    local t0 = now()
    x:launch()
    cuda.synchronize()
    if r > 0 then t[r] = (now() - t0) / CHAIN * 1e6 end
  end
  out("graph_replay_us", median(t))
  local e0, e1 = cuda.event(), cuda.event()
  t = {}
  for r = 1, REPS do
    e0:record()
    x:launch()
    e1:record()
    e1:synchronize()
    t[r] = e0:elapsed_time(e1) * 1e3 / CHAIN
  end
  out("diag_graph_replay_events_us", median(t))
  x:close(); g:close()
  -- the same chain from the seed's unbound nodes: built and instantiated, then replayed in
  -- turns with the bound form's graph (the same CUDA graph: the replays must match)
  local G = cuda.graph
  local function build_unbound()
    local prev
    for _ = 1, CHAIN do prev = G.kernel(empty, cfg, nil, prev and { prev } or nil) end
    return (prev:build())
  end
  -- build + instantiate of both forms in turns (the bound form's time drifts between runs)
  local function made(f) return function(m) for _ = 1, m do local bg = f(); bg:instantiate():close(); bg:close() end end end
  local r = interleaved({ bound = made(build), unbound = made(build_unbound) }, 1)
  out("graph_build_alt_ms", r.bound / 1e3)
  out("unbound_build_ms", r.unbound / 1e3)
  local bg, ug = build(), build_unbound()
  local bx, ux = bg:instantiate(), ug:instantiate()
  r = interleaved({
    bound = function(m) for _ = 1, m do bx:launch() end end,
    unbound = function(m) for _ = 1, m do ux:launch() end end,
  }, 20)
  out("graph_replay_alt_us", r.bound / CHAIN)
  out("unbound_replay_us", r.unbound / CHAIN)
  bx:close(); ux:close(); bg:close(); ug:close()
end)
collectgarbage()

---------------------------------------------------------------------------------------------
-- 10: 1000 iterations of a small kernel with a convergence test: a WHILE conditional node (one
-- launch) against a host loop that launches and reads a flag back each iteration
section("conditional graphs", function()
  local WLOOP = 1000
  local wmod = cuda.compile(WSRC)
  local x, count = cuda.device_array(32, "float32"), cuda.device_array(1, "int32")
  -- the body: unroll launches of k in a chain (a WHILE iteration's cost in the driver is
  -- shared by the body's kernels)
  local function time_while(k, unroll)
    local g = cuda.graph()
    local go_on = g:condition { default = 1 }
    local zero = g:memset(count, 0)
    local body = g:while_loop(go_on, { zero })
    local prev
    for _ = 1, unroll do prev = body:kernel(k, { 1, 32 }, { x, count, WLOOP, go_on }, prev and { prev }) end
    local t = {}
    for r = -1, REPS do
      local t0 = now()
      g:launch()
      cuda.synchronize()
      if r > 0 then t[r] = (now() - t0) * 1e3 end
    end
    if count[1] ~= WLOOP then note(("the WHILE loop (body of %d) ran %d times"):format(unroll, count[1])) end
    g:close()
    return median(t)
  end
  out("graph_while_ms", time_while(wmod.tick, 1))
  out("graph_while4_ms", time_while(wmod.tick_n, 4))
  local s = cuda.stream()
  local done, dflag = cuda.pinned_array(1, "int32"), cuda.device_array(1, "int32")
  local l = wmod.tick_flag[{ 1, 32, s }]
  local t = {}
  for r = 0, REPS do
    count:fill(0, s); dflag:fill(0, s)
    s:synchronize()   -- (raw C's loop starts from an idle stream too)
    local t0 = now()
    repeat
      l(x, count, WLOOP, dflag)
      dflag:copy_to_host(done, s)
      s:synchronize()
    until done[1] ~= 0
    if r > 0 then t[r] = (now() - t0) * 1e3 end
  end
  if count[1] ~= WLOOP then note(("the host loop ran %d times"):format(count[1])) end
  out("host_loop_ms", median(t))
  s:close()
end)
collectgarbage()

---------------------------------------------------------------------------------------------
-- 9: Lua host functions on a stream of their own, as bench/raw_helpers.c's driver callbacks
-- (cuLaunchHostFunc) and compare.py's CuPy ones: one then a synchronize, 100 then one
-- synchronize, and a graph of 1000 host nodes in a chain replayed
section("host functions", function()
  local HCHAIN, M = 1000, math.max(100, N // 50)
  local s = cuda.stream { non_blocking = true }
  local calls = 0
  local function bump() calls = calls + 1 end
  local t = {}
  for r = 0, REPS do
    local t0 = now()
    for _ = 1, M do
      s:launch_host_func(bump)
      s:synchronize()
    end
    if r > 0 then t[r] = (now() - t0) / M * 1e6 end
  end
  out("hostfn_roundtrip_us", median(t))
  t = {}
  for r = 0, REPS do
    local t0 = now()
    for _ = 1, M // 100 do
      for _ = 1, 100 do s:launch_host_func(bump) end
      s:synchronize()
    end
    if r > 0 then t[r] = (now() - t0) / (M // 100 * 100) * 1e6 end
  end
  out("hostfn_batch_us", median(t))
  local g = cuda.graph()
  local prev
  for _ = 1, HCHAIN do prev = g:host(bump, prev and { prev } or nil) end
  local x = g:instantiate()
  local before = calls
  t = {}
  for r = -1, REPS do
    local t0 = now()
    x:launch(s)
    s:synchronize()
    if r > 0 then t[r] = (now() - t0) / HCHAIN * 1e6 end
  end
  if calls - before ~= (REPS + 2) * HCHAIN then note(("host nodes ran %d times"):format(calls - before)) end
  out("hostfn_graph_replay_us", median(t))
  x:close(); g:close(); s:close()
end)
collectgarbage()

---------------------------------------------------------------------------------------------
-- 7: compiles of the vecadd module: cold (a source no cache has seen), a hit in the process,
-- and a hit on disk in a new process (lua5.4 children with a cache directory of their own)
section("compile", function()
  local stamp = ("%d-%d"):format(os.time(), math.random(1 << 30))
  local count = 0
  local function unique() count = count + 1; return ("%s-%d"):format(stamp, count) end
  cuda.kernel(vecadd_src(unique()), "vecadd") -- warm-up
  local cold, mem = {}, {}
  local last
  for r = 1, REPS do
    last = unique()
    local src = vecadd_src(last)
    local t0 = now()
    cuda.kernel(src, "vecadd")
    cold[r] = (now() - t0) * 1e3
  end
  out("compile_cold_ms", median(cold))
  local src = vecadd_src(last)
  for r = 1, REPS do
    local t0 = now()
    cuda.kernel(src, "vecadd")
    mem[r] = (now() - t0) * 1e3
  end
  out("compile_memory_ms", median(mem))

  local dir = tempdir()
  local nonce = unique()
  -- the first child compiles (a miss in a fresh process) and fills the directory
  local ms = child(dir, "--compile-child", nonce):match("^(%S+)")
  out("diag_compile_cold_child_ms", tonumber(ms) or -1)
  local cc = dev.compute_capability
  local arch = ("sm_%d%d"):format(cc[1], cc[2])
  -- a given arch is another key: one child fills that entry before the timed ones
  child(dir, "--compile-child-arch", nonce, arch)
  local t, ta = {}, {}
  local hits, misses
  for r = 1, REPS do
    ms, hits, misses = child(dir, "--compile-child", nonce):match("^(%S+) (%d+) (%d+)")
    if hits ~= "1" or misses ~= "0" then
      note(("helpers.lua: a disk cache child had %s hits, %s misses"):format(hits, misses))
    end
    t[r] = tonumber(ms) or -1
    ms, hits, misses = child(dir, "--compile-child-arch", nonce, arch):match("^(%S+) (%d+) (%d+)")
    if hits ~= "1" or misses ~= "0" then
      note(("helpers.lua: a disk cache child with arch %s had %s hits, %s misses"):format(arch, hits, misses))
    end
    ta[r] = tonumber(ms) or -1
  end
  out("compile_disk_child_ms", median(t))
  out("diag_compile_disk_child_given_arch_ms", median(ta))
  io.write(child(dir, "--compile-pieces", nonce))
  io.flush()
  os.execute(("rm -rf '%s'"):format(dir))
end)
collectgarbage()

---------------------------------------------------------------------------------------------
-- 6: a ~0.5 s kernel that bumps a managed counter, unpolled (a stream synchronize) vs polled
-- by cuda.progress.watch (interval 1 ms, lines into a file); runs interleaved, medians. The
-- pieces of watch's loop apart, each polling every 1 ms until the kernel is done: only
-- stream:query(), only reading the counter, only waking up (sleeping 1 ms at a time).
section("progress", function()
  local spin = cuda.kernel(SPIN_SRC, "spin")
  local blocks, threads, work = SMS * 4, 256, 4096
  local counter = cuda.managed_array(1, cuda.uint64)
  local sink = cuda.device_array(1, cuda.float32)
  local s = cuda.stream()
  local e0, e1 = cuda.event(), cuda.event()
  local logname = os.tmpname()
  local log = assert(io.open(logname, "w"))
  local sleep = cuda.sleep
  local expect_ms = 500
  local reads = {} -- mode -> µs of each host read of the counter while the kernel runs
  local function run(steps, mode, ctr)
    ctr = ctr or counter
    ctr[1] = 0
    local total = blocks * threads * steps
    local t0 = now()
    e0:record(s)
    spin[{ blocks, threads, s }](ctr, steps, work, sink)
    e1:record(s)
    local seen
    if mode == "watch" then
      seen = cuda.progress.watch(ctr, total, { stream = s, interval = 0.001, out = log, label = "spin" })
    elseif mode == "query" then
      while not s:query() do sleep(0.001) end
    elseif mode == "read" or mode == "read10" then
      local iv, rt = mode == "read10" and 0.01 or 0.001, reads[mode] or {}
      reads[mode] = rt
      while true do
        local t1 = now()
        local v = ctr[1]
        rt[#rt + 1] = (now() - t1) * 1e6
        if v >= total then break end
        sleep(iv)
      end
    elseif mode == "sleep" then
      local stop = t0 + expect_ms * 0.95e-3
      while now() < stop do sleep(0.001) end
    end
    s:synchronize()
    local wall = (now() - t0) * 1e3
    if ctr[1] ~= total or (mode == "watch" and seen ~= total) then
      note(("helpers.lua: progress counter %s, seen %s, expected %d"):format(ctr[1], seen, total))
    end
    return wall, e0:elapsed_time(e1)
  end
  local _, ms = run(200, "none")
  local steps = math.max(200, math.floor(200 * 500 / ms))
  _, expect_ms = run(steps, "watch") -- warm-up, and the counter's advice
  local modes = { "none", "watch", "query", "read", "read10", "sleep" }
  local wall, kern = {}, {}
  for _, m in ipairs(modes) do wall[m], kern[m] = {}, {} end
  reads = {}
  for r = 1, 4 do
    for i = 0, #modes - 1 do
      local m = modes[(i + r - 1) % #modes + 1] -- a different order each round
      wall[m][r], kern[m][r] = run(steps, m)
    end
  end
  log:close()
  local lines = 0
  for _ in io.lines(logname) do lines = lines + 1 end
  os.remove(logname)
  local u, p = median(wall.none), median(wall.watch)
  out("progress_unpolled_ms", u)
  out("progress_polled_ms", p)
  out("diag_progress_slowdown_pct", (p / u - 1) * 100)
  local ku = median(kern.none)
  out("diag_progress_kernel_unpolled_ms", ku)
  for _, m in ipairs(modes) do
    local k = kern[m]
    local lo, hi = math.min(table.unpack(k)), math.max(table.unpack(k))
    if m ~= "none" then
      out(("diag_progress_kernel_%s_slowdown_pct"):format(m), (median(k) / ku - 1) * 100)
    end
    out(("diag_progress_kernel_%s_spread_pct"):format(m), (hi - lo) / median(k) * 100)
  end
  out("diag_progress_log_lines", lines)
  for m, rt in pairs(reads) do
    out(("diag_progress_%s_host_read_us"):format(m), median(rt))
    out(("diag_progress_%s_reads_per_run"):format(m), #rt / 4)
  end
  -- the counter in mapped (pinned host) memory instead: the host reads it without moving a
  -- page, the kernel's atomics cross the bus; its own length (~0.25 s), 2 rounds
  local mapped = cuda.mapped_array(1, cuda.uint64)
  _, ms = run(20, "none", mapped)
  local msteps = math.max(20, math.min(steps, math.floor(20 * 250 / ms)))
  log = assert(io.open(logname, "w"))
  local mu, mp = {}, {}
  for r = 1, 2 do
    _, mu[r] = run(msteps, "none", mapped)
    _, mp[r] = run(msteps, "watch", mapped)
  end
  log:close()
  os.remove(logname)
  out("diag_progress_mapped_kernel_unpolled_ms", median(mu))
  out("diag_progress_mapped_kernel_polled_ms", median(mp))
  out("diag_progress_mapped_steps_per_ms", msteps / median(mu))
  out("diag_progress_managed_steps_per_ms", steps / ku)
end)

---------------------------------------------------------------------------------------------
-- 11: a module variable found and 64 KiB copied into it from pinned memory, on a stream of
-- its own, many times (bench/raw_helpers.c's: cuModuleGetGlobal + cuMemcpyHtoDAsync)
section("module globals", function()
  local m = cuda.compile([[
__device__ float gbuf[16384];
extern "C" __global__ void gread(float *o) { o[0] = gbuf[0]; }
]])
  local s = cuda.stream { non_blocking = true }
  local h = cuda.pinned_array(16384, cuda.float32)
  local M = math.max(1000, N // 10)
  -- in turns with the same loop in C in this process (bench/rawloop.c), on the same stream
  local bodies = { cudalua = function(n) for _ = 1, n do m:get_global("gbuf"):copy_to_device(h, s) end end }
  local rawloop = B.rawloop()
  if rawloop then
    local cc = cuda.devices()[1].compute_capability
    local arch = ("sm_%d%d"):format(cc[1], cc[2])
    bodies.raw = function(n) rawloop.global_copy(arch, n, s:handle()) end
  end
  local r = B.interleaved(bodies, M, nil, function() s:synchronize() end)
  out("get_global_copy_us", r.cudalua)
  if r.raw then out("inproc_get_global_copy_us", r.raw) end
  s:close()
end)
collectgarbage()

---------------------------------------------------------------------------------------------
-- 12: textures, as bench/raw_helpers.c's section 12: a 4096 x 4096 float32 CUDA array read
-- with tex2D (point, clamp) and copied to linear memory, 50 launches of a launcher made once
-- between two events; then cuda.texture(ca) + :close() in a loop against cuTexObjectCreate +
-- cuTexObjectDestroy (cudalua reuses the object a close left: src/cuarray.c's spares), and with
-- a new object each time
local TEXSRC = [[
extern "C" __global__ void tex_copy(float *out, cudaTextureObject_t t, int w, int h) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x < w && y < h) out[y * w + x] = tex2D<float>(t, x + 0.5f, y + 0.5f);
}
]]
section("textures", function()
  local W, K, M = 4096, 50, 10000
  local k = cuda.kernel(TEXSRC, "tex_copy")
  local d = cuda.device_array(W * W, cuda.float32):fill(1)
  local ca = cuda.cuda_array({ W, W }, cuda.float32):copy_to_device(d)
  local tex = cuda.texture(ca)
  local launch = k[{ { W // 16, W // 16 }, { 16, 16 } }]
  local e0, e1 = cuda.event(), cuda.event()
  local t = {}
  for r = 0, REPS do
    e0:record()
    for _ = 1, K do launch(d, tex, W, W) end
    e1:record(); e1:synchronize()
    if r > 0 then t[r] = e0:elapsed_time(e1) * 1e3 / K end
  end
  out("tex_fetch_us", median(t))
  tex:close()
  -- in turns with the same loop in C in this process (bench/rawloop.c: an array of its own)
  local bodies = { cudalua = function(n) for _ = 1, n do cuda.texture(ca):close() end end }
  local rawloop = B.rawloop()
  if rawloop then bodies.raw = function(n) rawloop.tex_create_destroy(n) end end
  local r = B.interleaved(bodies, M)
  out("tex_create_destroy_us", r.cudalua)
  if r.raw then out("inproc_tex_create_destroy_us", r.raw) end
  -- the same with a driver object made and destroyed each time: five descriptions in turn
  -- (point filtering and clamping as above, told apart only by a border colour the clamp never
  -- shows) outrun the array's four spares (src/cuarray.c), so none is reused
  local opts = {}
  for i = 1, 5 do opts[i] = { border = { i } } end
  local fresh = B.interleaved({ cudalua = function(n)
    for i = 1, n do cuda.texture(ca, opts[i % 5 + 1]):close() end
  end }, M)
  out("tex_create_destroy_fresh_us", fresh.cudalua)
  ca:close()
end)
