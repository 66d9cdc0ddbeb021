-- tools/stress.lua: random, seeded sequences over the places where Lua meets the driver's
-- threads (issue 24), each checked against a model kept in Lua. Run by tools/stress.c (several
-- states on several threads, a watchdog) through `make stress`; run(seed, seconds, thread)
-- returns {sequences, ops, wrong, report}. A sequence has 1 to 3 lanes (a stream, legacy,
-- blocking or non-blocking, with a device int32 array and a mapped tick counter), and queues at
-- random: kernels, copies into pinned, pageable and mapped arrays, Lua host functions (some that
-- raise, some that close or drop arrays and streams made for them, some that collect garbage),
-- captures (some through a temporary the graph allocates, some with an IF/ELSE node made in
-- the capture) and explicit graphs with host nodes
-- or a WHILE node replayed several times, bursts of launches behind
-- a host function (the driver's queue fills), and waits of every kind (synchronize, query,
-- events, element reads, blocking copies). Host functions check, when they run, that every tick
-- queued before them has happened and that the copy before them arrived.
-- The objects of issue 27 meet host functions too, each on its lane's stream:
--   cuarray: a CUDA array (1-D or 2-D, int32 or float32) filled from a temporary holding the
--     lane's values and copied out again, a host function closing (or dropping and collecting)
--     the CUDA array or the temporary before the copy in or between the copies;
--   texture: a texture over such a CUDA array read by a kernel (tex1D / tex2D, point filtering)
--     into a device array, a host function closing (or dropping) the texture or the CUDA array
--     before or after the launch;
--   surface: a kernel adding to a CUDA array made with surface = true through a surface
--     (surf1D / surf2D read and write), a host function closing (or dropping) the surface or
--     the CUDA array before or after the launch; copied out after;
--   global: the lane's own __device__ int of the module, set through Module:get_global's view
--     on the stream, bumped by a kernel k times (or by a capture replayed k times), read back.
-- And cuda.compile_all (issue 28): a good and a broken source compiled in forked children while
-- the other states run; the good one's kernel adds to the lane like add.
-- Whether a host function has run when the next call comes depends on the driver's timing (or a
-- wait put between, at random), so each call looks first: an object closed by then must make it
-- raise an error naming the function (or the kernel) and saying "closed"; otherwise the call may
-- work (the values it leads to are then checked against the model, by host functions) or raise
-- so (a host function closed the object during the call). What was closed refuses later uses too.
local cuda = require "cudalua"
local beat = rawget(_G, "beat") or function() end   -- given by tools/stress.c
local function yes() return true end
local try_capture, try_sync = rawget(_G, "try_capture") or yes, rawget(_G, "try_sync") or yes
local unlock = rawget(_G, "unlock") or function() end
-- STRESS_SKIP="while,temp,cond,cuarray,texture,surface,global,compile" leaves those sequences out (so
-- does any other operation's name: op.NAME below). The WHILE-node sequence is left out
-- unless STRESS_SKIP is set (to "" for everything): graphs with conditional nodes fail the
-- context on driver 580.159.04 when other streams run work at the same time, in plain CUDA C
-- too (tools/while_repro.cu), and every run would end there
local skipped = {}
for name in (os.getenv("STRESS_SKIP") or "while"):gmatch("[%w_]+") do skipped[name] = true end
-- cudalua's CPU device has no CUDA arrays, textures or surfaces (they run on a GPU only)
if cuda.is_available() and cuda.devices()[1].kind == "cpu" then
  skipped.cuarray, skipped.texture, skipped.surface = true, true, true
end
local M = {}

local SRC = [[
extern "C" __global__ void add(int *x, int v, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += v;
}
extern "C" __global__ void tick(int *c) { c[0] += 1; }
// a WHILE node's body: x += v, and the loop ends after *left runs (issue 26)
extern "C" __global__ void step(int *x, int v, int n, int *left, cudaGraphConditionalHandle go_on) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += v;
  if (i == 0 && --*left <= 0) cudaGraphSetConditional(go_on, 0);
}
// a captured IF/ELSE node's condition, from a value (issue 26's capture form)
extern "C" __global__ void setc(cudaGraphConditionalHandle c, int v) { cudaGraphSetConditional(c, v); }
// a lane's values told apart by index: y[i] = x[i] + i (exact in float: |values| < 2^24)
extern "C" __global__ void spread_int32(int *y, const int *x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] + i;
}
extern "C" __global__ void spread_float32(float *y, const int *x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = (float)(x[i] + i);
}
// module variables, one a lane (a state's lanes share its module), bumped by v
__device__ int var1;
__device__ int var2;
__device__ int var3;
extern "C" __global__ void bump(int lane, int v) {
  int *g = lane == 1 ? &var1 : lane == 2 ? &var2 : &var3;
  *g += v;
}
]]

