-- CUDA graphs: cuda.graph() built node by node (kernel, memcpy, memset, host, empty, child) with
-- dependencies, instantiated and replayed, executable graphs updated in place; stream capture
-- (s:begin_capture() ... s:end_capture()); stream:launch_host_func. Lua host functions run on
-- the Lua thread when cudalua waits (synchronize, query).
local H = require "spec.helper"
local C = require "spec.check"
local cuda = H.cuda
local gpu = H.gpu(it, pending)
local nogpu = C.nogpu(it, pending)
local NO_DRIVER = "no CUDA driver found" -- (the library path follows)
local N, B = 1037, 128
local LEGACY = "the legacy default stream cannot be used while a stream is capturing"
local WOULD_WAIT = "this would wait for a stream that is capturing"

local SRC = [[
extern "C" __global__ void add(float *x, float v, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += v;
}
extern "C" __global__ void mul(float *x, float v, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= v;
}
extern "C" __global__ void add64(double *x, double v, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += v;
}
extern "C" __global__ void axpy(float *out, const float *x, const float *y, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a * x[i] + y[i];
}
extern "C" __global__ void inc64(long long *out, const long long *x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = x[i] + 1;
}
extern "C" __global__ void index2(int *out, int nx, int ny) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x < nx && y < ny) out[y * nx + x] = x + 1000 * y;
}
// dynamic shared memory: each element plus its right neighbour within the block
extern "C" __global__ void neighbours(float *out, const float *x, int n) {
  extern __shared__ float buf[];
  int t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
  buf[t] = i < n ? x[i] : 0.0f;
  __syncthreads();
  if (i < n) out[i] = buf[t] + buf[(t + 1) % blockDim.x];
}
extern "C" __global__ void put(int *m, int idx, int v) { m[idx] = v; }
extern "C" __global__ void move(int *m, int from, int to) { m[to] = m[from]; }
]]
local mod
local function K(name)
  mod = mod or cuda.compile(SRC, { name = "graph.cu" })
  return mod:get(name)
end

local function blocks(n, b) return (n + b - 1) // b end
local CFG = { blocks(N, B), B }
local function ints(n) return H.rand_table(n or N, -100, 100, true) end -- exact in float32

-- asserts that the array (any kind) holds want[i] (a table or a function of i)
local function holds(a, want, what)
  local h = a.kind == "device_array" and a:copy_to_host() or a
  for i = 1, #h do
    local w = type(want) == "function" and want(i) or want[i]
    if h[i] ~= w then assert.equal(w, h[i], (what or "") .. " element " .. i) end
  end
end

-- runs fn while s captures, and always ends the capture (a failed test must not leave the
-- process capturing); returns the graph
local function capture(s, fn, mode)
  s:begin_capture(mode)
  local ok, err = pcall(fn)
  local ok2, g = pcall(s.end_capture, s)
  if not ok then error(err, 0) end
  if not ok2 then error(g, 0) end
  return g
end

it("the kernels of this file compile", function()
  assert.same({ "add", "add64", "axpy", "inc64", "index2", "move", "mul", "neighbours", "put" },
              cuda.compile(SRC, { arch = "sm_90", name = "graph.cu" }):kernels())
end)

