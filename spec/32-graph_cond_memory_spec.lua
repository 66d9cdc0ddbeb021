-- Every graph node CUDA 13 has beyond kernels and copies: memory (stream-ordered allocation in a
-- capture, graph:alloc / graph:free), events (graph:record / graph:wait and their captured
-- forms), conditional nodes (if, if/else, while, switch; kernels set the condition with
-- cudaGraphSetConditional), and executable-graph control (enable, clone, set_host, set_child).
-- Ported facts: NVIDIA's cuda-samples graphMemoryNodes (a captured allocation freed in the
-- capture, the graph launched many times) and graphConditionalNodes (an IF node whose kernel
-- sets the condition from data; a WHILE node whose body counts down to 0; an IF/ELSE and a
-- SWITCH node choosing a body by value); CuPy's test_graph (a captured graph launched again).
local H = require "spec.helper"
local C = require "spec.check"
local cuda = H.cuda
local gpu = H.gpu(it, pending)

local SRC = [[
extern "C" __global__ void add(float *x, float v, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += v;
}
extern "C" __global__ void copy(float *dst, const float *src, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = src[i];
}
// graphConditionalNodes' IF: the condition from a value in memory
extern "C" __global__ void set_from(const int *v, cudaGraphConditionalHandle c) {
  cudaGraphSetConditional(c, (unsigned)*v);
}
// graphConditionalNodes' WHILE: the body counts down, the loop ends at 0
extern "C" __global__ void count_down(int *left, int *runs, cudaGraphConditionalHandle c) {
  *runs += 1;
  if (--*left <= 0) cudaGraphSetConditional(c, 0);
}
]]
local mod
local function K(name)
  mod = mod or cuda.compile(SRC)
  return mod[name]
end
local function ints(t) return cuda.to_device(cuda.array(t, "int32")) end