-- (textures and surfaces: a source of their own, which the CPU device does not compile)
local TEX_SRC = [[
// a texture's texels at their centres in row-major order (point filtering); h = 0: 1-D
extern "C" __global__ void fetch_int32(int *out, cudaTextureObject_t t, int w, int h) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < w * (h ? h : 1)) out[i] = h ? tex2D<int>(t, i % w + 0.5f, i / w + 0.5f) : tex1D<int>(t, i + 0.5f);
}
extern "C" __global__ void fetch_float32(float *out, cudaTextureObject_t t, int w, int h) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < w * (h ? h : 1)) out[i] = h ? tex2D<float>(t, i % w + 0.5f, i / w + 0.5f) : tex1D<float>(t, i + 0.5f);
}
// v added to every element of a surface (x in bytes); h = 0: 1-D
extern "C" __global__ void surf_add_int32(cudaSurfaceObject_t s, int v, int w, int h) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= w * (h ? h : 1)) return;
  if (h) surf2Dwrite(surf2Dread<int>(s, i % w * 4, i / w) + v, s, i % w * 4, i / w);
  else surf1Dwrite(surf1Dread<int>(s, i * 4) + v, s, i * 4);
}
extern "C" __global__ void surf_add_float32(cudaSurfaceObject_t s, float v, int w, int h) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= w * (h ? h : 1)) return;
  if (h) surf2Dwrite(surf2Dread<float>(s, i % w * 4, i / w) + v, s, i % w * 4, i / w);
  else surf1Dwrite(surf1Dread<float>(s, i * 4) + v, s, i * 4);
}
]]

local KERNELS = { "add", "tick", "step", "setc", "spread_int32", "spread_float32", "bump" }
local TEX_KERNELS = { "fetch_int32", "fetch_float32", "surf_add_int32", "surf_add_float32" }

-- the module (its variables) and its kernels by name
local function kernels()
  local m = cuda.compile(SRC, { name = "stress.cu" })
  local k = { module = m }
  for _, name in ipairs(KERNELS) do k[name] = m:get(name) end
  if not (skipped.texture and skipped.surface) then
    local t = cuda.compile(TEX_SRC, { name = "stress_tex.cu" })
    for _, name in ipairs(TEX_KERNELS) do k[name] = t:get(name) end
  end
  return k
end

local function blocks(n) return (n + 127) // 128 end

-- ---- waits and host functions: cx is the sequence's state (context below) ----

