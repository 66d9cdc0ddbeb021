-- cudalua: the module table users get from require "cudalua".
-- The C core (src/*.c) does what must be fast or touch the driver; this file and its siblings
-- are glue and policy. They are compiled into the binary (see src/core.c).
local core = ...
local cuda = {}
local check = require "cudalua.check"

for _, name in ipairs {
  "is_available", "use_cpu", "driver_error", "launches_block", "devices", "select_device", "current_device", "synchronize",
  "time", "sleep", "dtype", "float32", "float64", "int8", "int16", "int32", "int64", "uint8",
  "uint16", "uint32", "uint64", "bool", "float16", "bfloat16", "complex64", "complex128", "array", "zeros", "pinned_array",
  "mapped_array", "managed_array", "device_array", "device_array_like", "to_device", "stream",
  "cuda_array", "texture", "surface",
  "default_stream", "stream_priority_range", "event", "event_elapsed_time", "block_cache", "empty_cache", "memory_stats",
  "reset_memory_stats", "set_memory_limit", "copy",
  "can_access_peer", "enable_peer_access", "disable_peer_access", "open_ipc_array",
  "open_ipc_event", "set_limit", "get_limit" } do
  cuda[name] = assert(core[name], name)
end
cuda.__version = core.version

-- cuda.versions() -> {driver = 13000, nvrtc = {13, 0}, nvjitlink = {13, 0}, cudalua = "x.y.z"}
function cuda.versions()
  local ma, mi = core.nvrtc_version()
  local ja, ji = core.jitlink_version()
  return { driver = core.driver_version(), nvrtc = ma and { ma, mi } or nil,
           nvjitlink = ja and { ja, ji } or nil, cudalua = core.version }
end

-- cuda.mem_info() -> free, total bytes of the current device
cuda.mem_info = core.mem_info

-- like `numba -s`: what this machine offers; returns true when a GPU is usable
function cuda.detect(out)
  out = out or io.stdout
  if not pcall(function() assert(type(out.write) == "function") end) then
    check.error("cuda.detect", 2, "out must be a file or an object with a write method, got %s", type(out))
  end
  local v = cuda.versions()
  local ma, mi, path = core.nvrtc_version()
  out:write(("cudalua %s\n"):format(core.version))
  out:write(("NVRTC: %s\n"):format(ma and ("%d.%d (%s)"):format(ma, mi, path) or mi))
  if not core.is_available() then
    out:write(core.driver_error() .. "\n")
    return false
  end
  local devs = core.devices()
  if devs[1].kind == "cpu" then
    out:write("CUDA driver: none: cudalua's CPU device runs the kernels (CUDALUA_DEVICE=cpu or cuda.use_cpu())\n")
  else
    out:write(("CUDA driver: %d.%d\n"):format(v.driver // 1000, v.driver % 1000 // 10))
  end
  out:write(("Found %d CUDA device%s\n"):format(#devs, #devs == 1 and "" or "s"))
  for _, d in ipairs(devs) do
    out:write(("id %d  %-28s  compute capability %d.%d  %d SMs  %.1f GiB\n"):format(
      d.id, d.name, d.compute_capability[1], d.compute_capability[2], d.multiprocessors,
      d.total_memory / 2 ^ 30))
  end
  return true
end

-- cuda.graph() makes a graph; cuda.graph.kernel, .memcpy, ... make nodes of none (the seed's form)
cuda.graph = require("cudalua.nodes").namespace(core.graph, core.graph_walk, core.graph_add,
  core.graph_kernel_node)

local compile = require "cudalua.compile"
cuda.compile = compile.compile
cuda.kernel = compile.kernel
cuda.compile_all = compile.compile_all
cuda.compile_stats = compile.compile_stats
local link = require "cudalua.link"
cuda.load_module = link.load_module
cuda.link = link.link

local reduce = require "cudalua.reduce"
-- a misplaced option (given to the constructor instead of the call) is refused, not lost
local function at_most(n, where, ...)
  if select("#", ...) > n then
    check.error(where, 3, "takes at most %d arguments, got %d", n, select("#", ...))
  end
end

function cuda.reduce(...)
  at_most(2, "cuda.reduce", ...)
  local expr, opts = ...
  local r = reduce.reduce(cuda, expr, opts)   -- not a tail call: its errors count this frame
  return r
end

cuda.as_cuda_array = core.as_cuda_array -- src/interop.c
cuda.from_dlpack = core.from_dlpack     -- src/dlpack.c
cuda.NULL = core.NULL   -- a NULL pointer kernel argument (src/args.c), like nil

cuda.random = require "cudalua.random"
cuda.gpus = require "cudalua.gpus"
cuda.progress = require "cudalua.progress"

-- CuPy's ElementwiseKernel: cuda.elementwise("float32 x, float32 a", "float32 z", "z = a * x")
local elementwise = require "cudalua.elementwise"
function cuda.elementwise(...)
  at_most(4, "cuda.elementwise", ...)
  local ins, outs, body, name = ...
  return elementwise.elementwise(cuda, ins, outs, body, name)
end

-- CuPy's ReductionKernel: cuda.reduction("float32 x", "float32 y", "x", "a + b", "y = a / _count", "0")
local reduction = require "cudalua.reduction"
function cuda.reduction(...)
  at_most(7, "cuda.reduction", ...)
  return reduction.reduction(cuda, ...)   -- (a tail call: its errors count from here, as elementwise's)
end

-- NVTX ranges for Nsight Systems and Nsight Compute (src/nvtx.c); no-ops without a profiler
local nvtx = core.nvtx
cuda.nvtx = nvtx
cuda.profile_start, cuda.profile_stop = core.profile_start, core.profile_stop

-- nvtx.range(name, fn, ...) -> fn's results, run inside a range that ends when fn raises too
function nvtx.range(name, fn, ...)
  if type(fn) ~= "function" then check.error("cuda.nvtx.range", 2, "expected a function, got %s", type(fn)) end
  nvtx.range_push(name)
  local r = table.pack(pcall(fn, ...))
  nvtx.range_pop()
  if not r[1] then error(r[2], 0) end
  return table.unpack(r, 2, r.n)
end

-- local _ <close> = cuda.nvtx.scope(name): a range that ends with the block
local Scope = { __name = "cudalua.nvtx_scope" }
Scope.__close = function(s)
  if not s.done then s.done = true; nvtx.range_pop() end
end
Scope.__index = { close = Scope.__close }
function nvtx.scope(name)
  nvtx.range_push(name)
  return setmetatable({}, Scope)
end

-- Numba's cuda.defer_cleanup: frees and destroys (arrays, streams, events, modules, graphs)
-- asked for inside are put off until the scope ends, so that a loop of short-lived arrays is
-- not held up by the waits a free implies. Scopes nest; the last to end runs what was put off.
--   cuda.defer_cleanup(fn, ...) -> fn's results (the scope ends when fn raises too)
--   local _ <close> = cuda.defer_cleanup()   (a guard: the scope ends with the block, or :close())
--   cuda.pending_cleanup() -> the releases put off now, the scopes open
local Guard = { __name = "cudalua.cleanup_guard" }
Guard.__close = function(g)
  if not g.done then g.done = true; core.cleanup_pause(-1) end
end
Guard.__gc = Guard.__close   -- (a guard never closed ends its scope when it is collected)
Guard.__index = { close = Guard.__close }
function cuda.defer_cleanup(fn, ...)
  if fn == nil and select("#", ...) == 0 then
    core.cleanup_pause(1)
    return setmetatable({}, Guard)
  end
  if type(fn) ~= "function" then
    check.error("cuda.defer_cleanup", 2, "expected a function (or nothing, for a <close> guard), got %s", type(fn))
  end
  core.cleanup_pause(1)
  local r = table.pack(pcall(fn, ...))
  core.cleanup_pause(-1)
  if not r[1] then error(r[2], 0) end
  return table.unpack(r, 2, r.n)
end

function cuda.pending_cleanup()
  local open, pending = core.cleanup_pause(0)
  return pending, open
end

return cuda