describe("graph memory nodes", function()
  gpu("a captured launch takes many of the capture's own allocations (each one checked, no stack overflow)", function()
    local N = math.random(40, 63)   -- (CL_MAXPARAMS is 64: out is one more)
    local params, body = {}, {}
    for i = 1, N do
      params[i] = "float *a" .. i
      body[i] = ("a%d[0] = %d.0f; s += a%d[0];"):format(i, i, i)
    end
    local m = cuda.compile(('extern "C" __global__ void many(float *out, %s) { float s = 0.0f; %s out[0] = s; }')
      :format(table.concat(params, ", "), table.concat(body, " ")))
    local out = cuda.device_array(1, "float32")
    local s = cuda.stream()
    s:begin_capture()
    local tmps = {}
    for i = 1, N do tmps[i] = cuda.device_array(1, "float32", { stream = s }) end
    m.many[{ 1, 1, s }](out, table.unpack(tmps))
    for i = 1, N do tmps[i]:close() end
    local g = s:end_capture()
    g:launch(s); g:launch(s)
    s:synchronize()
    assert.equal(N * (N + 1) / 2, out[1])
    g:close()
  end)

  gpu("an allocation closed in a capture is freed by the graph: replayed 100 times (graphMemoryNodes)", function()
    local n = math.random(100, 3000)
    local x = H.rand_table(n, -50, 50, true)
    local src = cuda.to_device(cuda.array(x, "float32"))
    local out = cuda.device_array(n, "float32")
    local s = cuda.stream()
    local cfg = { (n + 255) // 256, 256, s }
    s:begin_capture()
    local tmp = cuda.device_array(n, "float32", { stream = s })   -- an allocation node
    K("copy")[cfg](tmp, src, n)
    K("add")[cfg](tmp, 1, n)
    K("copy")[cfg](out, tmp, n)
    tmp:close()                                                    -- a free node
    local kept = cuda.device_array(n, "float32", { stream = s })    -- left open: freed at the end
    K("copy")[cfg](kept, src, n)
    local g = s:end_capture()
    local exec = g:instantiate()
    for _ = 1, 100 do exec:launch(s) end
    s:synchronize()
    local h = out:copy_to_host()
    for i = 1, n do assert.equal(x[i] + 1, h[i]) end
    C.raises("cudalua: array:copy_to_host: the array's memory is a graph's", kept.copy_to_host, kept)
    C.raises("argument 1 (float*): the array's memory is a graph's", function() K("add")[{ 1, 1 }](kept, 1, 1) end)
    C.raises("cudalua: array[i]: reading a device array element: the array's memory is a graph's", function() return kept[1] end)
    kept:close()   -- nothing to free: the graph did
    -- another capture, and an explicit graph, may not take this capture's temporary
    local s2 = cuda.stream()
    s:begin_capture("relaxed")
    local mine = cuda.device_array(n, "float32", { stream = s })
    s2:begin_capture("relaxed")
    -- (plain pcall: C.raises checks the process with legacy-stream work, refused in a capture)
    local ok1, e1 = pcall(function() K("add")[{ 1, 32, s2 }](mine, 1, n) end)
    local ok2, e2 = pcall(cuda.copy, out, mine, s2)
    s2:end_capture():close()
    assert.is_false(ok1)
    assert.matches("the array was allocated in another stream capture", e1, 1, true)
    assert.is_false(ok2)
    assert.matches("cudalua: cuda.copy: the array was allocated in another stream capture", e2, 1, true)
    local other = cuda.graph()
    local ok3, e3 = pcall(other.kernel, other, K("add"), { 1, 32 }, { mine, 1, n })
    s:end_capture():close()
    assert.is_false(ok3)
    assert.matches("cudalua: graph:kernel: the array was allocated in a stream capture", e3, 1, true)
    exec:close(); g:close()
  end)

  gpu("graph:alloc and graph:free give a temporary that each launch allocates and frees", function()
    local n = math.random(64, 4096)
    local x = H.rand_table(n, -100, 100, true)
    local src = cuda.to_device(cuda.array(x, "float32"))
    local out = cuda.device_array(n, "float32")
    local cfg = { (n + 127) // 128, 128 }
    local g = cuda.graph()
    local a, tmp = g:alloc({ n }, "float32")
    assert.equal("alloc", a.kind)
    assert.same({ n }, tmp.shape)
    local c1 = g:kernel(K("copy"), cfg, { tmp, src, n }, { a })
    local c2 = g:kernel(K("add"), cfg, { tmp, 2.5, n }, { c1 })
    local c3 = g:kernel(K("copy"), cfg, { out, tmp, n }, { c2 })
    C.raises("cudalua: graph:instantiate: 1 array from graph:alloc is not freed in the graph", g.instantiate, g)
    local f = g:free(tmp, { c3 })
    assert.equal("free", f.kind)
    C.raises("cudalua: graph:free: the array is freed in this graph already", g.free, g, tmp, { c3 })
    local other = cuda.graph()
    C.raises("cudalua: graph:free: expected an array from this graph's graph:alloc", other.free, other, tmp)
    C.raises("cudalua: graph:kernel: the array was allocated by another graph (graph:alloc)",
             other.kernel, other, K("add"), cfg, { tmp, 1, n })
    C.raises("cudalua: graph:free: expected an array from this graph's graph:alloc", g.free, g, out)
    local reps = math.random(2, 5)
    for _ = 1, reps do g:launch() end
    cuda.synchronize()
    local h = out:copy_to_host()
    for i = 1, n do assert.equal(x[i] + 2.5, h[i]) end
    C.raises("cudalua: array:fill: the array's memory is a graph's", tmp.fill, tmp, 0)
    C.raises("cudalua: graph:clone: CUDA cannot clone a graph with memory or conditional nodes", g.clone, g)
    g:close()
  end)
end)

describe("graph event nodes", function()
  gpu("graph:record times a kernel at each launch; graph:wait orders on another stream's event", function()
    local n = 1 << 20
    local d = cuda.device_array(n, "float32")
    d:fill(0)
    local e0, e1, go = cuda.event(), cuda.event(), cuda.event()
    local g = cuda.graph()
    local w = g:wait(go)
    local r0 = g:record(e0, { w })
    local k = g:kernel(K("add"), { n // 256, 256 }, { d, 1, n }, { r0 })
    local r1 = g:record(e1, { k })
    assert.equal("record", r1.kind)
    assert.equal("wait", w.kind)
    local s, other = cuda.stream(), cuda.stream()
    local reps = math.random(2, 4)
    for _ = 1, reps do
      go:record(other)
      g:launch(s)
      s:synchronize()
      assert.is_true(e0:elapsed_time(e1) >= 0)
    end
    assert.equal(reps, d[n])
    e0:close()   -- the graph still uses it: the object stays until the graph goes
    C.raises("closed event", g.record, g, e0)
    g:launch(s); s:synchronize()
    assert.equal(reps + 1, d[n])
  end)

  gpu("a captured external record and a wait on an outside event become nodes", function()
    local d = cuda.device_array(1024, "float32")
    d:fill(0)
    local s, outside = cuda.stream(), cuda.stream()
    local before, after = cuda.event(), cuda.event()
    before:record(outside)
    s:begin_capture()
    s:wait_event(before)                          -- recorded outside the capture: a wait node
    K("add")[{ 4, 256, s }](d, 3, 1024)
    after:record(s, { external = true })          -- a record node
    local g = s:end_capture()
    assert.equal(3, g:node_count())
    g:launch(s)
    after:synchronize()
    assert.equal(3, d[1024])
    C.raises("cudalua: event:record: unknown option 'extern'", after.record, after, s, { extern = true })
  end)
end)

describe("graph conditional nodes", function()
  gpu("if_then runs its body when a kernel sets the condition from data (graphConditionalNodes)", function()
    local d = cuda.device_array(256, "float32")
    for _, v in ipairs { 0, math.random(1, 100) } do
      d:fill(0)
      local g = cuda.graph()
      local cond = g:condition()
      assert.matches("^cudalua.graph_condition<", tostring(cond))
      local flag = ints { v }
      local set = g:kernel(K("set_from"), { 1, 1 }, { flag, cond })
      local body, node = g:if_then(cond, { set })
      assert.equal("conditional", node.kind)
      body:kernel(K("add"), { 1, 256 }, { d, 7, 256 })
      g:launch()
      cuda.synchronize()
      assert.equal(v ~= 0 and 7 or 0, d[256])
      g:close()
    end
  end)

  gpu("while_loop runs its body until a kernel in it sets 0; the default is set at each launch", function()
    local times = math.random(2, 300)
    local left, runs = ints { times }, ints { 0 }
    local g = cuda.graph()
    local cond = g:condition { default = 1 }
    local reset = g:memset(left, times)
    local body = g:while_loop(cond, { reset })
    local kn = body:kernel(K("count_down"), { 1, 1 }, { left, runs, cond })
    g:launch(); g:launch()
    cuda.synchronize()
    assert.equal(2 * times, runs[1])
    assert.equal(0, left[1])
    -- a node and a dependency added to the body: g:launch instantiates again
    local zero = body:memset(runs, 0)
    body:add_dependency(zero, kn)
    g:launch(); cuda.synchronize()
    assert.equal(1, runs[1])   -- zeroed in each run of the body, then counted once
    C.raises("cudalua: graph:launch: expected a stream", g.launch, g, 42)
  end)

  gpu("if_else and switch choose a body by value", function()
    local d = cuda.device_array(64, "float32")
    local n = math.random(2, 6)
    for v = 0, n do
      d:fill(0)
      local g = cuda.graph()
      local c1, c2 = g:condition(), g:condition()
      local flag = ints { v }
      local s1 = g:kernel(K("set_from"), { 1, 1 }, { flag, c1 })
      local s2 = g:kernel(K("set_from"), { 1, 1 }, { flag, c2 })
      local yes, no = g:if_else(c1, { s1 })
      yes:kernel(K("add"), { 1, 64 }, { d, 1, 64 })
      no:kernel(K("add"), { 1, 64 }, { d, 2, 64 })
      local bodies, node = g:switch(c2, n, { s2 })
      assert.equal(n, #bodies)
      assert.equal("conditional", node.kind)
      for k = 1, n do bodies[k]:kernel(K("add"), { 1, 64 }, { d, 10 * k, 64 }) end
      g:launch()
      cuda.synchronize()
      local want = (v ~= 0 and 1 or 2) + (v < n and 10 * (v + 1) or 0)
      assert.equal(want, d[1])
      g:close()
    end
  end)

  gpu("misuse: another graph's condition, an empty body, a host function in a body, a condition outside a graph", function()
    local g, other = cuda.graph(), cuda.graph()
    local cond = g:condition { default = 0 }
    C.raises("cudalua: graph:while_loop: the condition is another graph's", other.while_loop, other, cond)
    C.raises("cudalua: graph:if_then: expected a condition (graph:condition()), got number", g.if_then, g, 5)
    local flag = ints { 1 }
    C.raises("cudalua: graph:kernel: argument 2 is a condition of another graph",
             other.kernel, other, K("set_from"), { 1, 1 }, { flag, cond })
    local body = g:while_loop(cond)
    C.raises("cudalua: graph:instantiate: the body of a while_loop node is empty", g.instantiate, g)
    C.raises("cudalua: graph:launch: the body of a while_loop node is empty", g.launch, g)
    C.raises("cudalua: graph:host: a while_loop node's body cannot call Lua host functions", body.host, body, print)
    C.raises("cudalua: graph:alloc: a while_loop node's body cannot allocate", body.alloc, body, { 4 }, "float32")
    C.raises("cudalua: graph:instantiate: a while_loop node's body runs as part of its graph", body.instantiate, body)
    C.raises("a graph condition is an argument only of kernel nodes of its graph",
             function() K("set_from")[{ 1, 1 }](flag, cond) end)
    C.raises("cudalua: graph:condition: default must be an integer from 0 to 2^32-1, got number",
             g.condition, g, { default = -1 })
    C.raises("cudalua: graph:condition: unknown option 'dflt'", g.condition, g, { dflt = 1 })
    C.raises("cudalua: graph:switch: the number of bodies must be 1 to 4096, got 0", g.switch, g, cond, 0)
    g:close()
    C.raises("closed graph", body.kernel, body, K("add"), { 1, 1 }, { flag, 1, 1 })
  end)
end)

describe("executable graph control", function()
  gpu("exec:enable turns a kernel node off and on; clone and find copy a graph", function()
    local n = 512
    local d = cuda.device_array(n, "float32")
    d:fill(0)
    local g = cuda.graph()
    local a = g:kernel(K("add"), { 4, 128 }, { d, 1, n })
    local b = g:kernel(K("add"), { 4, 128 }, { d, 100, n }, { a })
    local x = g:instantiate()
    x:enable(b, false)
    x:launch(); cuda.synchronize()
    assert.equal(1, d[n])
    x:enable(b, true)
    x:launch(); cuda.synchronize()
    assert.equal(102, d[n])
    local g2 = g:clone()
    local b2 = g2:find(b)
    assert.equal("kernel", b2.kind)
    local x2 = g2:instantiate()
    x2:set_args(b2, { d, 1000, n })
    x2:launch(); cuda.synchronize()
    assert.equal(1103, d[n])
    C.raises("cudalua: graph:find: the node is not from the graph this one was cloned from", g.find, g, b)
    C.raises("cudalua: graph_exec:enable: the node is not from this executable graph's graph", x.enable, x, b2, true)
    local w = g:wait(cuda.event())
    C.raises("cudalua: graph_exec:enable: expected a boolean, got no value", x.enable, x, b)
    local x3 = g:instantiate()
    C.raises("cudalua: graph_exec:enable: only kernel, memcpy and memset nodes can be turned off, not a wait node",
             x3.enable, x3, w, false)
    x3:close()
  end)

  gpu("exec:set_host calls a new function at later launches; a clone's host nodes are its own", function()
    local seen = {}
    local g = cuda.graph()
    local h = g:host(function() seen[#seen + 1] = "old" end)
    local s = cuda.stream()
    local x = g:instantiate()
    x:launch(s); s:synchronize()
    x:set_host(h, function() seen[#seen + 1] = "new" end)
    x:launch(s); x:launch(s); s:synchronize()
    assert.same({ "old", "new", "new" }, seen)
    local c = g:clone():instantiate()
    c:launch(s); x:launch(s); s:synchronize()
    assert.same({ "old", "new", "new", "old", "new" }, seen)
    local g2 = g:clone()   -- (before the empty node below: x:update takes it at the end)
    C.raises("cudalua: graph_exec:set_host: expected a host node, got a", x.set_host, x, g:empty(), print)
    -- through nodes found in a clone, twice: the second replaces the first (a hang before)
    local x2 = g2:instantiate()
    x2:set_host(g2:find(h), function() seen[#seen + 1] = "f1" end)
    x2:set_host(g2:find(h), function() seen[#seen + 1] = "f2" end)
    x2:launch(s); s:synchronize()
    assert.equal("f2", seen[#seen])
    x:update(g2)
    C.raises("cudalua: graph_exec:set_host: the executable graph was updated from another graph", x.set_host, x, h, print)
  end)

  gpu("exec:set_child swaps a child graph of the same shape", function()
    local d = cuda.device_array(128, "float32")
    d:fill(0)
    local c1, c2 = cuda.graph(), cuda.graph()
    c1:kernel(K("add"), { 1, 128 }, { d, 1, 128 })
    c2:kernel(K("add"), { 1, 128 }, { d, 5, 128 })
    local g = cuda.graph()
    local node = g:child(c1)
    local x = g:instantiate()
    x:launch(); cuda.synchronize()
    x:set_child(node, c2)
    x:launch(); cuda.synchronize()
    assert.equal(6, d[1])
    local hg = cuda.graph()
    hg:host(print)
    C.raises("cudalua: graph_exec:set_child: a graph with Lua host functions cannot replace a child", x.set_child, x, node, hg)
  end)
end)

-- A graph holds the memory of the arrays its nodes use, and each launch marks it used on the
-- launch's stream: found by tools/stress.lua (a WHILE graph over a temporary array, dropped
-- while its launch ran, made the context fail: CUDA_ERROR_LAUNCH_FAILED).
describe("graphs and their arrays' memory", function()
  -- in a child process: before, the spin kernel wrote into a block the next allocation took
  gpu("a graph dropped while its launch runs frees nothing under it", function()
    local out, ok = H.child([==[
local spin = cuda.compile([[extern "C" __global__ void spin(float *x, long long c) {
  long long t0 = clock64(); while (clock64() - t0 < c) {} x[threadIdx.x] += 1; }]]):get("spin")
local s = cuda.stream(true)   -- non-blocking: stream-less work does not wait for it
local bytes = 4 * (32 + math.random(0, 64))
do
  local a = cuda.device_array(bytes // 4, "float32")   -- stream-less: no stream used it yet
  a:fill(0)
  cuda.synchronize()
  local g = cuda.graph()
  g:kernel(spin, { 1, 32 }, { a, 100000000 })   -- tens of milliseconds
  g:launch(s)
end
collectgarbage(); collectgarbage()   -- the graph, its executable graph and the array
local b = cuda.device_array(bytes // 4, "float32")   -- the same size: a's block if it was free
b:fill(7)
local early = b:copy_to_host()
s:synchronize()
local late = b:copy_to_host()
print(early[1], late[1], s:query())
]==], nil, "timeout 60")
    assert.is_true(ok, out)
    assert.equal("7.0\t7.0\ttrue\n", out)
  end)

  -- the block cache's count is the process's: no collection may free other blocks meanwhile
  before_each(function() collectgarbage(); collectgarbage("stop") end)
  after_each(function() collectgarbage("restart") end)

  gpu("an array closed while a graph uses it leaves its memory to the graph until the graph goes", function()
    cuda.empty_cache()
    local n = math.random(200, 2000)
    local x = H.rand_table(n, -50, 50, true)
    local a = cuda.to_device(cuda.array(x, "float32"))
    local b = cuda.device_array(n, "float32")
    local g = cuda.graph()
    local k = g:kernel(K("add"), { (n + 255) // 256, 256 }, { a, 1.5, n })
    g:memcpy(b, a, { k })
    local e = g:instantiate()
    local before = cuda.block_cache()
    a:close()
    assert.equal(before, (cuda.block_cache()))   -- the graph holds the block
    local s = cuda.stream()
    e:launch(s); e:launch(s)
    g:close()
    e:launch(s)
    s:synchronize()
    local h = b:copy_to_host()
    for i = 1, n do assert.near(x[i] + 4.5, h[i], 1e-4) end
    assert.equal(before, (cuda.block_cache()))   -- the executable graph holds it
    e:close()
    s:synchronize()
    assert.equal(before + 4 * n, (cuda.block_cache()))   -- freed after its launches (to the cache)
  end)

  gpu("a captured graph holds its arrays too, and its launches order their frees", function()
    cuda.empty_cache()
    local n = math.random(200, 2000)
    local a = cuda.device_array(n, "float32")
    a:fill(2)
    local s = cuda.stream()
    s:begin_capture()
    K("add")[{ (n + 255) // 256, 256, s }](a, 3, n)
    local g = s:end_capture()
    local e = g:instantiate()
    local view = a:slice(1, n)
    a:close()
    for _ = 1, 4 do e:launch(s) end
    s:synchronize()
    assert.equal(14, view[math.random(1, n)])
    local before = cuda.block_cache()
    view:close()
    assert.equal(before, (cuda.block_cache()))   -- the graph and the executable graph hold it
    g:close(); e:close()
    s:synchronize()
    assert.equal(before + 4 * n, (cuda.block_cache()))
  end)
end)

-- Found by tools/stress.lua, then in plain CUDA C (driver 580.159.04, H100): WHILE graphs
-- running at once on two or three streams fail the context (CUDA_ERROR_LAUNCH_FAILED) within
-- a few hundred graphs. cudalua runs a device's conditional graphs one at a time, in each
-- stream's order (src/gexec.c, cond_launch). In a child process: the failure poisons a context.
describe("graphs with conditional nodes on several streams", function()
  gpu("run one at a time, each in its stream's order: 300 WHILE graphs on 3 streams against the CPU", function()
    local seed = math.random(1, 1e6)
    local out, ok = H.child(([==[
math.randomseed(%d)
local rng = math.random
local m = cuda.compile([[
extern "C" __global__ void step(int *x, int v, int n, int *left, cudaGraphConditionalHandle go_on) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += v;
  if (i == 0 && --*left <= 0) cudaGraphSetConditional(go_on, 0);
}
extern "C" __global__ void negate(int *x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = -x[i];
}]])
local step, negate = m:get("step"), m:get("negate")
local lanes = {}
for i, nb in ipairs { false, false, true } do
  local s = cuda.stream(nb)
  local n = rng(1, 8) * 128 + rng(0, 127)
  local d = cuda.device_array(n, "int32", s)
  d:fill(0, s)
  lanes[i] = { s = s, n = n, d = d, value = 0 }
end
for _ = 1, 300 do
  local l = lanes[rng(1, 3)]
  local v, k, runs = rng(-9, 9), rng(1, 40), rng(1, 3)
  local left = cuda.device_array(1, "int32", l.s)
  local g = cuda.graph()
  local go_on = g:condition { default = 1 }
  local body = g:while_loop(go_on, { g:memset(left, k) })
  body:kernel(step, { (l.n + 127) // 128, 128 }, { l.d, v, l.n, left, go_on })
  for _ = 1, runs do
    g:launch(l.s)
    l.value = l.value + v * k
    if rng(1, 4) == 1 then   -- plain work between: the graph must keep the stream's order
      negate[{ (l.n + 127) // 128, 128, l.s }](l.d, l.n)
      l.value = -l.value
    end
  end
end
cuda.synchronize()
local bad = 0
for _, l in ipairs(lanes) do
  local h = l.d:copy_to_host()
  for i = 1, l.n do if h[i] ~= l.value then bad = bad + 1 break end end
end
print("wrong lanes", bad)
]==]):format(seed), nil, "timeout 120")
    assert.is_true(ok, out)
    assert.equal("wrong lanes\t0\n", out)
  end)
end)
