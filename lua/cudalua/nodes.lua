-- cudalua.nodes: graphs the seed's way (the CUDA graph API proposal for Numba). Nodes belong to no
-- graph until built, so they can be made in any order and changed until then:
--   local G = cuda.graph
--   local n1 = G.kernel[{4, 1}](k1, {d_a}, {n0})      -- or G.kernel(k1, {4, 1}, {d_a}, {n0})
--   n1.args[#n1.args + 1] = x ; n1.deps[#n1.deps + 1] = n2
--   local g = n1:build() ; g:launch(s)                -- g: a cuda.graph, the same as the bound form
-- node:build() makes a cuda.graph() and adds the node and everything it depends on, each node once,
-- dependencies first: the walk in C (core.graph_walk) and kernel nodes by g:kernel's C code
-- (core.graph_add: no Lua call per node, so a build costs about what the bound form's calls
-- do), the other kinds through the bound functions (g:memcpy, ...). The CUDA graph is the one the bound form gives, and so is the
-- cost of each replay.
local check = require "cudalua.check"

local M = {}
local Node = {}
local node_mt = { __index = Node, __name = "cudalua.unbound_node" }
function node_mt.__tostring(n) return ("cudalua.unbound_node<%s>"):format(n.kind) end
local function is_node(v) return getmetatable(v) == node_mt end

-- a fresh list of the nodes in deps (nil: none); the user's table is not kept
local function deps_list(deps, where)
  if deps == nil then return {} end
  if type(deps) ~= "table" or getmetatable(deps) == node_mt then
    check.error(where, 3, "deps must be a list of nodes, got %s", is_node(deps) and "a node (wrap it: {node})" or type(deps))
  end
  local out = {}
  for i = 1, #deps do
    local d = deps[i]
    if getmetatable(d) ~= node_mt then check.error(where, 3, "deps[%d] must be a node, got %s", i, type(d)) end
    out[i] = d
  end
  return out
end

local function list(v, what, where)
  if v == nil then return {} end
  if type(v) ~= "table" or is_node(v) then check.error(where, 3, "%s must be a list, got %s", what, type(v)) end
  return table.move(v, 1, #v, 1, {})
end

-- fields: the node's table, made with kind and a deps slot in one constructor (no rehash)
local function node(fields, deps, where)
  fields.deps = deps_list(deps, where)
  return setmetatable(fields, node_mt)
end

-- cuda.graph.kernel(k, config, args, deps) (called as a table: the first argument is it) and
-- cuda.graph.kernel[config](k, args, deps), the seed's KernelNode[64, 32](k, args, deps). The
-- constructor is C's (core.graph_kernel_node, set by M.namespace): graphs of thousands of
-- kernel nodes are made in loops.
local kernel_node
local kernel_mt = {   -- (__call: kernel_node)
  __index = function(_, config)
    if type(config) ~= "table" then
      check.error("cuda.graph.kernel[config]", 2, "config must be a table ({grid, block} or keys), got %s", type(config))
    end
    return function(k, args, deps) return kernel_node(nil, k, config, args, deps) end
  end,
}
M.kernel = setmetatable({}, kernel_mt)

function M.memcpy(dst, src, deps) return node({ kind = "memcpy", dst = dst, src = src, deps = false }, deps, "cuda.graph.memcpy") end
function M.memset(dst, value, deps) return node({ kind = "memset", dst = dst, value = value, deps = false }, deps, "cuda.graph.memset") end
function M.empty(deps) return node({ kind = "empty", deps = false }, deps, "cuda.graph.empty") end
function M.child(graph, deps) return node({ kind = "child", graph = graph, deps = false }, deps, "cuda.graph.child") end
function M.record(event, deps) return node({ kind = "record", event = event, deps = false }, deps, "cuda.graph.record") end
function M.wait(event, deps) return node({ kind = "wait", event = event, deps = false }, deps, "cuda.graph.wait") end
-- (allocations and conditions have no unbound form: an allocation's address and a condition's
-- handle are made by the graph they belong to, so they exist only once it does)

-- cuda.graph.host(fn, args, deps): fn(args...) runs on the Lua thread when the graph reaches it
function M.host(fn, args, deps)
  if type(fn) ~= "function" then check.error("cuda.graph.host", 2, "expected a function, got %s", type(fn)) end
  return node({ kind = "host", fn = fn, args = list(args, "args", "cuda.graph.host"), deps = false }, deps,
    "cuda.graph.host")
end

-- how each kind is added to the graph, through the bound functions
local add = {
  kernel = true,   -- (added in C: core.graph_add)
  memcpy = function(g, n, deps) return g:memcpy(n.dst, n.src, deps) end,
  memset = function(g, n, deps) return g:memset(n.dst, n.value, deps) end,
  empty = function(g, _, deps) return g:empty(deps) end,
  child = function(g, n, deps) return g:child(n.graph, deps) end,
  record = function(g, n, deps) return g:record(n.event, deps) end,
  wait = function(g, n, deps) return g:wait(n.event, deps) end,
  host = function(g, n, deps)
    local fn, args = n.fn, table.move(n.args, 1, #n.args, 1, {})   -- as they are now
    return g:host(function() fn(table.unpack(args, 1, #args)) end, deps)
  end,
}

-- cuda.graph's constructor (named graph: an error of a C function is named by the variable it
-- was called through, so a missing driver reads "cuda.graph: ..."), core.graph_walk, core.graph_add
local graph, walk, add_all

-- node:build() -> graph, nodes: a new cuda.graph of the node and everything it depends on;
-- nodes maps each unbound node to its node in the graph (for exec:set_args and the like).
-- core.graph_walk orders the nodes, checking each before what it depends on (a malformed node
-- or a cycle is refused before any graph is made); core.graph_add adds them. An error while
-- adding closes the half-made graph and names node:build and the node's kind.
function Node.build(root)
  if not is_node(root) then check.error("node:build", 2, "call it as node:build()") end
  local bound, failing = {}, {}
  local order = walk(root, node_mt, add, bound)
  local g = graph()   -- (not a tail call: an error names cuda.graph)
  local ok, r = pcall(add_all, g, order, bound, add, failing)
  if not ok then
    g:close()
    check.error("node:build", 2, "%s node: %s", (failing[1] or root).kind, (check.cause(r):gsub("^graph:%w+: ", "")))
  end
  return g, bound
end

-- cuda.graph: called, a new empty graph (graph: the C constructor); indexed, the unbound nodes
function M.namespace(ctor, walker, adder, kernel_ctor)
  graph, walk, add_all = ctor, walker, adder
  kernel_node = kernel_ctor(node_mt)
  kernel_mt.__call = kernel_node
  local public = { kernel = M.kernel, memcpy = M.memcpy, memset = M.memset, host = M.host, empty = M.empty,
                   child = M.child, record = M.record, wait = M.wait }
  return setmetatable(public, {
    __call = function(_, ...)
      local g = graph(...)
      return g
    end,
  })
end

return M