describe("cuda.graph", function()
  nogpu("needs the driver", function()
    C.raises(NO_DRIVER, cuda.graph)
  end)

  gpu("kernel nodes run after their dependencies, with every form of configuration", function()
    local t = ints()
    local d = cuda.to_device(t, "float32")
    local g = cuda.graph()
    local k1 = g:kernel(K("add"), CFG, { d, 2, N })
    local k2 = g:kernel(K("mul"), { grid = blocks(N, 64), block = 64 }, { d, 3, N }, { k1 })
    local k3 = g:kernel(K("mul"), { grid = { blocks(N, 32) }, block = { 32 } }, { d, 3, N }, { k2 })
    assert.equal("kernel", k3.kind)
    assert.equal(g, k1.graph)
    assert.equal("cudalua.graph_node<kernel>", tostring(k1))
    assert.equal(3, g:node_count())
    local exec = g:instantiate()
    assert.equal(exec, exec:launch())
    cuda.synchronize()
    holds(d, function(i) return (t[i] + 2) * 9 end)
    -- 2-d grids and blocks
    local nx, ny = 37, 29
    local out = cuda.device_array(nx * ny, "int32")
    local g2 = cuda.graph()
    g2:kernel(K("index2"), { { blocks(nx, 16), blocks(ny, 8) }, { 16, 8 } }, { out, nx, ny })
    g2:instantiate():launch()
    cuda.synchronize()
    holds(out, function(i) return (i - 1) % nx + 1000 * ((i - 1) // nx) end)
  end)

  gpu("kernel nodes take dynamic shared memory by name or in position 4", function()
    local t = ints()
    local dx = cuda.to_device(t, "float32")
    local o1, o2 = cuda.device_array(N, "float32"), cuda.device_array(N, "float32")
    local g = cuda.graph()
    g:kernel(K("neighbours"), { grid = blocks(N, B), block = B, shared = B * 4 }, { o1, dx, N })
    g:kernel(K("neighbours"), { blocks(N, 64), 64, nil, 64 * 4 }, { o2, dx, N })
    g:instantiate():launch()
    cuda.synchronize()
    for _, c in ipairs { { o1, B }, { o2, 64 } } do
      local bs = c[2]
      holds(c[1], function(i)
        local j = (i - 1) - (i - 1) % bs + ((i - 1) % bs + 1) % bs
        return t[i] + (j < N and t[j + 1] or 0)
      end, "block " .. bs)
    end
  end)

  gpu("branches join where a node depends on several, and add_dependency orders nodes", function()
    local tx, ty = ints(), ints()
    local x, y = cuda.to_device(tx, "float32"), cuda.to_device(ty, "float32")
    local out = cuda.device_array(N, "float32")
    local g = cuda.graph()
    local a = g:kernel(K("add"), CFG, { x, 1, N })
    local b = g:kernel(K("mul"), CFG, { y, 2, N })
    g:kernel(K("axpy"), CFG, { out, x, y, 3, N }, { a, b })
    g:instantiate():launch()
    cuda.synchronize()
    holds(out, function(i) return 3 * (tx[i] + 1) + 2 * ty[i] end)
    -- nodes made without dependencies, ordered afterwards
    local z = cuda.to_device(tx, "float32")
    local g2 = cuda.graph()
    local m = g2:kernel(K("mul"), CFG, { z, 2, N })
    local p = g2:kernel(K("add"), CFG, { z, 10, N })
    assert.is_nil(g2:add_dependency(p, m)) -- add first, then multiply
    g2:instantiate():launch()
    cuda.synchronize()
    holds(z, function(i) return (tx[i] + 10) * 2 end)
  end)

  gpu("memcpy nodes copy in every direction, reading their sources at each replay", function()
    local s = cuda.stream()
    local h = cuda.array(ints(), "float32") -- pageable, both ways
    local p_in, p_out = cuda.pinned_array(N, "float32"), cuda.pinned_array(N, "float32")
    local mapped, managed = cuda.mapped_array(N, "float32"), cuda.managed_array(N, "float32")
    local d1, d2, d3 = cuda.device_array(N, "float32"), cuda.device_array(N, "float32"), cuda.device_array(N, "float32")
    local g = cuda.graph()
    local c1 = g:memcpy(d1, h) -- pageable host to device
    local c2 = g:memcpy(d2, p_in) -- pinned host to device
    local k = g:kernel(K("axpy"), CFG, { d3, d1, d2, 10, N }, { c1, c2 })
    local c3 = g:memcpy(d1, d3, { k }) -- device to device
    g:memcpy(h, d1, { c3 }) -- device to pageable host
    g:memcpy(p_out, d3, { k }) -- device to pinned host
    g:memcpy(mapped, d3, { k })
    g:memcpy(managed, d3, { k })
    assert.equal("memcpy", c1.kind)
    local exec = g:instantiate()
    for round = 1, 3 do
      local a, b = ints(), ints()
      for i = 1, N do h[i], p_in[i] = a[i], b[i] end
      exec:launch(s)
      s:synchronize()
      local want = function(i) return 10 * a[i] + b[i] end
      holds(h, want, "pageable, round " .. round)
      holds(p_out, want, "pinned, round " .. round)
      holds(mapped, want, "mapped, round " .. round)
      holds(managed, want, "managed, round " .. round)
      holds(d1, want, "device, round " .. round)
    end
  end)

  gpu("memcpy nodes take several small pageable host arrays", function()
    -- small pageable arrays are neighbours in memory, often on one page: each one must still
    -- be usable by a memcpy node (page-locking them one by one could refuse the second one)
    local hs, ds, ts = {}, {}, {}
    local g = cuda.graph()
    for i = 1, 8 do
      ts[i] = ints(100)
      hs[i] = cuda.array(ts[i], "float32")
      ds[i] = cuda.device_array(100, "float32")
      g:memcpy(ds[i], hs[i])
    end
    g:instantiate():launch()
    cuda.synchronize()
    for i = 1, 8 do holds(ds[i], ts[i], "array " .. i) end
  end)

  gpu("memcpy nodes check dtypes and sizes", function()
    local g = cuda.graph()
    local d = cuda.device_array(N, "float32")
    C.raises("cudalua: graph:memcpy: dtype mismatch (float64 into float32)", g.memcpy, g, d, cuda.array(N, "float64"))
    C.raises("cudalua: graph:memcpy: size mismatch (1038 elements into 1037)", g.memcpy, g, d, cuda.array(N + 1, "float32"))
    C.raises("cudalua: graph:memcpy: empty arrays", g.memcpy, g, cuda.device_array(0, "int8"), cuda.array(0, "int8"))
    C.raises("cudalua array expected, got number", g.memcpy, g, d, 5)
    C.raises("cudalua array expected, got table", g.memcpy, g, { 1, 2 }, d)
    assert.equal(0, g:node_count())
  end)

  gpu("memset nodes set 1-, 2-, 4- and 8-byte elements, negative int64 included", function()
    local cases = {
      { "int8", math.random(-128, -1) }, { "uint8", math.random(1, 255) }, { "int16", math.random(-32768, -1) },
      { "uint16", math.random(1, 65535) }, { "float16", math.random(-2000, 2000) / 4 + 0.25 },
      { "int32", math.random(-2 ^ 31, -1) }, { "uint32", math.random(2 ^ 31, 2 ^ 32 - 1) },
      { "float32", math.random(-1e6, 1e6) / 8 + 0.125 }, { "int64", math.random(math.mininteger, -1) },
      { "uint64", math.random(1, math.maxinteger) }, { "float64", H.rand_table(1)[1] },
    }
    for _, c in ipairs(cases) do
      local dt, v = c[1], c[2]
      local d = cuda.device_array(N, dt)
      d:fill(1)
      local g = cuda.graph()
      assert.equal("memset", g:memset(d, v).kind)
      g:instantiate():launch()
      cuda.synchronize()
      holds(d, function() return v end, dt)
    end
    -- the node returned for 8-byte elements is the one to depend on
    local d = cuda.device_array(N, "int64")
    local out = cuda.device_array(N, "int64")
    local v = math.random(math.mininteger, -1)
    local g = cuda.graph()
    local m = g:memset(d, v)
    g:kernel(K("inc64"), CFG, { out, d, N }, { m })
    g:instantiate():launch()
    cuda.synchronize()
    holds(out, function() return v + 1 end)
    -- pinned memory is set by the GPU too
    local p = cuda.pinned_array(N, "int32")
    local g2 = cuda.graph()
    g2:memset(p, -77)
    g2:instantiate():launch()
    cuda.synchronize()
    holds(p, function() return -77 end)
  end)

  gpu("memset nodes refuse pageable memory and values the dtype cannot hold", function()
    local g = cuda.graph()
    C.raises("cudalua: graph:memset: a pageable host array cannot be set by the GPU; use a pinned or device array",
             g.memset, g, cuda.array(N, "int32"), 1)
    C.raises("graph:memset: value 300 does not fit int8", g.memset, g, cuda.device_array(N, "int8"), 300)
    C.raises("graph:memset: value 1.5 is not an integer (dtype int32)", g.memset, g, cuda.device_array(N, "int32"), 1.5)
    C.raises("graph:memset: expected a number for int32, got string", g.memset, g, cuda.device_array(N, "int32"), "1")
    C.raises("cudalua: graph:memset: empty array", g.memset, g, cuda.device_array(0, "int32"), 1)
    assert.equal(0, g:node_count())
  end)

  gpu("host nodes run Lua functions on the Lua thread, after their dependencies, at each replay", function()
    local t = H.rand_table(N, -1000, 1000, true) -- integers: +1 three times is +3
    local h = cuda.array(t, "float64")
    local d = cuda.device_array_like(h)
    local seen = {}
    local g = cuda.graph()
    local c1 = g:memcpy(d, h)
    local k = g:kernel(K("add64"), CFG, { d, 1, N }, { c1 })
    local c2 = g:memcpy(h, d, { k })
    local hn = g:host(function() seen[#seen + 1] = h[N] end, { c2 })
    assert.equal("host", hn.kind)
    local exec = g:instantiate()
    local s = cuda.stream()
    exec:launch(s)
    -- host functions run when cudalua waits, not before; where launches block, the launch waits
    assert.same(cuda.launches_block() and { t[N] + 1 } or {}, seen)
    s:synchronize()
    assert.same({ t[N] + 1 }, seen)
    exec:launch(s)
    exec:launch(s)
    s:synchronize()
    assert.same({ t[N] + 1, t[N] + 2, t[N] + 3 }, seen)
    exec:launch() -- the legacy stream, waited on by cuda.synchronize
    cuda.synchronize()
    assert.same({ t[N] + 1, t[N] + 2, t[N] + 3, t[N] + 4 }, seen)
    holds(h, function(i) return t[i] + 4 end)
  end)

  gpu("an error in a host node is raised by the wait, and the stream goes on", function()
    local tag = "boom " .. math.random(1, 1 << 30)
    local g = cuda.graph()
    g:host(function() error(tag) end)
    local exec = g:instantiate()
    local s = cuda.stream()
    exec:launch(s)
    local e = C.raises("cudalua: stream:synchronize: a Lua host function failed: ", s.synchronize, s)
    assert.matches(tag, e, 1, true)
    exec:launch(s)
    exec:launch(s)
    e = C.raises("cudalua: stream:synchronize: a Lua host function failed (and 1 more): ", s.synchronize, s)
    assert.matches(tag, e, 1, true)
    -- the stream works afterwards
    local d = cuda.device_array(N, "float32", s)
    d:fill(2, s)
    K("add")[{ blocks(N, B), B, s }](d, 3, N)
    s:synchronize()
    holds(d, function() return 5 end)
  end)

  gpu("a host node may not wait for the GPU: that is raised instead of hanging", function()
    local g = cuda.graph()
    g:host(function() cuda.synchronize() end)
    local s = cuda.stream()
    g:instantiate():launch(s)
    C.raises("a Lua host function cannot use the GPU", s.synchronize, s)
    s:synchronize()
  end)

  gpu("empty nodes join, child nodes run a copy of another graph", function()
    local t = ints()
    local d = cuda.to_device(t, "float32")
    local child = cuda.graph()
    local a = child:kernel(K("add"), CFG, { d, 1, N })
    child:kernel(K("mul"), CFG, { d, 2, N }, { a })
    local g = cuda.graph()
    local e0 = g:empty()
    assert.equal("empty", e0.kind)
    local c = g:child(child, { e0 })
    assert.equal("child", c.kind)
    local after = g:kernel(K("add"), CFG, { d, 5, N }, { c })
    g:empty({ after, c })
    child:kernel(K("add"), CFG, { d, 100, N }) -- added later: not in g's copy
    g:instantiate():launch()
    cuda.synchronize()
    holds(d, function(i) return (t[i] + 1) * 2 + 5 end)
    -- a child's host nodes run with the parent
    local ran = 0
    local hchild = cuda.graph()
    hchild:host(function() ran = ran + 1 end)
    local parent = cuda.graph()
    parent:child(hchild)
    parent:child(hchild)
    local s = cuda.stream()
    parent:instantiate():launch(s)
    s:synchronize()
    assert.equal(2, ran)
  end)

  gpu("executable graphs replay many times, after an upload, and keep working once their graph is closed", function()
    local t = ints()
    local d = cuda.to_device(t, "float32")
    local g = cuda.graph()
    g:kernel(K("add"), CFG, { d, 3, N })
    local exec = g:instantiate()
    local s = cuda.stream()
    assert.equal(exec, exec:upload(s))
    for _ = 1, 4 do exec:launch(s) end
    exec:launch(s):launch(s)
    s:synchronize()
    holds(d, function(i) return t[i] + 18 end)
    g:close()
    assert.equal("cudalua.graph<closed>", tostring(g))
    exec:launch(s)
    s:synchronize()
    holds(d, function(i) return t[i] + 21 end)
  end)

  gpu("exec:set_args gives a kernel node new arguments without a new instantiation", function()
    local tx, ty = ints(), ints()
    local x, y = cuda.to_device(tx, "float32"), cuda.to_device(ty, "float32")
    local g = cuda.graph()
    local k = g:kernel(K("add"), CFG, { x, 1, N })
    local exec = g:instantiate()
    exec:launch()
    cuda.synchronize()
    holds(x, function(i) return tx[i] + 1 end)
    assert.equal(exec, exec:set_args(k, y, 10, N))
    exec:launch()
    exec:launch()
    cuda.synchronize()
    holds(y, function(i) return ty[i] + 20 end)
    holds(x, function(i) return tx[i] + 1 end, "the old argument")
    exec:set_args(k, x, -1, 100) -- the first 100 elements only
    exec:launch()
    cuda.synchronize()
    holds(x, function(i) return i <= 100 and tx[i] or tx[i] + 1 end)
    -- the graph keeps its own arguments
    g:instantiate():launch()
    cuda.synchronize()
    holds(x, function(i) return i <= 100 and tx[i] + 1 or tx[i] + 2 end)
  end)

  -- issue 24: documented as set_args(node, args) with a list, as g:kernel takes them, but it took
  -- only the arguments spread out (the list was "expected a device array" for parameter 1)
  gpu("exec:set_args takes the arguments as a list too, as g:kernel does", function()
    local tx = ints()
    local x = cuda.to_device(tx, "float32")
    local g = cuda.graph()
    local k = g:kernel(K("add"), CFG, { x, 1, N })
    local exec = g:instantiate()
    assert.equal(exec, exec:set_args(k, { x, 5, N }))
    exec:launch()
    exec:set_args(k, x, 7, N)
    exec:launch()
    cuda.synchronize()
    holds(x, function(i) return tx[i] + 12 end)
    C.raises("cudalua: kernel 'add' expects 3 arguments, got 1", exec.set_args, exec, k, { x, 5 })
    -- one complex parameter: {re, im} is the value, {{re, im}} the list holding it
    local cz = cuda.kernel([[#include <cuComplex.h>
      extern "C" __global__ void put(cuDoubleComplex *o, cuDoubleComplex v) { o[0] = v; }]], "put")
    local o = cuda.device_array(1, "complex128")
    local g2 = cuda.graph()
    local n2 = g2:kernel(cz, { 1, 1 }, { o, { 1, 2 } })
    local e2 = g2:instantiate()
    e2:set_args(n2, { o, { 3, -4 } })
    e2:launch()
    cuda.synchronize()
    assert.same({ 3, -4 }, { o[1][1], o[1][2] })
  end)

  gpu("exec:set_memcpy and exec:set_memset give copy and set nodes new arrays and values", function()
    local a, b = ints(), ints()
    local p1, p2 = cuda.pinned_array(N, "float32"), cuda.pinned_array(N, "float32")
    for i = 1, N do p1[i], p2[i] = a[i], b[i] end
    local d1, d2 = cuda.device_array(N, "float32"), cuda.device_array(N, "float32")
    d1:fill(-1); d2:fill(-1)
    local g = cuda.graph()
    local c = g:memcpy(d1, p1)
    local exec = g:instantiate()
    assert.equal(exec, exec:set_memcpy(c, d2, p2))
    exec:launch()
    cuda.synchronize()
    holds(d2, b)
    holds(d1, function() return -1 end, "the old destination")
    local i1, i2 = cuda.device_array(N, "int32"), cuda.device_array(N, "int32")
    i1:fill(1); i2:fill(2)
    local gs = cuda.graph()
    local m = gs:memset(i1, 5)
    local es = gs:instantiate()
    assert.equal(es, es:set_memset(m, i2, -9))
    es:launch()
    cuda.synchronize()
    holds(i2, function() return -9 end)
    holds(i1, function() return 1 end, "the old destination")
    -- 8-byte elements are two memset nodes: not updated in place
    local l = cuda.device_array(N, "int64")
    local gl = cuda.graph()
    local ml = gl:memset(l, 1)
    local el = gl:instantiate()
    C.raises("cudalua: graph_exec:set_memset: 8 and 16-byte elements are several memsets; build the graph again",
             el.set_memset, el, ml, l, 2)
  end)

  gpu("exec:update takes a graph of the same shape", function()
    local tx, ty = ints(), ints()
    local x, y = cuda.to_device(tx, "float32"), cuda.to_device(ty, "float32")
    local g1 = cuda.graph()
    g1:kernel(K("add"), CFG, { x, 1, N })
    local exec = g1:instantiate()
    local g2 = cuda.graph()
    g2:kernel(K("add"), CFG, { y, 7, N })
    assert.equal(exec, exec:update(g2))
    exec:launch()
    cuda.synchronize()
    holds(y, function(i) return ty[i] + 7 end)
    holds(x, tx, "the first graph's array")
  end)

  -- the driver's refusal is the error: a sanitizer reports it (hence #cudaerror)
  gpu("exec:update refuses a graph of another shape, which still instantiates #cudaerror", function()
    local ty = ints()
    local y = cuda.to_device(ty, "float32")
    local g1 = cuda.graph()
    g1:kernel(K("add"), CFG, { y, 1, N })
    local exec = g1:instantiate()
    local g3 = cuda.graph()
    local a = g3:kernel(K("add"), CFG, { y, 1, N })
    g3:kernel(K("add"), CFG, { y, 1, N }, { a })
    C.raises("cudalua: graph_exec:update: the driver cannot update this executable graph", exec.update, exec, g3)
    g3:instantiate():launch()
    cuda.synchronize()
    holds(y, function(i) return ty[i] + 2 end)
  end)

  gpu("g:dot writes Graphviz, node_count counts nodes, nodes say what they are", function()
    local d = cuda.device_array(N, "float32")
    local p = cuda.pinned_array(N, "float32")
    local g = cuda.graph()
    local k = g:kernel(K("add"), CFG, { d, 1, N })
    local c = g:memcpy(p, d, { k })
    g:memset(d, 0, { c })
    g:host(function() end, { c })
    g:empty({ k })
    assert.equal(5, g:node_count())
    assert.equal("cudalua.graph<5 nodes>", tostring(g))
    local path = os.tmpname()
    g:dot(path)
    local f = assert(io.open(path))
    local text = f:read("a")
    f:close()
    os.remove(path)
    assert.matches("^digraph", text)
    assert.matches("add", text, 1, true)
    C.raises("cudalua: node[k]: graph nodes have no field 'foo'", function() return k.foo end)
    C.raises("string expected, got no value", g.dot, g)
  end)

  gpu("g:dot says which file it cannot write, and why", function()
    local g = cuda.graph()
    g:empty()
    C.raises("cudalua: graph:dot: cannot write '/nonexistent-dir/g.dot' (No such file or directory)",
             g.dot, g, "/nonexistent-dir/g.dot")
  end)

  gpu("graphs and executable graphs close with <close>", function()
    local t = ints()
    local d = cuda.to_device(t, "float32")
    local exec, gref
    do
      local g <close> = cuda.graph()
      g:kernel(K("add"), CFG, { d, 1, N })
      exec = g:instantiate()
      gref = g
    end
    assert.equal("cudalua.graph<closed>", tostring(gref))
    C.raises("closed graph", gref.empty, gref)
    exec:launch()
    cuda.synchronize()
    holds(d, function(i) return t[i] + 1 end)
    do local e <close> = exec end
    assert.equal("cudalua.graph_exec<closed>", tostring(exec))
    C.raises("closed executable graph", exec.launch, exec)
    gref:close() -- twice is fine
    exec:close()
  end)
end)

describe("graph misuse", function()
  gpu("nodes of another graph, or of a closed one, are refused", function()
    local g, other = cuda.graph(), cuda.graph()
    local foreign = other:empty()
    local d = cuda.device_array(N, "float32")
    C.raises("cudalua: graph:kernel: the node belongs to another graph", g.kernel, g, K("add"), CFG, { d, 1, N }, { foreign })
    C.raises("cudalua: graph:empty: the node belongs to another graph", g.empty, g, { foreign })
    C.raises("cudalua: graph:memset: the node belongs to another graph", g.memset, g, d, 1, { foreign })
    local mine = g:empty()
    C.raises("cudalua: graph:add_dependency: the node belongs to another graph", g.add_dependency, g, mine, foreign)
    local dead_graph = cuda.graph()
    local dead = dead_graph:empty()
    dead_graph:close()
    C.raises("cudalua: graph:empty: the node's graph is closed", g.empty, g, { dead })
    local exec = g:instantiate()
    C.raises("the node is not from this executable graph's graph", exec.set_args, exec, foreign, d, 1, N)
    C.raises("cudalua: graph_exec:set_args: the node's graph is closed", exec.set_args, exec, dead, d, 1, N)
    C.raises("cudalua: graph:empty: expected a graph node, got number", g.empty, g, { 5 })
    C.raises("cudalua: graph:empty: dependencies must be a list of nodes, got number", g.empty, g, 5)
  end)

  gpu("add_dependency refuses cycles, and the graph stays usable", function()
    local t = ints()
    local d = cuda.to_device(t, "float32")
    local g = cuda.graph()
    local a = g:kernel(K("add"), CFG, { d, 1, N })
    local b = g:kernel(K("mul"), CFG, { d, 2, N }, { a })
    local c = g:kernel(K("add"), CFG, { d, 3, N }, { b })
    C.raises("cudalua: graph:add_dependency: this would make a cycle", g.add_dependency, g, c, a)
    C.raises("this would make a cycle", g.add_dependency, g, b, a)
    C.raises("this would make a cycle", g.add_dependency, g, a, a)
    g:instantiate():launch()
    cuda.synchronize()
    holds(d, function(i) return (t[i] + 1) * 2 + 3 end)
  end)

  gpu("closed graphs refuse everything", function()
    local g = cuda.graph()
    g:close()
    local d = cuda.device_array(N, "float32")
    C.raises("closed graph", g.empty, g)
    C.raises("closed graph", g.kernel, g, K("add"), CFG, { d, 1, N })
    C.raises("closed graph", g.memset, g, d, 1)
    C.raises("closed graph", g.instantiate, g)
    C.raises("closed graph", g.node_count, g)
    local other = cuda.graph()
    C.raises("closed graph", other.child, other, g)
  end)

  gpu("kernel nodes check their kernel's arguments and their configuration", function()
    local g = cuda.graph()
    local d = cuda.device_array(N, "float32")
    local add = K("add")
    C.raises("cudalua: kernel 'add' argument 1 (float*): expected a device, pinned, mapped or managed array (a pageable host array cannot be copied in and out here)",
             g.kernel, g, add, CFG, { cuda.array(N, "float32"), 1, N })
    C.raises("cudalua: kernel 'add' expects 3 arguments, got 2", g.kernel, g, add, CFG, { d, 1 })
    C.raises("cudalua: kernel 'add' expects 3 arguments, got 0", g.kernel, g, add, CFG)
    C.raises("cudalua: kernel 'add' argument 3 (int): expected an integer, got 1.5", g.kernel, g, add, CFG, { d, 1, 1.5 })
    C.raises("cudalua: graph:kernel: configuration needs grid", g.kernel, g, add, { block = 32 }, { d, 1, N })
    C.raises("cudalua: graph:kernel: configuration needs block", g.kernel, g, add, { 1 }, { d, 1, N })
    C.raises("cudalua: graph:kernel: grid must be an integer >= 1 or a table of them", g.kernel, g, add, { 0, 32 }, { d, 1, N })
    C.raises("cudalua: graph:kernel: block[2] must be an integer >= 1", g.kernel, g, add, { 1, { 32, 0 } }, { d, 1, N })
    C.raises("cudalua: graph:kernel: grid needs 1 to 3 dimensions", g.kernel, g, add, { {}, 32 }, { d, 1, N })
    C.raises("cudalua: graph:kernel: shared must be an integer >= 0", g.kernel, g, add,
             { grid = 1, block = 32, shared = -1 }, { d, 1, N })
    C.raises("table expected, got number", g.kernel, g, add, 5, { d, 1, N })
    C.raises("table expected, got number", g.kernel, g, add, CFG, 5)
    C.raises("cudalua.kernel expected", g.kernel, g, 5, CFG, { d, 1, N })
    assert.equal(0, g:node_count())
  end)

  gpu("host, child and launch refuse what they cannot use", function()
    local g = cuda.graph()
    C.raises("function expected, got number", g.host, g, 5)
    C.raises("cudalua: graph:child: a graph cannot contain itself", g.child, g, g)
    C.raises("cudalua.graph expected, got number", g.child, g, 5)
    g:empty()
    local exec = g:instantiate()
    C.raises("graph_exec:launch: expected a stream, got string", exec.launch, exec, "s")
    C.raises("graph_exec:upload: expected a stream, got table", exec.upload, exec, {})
  end)

  gpu("set_args, set_memcpy and set_memset take only nodes of their kind", function()
    local d = cuda.device_array(N, "float32")
    local p = cuda.pinned_array(N, "float32")
    local g = cuda.graph()
    local k = g:kernel(K("add"), CFG, { d, 1, N })
    local c = g:memcpy(d, p, { k })
    local m = g:memset(d, 1, { c })
    local exec = g:instantiate()
    C.raises("cudalua: graph_exec:set_args: a memcpy node has no arguments", exec.set_args, exec, c, d, 1, N)
    C.raises("cudalua: graph_exec:set_memcpy: expected a memcpy node, got a kernel node", exec.set_memcpy, exec, k, d, p)
    C.raises("cudalua: graph_exec:set_memset: expected a memset node, got a memcpy node", exec.set_memset, exec, c, d, 1)
    C.raises("cudalua: kernel 'add' expects 3 arguments, got 1", exec.set_args, exec, k, d)
    C.raises("a pageable host array cannot be copied in and out here", exec.set_args, exec, k, cuda.array(N, "float32"), 1, N)
    C.raises("graph_exec:set_memcpy: dtype mismatch (int32 into float32)", exec.set_memcpy, exec, c, d, cuda.pinned_array(N, "int32"))
    C.raises("graph_exec:set_memset: value 0.5 is not an integer", exec.set_memset, exec, m, cuda.device_array(N, "int32"), 0.5)
    -- nothing was changed: the graph runs as built
    p:fill(4)
    exec:launch()
    cuda.synchronize()
    holds(d, function() return 1 end)
  end)
end)

describe("stream capture", function()
  it("refuses the legacy default stream, without needing a GPU", function()
    local ds = cuda.default_stream()
    C.raises("cudalua: stream:begin_capture: the legacy default stream cannot be captured; use cuda.stream()",
             ds.begin_capture, ds)
    C.raises("cudalua: stream:end_capture: the legacy default stream cannot be captured", ds.end_capture, ds)
    assert.is_false(ds:is_capturing())
  end)

  gpu("turns kernels, copies and fills queued on a stream into a graph that replays them", function()
    local s = cuda.stream()
    local p_in, p_out = cuda.pinned_array(N, "float32"), cuda.pinned_array(N, "float32")
    local d = cuda.device_array(N, "float32", s)
    local e = cuda.device_array(N, "float32", s)
    local t0 = ints()
    for i = 1, N do p_in[i] = t0[i] end
    s:synchronize()
    assert.is_false(s:is_capturing())
    local g = capture(s, function()
      assert.is_true(s:is_capturing())
      d:copy_to_device(p_in, s)
      e:fill(5, s)
      K("add")[{ blocks(N, B), B, s }](d, 1, N)
      K("axpy")[{ blocks(N, B), B, s }](d, d, e, 3, N) -- d = 3 * d + 5
      d:copy_to_host(p_out, s)
    end)
    assert.is_false(s:is_capturing())
    assert.equal(5, g:node_count())
    holds(p_out, function() return 0 end, "nothing ran while capturing")
    local exec = g:instantiate()
    for round = 1, 3 do
      local t = ints()
      for i = 1, N do p_in[i] = t[i] end
      exec:launch(s)
      s:synchronize()
      holds(p_out, function(i) return 3 * (t[i] + 1) + 5 end, "round " .. round)
    end
    -- the stream works as before
    K("add")[{ blocks(N, B), B, s }](d, 1, N)
    d:copy_to_host(p_out, s)
    s:synchronize()
    holds(p_out, function(i) return 3 * (p_in[i] + 1) + 6 end)
  end)

  gpu("captures in the thread_local and relaxed modes too", function()
    for _, mode in ipairs { "global", "thread_local", "relaxed" } do
      local s = cuda.stream()
      local t = ints()
      local d = cuda.to_device(t, "float32", s)
      s:synchronize()
      local g = capture(s, function() K("mul")[{ blocks(N, B), B, s }](d, 2, N) end, mode)
      g:instantiate():launch(s)
      s:synchronize()
      holds(d, function(i) return 2 * t[i] end, mode)
    end
  end)

  gpu("refuses, while capturing, what would use the legacy stream or wait; the capture survives", function()
    local s = cuda.stream()
    local d = cuda.device_array(N, "float32", s)
    d:fill(1, s)
    s:synchronize()
    local add = K("add")
    local errs = {}
    local g = capture(s, function()
      add[{ blocks(N, B), B, s }](d, 1, N)
      errs["legacy launch"] = H.err(add[{ blocks(N, B), B }], d, 1, N)
      errs["legacy fill"] = H.err(d.fill, d, 0)
      errs["synchronize"] = H.err(cuda.synchronize)
      errs["element read"] = H.err(function() return d[1] end)
      errs["element write"] = H.err(function() d[1] = 3 end)
      errs["legacy allocation"] = H.err(cuda.device_array, 4, "float32")
      errs["legacy copy"] = H.err(cuda.to_device, { 1, 2 }, "float32")
      errs["stream synchronize"] = H.err(s.synchronize, s)
      errs["pageable copy"] = H.err(d.copy_to_device, d, cuda.array(N, "float32"), s)
      errs["pageable kernel argument"] = H.err(add[{ blocks(N, B), B, s }], cuda.array(N, "float32"), 1, N)
      errs["second begin"] = H.err(s.begin_capture, s)
      add[{ blocks(N, B), B, s }](d, 1, N)
    end)
    for _, what in ipairs { "legacy launch", "legacy fill", "synchronize", "element read", "element write",
                            "legacy allocation", "legacy copy" } do
      assert(errs[what], what .. " did not raise")
      assert.matches(LEGACY, errs[what], 1, true)
    end
    for _, what in ipairs { "stream synchronize", "pageable copy", "pageable kernel argument" } do
      assert(errs[what], what .. " did not raise")
      assert.matches(WOULD_WAIT, errs[what], 1, true)
    end
    assert.matches("cudalua: stream:begin_capture: the stream is already capturing", errs["second begin"], 1, true)
    assert.equal(2, g:node_count())
    C.alive()
    holds(d, function() return 1 end, "captured work has not run")
    g:instantiate():launch(s)
    s:synchronize()
    holds(d, function() return 3 end)
  end)

  -- the legacy stream's work waits for blocking streams only: while a non-blocking stream
  -- captures (another Lua state's, on another thread, say), the legacy stream stays usable
  gpu("a non-blocking stream's capture leaves the legacy stream usable", function()
    local s = cuda.stream(true)
    local d = cuda.device_array(N, "float32", s)
    local e = cuda.device_array(N, "float32")
    d:fill(1, s)
    e:fill(5)
    s:synchronize()
    local g = capture(s, function()
      K("add")[{ blocks(N, B), B, s }](d, 1, N)
      K("add")[{ blocks(N, B), B }](e, 2, N) -- on the legacy stream, not captured
    end, "relaxed")
    assert.equal(1, g:node_count())
    cuda.synchronize()
    holds(e, function() return 7 end)
    g:instantiate():launch(s)
    s:synchronize()
    holds(d, function() return 2 end)
  end)

  gpu("end_capture needs a capture, and begin_capture a valid mode and an open stream", function()
    local s = cuda.stream()
    C.raises("cudalua: stream:end_capture: the stream is not capturing", s.end_capture, s)
    C.raises("invalid option 'bogus'", s.begin_capture, s, "bogus")
    assert.is_false(s:is_capturing())
    s:close()
    C.raises("closed stream", s.begin_capture, s)
    assert.is_false(s:is_capturing())
  end)

  gpu("refuses an event recorded on the legacy stream while capturing", function()
    -- BUG: event:record() has no capture guard: recording on the legacy stream during a
    -- capture reaches the driver, which invalidates the capture (end_capture then fails)
    local s = cuda.stream()
    local d = cuda.device_array(N, "float32", s)
    d:fill(1, s)
    s:synchronize()
    local ev = cuda.event()
    local err
    local ok, g = pcall(capture, s, function()
      K("add")[{ blocks(N, B), B, s }](d, 1, N)
      err = H.err(ev.record, ev)
    end)
    assert(ok, "the capture was broken: " .. tostring(g))
    assert(err, "event:record() on the legacy stream did not raise")
    assert.matches(LEGACY, err, 1, true)
    g:instantiate():launch(s)
    s:synchronize()
    holds(d, function() return 2 end)
  end)

  gpu("a captured graph says how many nodes it has", function()
    -- BUG: tostring counts only nodes added through the graph API: a captured graph with 2
    -- nodes prints as "cudalua.graph<0 nodes>"
    local s = cuda.stream()
    local d = cuda.device_array(N, "float32", s)
    s:synchronize()
    local g = capture(s, function()
      d:fill(1, s)
      K("add")[{ blocks(N, B), B, s }](d, 1, N)
    end)
    assert.equal(2, g:node_count())
    assert.equal("cudalua.graph<2 nodes>", tostring(g))
  end)
end)

describe("stream:launch_host_func", function()
  gpu("runs Lua functions in stream order, on the Lua thread, when the stream is waited on", function()
    local s = cuda.stream()
    local m = cuda.mapped_array(4, "int32")
    local seen = {}
    K("put")[{ 1, 1, s }](m, 0, 42)
    s:launch_host_func(function() seen[#seen + 1] = m[1]; m[2] = 7 end)
    K("move")[{ 1, 1, s }](m, 1, 2) -- sees what the host function wrote
    K("put")[{ 1, 1, s }](m, 0, 43)
    s:launch_host_func(function() seen[#seen + 1] = m[1] end)
    -- where launches block, each ran before launch_host_func returned
    assert.same(cuda.launches_block() and { 42, 43 } or {}, seen)
    s:synchronize()
    assert.same({ 42, 43 }, seen)
    assert.same({ 43, 7, 7, 0 }, m:totable())
    -- on the legacy stream, run by cuda.synchronize
    local ran = false
    cuda.default_stream():launch_host_func(function() ran = true end)
    cuda.synchronize()
    assert.is_true(ran)
    -- and by a query that finds the stream done
    local q = 0
    s:launch_host_func(function() q = q + 1 end)
    local deadline = cuda.time() + 10
    while not s:query() and cuda.time() < deadline do end
    assert.equal(1, q)
  end)

  gpu("raises a host function's error at the wait, and the stream goes on", function()
    local s = cuda.stream()
    s:launch_host_func(function() error("host failure 17") end)
    local e = C.raises("cudalua: stream:synchronize: a Lua host function failed: ", s.synchronize, s)
    assert.matches("host failure 17", e, 1, true)
    local ran = false
    s:launch_host_func(function() ran = true end)
    s:synchronize()
    assert.is_true(ran)
  end)

  gpu("may drop arrays whose free would wait for the stream: they are freed after it", function()
    collectgarbage()
    collectgarbage()
    cuda.empty_cache()
    local s, other = cuda.stream(), cuda.stream(true)
    local d = cuda.device_array(N, "float32", s)
    d:fill(1, s)
    d:fill(2, other) -- used on a non-blocking stream too: its free waits for the device
    other:synchronize()
    local p = cuda.pinned_array(N, "float32")
    d:copy_to_host(p, s) -- queued on s: its free waits for s, stopped at the host function
    local inside
    s:launch_host_func(function()
      d:close()
      p:close()
      inside = cuda.block_cache()
    end)
    s:synchronize()
    assert.is_true(d.closed and p.closed)
    assert.equal(0, inside)               -- nothing freed while the function ran
    assert.equal(N * 4, (cuda.block_cache())) -- the device block, freed after it (to the cache)
  end)

  -- in a child process with a time limit: the failure this guards against is a hang
  gpu("may drop host-visible memory and modules, whose frees wait for the device: no hang", function()
    local out, ok = H.child([==[
local SPIN = [[extern "C" __global__ void spin(float *x, long long c) {
  long long t0 = clock64(); while (clock64() - t0 < c) {} x[threadIdx.x] += 1; }]]
local s = cuda.stream()
local d = cuda.device_array(32, "float32", s)
d:fill(1, s)
local spin = cuda.compile(SPIN):get("spin")
local p, mp, mg = cuda.pinned_array(16, "float32"), cuda.mapped_array(16, "int32"), cuda.managed_array(16, "float32")
local own = cuda.compile(SPIN .. " // another module") -- dropped inside the host function
do local _ = cuda.compile(SPIN .. " // garbage"); _ = cuda.pinned_array(8, "float32") end
spin[{ 1, 32, s }](d, 20000000)
local ran
s:launch_host_func(function()
  p:close(); mp:close(); mg:close()
  own = nil; collectgarbage(); collectgarbage()
  ran = true
end)
s:synchronize()
spin[{ 1, 32, s }](d, 1)   -- the stream and the kernel's module still work afterwards
local v = d:copy_to_host()
print(ran, p.closed, mp.closed, mg.closed, v[1], v[32])
]==], nil, "timeout 60")
    assert.matches("^true\ttrue\ttrue\ttrue\t3%.0\t3%.0\n$", out)
    assert.is_true(ok, out)
  end)

  -- in a child process with a time limit: the failure this guards against is a hang (work
  -- queued behind a host function waits for it, and it waits for the Lua thread)
  gpu("with launches that block (CUDA_LAUNCH_BLOCKING=1), work behind a host function: no hang", function()
    local out, ok = H.child([==[
local twice = cuda.compile([[extern "C" __global__ void twice(int *m) { m[1] = 2 * m[0]; }]]):get("twice")
local s = cuda.stream()
local m = cuda.mapped_array(2, "int32")
local d = cuda.device_array(4, "int32")
local order = {}
s:launch_host_func(function() m[1] = 21; order[#order + 1] = "a" end)
twice[{ 1, 1, s }](m)                                   -- a launch behind it
s:launch_host_func(function() order[#order + 1] = "b" end)
d:fill(m[2], s)                                         -- a fill behind it
s:launch_host_func(function() order[#order + 1] = "c" end)
local h = d:copy_to_host(nil, s)                        -- a copy behind it
local g = cuda.graph()
g:host(function() order[#order + 1] = "d" end)
local e = g:instantiate()
e:launch(s)
e:launch(s)                                             -- a graph launch behind a host node
s:synchronize()
print(cuda.launches_block(), m[1], m[2], h[4], table.concat(order))
]==], { CUDA_LAUNCH_BLOCKING = "1" }, "timeout 60")
    assert.equal("true\t21\t42\t42\tabcdd\n", out)
    assert.is_true(ok, out)
  end)

  gpu("refuses what is not a function, and closed streams", function()
    local s = cuda.stream()
    C.raises("function expected, got number", s.launch_host_func, s, 5)
    C.raises("function expected, got no value", s.launch_host_func, s)
    s:close()
    C.raises("closed stream", s.launch_host_func, s, function() end)
  end)
end)