-- fn(...): with other states on other threads, a wait for the whole device (or the legacy
-- stream) is refused while one of them captures (CUDA's rule, said by cudalua): tried again a
-- little later. A host function's error, raised by a wait once the work was done, is counted
-- ("(and N more)" included). Returns true, or false and any other error's message
local function attempt(cx, fn, ...)
  local ok, e = pcall(fn, ...)
  local tries = 0
  while not ok and not cx.solo and tries < 20000 and tostring(e):find("while a stream is capturing", 1, true) do
    cuda.sleep(0.0005)
    tries = tries + 1
    ok, e = pcall(fn, ...)
  end
  if ok then return true end
  e = tostring(e)
  if e:find("a Lua host function failed", 1, true) and e:find("stress-host-error", 1, true) then
    cx.hf.raised = cx.hf.raised + 1 + tonumber(e:match("%(and (%d+) more%)") or "0")
    return true
  end
  return false, e
end

-- a wait (or any call that must work): another error is a wrong result
local function waiting(cx, fn, ...)
  local ok, e = attempt(cx, fn, ...)
  if not ok then cx.wrong(cx.where .. ": a wait raised: " .. e) end
end

-- with other states: captures and device-wide waits one at a time (tools/stress.c), the lock
-- taken while this state's host functions keep running (a query runs them)
local function locked(cx, try, fn, ...)
  if cx.solo then return fn(...) end
  while not try() do
    waiting(cx, cx.idle.query, cx.idle)   -- (its errors are the host functions': counted there)
    cuda.sleep(0.0002)
  end
  local ok, e = pcall(fn, ...)
  unlock()
  if not ok then error(e, 0) end
end

-- a host function checking, when it runs, the lane's ticks (and a copy's values); it may
-- close objects, drop one (opts.drops = {table, key}), collect garbage and raise
local function host_fn(cx, l, opts)
  local hf = cx.hf
  local want_ticks = l.ticks
  local copy, copy_want = opts and opts.copy, opts and opts.copy_want
  local raises, closes, drops = opts and opts.raises, opts and opts.closes, opts and opts.drops
  return function()
    hf.ran = hf.ran + 1
    if l.c[1] ~= want_ticks then hf.bad = hf.bad + 1 end
    if copy and copy[1] ~= copy_want then hf.bad = hf.bad + 1 end
    if closes then for _, o in ipairs(closes) do o:close() end end
    if drops then drops[1][drops[2]] = nil end
    if opts and opts.collect then collectgarbage() end
    if raises then error("stress-host-error", 0) end
  end
end

-- the model of one lane: the values its array must hold, the ticks queued, and the expected
-- host-function runs; i: its place (its module variable is var<i>)
local function new_lane(cx, kind, i)
  local rng = cx.rng
  local n = rng(1, 8) * 128 + rng(0, 127)
  local s = kind == "legacy" and cuda.default_stream() or cuda.stream(kind == "nonblocking")
  local base = rng(-1000, 1000)
  local d = cuda.device_array(n, "int32", kind ~= "legacy" and s or nil)
  waiting(cx, d.fill, d, base, kind ~= "legacy" and s or nil)   -- stream-less: a wait
  local c = cuda.mapped_array(1, "int32")
  return { kind = kind, i = i, s = s, n = n, d = d, c = c, value = base, ticks = 0 }
end

-- the stream a lane's allocations and stream-less waits take: none for the legacy lane
local function on(l) return l.kind ~= "legacy" and l.s or nil end

-- with other states on other threads, only thread 1 captures, a non-blocking stream in the
-- thread_local or relaxed mode: a global capture stops every thread's allocations, and while a
-- blocking stream captures the legacy stream is refused everywhere (CUDA's rules, which
-- cudalua keeps with a clear error)
local function can_capture(cx, l)
  return cx.solo and l.kind ~= "legacy" or cx.thread == 1 and l.kind == "nonblocking"
end

-- the graph body() captures on the lane's stream, in a random mode
local function capture(cx, l, body)
  local modes = cx.solo and { "global", "thread_local", "relaxed" } or { "thread_local", "relaxed" }
  local g
  locked(cx, try_capture, function()
    l.s:begin_capture(modes[cx.rng(1, #modes)])
    body()
    g = l.s:end_capture()
  end)
  return g
end

-- ---- the operations: op.NAME(cx, l) on lane l ----
local op = {}

function op.add(cx, l)
  beat("add")
  local v = cx.rng(-50, 50)
  cx.k.add[{ blocks(l.n), 128, l.s }](l.d, v, l.n)
  l.value = l.value + v
end

-- cuda.compile_all from several states at once (issue 28): each source's NVRTC run in a
-- process forked while the other states' threads use the driver; a broken source's error comes
-- back by its index, and the good one's kernel adds v like op.add
local COMPILED = 'extern "C" __global__ void %s(int *x, int v, int n) {\n'
  .. '  int i = blockIdx.x * blockDim.x + threadIdx.x;\n  if (i < n) x[i] += v;\n}\n'
function op.compile(cx, l)
  beat("compile_all")
  local v, name = cx.rng(-50, 50), ("add_%d_%d"):format(cx.thread, cx.rng(1, 1 << 30))
  local mods, errs = cuda.compile_all({ COMPILED:format(name), "__global__ void broken( {" }, { cache = false })
  if not (errs and not errs[1] and (errs[2] or ""):find("failed to compile", 1, true) and mods[2] == false) then
    cx.wrong(("%s: compile_all: the broken source's error is missing or the good one failed: %s"):format(
      cx.where, errs and tostring(errs[1] or errs[2]) or "no errors"))
    return
  end
  mods[1]:get(name)[{ blocks(l.n), 128, l.s }](l.d, v, l.n)
  l.value = l.value + v
end

function op.tick(cx, l)
  beat("tick")
  cx.k.tick[{ 1, 1, l.s }](l.c)
  l.ticks = l.ticks + 1
end

function op.host(cx, l)
  beat("host function")
  local rng, hf = cx.rng, cx.hf
  local o = {}
  if rng(1, 6) == 1 then o.raises = true; hf.raising = hf.raising + 1 end
  if rng(1, 6) == 1 then o.collect = true end
  if rng(1, 4) == 1 then
    local a = cuda.device_array(rng(1, 4096), "float32")
    local st = cuda.stream()
    a:fill(1, st)
    o.closes = { a, st }
    cx.scratch[#cx.scratch + 1] = a
  end
  l.s:launch_host_func(host_fn(cx, l, o))
  hf.want = hf.want + 1
end

function op.copy(cx, l)
  beat("copy and check")
  local kinds = { "pinned_array", "mapped_array", "array" }
  local k = kinds[cx.rng(1, 3)]
  local h = cuda[k](l.n, "int32")
  waiting(cx, l.d.copy_to_host, l.d, h, l.s)   -- pageable: finished on return (a wait)
  l.s:launch_host_func(host_fn(cx, l, { copy = h, copy_want = l.value }))
  cx.hf.want = cx.hf.want + 1
end

-- the body of a capture: an IF/ELSE node, a plain launch or one through a temporary; returns
-- what it adds at each launch
local function captured_add(cx, l, v)
  local rng, s, k = cx.rng, l.s, cx.k
  if rng(1, 3) == 1 and not skipped.cond then
    -- an IF/ELSE node made in the capture: its bodies captured on streams of their own
    -- (capture state shared with other threads' captures); v or w at each launch
    local pick, w, cfg = rng(0, 1), rng(-9, 9), { blocks(l.n), 128 }
    local c = s:condition()
    k.setc[{ 1, 1, s }](c, pick)
    s:if_else(c, function(b) k.add[{ cfg[1], cfg[2], b }](l.d, v, l.n) end,
                 function(b) k.add[{ cfg[1], cfg[2], b }](l.d, w, l.n) end)
    if pick == 0 then v = w end
  elseif rng(1, 2) == 1 or skipped.temp then
    k.add[{ blocks(l.n), 128, s }](l.d, v, l.n)
  else   -- through a temporary the graph allocates, and frees (closed here, or at the end)
    local tmp = cuda.device_array(l.n, "int32", { stream = s })
    tmp:copy_to_device(l.d, s)
    k.add[{ blocks(l.n), 128, s }](tmp, v, l.n)
    l.d:copy_to_device(tmp, s)
    if rng(1, 2) == 1 then tmp:close() end
  end
  return v
end

function op.capture(cx, l)
  beat("capture and replay")
  local rng, hf, s = cx.rng, cx.hf, l.s
  local v, k, base, runs = rng(-9, 9), rng(1, 4), l.ticks, 0
  local g = capture(cx, l, function()
    v = captured_add(cx, l, v)
    cx.k.tick[{ 1, 1, s }](l.c)
    s:launch_host_func(function()
      runs = runs + 1
      hf.ran = hf.ran + 1
      if l.c[1] ~= base + runs then hf.bad = hf.bad + 1 end
    end)
  end)
  local e = g:instantiate()
  for _ = 1, k do e:launch(s) end
  l.ticks, l.value = l.ticks + k, l.value + v * k
  hf.want = hf.want + k
  e = nil   -- luacheck: ignore
  if rng(1, 3) == 1 then collectgarbage() end
end

function op.while_graph(cx, l)
  beat("graph with a WHILE node")
  local rng = cx.rng
  local v, k, runs = rng(-9, 9), rng(1, 40), rng(1, 3)
  local left = cuda.device_array(1, "int32", on(l))
  local g = cuda.graph()
  local go_on = g:condition { default = 1 }
  local body = g:while_loop(go_on, { g:memset(left, k) })
  body:kernel(cx.k.step, { blocks(l.n), 128 }, { l.d, v, l.n, left, go_on })
  for _ = 1, runs do g:launch(l.s) end
  l.value = l.value + v * k * runs
end

function op.host_graph(cx, l)
  beat("graph with a host node")
  local rng, hf = cx.rng, cx.hf
  local v, k, base, runs = rng(-9, 9), rng(1, 3), l.ticks, 0
  local g = cuda.graph()
  local a = g:kernel(cx.k.add, { blocks(l.n), 128 }, { l.d, v, l.n })
  local b = g:kernel(cx.k.tick, { 1, 1 }, { l.c }, { a })
  g:host(function()
    runs = runs + 1
    hf.ran = hf.ran + 1
    if l.c[1] ~= base + runs then hf.bad = hf.bad + 1 end
  end, { b })
  local e = g:instantiate()
  for _ = 1, k do e:launch(l.s) end
  l.ticks, l.value = l.ticks + k, l.value + v * k
  hf.want = hf.want + k
end

function op.burst(cx, l)
  beat("burst behind a host function")
  l.s:launch_host_func(host_fn(cx, l))
  cx.hf.want = cx.hf.want + 1
  local count = cx.rng(1, 4) == 1 and 1500 or 50
  for _ = 1, count do cx.k.add[{ 1, 1, l.s }](l.d, 0, 1) end
end

function op.sync(cx, l)
  beat("synchronize")
  waiting(cx, l.s.synchronize, l.s)
end

function op.query(cx, l)
  beat("query until done")
  local t0 = cuda.time()
  while true do
    local ok, done = pcall(l.s.query, l.s)
    if not ok then waiting(cx, error, done) break end
    if done then break end
    if cuda.time() - t0 > 30 then cx.wrong(cx.where .. ": a stream stayed busy for 30 s") break end
  end
end

function op.event(cx, l)
  beat("event wait")
  local ev = cuda.event(false)
  ev:record(on(l))
  waiting(cx, ev.synchronize, ev)
end

function op.element(cx, l)
  beat("element read")
  local i = cx.rng(1, l.n)   -- drawn first: a try refused while another state captures is made again alike
  waiting(cx, function()
    local v = l.d[i]
    if v ~= l.value then cx.wrong(("%s: element read %d, model %d"):format(cx.where, v, l.value)) end
  end)
end

function op.device_sync(cx)
  beat("device synchronize")
  waiting(cx, locked, cx, try_sync, cuda.synchronize)
end

-- memory two streams used, one non-blocking, is freed after a wait for the whole device, which
-- another thread's capture must not meet (src/hostfn.c's claims)
function op.two_stream(cx, l)
  beat("two-stream array dropped")
  local close, n = cx.rng(1, 2) == 1, cx.rng(1, 1 << 12)
  waiting(cx, function()   -- stream-less (legacy lane): refused while another state captures
    local a = cuda.device_array(n, "float32", on(l))
    a:fill(1, on(l))
    a:fill(2, cx.idle)
    if close then a:close() end
  end)
  if not close then collectgarbage() end
end

-- blocks cached for reuse on a stream, then the stream closed, while other threads free their
-- own blocks of the one cache (src/memory.c: a stream's blocks are freed only by its own
-- state; another thread's free on it crashed cuMemFreeAsync before)
function op.stream_closed(cx)
  beat("stream closed with cached blocks")
  local rng = cx.rng
  local st = cuda.stream(rng(1, 2) == 1)
  for _ = 1, rng(1, 6) do
    local a = cuda.device_array(rng(1, 64) * 256, "float32", st)
    a:fill(3, st)
    a:close()
  end
  st:close()
end

-- ported from CuPy's tests/cupy_tests/cuda_tests/test_memory_threaded.py
-- (test_default_memory_pool_threaded): random sizes, a ring only the collector frees, now and
-- then a collection or the pool emptied, in every thread at once. Here the cache is emptied
-- while other states capture (src/memory.c frees only this state's blocks: another's may be
-- on a capturing stream); one array's contents checked
function op.pool(cx, l)
  beat("pool: random sizes, a ring, empty_cache")
  local rng = cx.rng
  local keep, ring = {}, {}
  for i = 1, rng(1, 50) do keep[i] = rng(1, 12500) end
  for i = 1, rng(2, 49) do ring[i] = rng(1, 12500) end
  local which, v, pick = rng(1, #keep), rng(-1000, 1000), rng(1, 10)
  local at = rng(1, keep[which])
  waiting(cx, function()   -- (everything drawn first: a refused try is made again alike)
    local kept = {}
    for i, n in ipairs(keep) do kept[i] = cuda.device_array(n, "int32", on(l)) end
    local first = { false, cuda.device_array(ring[1], "int32", on(l)) }
    local last = first
    for i = 2, #ring do last = { last, cuda.device_array(ring[i], "int32", on(l)) } end
    first[1] = last
    local a = kept[which]
    a:fill(v, on(l))
    local got = a[at]
    if got ~= v then cx.wrong(("%s: a pool block read %d, filled with %d"):format(cx.where, got, v)) end
    -- cuda.memory_stats (issue 31) while every state allocates and frees: this state's live
    -- arrays are counted, and no count went below 0 (a block counted off twice would)
    local st, mine = cuda.memory_stats(), 0
    for _, k in ipairs(kept) do mine = mine + k.nbytes end
    for name, n in pairs(st) do
      if n < 0 then cx.wrong(("%s: memory_stats().%s is %d"):format(cx.where, name, n)) end
    end
    if st.used_bytes < mine or st.allocations < #kept + #ring then
      cx.wrong(("%s: memory_stats() says %d bytes in %d arrays, this state alone holds %d in %d"):format(
        cx.where, st.used_bytes, st.allocations, mine, #kept + #ring))
    end
    if pick == 1 then collectgarbage() elseif pick == 2 then cuda.empty_cache() end
  end)
end

function op.drop(cx, l)
  beat("drop and collect")
  cx.scratch = {}
  local n = cx.rng(1, 1 << 16)
  waiting(cx, function() cuda.device_array(n, "float32", on(l)):fill(0, on(l)) end)   -- stream-less: waits
  collectgarbage("step")
end

-- cuda.defer_cleanup around a few of the other operations (issue 31): frees and destroys put
-- off while host functions fire and other states capture and free; every scope ends, and the
-- sequence's values stay the model's
local DEFERRED = { "add", "drop", "host", "sync", "event", "copy", "tick" }
function op.deferred(cx, l)
  beat("defer_cleanup")
  cuda.defer_cleanup(function()
    for _ = 1, cx.rng(1, 4) do
      local name = DEFERRED[cx.rng(1, #DEFERRED)]
      op[skipped[name] and "add" or name](cx, l)
    end
  end)
  local _, open = cuda.pending_cleanup()
  if open ~= 0 then cx.wrong(("%s: cuda.defer_cleanup left %d scopes open"):format(cx.where, open)) end
end

-- ---- CUDA arrays, textures, surfaces and module variables (issue 27) ----
local SENTINEL = -999999   -- what fresh arrays hold first: no lane's value comes near it
local OUT = { "pinned_array", "mapped_array", "array", "device_array" }

-- a CUDA array's shape for n elements, {n} or {rows, n // rows} for a random divisor, and the
-- kernels' w and h (h = 0: 1-D)
local function ca_shape(rng, n)
  if rng(1, 2) == 1 then return { n }, n, 0 end
  local divisors = {}
  for d = 1, n do if n % d == 0 then divisors[#divisors + 1] = d end end
  local rows = divisors[rng(1, #divisors)]
  return { rows, n // rows }, n // rows, rows
end

local function closed(o) return o ~= nil and o.closed end

-- a device array (made on the lane's stream) of the lane's values told apart: value + i - 1 at i
local function spread(cx, l, dtype)
  local d = cuda.device_array(l.n, dtype, on(l))
  cx.k["spread_" .. dtype][{ blocks(l.n), 128, l.s }](d, l.d, l.n)
  return d
end

-- an array of a kind in OUT for the lane's n values of dtype, holding SENTINEL
local function fresh(cx, l, kind, dtype)
  if kind ~= "device_array" then return cuda[kind](l.n, dtype):fill(SENTINEL) end
  local d = cuda.device_array(l.n, dtype, on(l))
  waiting(cx, d.fill, d, SENTINEL, on(l))   -- stream-less (legacy lane): a wait
  return d
end

-- a host function queued on the lane's stream that checks, when it runs, that a holds
-- want + i - 1 at each i (a device array's values: through pinned memory)
local function check_later(cx, l, what, a, dtype, want)
  if a.kind == "device_array" then
    local h = cuda.pinned_array(#a, dtype)
    waiting(cx, a.copy_to_host, a, h, l.s)
    a = h
  end
  local hf = cx.hf
  l.s:launch_host_func(function()
    hf.ran = hf.ran + 1
    local bad, first
    for i = 1, #a do
      if a[i] ~= want + i - 1 then
        bad = (bad or 0) + 1
        first = first or ("element %d is %s, model %d"):format(i, tostring(a[i]), want + i - 1)
      end
    end
    if bad then cx.wrong(("%s: %s: %s (%d of %d wrong)"):format(cx.where, what, first, bad, #a)) end
  end)
  hf.want = hf.want + 1
end

-- a host function queued on the lane's stream that closes o[name], or drops it and collects
-- garbage; then, when wait, a wait for the stream (it has run)
local function release_later(cx, l, o, name, drop, wait)
  l.s:launch_host_func(host_fn(cx, l, drop and { drops = { o, name }, collect = true } or { closes = { o[name] } }))
  cx.hf.want = cx.hf.want + 1
  if wait then waiting(cx, l.s.synchronize, l.s) end
end

-- fn(...) on objects a host function may have closed: true when it was done. One closed before
-- the call (was_closed) must make it raise, and a raise must name what (the function, or the
-- kernel) and say "closed"
local function use(cx, was_closed, what, fn, ...)
  local ok, e = attempt(cx, fn, ...)
  if ok and was_closed then
    cx.wrong(("%s: %s took a closed object without an error"):format(cx.where, what))
  elseif not ok and not (e:find(what, 1, true) and e:find("closed", 1, true)) then
    cx.wrong(("%s: %s raised: %s"):format(cx.where, what, e))
  end
  return ok
end

-- (after a wait for the lane's stream, when wait) what the host function closed, not dropped,
-- refuses a later use with the function's name
local function refuses(cx, l, o, wait)
  if wait then waiting(cx, l.s.synchronize, l.s) end
  if closed(o.ca) then use(cx, true, "cuda.texture", cuda.texture, o.ca) end
  if closed(o.src) then use(cx, true, "cuda.texture", cuda.texture, o.src) end
  if closed(o.tex) then use(cx, true, "texture.handle", function() return o.tex.handle end) end
  if closed(o.surf) then use(cx, true, "surface.handle", function() return o.surf.handle end) end
end

local function about(what, dtype, shape) return ("%s (%s {%s})"):format(what, dtype, table.concat(shape, ", ")) end

-- CUDA arrays: the lane's values (int32, or float32 through a kernel) copied from a temporary
-- into a CUDA array and out again on the lane's stream, a host function closing (or dropping
-- and collecting) the CUDA array or the temporary queued before the copy in or between the
-- copies, with a wait after it or not. The values come back whenever both copies were made
function op.cuarray(cx, l)
  beat("CUDA array in and out")
  local rng, s = cx.rng, l.s
  local dtype = rng(1, 2) == 1 and "int32" or "float32"
  local shape = ca_shape(rng, l.n)
  local victim, drop, first = rng(1, 2) == 1 and "ca" or "src", rng(1, 3) == 1, rng(1, 2) == 1
  local wait, later, into = rng(1, 2) == 1, rng(1, 2) == 1, OUT[rng(1, #OUT)]
  local base = l.value
  local o = { src = spread(cx, l, dtype), ca = cuda.cuda_array(shape, dtype) }
  if first then release_later(cx, l, o, victim, drop, wait) end
  local copied = o.ca and o.src
    and use(cx, closed(o.ca) or closed(o.src), "cuda_array:copy_to_device", o.ca.copy_to_device, o.ca, o.src, s)
  if not first then release_later(cx, l, o, victim, drop, wait) end
  local out = fresh(cx, l, into, dtype)
  if o.ca and use(cx, closed(o.ca), "cuda_array:copy_to_host", o.ca.copy_to_host, o.ca, out, s) and copied then
    check_later(cx, l, about("a CUDA array copied back", dtype, shape), out, dtype, base)
  end
  refuses(cx, l, o, later)
end

-- textures: a CUDA array of the lane's values read by fetch_<dtype> (tex1D / tex2D, point
-- filtering) into a device array, a host function closing (or dropping and collecting) the
-- texture or its CUDA array queued before the launch (a wait after it, or not) or after it. A
-- texture closed first refuses the launch; its CUDA array closed first does not matter (the
-- texture goes on reading it)
function op.texture(cx, l)
  beat("texture fetch")
  local rng, s = cx.rng, l.s
  local dtype = rng(1, 2) == 1 and "int32" or "float32"
  local shape, w, h = ca_shape(rng, l.n)
  local victim, drop, first = rng(1, 2) == 1 and "tex" or "ca", rng(1, 3) == 1, rng(1, 2) == 1
  local wait, later = rng(1, 2) == 1, rng(1, 2) == 1
  local base = l.value
  local o = { ca = cuda.cuda_array(shape, dtype) }
  waiting(cx, o.ca.copy_to_device, o.ca, spread(cx, l, dtype), s)   -- (the legacy lane's: a wait)
  o.tex = cuda.texture(o.ca)   -- point filtering, clamped, the elements as they are
  local out = fresh(cx, l, "device_array", dtype)
  if first then release_later(cx, l, o, victim, drop, wait) end
  local name = "fetch_" .. dtype
  local fetched = o.tex
    and use(cx, closed(o.tex), ("kernel '%s'"):format(name), cx.k[name][{ blocks(l.n), 128, s }], out, o.tex, w, h)
  if not first then release_later(cx, l, o, victim, drop, wait) end
  if fetched then
    local what = ("%s, lane %s, %s %s%s, %s%s"):format(about("a texture's fetches", dtype, shape), l.kind, drop and "drop" or "close",
      victim, first and " before the launch" or " after it", wait and "waited" or "not waited", later and ", later" or "")
    check_later(cx, l, what, out, dtype, base)
  end
  refuses(cx, l, o, later)
end

-- surfaces: surf_add_<dtype> adds v through a surface to a CUDA array (surface = true) of the
-- lane's values, copied out after. A host function closes (or drops and collects) the surface
-- or the CUDA array, queued before the launch (a wait after it, or not) or after it: a surface
-- closed first refuses the launch (the values come back unchanged), a CUDA array closed before
-- the copy out refuses that
function op.surface(cx, l)
  beat("surface write")
  local rng, s = cx.rng, l.s
  local dtype = rng(1, 2) == 1 and "int32" or "float32"
  local shape, w, h = ca_shape(rng, l.n)
  local victim, drop, first = rng(1, 2) == 1 and "surf" or "ca", rng(1, 3) == 1, rng(1, 2) == 1
  local wait, later, into, v = rng(1, 2) == 1, rng(1, 2) == 1, OUT[rng(1, #OUT)], rng(-50, 50)
  local base = l.value
  local o = { ca = cuda.cuda_array(shape, dtype, { surface = true }) }
  waiting(cx, o.ca.copy_to_device, o.ca, spread(cx, l, dtype), s)
  o.surf = cuda.surface(o.ca)
  if first then release_later(cx, l, o, victim, drop, wait) end
  local name = "surf_add_" .. dtype
  local added = o.surf
    and use(cx, closed(o.surf), ("kernel '%s'"):format(name), cx.k[name][{ blocks(l.n), 128, s }], o.surf, v, w, h)
  if not first then release_later(cx, l, o, victim, drop, wait) end
  local out = fresh(cx, l, into, dtype)
  if o.ca and use(cx, closed(o.ca), "cuda_array:copy_to_host", o.ca.copy_to_host, o.ca, out, s) then
    check_later(cx, l, about("a surface's writes", dtype, shape), out, dtype, added and base + v or base)
  end
  refuses(cx, l, o, later)
end

-- the bumps of op.global captured once and replayed k times: each run reads the variable back
-- into pinned memory, and its host function checks it
local function replay_bumps(cx, l, var, start, v, k)
  local s, hf, runs = l.s, cx.hf, 0
  local seen = cuda.pinned_array(1, "int32"):fill(SENTINEL)
  local g = capture(cx, l, function()
    cx.k.bump[{ 1, 1, s }](l.i, v)
    var:copy_to_host(seen, s)
    s:launch_host_func(function()
      runs = runs + 1
      hf.ran = hf.ran + 1
      if seen[1] ~= start + v * runs then
        cx.wrong(("%s: var%d is %d at a graph's run %d, model %d"):format(cx.where, l.i, seen[1], runs, start + v * runs))
      end
    end)
  end)
  local e = g:instantiate()
  for _ = 1, k do e:launch(s) end
  hf.want = hf.want + k
end

-- module variables: the lane's own __device__ int (a state's lanes share its module), set
-- through Module:get_global's view on the lane's stream from a device, pinned or pageable array
-- or a table, bumped k times by a kernel (or by a capture replayed k times, its host function
-- checking each run), read back into pinned memory and checked by a host function
function op.global(cx, l)
  beat("module variable")
  local rng, s = cx.rng, l.s
  local start, v, k = rng(-1000, 1000), rng(-9, 9), rng(1, 6)
  local from = ({ "device_array", "pinned_array", "array", "table" })[rng(1, 4)]
  local captured = rng(1, 3) == 1 and can_capture(cx, l)
  local var = cx.k.module:get_global("var" .. l.i)
  local src = { start }
  if from == "device_array" then
    src = cuda.device_array(1, "int32", on(l))
    waiting(cx, src.fill, src, start, on(l))
  elseif from ~= "table" then
    src = cuda[from](1, "int32"):fill(start)
  end
  waiting(cx, var.copy_to_device, var, src, s)   -- pageable, or a table: finished on return (a wait)
  if captured then
    replay_bumps(cx, l, var, start, v, k)
  else
    for _ = 1, k do cx.k.bump[{ 1, 1, s }](l.i, v) end
  end
  local back = cuda.pinned_array(1, "int32"):fill(SENTINEL)
  waiting(cx, var.copy_to_host, var, back, s)
  check_later(cx, l, ("module variable var%d"):format(l.i), back, "int32", start + v * k)
end

-- ---- sequences ----

-- the operation of each number rng(1, #ORDER) draws; "graph" is a WHILE node's or a host node's
local ORDER = { "add", "add", "add", "tick", "host", "host", "copy", "capture", "graph", "burst", "sync", "query",
  "event", "element", "device_sync", "drop", "two_stream", "stream_closed", "pool", "cuarray", "texture", "surface",
  "global", "compile", "deferred" }

local function pick(cx, l, n)
  local name = ORDER[n]
  if skipped[name] then return op.drop end   -- (before "graph" becomes one of its two kinds)
  if name == "graph" then name = cx.rng(1, 3) == 1 and not skipped["while"] and "while_graph" or "host_graph" end
  if name == "capture" and not can_capture(cx, l) or skipped[name] then name = "drop" end
  -- a compile costs tens of milliseconds (two NVRTC runs in children): one draw in eight, the
  -- others an add, so that the rest keeps its share of the run
  if name == "compile" and cx.rng(1, 8) ~= 1 then name = "add" end
  return op[name]
end

-- a sequence's state: its random numbers, its lanes, and its host functions' tallies (how many
-- must run, ran, raise, were raised, saw the stream's work not done)
local function context(st, sequence)
  math.randomseed(st.seed * 1000003 + sequence)
  local cx = { rng = math.random, solo = st.solo, thread = st.thread, k = st.k, wrong = st.wrong, scratch = {},
    where = ("thread %d seed %d sequence %d"):format(st.thread, st.seed, sequence),
    hf = { want = 0, ran = 0, raising = 0, raised = 0, bad = 0 }, lanes = {} }
  for i = 1, cx.rng(1, 3) do
    local kinds = { "legacy", "blocking", "nonblocking" }
    cx.lanes[i] = new_lane(cx, kinds[cx.rng(i == 1 and 1 or 2, 3)], i)
  end
  cx.idle = cuda.stream(true)
  return cx
end

-- the end of the sequence: every host function has run, every value is the model's
local function finish(cx)
  local hf, where = cx.hf, cx.where
  beat("final synchronize")
  for _ = 1, 3 do waiting(cx, locked, cx, try_sync, cuda.synchronize) end
  for _, l in ipairs(cx.lanes) do
    beat("final check")
    local h
    waiting(cx, function() h = l.d:copy_to_host() end)
    for i = 1, h and l.n or 0 do
      if h[i] ~= l.value then cx.wrong(("%s: element %d is %d, model %d"):format(where, i, h[i], l.value)) break end
    end
    if l.c[1] ~= l.ticks then cx.wrong(("%s: %d ticks, model %d"):format(where, l.c[1], l.ticks)) end
  end
  if hf.ran ~= hf.want then cx.wrong(("%s: %d host functions ran, %d queued"):format(where, hf.ran, hf.want)) end
  if hf.raised ~= hf.raising then
    cx.wrong(("%s: %d host function errors raised, %d host functions raise"):format(where, hf.raised, hf.raising))
  end
  if hf.bad > 0 then cx.wrong(("%s: %d host functions saw the stream's work not done"):format(where, hf.bad)) end
  for _, a in ipairs(cx.scratch) do
    if not a.closed then cx.wrong(where .. ": an array a host function closed is open") end
  end
end

function M.run(seed, seconds, thread, solo)
  local t = { sequences = 0, ops = 0, wrong = 0 }
  local report = {}
  local st = { seed = seed, thread = thread, solo = solo, k = kernels() }
  function st.wrong(msg)
    t.wrong = t.wrong + 1
    if #report < 5 then report[#report + 1] = msg end
  end
  local deadline = cuda.time() + seconds
  local sequence = 0
  while cuda.time() < deadline do
    sequence = sequence + 1
    local cx = context(st, sequence)
    for _ = 1, cx.rng(10, 60) do
      t.ops = t.ops + 1
      local l = cx.lanes[cx.rng(1, #cx.lanes)]
      pick(cx, l, cx.rng(1, #ORDER))(cx, l)
    end
    finish(cx)
    t.sequences = t.sequences + 1
    if sequence % 8 == 0 then collectgarbage() end
  end
  t.report = table.concat(report, "; ")
  return t
end

return M
