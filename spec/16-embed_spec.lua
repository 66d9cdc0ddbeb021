-- The C embedding API (src/cudalua.h): a C host program (spec/support/embed_harness.c, built
-- here against libcudalua.a) opens cudalua in lua_States of its own with luaL_requiref and runs
-- scripts that reach cudalua_to_array, cudalua_push_device_array and cudalua_push_stream
-- through it; what cudalua_to_array reads (dtype, shape, the host memory) is read in C.
-- With a GPU, the embedding example (examples/embed, build/embed_host) runs too.
local H = require "spec.helper"
local C = require "spec.check"
local cuda = H.cuda
local gpu = H.gpu(it, pending)
local nogpu = C.nogpu(it, pending)

local q = H.q

local run = H.sh

local function exists(path)
  local f = io.open(path)
  if f then f:close() end
  return f ~= nil
end

-- builds the harness once: libcudalua.a first (make libs), then cc
local harness, workdir
local function build()
  if harness then return harness end
  local ok, out = run("make -s libs")
  assert(ok, "make libs failed:\n" .. out)
  workdir = H.tmpdir()
  local inc = os.getenv("LUA_INCDIR")
  if not inc or inc == "" then inc = "/usr/include/lua5.4" end
  -- as the Makefile does: the packed Lua of a GPU machine has only liblua5.4.so.0
  local lib = inc .. "/../lib/liblua5.4.so.0"
  local lualib = exists(lib) and (q(lib) .. " -Wl,-rpath," .. q(inc .. "/../lib")) or "-llua5.4"
  harness = workdir .. "/embed_harness"
  -- CUDALUA_SPEC_CFLAGS: make asan's sanitizer flags (libcudalua.a is instrumented then)
  ok, out = run(("cc -std=gnu11 -Wall %s -I src -I %s -o %s spec/support/embed_harness.c libcudalua.a %s -ldl -lpthread -lm")
    :format(os.getenv("CUDALUA_SPEC_CFLAGS") or "", q(inc), q(harness), lualib))
  assert(ok, "building the harness failed:\n" .. out)
  return harness
end

-- runs script (Lua source) in the harness (times: in that many states, one after another);
-- returns ok, output
local function script(src, times)
  local exe = build()
  local path = workdir .. "/script.lua"
  H.write(path, src)
  -- (a watchdog: a hang ends the run, reported as a failure)
  return run("timeout -k 5 300 " .. q(exe) .. " " .. q(path) .. " " .. (times or 1))
end

