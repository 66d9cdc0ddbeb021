-- Graphs the seed's way (shared/seeds: the CUDA graph API proposal for Numba, KernelNode /
-- MemcpyHtoDNode / MemcpyDtoHNode / HostNode / EmptyNode): nodes that belong to no graph until
-- node:build(), their args and deps plain lists changed until then; g:launch(s) instantiates
-- once. The seed's two snippets are ported with their values (k1: a[0] += 2, k2: a[0] *= 3;
-- k1 on 4 threads adds 2 atomically each), from a random start checked against the CPU.
local H = require "spec.helper"
local C = require "spec.check"
local cuda = H.cuda
local gpu = H.gpu(it, pending)
local G = cuda.graph

local SRC = [[
extern "C" __global__ void k1(double *a) { a[0] += 2; }
extern "C" __global__ void k2(double *a) { a[0] *= 3; }
extern "C" __global__ void k1_atomic(double *a) { atomicAdd(a, 2.0); }
extern "C" __global__ void add(float *x, float v, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += v;
}
]]
local mod
local function K(name)
  mod = mod or cuda.compile(SRC)
  return mod[name]
end

describe("cuda.graph's unbound nodes", function()
  it("are made without a GPU; args and deps are the node's own lists", function()
    local a = G.empty()
    local deps, args = { a }, { 1, 2 }
    local k = G.kernel[{ 4, 1 }]("k", args, deps)
    deps[2], args[3] = a, 3            -- the caller's tables are not kept
    assert.same({ a }, k.deps)
    assert.same({ 1, 2 }, k.args)
    k.args[#k.args + 1] = 3
    assert.same({ 1, 2, 3 }, k.args)
    assert.equal("kernel", k.kind)
    assert.equal("empty", a.kind)
    assert.matches("^cudalua.unbound_node<kernel>$", tostring(k))
    local k2 = G.kernel("k", { 2, 8 }, nil, { k })
    assert.same({ 2, 8 }, k2.config)
    assert.same({}, k2.args)
    assert.equal(k, k2.deps[1])
    for _, f in ipairs { function() return G.memcpy(1, 2, { a }) end, function() return G.memset(1, 0, { a }) end,
                         function() return G.host(print, { 1 }, { a }) end, function() return G.child(1, { a }) end } do
      assert.equal(a, f().deps[1])
    end
  end)

  it("refuse what is not a list or a node, naming the call", function()
    local a = G.empty()
    C.raises("cudalua: cuda.graph.empty: deps must be a list of nodes, got a node (wrap it: {node})", G.empty, a)
    C.raises("cudalua: cuda.graph.memcpy: deps must be a list of nodes, got number", G.memcpy, 1, 2, 5)
    C.raises("cudalua: cuda.graph.memset: deps[2] must be a node, got string", G.memset, 1, 0, { a, "x" })
    C.raises("cudalua: cuda.graph.host: expected a function, got number", G.host, 5)
    C.raises("cudalua: cuda.graph.host: args must be a list, got string", G.host, print, "x")
    C.raises("cudalua: cuda.graph.kernel: config must be a table ({grid, block} or keys), got number", G.kernel, "k", 4)
    C.raises("cudalua: cuda.graph.kernel: args must be a list, got boolean", G.kernel, "k", { 1, 1 }, true)
    C.raises("cudalua: cuda.graph.kernel[config]: config must be a table ({grid, block} or keys), got number",
             function() return G.kernel[4] end)
    C.raises("cudalua: node:build: call it as node:build()", a.build, 5)
  end)

  it("refuse a cycle and a dependency changed into something else, before any graph is made", function()
    -- a random ring: the last node depends on the first
    local n = math.random(2, 40)
    local ring = { G.empty() }
    for i = 2, n do ring[i] = G.empty({ ring[i - 1] }) end
    ring[1].deps[1] = ring[n]
    C.raises("cudalua: node:build: the deps make a cycle (this empty node depends on itself through them)",
             ring[n].build, ring[n])
    -- a cycle in a later branch than a finished one (a leaf): still before any graph
    local leaf, a2 = G.empty(), G.empty()
    local b2 = G.empty({ a2 })
    a2.deps[1] = b2
    local top = G.empty({ leaf, b2 })
    C.raises("cudalua: node:build: the deps make a cycle (this empty node depends on itself through them)", top.build, top)
    local self = G.memset(1, 0)
    self.deps[1] = self
    C.raises("the deps make a cycle (this memset node", self.build, self)
    local b = G.empty({ G.empty() })
    b.deps[2] = "not a node"
    C.raises("cudalua: node:build: the empty node's deps[2] is not a node (string)", b.build, b)
    b.deps = 7
    C.raises("cudalua: node:build: the empty node's deps is not a list (number)", b.build, b)
    local odd = G.empty()
    odd.kind = "nonsense"
    C.raises("cudalua: node:build: a node of unknown kind nonsense", odd.build, odd)
  end)

  gpu("run the seed's first snippet: k1, k2, then k2 again with args and deps appended", function()
    local a0 = math.random(-1000, 1000) / 8
    local arr = cuda.to_device(cuda.array({ a0 }, "float64"))
    local n1 = G.kernel[{ 1, 1 }](K("k1"), { arr })
    local n2 = G.kernel[{ 1, 1 }](K("k2"), { arr }, { n1 })
    local n3 = G.kernel[{ 1, 1 }](K("k2"))
    n3.args[#n3.args + 1] = arr
    n3.deps[#n3.deps + 1] = n2
    local g, bound = n3:build()
    assert.equal(3, g:node_count())
    assert.equal("kernel", bound[n1].kind)
    g:launch()
    cuda.synchronize()
    assert.equal(((a0 + 2) * 3) * 3, arr[1])
    local s = cuda.stream()
    g:launch(s)                          -- the executable graph is kept: the same graph again
    s:synchronize()
    assert.equal((((((a0 + 2) * 3) * 3) + 2) * 3) * 3, arr[1])
    g:close()
  end)

  gpu("run the seed's second snippet: copy in, a 4-thread kernel, copy out, a host node with args", function()
    local a0 = math.random(0, 1000)
    local host_arr = cuda.pinned_array(1, "float64")
    host_arr[1] = a0
    local dev_arr = cuda.device_array_like(host_arr)
    local seen = {}
    local n0 = G.memcpy(dev_arr, host_arr)
    local n1 = G.kernel[{ 4, 1 }](K("k1_atomic"), { dev_arr }, { n0 })
    local n2 = G.memcpy(host_arr, dev_arr, { n1 })
    local n3 = G.host(function(a, tag) seen[#seen + 1] = { a[1], tag } end, { host_arr, "h1" }, { n2 })
    local s = cuda.stream()
    n3:build():launch(s)
    s:synchronize()
    assert.same({ { a0 + 8, "h1" } }, seen)
    assert.equal(a0 + 8, host_arr[1])
  end)

  gpu("build each node once, dependencies first, and give the graph the bound form gives", function()
    local n = math.random(200, 1000)
    local x = H.rand_table(n, -10, 10, true)
    local d = cuda.to_device(cuda.array(x, "float32"))
    local add = K("add")
    local cfg = { (n + 127) // 128, 128 }
    -- a diamond: top, two middles, a bottom that depends on both; then a chain hanging off it
    local top = G.kernel(add, cfg, { d, 1, n })
    local left = G.kernel(add, cfg, { d, 2, n }, { top })
    local right = G.empty({ top })
    local bottom = G.kernel(add, cfg, { d, 4, n }, { left, right, left })   -- left twice: once
    local last, steps = bottom, math.random(3, 12)
    for _ = 1, steps do last = G.kernel(add, cfg, { d, 1, n }, { last }) end
    local g, bound = last:build()
    assert.equal(4 + steps, g:node_count())
    local bg = cuda.graph()
    local t = bg:kernel(add, cfg, { d, 1, n })
    local l = bg:kernel(add, cfg, { d, 2, n }, { t })
    local r = bg:empty({ t })
    local b = bg:kernel(add, cfg, { d, 4, n }, { l, r })
    for _ = 1, steps do b = bg:kernel(add, cfg, { d, 1, n }, { b }) end
    assert.equal(bg:node_count(), g:node_count())
    assert.equal("empty", bound[right].kind)
    local reps = math.random(1, 4)
    for _ = 1, reps do g:launch() end
    cuda.synchronize()
    local h = d:copy_to_host()
    for i = 1, n do assert.equal(C.f32(C.f32(x[i]) + reps * (7 + steps)), C.f32(h[i])) end
  end)

  gpu("record and wait nodes built from unbound ones time a kernel", function()
    local n = 1 << 16
    local d = cuda.device_array(n, "float32")
    d:fill(0)
    local e0, e1 = cuda.event(), cuda.event()
    local r0 = G.record(e0)
    local k = G.kernel(K("add"), { n // 256, 256 }, { d, 2, n }, { r0 })
    local r1 = G.record(e1, { k })
    local w = G.wait(e1, { r1 })
    local g, bound = w:build()
    assert.equal(4, g:node_count())
    assert.equal("wait", bound[w].kind)
    local reps = math.random(1, 3)
    for _ = 1, reps do g:launch() end
    cuda.synchronize()
    assert.equal(2 * reps, d[n])
    assert.is_true(e0:elapsed_time(e1) >= 0)
  end)

  gpu("g:launch instantiates again once nodes were added, not before", function()
    local n = 257
    local d = cuda.device_array(n, "float32")
    d:fill(0)
    local add = K("add")
    local g = cuda.graph()
    local a = g:kernel(add, { 3, 128 }, { d, 1, n })
    g:launch(); g:launch()
    g:kernel(add, { 3, 128 }, { d, 10, n }, { a })     -- a node added after launches
    g:launch()
    cuda.synchronize()
    assert.equal(1 + 1 + 11, d[n])
  end)

  gpu("a failing node closes the half-made graph and names node:build and the node's kind", function()
    local d = cuda.device_array(4, "float32")
    local ok_node = G.memset(d, 0)
    local bad = G.kernel(K("add"), { 1, 4 }, { d, 1 }, { ok_node })   -- one argument short
    C.raises("cudalua: node:build: kernel node: kernel 'add' expects 3 arguments, got 2", bad.build, bad)
    local bad_cfg = G.kernel(K("add"), { 0, 4 }, { d, 1, 4 })
    C.raises("cudalua: node:build: kernel node: grid must be", bad_cfg.build, bad_cfg)
  end)
end)
