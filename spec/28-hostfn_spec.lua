-- Lua host functions (stream:launch_host_func, graph host nodes, captured host functions) as code
-- written by others uses them: replayed graphs (CuPy's test_capture_launch_host_func, NVIDIA's
-- simpleCudaGraphs), many host functions behind copies (CuPy's test_launch_host_func), work queued
-- behind a fired host function until the driver's queue is full, and host functions that close
-- what the waiting call uses. The failures these guard against are crashes and hangs: such tests
-- run in child processes under a time limit.
local H = require "spec.helper"
local C = require "spec.check"
local cuda = H.cuda
local gpu = H.gpu(it, pending)

local SRC = [[
extern "C" __global__ void add(int *x, int v, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += v;
}
extern "C" __global__ void tick(int *m) { m[0] += 1; }
]]
local mod
local function K(name)
  mod = mod or cuda.compile(SRC, { name = "hostfn.cu" })
  return mod:get(name)
end

-- runs code in a child with cudalua and the kernels above; returns its output, and whether it
-- ended well within the time limit
local function child(code, env)
  local pre = ("local SRC = %q\nlocal mod = cuda.compile(SRC)\nlocal function K(n) return mod:get(n) end\n"):format(SRC)
  return H.child(pre .. code, env, "timeout 120")
end

describe("Lua host functions in captured graphs", function()
  -- CuPy test_graph.py test_capture_launch_host_func: a callback captured on a non-blocking stream,
  -- dropped and collected, then the graph launched twice: the count is 1, then 2. Here: three
  -- launches, with a kernel before the host function whose result it reads. The call record was
  -- freed after the first launch (the second segfaulted).
  gpu("run at every launch of the graph, after the work before them, and keep their function alive", function()
    local out, ok = child([==[
local s = cuda.stream(true)
local m = cuda.mapped_array(1, "int32")
local seen = {}
s:begin_capture("global")
K("tick")[{ 1, 1, s }](m)
do
  local f = function() seen[#seen + 1] = m[1] end
  s:launch_host_func(f)
end
K("tick")[{ 1, 1, s }](m)
local g = s:end_capture()
collectgarbage(); collectgarbage()
local exec = g:instantiate()
g = nil; collectgarbage()
for _ = 1, 3 do exec:launch(s); s:synchronize() end
exec:upload(s)
exec:launch(s); exec:launch(s); exec:launch(s)
s:synchronize()
print(table.concat(seen, ","), m[1])
]==])
    assert.is_true(ok, out)
    assert.equal("1,3,5,7,9,11\t12\n", out)
  end)

  -- NVIDIA's simpleCudaGraphs: a host node reads the value a device-to-host copy made and resets
  -- it, at each of 3 launches of the graph and 3 of a second executable graph of it
  gpu("read what the copy before them brought, at each launch of two executable graphs of one graph", function()
    local n = 4099
    local t = H.rand_table(n, -1000, 1000, true)
    local want = 0
    for _, v in ipairs(t) do want = want + v end
    local d = cuda.to_device(t, "int32")
    local sum = cuda.pinned_array(1, "int32")
    local dsum = cuda.device_array(1, "int32")
    local red = cuda.kernel([[extern "C" __global__ void red(int *s, const int *x, int n) {
      int acc = 0;
      for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) acc += x[i];
      atomicAdd(s, acc); }]], "red")
    local got = {}
    local g = cuda.graph()
    local z = g:memset(dsum, 0)
    local r = g:kernel(red, { 8, 128 }, { dsum, d, n }, { z })
    local c = g:memcpy(sum, dsum, { r })
    g:host(function() got[#got + 1] = sum[1]; sum[1] = 0 end, { c })
    local e1, e2 = g:instantiate(), g:instantiate()
    local s1, s2 = cuda.stream(), cuda.stream(true)
    for _ = 1, 3 do e1:launch(s1) end
    for _ = 1, 3 do e2:launch(s2) end
    e1:launch(s2) -- the same executable graph on another stream, behind e2's
    cuda.synchronize()
    assert.same({ want, want, want, want, want, want, want }, got)
    assert.equal(0, sum[1])
  end)

  gpu("a child graph's host nodes are its own in each copy: two copies run twice as often", function()
    local ran = {}
    local child_g = cuda.graph()
    child_g:host(function() ran[#ran + 1] = "c" end)
    local parent = cuda.graph()
    parent:child(child_g)
    parent:child(child_g)
    parent:host(function() ran[#ran + 1] = "p" end)
    local s = cuda.stream()
    local e = parent:instantiate()
    e:launch(s); e:launch(s)
    child_g:instantiate():launch(s)
    s:synchronize()
    local c, p = 0, 0
    for _, v in ipairs(ran) do if v == "c" then c = c + 1 else p = p + 1 end end
    assert.equal(5, c)
    assert.equal(2, p)
  end)

  gpu("captured on a stream joined to the capture, they are kept with the graph", function()
    local out, ok = child([==[
local s, t = cuda.stream(), cuda.stream(true)
local fork, join = cuda.event(false), cuda.event(false)
local n = 0
s:begin_capture("global")
fork:record(s)
t:wait_event(fork)
t:launch_host_func(function() n = n + 1 end)
join:record(t)
s:wait_event(join)
local g = s:end_capture()
collectgarbage(); collectgarbage()
local e = g:instantiate()
for _ = 1, 4 do e:launch(s) end
s:synchronize()
print(n)
]==])
    assert.is_true(ok, out)
    assert.equal("4\n", out)
  end)
end)

describe("Lua host functions and queued work", function()
  -- CuPy test_stream.py test_launch_host_func: 100 copies, each followed by a host function, then
  -- one synchronize; the callbacks run in order. Here the copies go into pinned arrays (the
  -- issue's form, which hung) and into pageable ones, on the legacy, a blocking and a
  -- non-blocking stream; each host function also checks that its copy has arrived.
  gpu("100 copies each followed by a host function, then one synchronize: all run, in order", function()
    local out, ok = child([==[
math.randomseed(24)
for _, which in ipairs { "legacy", "blocking", "nonblocking" } do
  for _, kind in ipairs { "pinned", "pageable" } do
    local stream = which == "legacy" and cuda.default_stream() or cuda.stream(which == "nonblocking")
    local N = 100
    local src, hosts, vals, order, bad = {}, {}, {}, {}, 0
    for i = 1, N do
      vals[i] = { math.random(-1e6, 1e6), math.random(-1e6, 1e6), math.random(-1e6, 1e6) }
      src[i] = cuda.to_device(vals[i], "int32")
      hosts[i] = kind == "pinned" and cuda.pinned_array(3, "int32") or cuda.array(3, "int32")
    end
    for i = 1, N do
      src[i]:copy_to_host(hosts[i], stream)
      stream:launch_host_func(function()
        order[#order + 1] = i
        for j = 1, 3 do if hosts[i][j] ~= vals[i][j] then bad = bad + 1 end end
      end)
    end
    stream:synchronize()
    for i = 1, N do assert(order[i] == i, which .. " " .. kind .. ": order " .. tostring(order[i]) .. " at " .. i) end
    print(which, kind, #order, bad)
  end
end
]==])
    assert.is_true(ok, out)
    assert.equal(table.concat({
      "legacy\tpinned\t100\t0", "legacy\tpageable\t100\t0", "blocking\tpinned\t100\t0",
      "blocking\tpageable\t100\t0", "nonblocking\tpinned\t100\t0", "nonblocking\tpageable\t100\t0", "" }, "\n"), out)
  end)

  -- the driver takes about a thousand operations behind one that waits; past that, queueing
  -- blocks in the driver until the host function has run, which needs the Lua thread: the helper
  -- thread runs it meanwhile
  gpu("thousands of launches behind a fired host function, without a wait: no hang", function()
    local out, ok = child([==[
local s = cuda.stream()
local x = cuda.device_array(1, "int32")
x:fill(0, s)
local ran = 0
s:launch_host_func(function() ran = ran + 1 end)
for _ = 1, 5000 do K("add")[{ 1, 1, s }](x, 1, 1) end
s:launch_host_func(function() ran = ran + 1 end)
for _ = 1, 3000 do K("add")[{ 1, 1, s }](x, 1, 1) end
s:synchronize()
print(ran, x:copy_to_host()[1])
]==])
    assert.is_true(ok, out)
    assert.equal("2\t8000\n", out)
  end)

  -- a copy between host arrays waits for the stream that last used its source; a host function
  -- run during that wait closes the destination, the stream and an event: the copy raises
  -- instead of writing into freed memory, and what was closed is released afterwards
  gpu("a host function that closes what the waiting call uses: a clear error, no crash", function()
    local out, ok = child([==[
local s = cuda.stream()
local p = cuda.pinned_array(1 << 16, "float32")
local h = cuda.array(1 << 16, "float32")
local d = cuda.device_array(1 << 16, "float32")
d:fill(3, s)
d:copy_to_host(p, s)
local ev = cuda.event()
ev:record(s)
s:launch_host_func(function() h:close(); s:close(); ev:close(); collectgarbage() end)
local ok1, e1 = pcall(cuda.copy, h, p)
local ok2 = pcall(function() return h[1] end)
cuda.synchronize()
print(ok1, (tostring(e1):gsub("\n.*", "")), ok2, h.closed, tostring(s), tostring(ev), p[7], d:copy_to_host()[7])
]==])
    assert.is_true(ok, out)
    assert.equal("false\tcudalua: cuda.copy: the array was closed (by a Lua host function) while this waited for the GPU\t" ..
                 "false\ttrue\tcudalua.stream<closed>\tcudalua.event<closed>\t3.0\t3.0\n", out)
  end)

  -- a host function that closes a stream while it captures: the close (ending the capture) is
  -- put off to the end of the wait that ran the function, not done inside it
  gpu("a stream closed by a host function while it captures ends its capture afterwards", function()
    local out, ok = child([==[
local a, b = cuda.stream(), cuda.stream(true)
local x = cuda.device_array(32, "int32", a)
a:begin_capture("relaxed")
K("add")[{ 1, 32, a }](x, 1, 32)
local inside
b:launch_host_func(function() a:close(); inside = tostring(a) end)
b:synchronize()
print(inside, a:is_capturing(), pcall(cuda.synchronize))
]==])
    assert.is_true(ok, out)
    assert.equal("cudalua.stream<closed>\tfalse\ttrue\n", out)
  end)

  gpu("with launches that block, graph host nodes run during the launch (on the helper thread)", function()
    local out, ok = child([==[
local s = cuda.stream()
local m = cuda.mapped_array(1, "int32")
local seen = {}
local g = cuda.graph()
local a = g:kernel(K("tick"), { 1, 1 }, { m })
local b = g:host(function() seen[#seen + 1] = m[1] end, { a })
g:kernel(K("tick"), { 1, 1 }, { m }, { b })
local e = g:instantiate()
e:launch(s)
local after_one = #seen
e:launch(s)
s:launch_host_func(function() seen[#seen + 1] = -m[1] end)
print(cuda.launches_block(), after_one, table.concat(seen, ","))
]==], { CUDA_LAUNCH_BLOCKING = "1" })
    assert.is_true(ok, out)
    assert.equal("true\t1\t1,3,-4\n", out)
  end)

  gpu("the state's close releases host functions that never ran: the process ends", function()
    local out, ok = child([==[
local s = cuda.stream()
local spin = cuda.kernel([[extern "C" __global__ void spin(long long c) {
  long long t0 = clock64(); while (clock64() - t0 < c) {} }]], "spin")
spin[{ 1, 1, s }](200000000)   -- about 0.1 s: the host functions fire after the script ends
local g = cuda.graph()
g:host(function() error("never") end)
local e = g:instantiate()
for _ = 1, 5 do s:launch_host_func(function() error("never") end); e:launch(s) end
print("queued")
]==])
    assert.is_true(ok, out)
    assert.equal("queued\n", out)
  end)

  -- a thread that retries a wait refused while another state captures sleeps between tries;
  -- another thread's device-wide wait may be waiting for this state's host functions meanwhile
  -- (tools/stress.c under load: a capture stalled for seconds). cuda.sleep is a wait for time:
  -- the functions that come due run in it, their errors left for the next wait.
  gpu("cuda.sleep runs the state's host functions that come due; their errors wait for a wait", function()
    local out, ok = child([==[
math.randomseed(2405)
local s = cuda.stream(true)
local spin = cuda.kernel([[extern "C" __global__ void spin(long long c) {
  long long t0 = clock64(); while (clock64() - t0 < c) {} }]], "spin")
local m = cuda.mapped_array(1, "int32")
m[1] = 0
local want, seen = math.random(3, 9), {}
spin[{ 1, 1, s }](20000000)   -- about 10 ms: they fire during the sleeps below
for i = 1, want do
  K("tick")[{ 1, 1, s }](m)
  s:launch_host_func(function() seen[#seen + 1] = m[1] == i and i or -i end)
end
s:launch_host_func(function() error("sleep-error", 0) end)
local last = false
s:launch_host_func(function() last = true end)
local t0 = cuda.time()
while not last and cuda.time() - t0 < 20 do cuda.sleep(0.001) end
print(#seen == want, table.concat(seen, ",") == table.concat((function()
  local t = {} for i = 1, want do t[i] = i end return t end)(), ","), last)
print(pcall(s.synchronize, s))
-- inside a host function it only sleeps
s:launch_host_func(function() cuda.sleep(0.001); seen[#seen + 1] = "in" end)
s:synchronize()
print(seen[#seen], s:query())
]==])
    assert.is_true(ok, out)
    assert.equal("true\ttrue\ttrue\nfalse\tcudalua: stream:synchronize: a Lua host function failed: sleep-error\nin\ttrue\n", out)
  end)
end)