-- the helpers every script starts with
local PRELUDE = [[
local cuda = require "cudalua"
local function check(cond, ...) if not cond then error(table.concat({ ... }, " "), 2) end end
local function same(a, b, what)
  check(#a == #b, what, "lengths", #a, #b)
  for i = 1, #a do check(a[i] == b[i], what, "element", i, tostring(a[i]), tostring(b[i])) end
end
local function raises(text, fn, ...)
  local ok, e = pcall(fn, ...)
  check(not ok, "expected an error containing", text)
  check(tostring(e):find(text, 1, true), "expected", text, "got", tostring(e))
end
]]

local function lua_list(t)
  local parts = {}
  for i, v in ipairs(t) do parts[i] = math.type(v) == "integer" and ("%d"):format(v) or ("%.17g"):format(v) end
  return "{" .. table.concat(parts, ", ") .. "}"
end

local function expect_ok(ok, out)
  assert(ok, "the host program failed:\n" .. out)
  assert.matches("released %d+\n$", out)
end

describe("a C host program", function()
  it("opens cudalua with luaL_requiref: a global, in package.loaded, usable", function()
    expect_ok(script(PRELUDE .. [[
check(cuda == cudalua, "luaL_requiref made no global")
check(package.loaded.cudalua == cuda, "not in package.loaded")
check(cuda.versions().cudalua == cuda.__version)
check(require("cudalua.cache").stats ~= nil)
local a = cuda.array({ 3, 1, 2 }, "int32")
check(tostring(a) == "cudalua.array<int32>[3] {3, 1, 2}", tostring(a))
local m = cuda.compile('#include <cudalua/grid.cuh>\nextern "C" __global__ void k(int *x) { x[grid(1)] = 1; }', { arch = "sm_90" })
check(m:kernels()[1] == "k")
]]))
  end)

  it("reads any host array back through cudalua_to_array: dtype, shape, sizes, contents", function()
    local f32 = {}
    for i, v in ipairs(H.rand_table(6, -1000, 1000, true)) do f32[i] = v / 8 end
    local f64, i32 = H.rand_table(7), H.rand_table(5, -2 ^ 31, 2 ^ 31 - 1, true)
    local i64, u8 = H.rand_table(4, math.mininteger, math.maxinteger, true), H.rand_table(9, 1, 255, true)
    local i16 = H.rand_table(3, -32768, 32767, true)
    expect_ok(script(PRELUDE .. ([[
local f32, f64, i32, i64, u8, i16 = %s, %s, %s, %s, %s, %s
local m = cuda.array({ { f32[1], f32[2], f32[3] }, { f32[4], f32[5], f32[6] } }, "float32")
local i = c_info(m)
check(i.dtype == "float32" and i.itemsize == 4 and i.nbytes == 24 and i.ndim == 2, i.dtype, i.nbytes)
same({ 2, 3 }, i.shape, "shape")
check(i.ptr == 0 and i.has_host and i.stream == 0, "a pageable array has a host pointer only")
same(f32, i.values, "float32 contents")
for _, c in ipairs { { f64, "float64", 8 }, { i32, "int32", 4 }, { i64, "int64", 8 }, { u8, "uint8", 1 }, { i16, "int16", 2 } } do
  local a = cuda.array(c[1], c[2])
  local x = c_info(a)
  check(x.dtype == c[2] and x.itemsize == c[3] and x.nbytes == c[3] * #c[1] and x.ndim == 1, c[2])
  same({ #c[1] }, x.shape, c[2] .. " shape")
  same(c[1], x.values, c[2] .. " contents")
  -- a view: the host pointer moves with it
  local v = c_info(a:slice(2))
  same({ table.unpack(c[1], 2) }, v.values, c[2] .. " view contents")
  -- writes from Lua are seen by C
  a[1] = c[1][2]
  check(c_info(a).values[1] == c[1][2], c[2] .. " after a write")
end
-- N-d zeros and reshaped views
local z = c_info(cuda.zeros({ 2, 2, 3 }, "uint16"))
same({ 2, 2, 3 }, z.shape, "zeros shape")
check(z.nbytes == 24 and z.values[12] == 0)
same({ 3, 2 }, c_info(m:reshape(3, 2)).shape, "reshaped")
]]):format(lua_list(f32), lua_list(f64), lua_list(i32), lua_list(i64), lua_list(u8), lua_list(i16))))
  end)

  it("cudalua_to_array answers 0 for what is not an open array, without raising", function()
    expect_ok(script(PRELUDE .. [[
for _, v in ipairs { 42, "array", {}, { 1, 2, 3 }, true, print } do
  check(c_info(v) == false, type(v))
end
check(c_info() == false)
local a = cuda.array({ 1, 2 }, "float32")
a:close()
check(c_info(a) == false, "a closed array")
-- an object whose __cuda_array_interface is broken: 0, not an error
local bad = setmetatable({}, { __cuda_array_interface = { version = 99 } })
check(c_info(bad) == false, "a broken interface")
local worse = setmetatable({}, { __cuda_array_interface = function() error("boom") end })
check(c_info(worse) == false, "an interface that raises")
]]))
  end)

  it("pushes a host-made stream that cudalua uses and does not destroy", function()
    expect_ok(script(PRELUDE .. [[
local s = c_push_stream(0x1234, 1)
check(tostring(s):find("^cudalua%.stream<0x1234[ >]"), tostring(s))   -- " on device 0" with a driver
check(s:handle() == 0x1234)
s:close()
check(tostring(s) == "cudalua.stream<closed>")
]]))
  end)

  it("runs several states, each with its own cudalua", function()
    expect_ok(script(PRELUDE .. [[
local r = c_other_state("local c = require 'cudalua'; return tostring(c.array({ 7, 8 }, 'int16')) .. ' ' .. tostring(cudalua == c)")
check(r == "cudalua.array<int16>[2] {7, 8} true", r)
check(c_other_state("return tostring(c_info)") == "nil", "the second state sees the first one's globals")
raises("boom", c_other_state, "error('boom')")
local a = cuda.array({ 1.5 }, "float64")
check(c_info(a).values[1] == 1.5)
]]))
  end)

  it("runs states on threads that end, leaving nothing of theirs behind (make asan's leak check)", function()
    expect_ok(script(PRELUDE .. [[
local keep = cuda.array({ 3 }, "int32") -- this state outlives the threads
for t = 1, 3 do
  local r = c_thread_state(("local c = require 'cudalua'; local s = 0; for i = 1, 200 do local a <close> = c.array({ i, %d }, 'float64'); s = s + a[1] * a[2] end; return s"):format(t))
  check(tonumber(r) == t * 200 * 201 / 2, r)
end
raises("thread boom", c_thread_state, "error('thread boom')")
check(keep[1] == 3)
]]))
  end)

  -- the CPU device's queue worker and pool threads end with the last state (joined): left
  -- asleep in cudalua's code, they outlived it once Lua unloaded the library, and a child that
  -- exited right after a launch now and then died of a segmentation fault in CI
  it("ends the CPU device's threads with the last state, and starts them again in the next", function()
    if not H.sh("test -d /proc/self/task") then return pending("it counts threads in /proc/self/task") end
    local src = PRELUDE .. [[
local function threads() local p = io.popen("ls /proc/" .. c_pid() .. "/task | wc -l"); local n = tonumber(p:read("a")); p:close(); return n end
check(threads() == 1, "threads at the start:", threads())
local k = cuda.kernel('extern "C" __global__ void k(int *x, int n, int s) { int i = blockIdx.x * blockDim.x'
  .. ' + threadIdx.x; __shared__ int t[64]; t[threadIdx.x] = i; __syncthreads(); if (i < n) x[i] = s * t[63 - threadIdx.x]; }', 'k')
local seed = math.random(1, 1000)
local x = cuda.device_array(4096, 'int32')
k[{ 64, 64 }](x, 4096, seed)
local h = x:copy_to_host()
for i = 0, 4095 do local b = i // 64 * 64; check(h[i + 1] == seed * (b + 63 - (i - b)), "element", i) end
check(threads() > 1, "no worker thread ran the launch")
k[{ 64, 64 }](x, 4096, seed + 1) -- left queued: the close waits for it
]]
    local exe = build()
    H.write(workdir .. "/threads.lua", src)
    expect_ok(run("env CUDALUA_DEVICE=cpu " .. q(exe) .. " " .. q(workdir .. "/threads.lua") .. " 4"))
  end)

  it("cudalua_push_device_array rejects bad dtypes and shapes", function()
    expect_ok(script(PRELUDE .. [[
raises("cudalua_push_device_array: ndim must be 1..8", c_push_device_array, 4096, "float32", 0)
raises("cudalua_push_device_array: ndim must be 1..8", c_push_device_array, 4096, "float32", 9)
raises("unknown dtype 'float33'", c_push_device_array, 4096, "float33", 1, 4)
raises("is negative", c_push_device_array, 4096, "float32", 2, 3, -1)
check(c_info(cuda.array({ 1 }, "int8")).values[1] == 1, "still works")
]]))
  end)

  nogpu("cudalua_push_device_array raises the no-driver error, which the host catches", function()
    local ok, out = script(PRELUDE .. [[
raises("no CUDA driver found", c_push_device_array, 4096, "float32", 1, 16)
raises("no CUDA driver found", c_push_owned, 4096, "float32", 16)
check(c_info(cuda.array({ 2 }, "int8")).values[1] == 2, "still works")
]])
    expect_ok(ok, out)
    assert.matches("released 0\n", out, 1, true)
  end)

  gpu("views device memory through cudalua_push_device_array and reads it back", function()
    local t = {}
    for i, v in ipairs(H.rand_table(1000, -4000, 4000, true)) do t[i] = v / 4 end
    local ok, out = script(PRELUDE .. ([[
local t = %s
local d = cuda.to_device(t, "float32")
local i = c_info(d)
check(i.ptr == d:ptr() and not i.has_host and i.values == nil, "a device array: no host pointer")
check(i.dtype == "float32" and i.nbytes == 4 * #t and i.ndim == 1)
local v = c_push_device_array(d:ptr(), "float32", 1, #t)
check(v.kind == "foreign_array" and v:ptr() == d:ptr(), tostring(v))
same(t, v:copy_to_host():totable(), "contents through the view")
local m = c_push_device_array(d:ptr(), "float32", 2, 10, #t // 10)
same({ 10, #t // 10 }, m.shape, "2-d view")
check(m:get(2, 1) == t[#t // 10 + 1])
v:fill(2.5) -- writes through the view are the array's
check(d[1] == 2.5 and d[#t] == 2.5)
local view = c_info(v)
check(view.ptr == d:ptr() and view.dtype == "float32")
local pinned = cuda.pinned_array(1 << 18, "float32") -- 1 MiB
raises("allocation ends", c_push_device_array, pinned:ptr(), "float32", 1, 1 << 20)
raises("is not memory the CUDA driver knows", c_push_device_array, 12345, "float32", 1, 4)
-- an array used on a stream reports that stream
local s = cuda.stream()
local on_s = cuda.device_array(16, "float32", s)
on_s:fill(1, s)
check(c_info(on_s).stream == s:handle(), "stream")
s:synchronize()
-- a host stream handle works for cudalua's work
local hs = c_push_stream(s:handle(), 1)
local x = cuda.device_array(8, "int32", hs)
x:fill(7, hs)
hs:synchronize()
check(x[8] == 7)
-- Lua owns this one: the release callback runs once it is collected
do local owned = c_push_owned(d:ptr(), "float32", #t); owned:fill(1.5) end
collectgarbage(); collectgarbage()
cuda.synchronize()
check(d[#t] == 1.5)
]]):format(lua_list(t)))
    expect_ok(ok, out)
    assert.matches("released 1\n", out, 1, true) -- once, by the end of the state at the latest
  end)

  -- DLPack through the C API (issue 31, part 5): tensors made in C, in and out, every dtype
  -- DLPack has that cudalua has, strides in items, the read-only flag, device types, and the
  -- deleter called once (from another thread too, for the ones cudalua hands out)
  gpu("DLPack in and out through the C API: dtypes, strides, read-only, deleters once, misuse", function()
    local ok, out = script(PRELUDE .. [[
math.randomseed(91)
local h = cuda.zeros({ 5, 7 }, "int32")
for i = 1, #h do h[i] = math.random(-1000, 1000) end
local d = cuda.to_device(h)
-- in: a legacy tensor and a versioned one over d's memory, the second a transposed view
local a = c_dlpack_in { ptr = d:ptr(), code = 0, bits = 32, shape = { 5, 7 }, versioned = 0 }
check(a.kind == "foreign_array" and a.dtype == cuda.int32 and a:is_contiguous())
same(h:totable()[3], a:copy_to_host():totable()[3], "row 3")
local t = c_dlpack_in { ptr = d:ptr(), code = 0, bits = 32, shape = { 7, 5 }, strides = { 1, 7 }, readonly = 1 }
check(not t:is_contiguous() and t.strides[1] == 4 and t.strides[2] == 28)
for i = 1, 7 do for j = 1, 5 do check(t:get(i, j) == h:get(j, i), "transpose", i, j) end end
raises("read-only", t.fill, t, 0)
-- every dtype's code and bits
local codes = { int8 = { 0, 8 }, uint16 = { 1, 16 }, float16 = { 2, 16 }, float64 = { 2, 64 }, bfloat16 = { 4, 16 },
  complex64 = { 5, 64 }, complex128 = { 5, 128 }, bool = { 6, 8 } }
for name, cb in pairs(codes) do
  local x = c_dlpack_in { ptr = d:ptr(), code = cb[1], bits = cb[2], shape = { 2 } }
  check(tostring(x.dtype) == name, name, tostring(x.dtype))
  local o = c_dlpack_out(x, true)
  check(o.code == cb[1] and o.bits == cb[2] and o.lanes == 1, "out", name)
end
-- misuse: the tensor stays the caller's (freed by the harness), nothing is called
raises("cudalua_push_dlpack: dtype code 2, 8 bits, 1 lanes has no cudalua dtype", c_dlpack_in, { ptr = d:ptr(), code = 2, bits = 8, shape = { 2 } })
raises("dtype code 2, 32 bits, 4 lanes", c_dlpack_in, { ptr = d:ptr(), code = 2, bits = 32, lanes = 4, shape = { 2 } })
raises("cudalua_push_dlpack: a CPU tensor (kDLCPU)", c_dlpack_in, { ptr = d:ptr(), device_type = 1, shape = { 2 } })
raises("cudalua_push_dlpack: device type 10", c_dlpack_in, { ptr = d:ptr(), device_type = 10, shape = { 2 } })
raises("cudalua_push_dlpack: the tensor says CUDA device 1, its memory is device 0's", c_dlpack_in, { ptr = d:ptr(), device_id = 1, shape = { 2 } })
raises("cudalua_push_dlpack: strides[1] is -1", c_dlpack_in, { ptr = d:ptr(), shape = { 3 }, strides = { -1 } })
raises("cudalua_push_dlpack: a DLPack 2.0 tensor: cudalua reads DLPack 1.x", c_dlpack_in, { ptr = d:ptr(), shape = { 2 }, version = 2 })
raises("is not memory the CUDA driver knows", c_dlpack_in, { ptr = 4096, shape = { 2 } })
raises("the array needs", c_dlpack_in, { ptr = d:ptr(), code = 0, bits = 32, shape = { 5, 7 }, strides = { 8, 1 } })
local n0, twice0 = c_dl_deleted()
check(twice0 == 0)
a, t = nil, nil
collectgarbage(); collectgarbage()
cuda.synchronize()
local n1, twice1 = c_dl_deleted()
check(n1 == n0 + 2 and twice1 == 0, "deleters", n0, n1, twice1)
-- out: fields, strides in items, flags; the memory outlives the array until the deleter
local v = d:sub({ 2, 5, 2 }, { 1, 7, 3 })
local o, p = c_dlpack_out(v, true)
check(o.device_type == 2 and o.device_id == 0 and o.code == 0 and o.bits == 32 and o.version == 1 and o.flags == 0)
same({ 2, 3 }, o.shape, "shape")
same({ 14, 3 }, o.strides, "strides in items")
check(o.ptr == d:ptr() + 7 * 4, "data: the view's first element")
local pin = cuda.pinned_array(4, "float32")
check(c_dlpack_out(pin, true).device_type == 3, "pinned: kDLCUDAHost")
local man = cuda.managed_array(4, "float32")
check(c_dlpack_out(man, false).device_type == 13, "managed: kDLCUDAManaged")
local ro = cuda.as_cuda_array(setmetatable({}, { __cuda_array_interface = { version = 3, data = { d:ptr(), true },
  shape = { 35 }, typestr = "<i4" } }))
check(c_dlpack_out(ro, true).flags == 1, "read-only flag")
local odd = cuda.as_cuda_array(setmetatable({}, { __cuda_array_interface = { version = 3, data = { d:ptr(), false },
  shape = { 3 }, typestr = "<i4", strides = { 6 } } }))
raises("cudalua_to_dlpack: strides[1] is 6 bytes, not a whole number of 4-byte items", c_dlpack_out, odd, true)
local keep = cuda.device_array(1 << 20, "float32")
keep:fill(3)
local o2, p2 = c_dlpack_out(keep, false)
local addr = keep:ptr()
keep = nil
collectgarbage(); collectgarbage()
local still = c_push_device_array(addr, "float32", 1, 1 << 20)
check(still[1 << 20] == 3, "the memory outlives the array until the deleter")
still = nil
c_dlpack_delete(p2, false, true)   -- from another thread
c_dlpack_delete(p, true, false)
]])
    expect_ok(ok, out)
  end)

  -- where threads meet: consumers delete handed-out tensors from 8 threads of their own, in an
  -- order drawn from a seed, while the state hands out more, takes tensors in and collects;
  -- a watchdog (timeout) ends a hang. Every tensor's memory must be let go, none twice.
  gpu("DLPack deleters from 8 threads at once, seeded, while the state goes on (under a watchdog)", function()
    for _, seed in ipairs({ 17, 4242, 90001 }) do
      local ok, out = script(PRELUDE .. ([[
local function collect() collectgarbage(); collectgarbage() end
local function drain() cuda.from_dlpack(cuda.device_array(1, "int8"):to_dlpack()); collect() end
drain(); drain(); cuda.empty_cache()
local base = cuda.memory_stats().used_bytes
math.randomseed(%d)
local handles = {}
for i = 1, 600 do
  local a = cuda.device_array(math.random(1, 64) * 256, "float32")
  local _, p = c_dlpack_out(i %% 3 == 0 and a:sub({ 1, -1, 2 }) or a, true)
  handles[i] = p
end
collect()
c_dlpack_scatter(handles, %d, 8)
for i = 1, 300 do   -- the state goes on meanwhile: more tensors out and in, collections
  local b = cuda.from_dlpack(cuda.device_array(math.random(1, 16) * 64, "int32"):to_dlpack())
  b:fill(i)
  if i %% 50 == 0 then collect() end
end
c_dlpack_join()
drain(); drain()
local left = cuda.memory_stats().used_bytes - base
check(left <= 64, "memory left after every deleter ran:", left)
]]):format(seed, seed))
      expect_ok(ok, out)
    end
  end)

  gpu("the last state to close frees what cudalua holds and releases every primary context", function()
    local ok, out = script(PRELUDE .. [[
local v = math.random(1, 1000) + 0.5
-- on every device: an array in use, one dropped into the block cache, a module, a stream
-- with queued work, pinned memory and a graph
local keep = {}
for d = 0, #cuda.gpus - 1 do
  cuda.gpus[d]:run(function()
    local a = cuda.to_device(cuda.array({ v, v + 1, v + 2 }, "float32"))
    local dropped = cuda.device_array(4096, "float32")
    dropped:fill(v)
    dropped = nil
    collectgarbage(); collectgarbage()
    local k = cuda.kernel("extern \"C\" __global__ void inc(float *x) { x[threadIdx.x] += 1; }", "inc")
    local s = cuda.stream()
    for _ = 1, 100 do k[{ 1, 3, stream = s }](a) end
    local g = cuda.graph()
    g:kernel(k, { 1, 3 }, { a })
    keep[#keep + 1] = { a, k, s, g:instantiate(), cuda.pinned_array(1000, "float64") }
  end)
end
check(cuda.block_cache() > 0, "nothing went to the block cache")
-- a second state that comes and goes leaves the devices to the first
check(c_other_state("local c = require 'cudalua'; local d = c.device_array(1000, 'float32'); d:fill(2); return d:copy_to_host()[1000]") == "2.0")
local h = keep[1][1]:copy_to_host(keep[1][3])
keep[1][3]:synchronize()
check(h[3] == v + 102, "the first state's array after the second closed", h[3])
]])
    expect_ok(ok, out)
    -- (the GPU driver's primary contexts: the CPU device has none)
    if not H.cpu_device then assert.matches("active contexts 0\n", out, 1, true) end
  end)

  -- the conditional lane (src/gexec.c) is a stream of the primary context, which the last state
  -- to close releases: the lane goes with it and the next state makes its own (a lane kept
  -- past its context was a dead stream to the next state's WHILE graphs)
  gpu("a state after the last one closed runs WHILE graphs again", function()
    local n = math.random(3, 40)
    local ok, out = script(PRELUDE .. ([[
local m = cuda.compile([=[
extern "C" __global__ void step(int *count, int limit, cudaGraphConditionalHandle c) {
  if (++*count >= limit) cudaGraphSetConditional(c, 0);
}]=])
local count = cuda.device_array(1, "int32")
count:fill(0)
local g = cuda.graph()
local go_on = g:condition { default = 1 }
local body = g:while_loop(go_on)
body:kernel(m.step, { 1, 1 }, { count, %d, go_on })
g:launch()
cuda.synchronize()
check(count[1] == %d, "the WHILE loop ran", count[1], "times")
g:close()
io.write("looped\n")
]]):format(n, n), 3)
    expect_ok(ok, out)
    local _, loops = out:gsub("looped\n", "")
    assert.equal(3, loops)
    -- (the GPU driver's primary contexts: the CPU device has none)
    if not H.cpu_device then assert.matches("active contexts 0\n", out, 1, true) end
  end)

  -- found by tools/stress.c (seed 1699): a state on another thread evicted this state's cached
  -- block onto its stream while that stream captured, and the capture failed
  -- (CUDA_ERROR_STREAM_CAPTURE_INVALIDATED at the next launch)
  gpu("a state frees only the blocks it cached: another state's eviction never reaches a capturing stream", function()
    expect_ok(script(PRELUDE .. [[
local n, v = math.random(1000, 5000), math.random(-100, 100)
local k = cuda.kernel('extern "C" __global__ void add(int *x, int v, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] += v; }', "add")
local s = cuda.stream(true)
local x = cuda.device_array(n, "int32", s)
x:fill(0, s)
local dropped = cuda.device_array(n, "int32", s)   -- cached on s, this state's
dropped:close()
local mine = cuda.block_cache()
check(mine >= n * 4, "the dropped block was not cached", mine)
-- another state caches a block of its own, empties the cache, lowers the limit to 0 and back:
-- only its own block goes
local other = [=[local c = require 'cudalua'
local a = c.device_array(%d, 'float32'); a:close()
local before = c.block_cache(); c.empty_cache(); local after = c.block_cache()
local _, limit = c.block_cache(0); c.block_cache(limit)
return before .. ' ' .. after .. ' ' .. c.block_cache()]=]
local m = math.random(100, 900)
local before, after, last = c_other_state(other:format(m)):match("^(%d+) (%d+) (%d+)$")
check(tonumber(before) == mine + m * 4, "the other state's block was not cached", before, mine)
check(tonumber(after) == mine and tonumber(last) == mine, "the other state freed this state's blocks", after, last)
check(cuda.block_cache() == mine)
-- the same on a thread of its own while this state's stream captures (relaxed: the other
-- thread's driver calls are allowed)
s:begin_capture("relaxed")
before, after, last = c_thread_state(other:format(m)):match("^(%d+) (%d+) (%d+)$")
check(tonumber(after) == mine and tonumber(last) == mine, "the other thread freed this state's blocks", after, last)
k[{ (n + 127) // 128, 128, s }](x, v, n)
local g = s:end_capture():instantiate()
local runs = math.random(2, 5)
for _ = 1, runs do g:launch(s) end
s:synchronize()
local h = x:copy_to_host()
for i = 1, n do check(h[i] == v * runs, "element", i, h[i], v * runs) end
cuda.empty_cache()
check(cuda.block_cache() == 0, "this state's own blocks stay", cuda.block_cache())
]]))
  end)

  H.gpuonly(it, pending, "the example's host uses the CUDA runtime")("the embedding example runs in one state and in two states on two threads", function()
    local ok, out = run("make -s build/embed_host")
    assert(ok, "building build/embed_host failed:\n" .. out)
    for _, mode in ipairs { "single", "threads" } do
      ok, out = run("build/embed_host " .. mode)
      assert(ok, "build/embed_host " .. mode .. " failed:\n" .. out)
      assert.matches("embed " .. mode .. ": ok", out, 1, true)
    end
  end)
end)

teardown(function()
  if workdir then H.rmrf(workdir) end
end)
