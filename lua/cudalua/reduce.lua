-- cudalua.reduce: Numba's @cuda.reduce for Lua. cuda.reduce("a + b") gives a reducer; calling
-- it on an array returns op(init, x1 op x2 op ... op xn), computed in one kernel launch
-- (kernels/cudalua/reduce.cuh) that keeps the order of the elements; an expression known to
-- commute ("a + b", "a * b", bitwise ops) lets each lane fold its own elements first.
local core = ...
local compile = require "cudalua.compile"
local check = require "cudalua.check"
local gpus = require "cudalua.gpus"

local M = {}
local BLOCK = 256
local W = BLOCK // 32
-- tiles a warp loads before reducing them, and the grid in waves of resident blocks: chosen on
-- an H200 (2^28 float32 sum) for the kernel that keeps the order and the one for commuting ops
local ORDERED = { un = 4, waves = 2, comm = "false" }
local COMMUTING = { un = 8, waves = 4, comm = "true" }
-- expressions (spaces removed) whose operands commute exactly on every dtype they compile for;
-- complex "*" is left out (its NaN and infinity handling need not be symmetric)
local COMMUTES = { ["a+b"] = true, ["b+a"] = true, ["a|b"] = true, ["b|a"] = true,
  ["a&b"] = true, ["b&a"] = true, ["a^b"] = true, ["b^a"] = true }
local COMMUTES_REAL = { ["a*b"] = true, ["b*a"] = true }

-- the complex dtypes, and how their values are packed: a table lookup per call costs less
-- than a dtype field read through its __index
local PACK = { [core.dtype("complex64")] = "<ff", [core.dtype("complex128")] = "<dd" }

local Reducer = {}
Reducer.__index = Reducer
Reducer.__name = "cudalua.reducer"

-- the operation sees elements as compile.value_type says (complex: cuda::std::complex, with the
-- operators "a + b" needs); header: what declares that type
local function source(self, ctype, header)
  local fn
  if self.expr then
    fn = ("__device__ __forceinline__ T operator()(T a, T b) const { return (%s); }"):format(self.expr)
  else
    fn = ("__device__ __forceinline__ T operator()(T a, T b) const { %s }"):format(self.body)
  end
  return table.concat({
    "#include <cudalua/reduce.cuh>",
    header or "",
    self.preamble or "",
    "struct cudalua_op { typedef " .. ctype .. " T; " .. fn .. " };",
  }, "\n")
end

-- what one dtype's kernels are compiled from: the source, the compile options, and the two
-- instances (aligned: 16-byte vector loads; unaligned)
local function plan(self, dtype)
  local ctype, header = compile.value_type(dtype)
  local v = 16 // dtype.itemsize
  local key = self.expr and self.expr:gsub("%s+", "")
  local p = (COMMUTES[key] or COMMUTES_REAL[key] and not PACK[dtype]) and COMMUTING or ORDERED
  local aligned = ("cudalua::reduce_kernel<%s, cudalua_op, %d, %d, %s>"):format(ctype, v, p.un, p.comm)
  local unaligned = ("cudalua::reduce_kernel<%s, cudalua_op, 1, %d, %s>"):format(ctype, p.un, p.comm)
  return { src = source(self, ctype, header), opts = { name = "cudalua_reduce.cu", name_expressions = { aligned, unaligned } },
           aligned = aligned, unaligned = unaligned, p = p, v = v }
end

local function no_compile(self, dtype, why, fname)
  check.error(fname or "cuda.reduce", 0, "the reduction %q does not compile for %s:\n%s", self.expr or self.body, tostring(dtype), why)
end

-- the kernels of plan pl from module mod, kept for dtype on device dev
local sms_of = {}   -- device -> multiprocessors (core.devices() builds every device's table)
local function install(self, dtype, dev, mod, pl)
  local cur = core.current_device()
  local sms = sms_of[cur]
  if not sms then sms = core.devices()[cur + 1].multiprocessors; sms_of[cur] = sms end
  local p, v = pl.p, pl.v
  -- per_block: the elements that give each warp of a block its un tiles
  local ks = { mod = mod, { k = mod:get(pl.aligned), per_block = 32 * v * W * p.un },
    { k = mod:get(pl.unaligned), per_block = 32 * W * p.un } }
  for _, k in ipairs(ks) do
    k.max_grid = p.waves * sms * math.max(1, k.k:max_blocks_per_sm(BLOCK))
    k.one = k.k[{ 1, BLOCK }] -- the launcher for small inputs on the default stream
  end
  local per = self.kernels[dev] or {}
  self.kernels[dev] = per
  per[dtype] = ks -- dtypes are unique objects
  return ks
end

-- the kernels for one dtype on the selected device
local function kernels(self, dtype, dev)
  local pl = plan(self, dtype)
  local ok, mod = pcall(compile.compile, pl.src, pl.opts)
  if not ok then no_compile(self, dtype, check.cause(mod)) end
  return install(self, dtype, dev, mod, pl)
end

-- per dtype: a one-element mapped array the kernel writes the host result into (no copy call)
local outs = {}
-- per device and stream: scratch for the blocks' values and the ticket counter
local scratch = {}
local DEFAULT = {}

local function get_scratch(cuda, stream, bytes, dev)
  local key = stream or DEFAULT
  local per = scratch[dev]
  if not per then per = setmetatable({}, { __mode = "k" }); scratch[dev] = per end
  local s = per[key]
  if not s or s.bytes < bytes then
    local arr = cuda.device_array(bytes // 8 + 1, "uint64", stream)
    local counter = cuda.device_array(1, "uint32", stream)
    counter:fill(0, stream)
    s = { bytes = bytes, partials = arr, counter = counter }
    per[key] = s
  end
  return s
end

local function typed(dtype, v)
  if PACK[dtype] then return type(v) == "table" and { v[1] + 0.0, v[2] + 0.0 } or { v + 0.0, 0.0 } end
  if dtype.is_float then return v + 0.0 end
  return v
end

-- init as the kernel takes it: complex numbers are structs to the launcher (their bytes)
local function kernel_init(dtype, v)
  local fmt = PACK[dtype]
  if not fmt then return v end
  if type(v) == "table" then return string.pack(fmt, v[1], v[2]) end
  return string.pack(fmt, v, 0)
end

local default_stream
local flag, seq = nil, 0

-- the reduction itself, with the array's device selected
local function run(self, arr, n, dtype, kind, ptr, init, stream, res, dev)
  local cuda = self.cuda
  if n == 0 then
    if res then res:slice(1, 1):fill(init, stream); return res end
    return typed(dtype, init)
  end
  init = kernel_init(dtype, init)
  local src = arr
  if kind == "array" then -- pageable host memory: through a device copy
    src = cuda.to_device(arr, stream)
    ptr = src:ptr()
  end
  local ks = self.kernels[dev] and self.kernels[dev][dtype] or kernels(self, dtype, dev)
  local e = ptr % 16 == 0 and ks[1] or ks[2]
  local grid = n // e.per_block -- with several blocks every warp gets its un tiles or more
  if grid < 1 then grid = 1 elseif grid > e.max_grid then grid = e.max_grid end
  local out = res
  if not out then
    out = outs[dtype]
    if not out then out = cuda.mapped_array(1, dtype); outs[dtype] = out end
    flag = flag or cuda.mapped_array(1, "uint32")
  end
  if grid == 1 and not stream and not res then
    -- small input, result to the host: the kernel raises a flag in mapped memory after
    -- writing the result, and the host spins on it (cheaper than a stream synchronize)
    seq = seq % 0x3fffffff + 1
    e.one(src, n, init, 1 | (seq << 1), out, out, flag)
    core.wait_flag(flag, seq)
    return out[1]
  elseif grid == 1 and not stream then
    e.one(src, n, init, 1, out, out, out)
  else
    local partials, counter = out, out
    if grid > 1 then
      local s = get_scratch(cuda, stream, grid * dtype.itemsize, dev)
      partials, counter = s.partials, s.counter
    end
    e.k[{ grid, BLOCK, stream }](src, n, init, 1, out, partials, counter)
  end
  if res then return res end
  if stream then stream:synchronize()
  else
    default_stream = default_stream or cuda.default_stream()
    default_stream:synchronize()
  end
  return out[1]
end

local CALL_OPTS = { "init", "res", "stream", "axis", "keepdims" }   -- a reducer's call takes these (made once)

-- a literal of init for the fold's type (_cl_R, cudalua.reduction's)
local function literal(init)
  local function num(x) return math.type(x) == "integer" and tostring(x) or ("%.17g"):format(x) end
  if type(init) == "table" then return ("_cl_R(%s, %s)"):format(num(init[1]), num(init[2])) end
  return num(init)
end

-- the identities of the expressions known to commute (their lanes fold from it, then init
-- is folded in once)
local IDENTITY = { ["a+b"] = "0", ["b+a"] = "0", ["a|b"] = "0", ["b|a"] = "0", ["a&b"] = "~(_cl_R)0",
  ["b&a"] = "~(_cl_R)0", ["a^b"] = "0", ["b^a"] = "0", ["a*b"] = "1", ["b*a"] = "1" }

-- along axes (opts.axis; or every axis of a strided view): a cudalua.reduction whose map is the
-- element and whose fold is this reducer's, init folded in once per result as the whole
-- array's is: an expression known to commute folds in lanes from its identity, then init op
-- that; any other runs each result's fold in one thread, init first and the elements in order
-- (Numba's semantics, whatever the operation). One per dtype and init. Returns the array of
-- results (res: into it)
local function by_axis(self, arr, dtype, init, opts, stream, res)
  local key = tostring(dtype) .. "\0" .. literal(init)
  self.by_axis = self.by_axis or {}
  local red = self.by_axis[key]
  if not red then
    local fold = self.expr and ("(" .. self.expr .. ")")
      or ("([](_cl_R a, _cl_R b) -> _cl_R { " .. self.body .. " })(a, b)")
    local t = dtype.name
    local e = self.expr and self.expr:gsub("%s+", "")
    local id = e and (COMMUTES[e] or COMMUTES_REAL[e] and not PACK[dtype]) and IDENTITY[e]
    if id then
      local post = ("{ const _cl_R b = a; _cl_R a = (_cl_R)(%s); y = %s; }"):format(literal(init), fold)
      red = self.cuda.reduction(t .. " x", t .. " y", "x", fold, post, id)
    else
      red = self.cuda.reduction(t .. " x", t .. " y", "x", fold, "y = a", literal(init))
      red.serial = true
    end
    red.preamble = self.preamble
    red.where, red.up = "cuda.reduce", 1   -- (its errors: this reducer's, at its caller's line: red's call below is a tail call)
    self.by_axis[key] = red
  end
  return red(arr, { axis = opts and opts.axis, keepdims = opts and opts.keepdims, out = res, stream = stream })
end

function Reducer:__call(arr, opts)
  local cuda = self.cuda
  local init, stream, res
  if opts ~= nil then
    if type(opts) ~= "table" then
      check.error("cuda.reduce", 2, "options must be a table {init=, res=, stream=}, got %s", type(opts))
    end
    init, stream, res = opts.init, opts.stream, opts.res
    check.options(opts, CALL_OPTS, "cuda.reduce", 3)
    if stream ~= nil and stream ~= 0 then
      if not check.is_stream(stream) then
        check.error("cuda.reduce", 2, "expected a stream, got %s", type(stream))
      end
    elseif stream == 0 then
      stream = nil
    end
  end
  local n, dtype, kind, ptr, dev, contig = core.array_info(arr)
  if not n and type(getmetatable(arr)) == "table" and getmetatable(arr).__cuda_array_interface then
    arr = cuda.as_cuda_array(arr)
    n, dtype, kind, ptr, dev, contig = core.array_info(arr)
  end
  local along = opts ~= nil and (opts.axis ~= nil or opts.keepdims ~= nil)
  local strided = n and not contig
  if strided and not along and res ~= nil then
    check.error("cuda.reduce", 2, "res with a strided view: give axis (or reduce a:copy())")
  end
  if not n then
    if type(arr) == "table" and getmetatable(arr) == nil then
      check.error("cuda.reduce", 2, "expected an array, got a table (make one with cuda.array(t, dtype))")
    end
    check.error("cuda.reduce", 2, "expected an array, got %s", type(arr))
  end
  if init == nil then init = self.init or 0 end
  if PACK[dtype] then
    if type(init) ~= "number" and not (type(init) == "table" and type(init[1]) == "number" and type(init[2]) == "number") then
      check.error("cuda.reduce", 2, "init must be a number or a pair {re, im} for %s, got %s", dtype, type(init))
    end
  elseif math.type(init) ~= "integer" then
    if type(init) ~= "number" then check.error("cuda.reduce", 2, "init must be a number, got %s", type(init)) end
    if not dtype.is_float then
      check.error("cuda.reduce", 2, "init must be an integer for %s, got %s", dtype, init)
    end
  end
  if res ~= nil then
    local rn, rdt, rkind, _, rdev = core.array_info(res)
    if not rn then check.error("cuda.reduce", 2, "res must be an array, got %s", type(res)) end
    if rdt ~= dtype then check.error("cuda.reduce", 2, "res has dtype %s, the input %s", rdt, dtype) end
    if rn < 1 then check.error("cuda.reduce", 2, "res is empty") end
    if rkind == "array" then check.error("cuda.reduce", 2, "res must be a device (or pinned/mapped/managed) array") end
    if rdev >= 0 and dev >= 0 and rdev ~= dev then
      check.error("cuda.reduce", 2, "res is on device %d and the input on device %d", rdev, dev)
    end
    if dev < 0 then dev = rdev end
  end
  if along or strided then   -- (a strided view's whole reduction: its one result read back)
    local out = by_axis(self, arr, dtype, init, opts, stream, res)
    if along then return out end
    return out:copy_to_host(nil, stream)[1]
  end
  -- the work runs on the input's device (a stream given must be that device's)
  local cur = core.is_available() and core.current_device() or 0
  if dev < 0 then dev = stream and stream:device() or cur end
  local r
  if dev == cur then r = run(self, arr, n, dtype, kind, ptr, init, stream, res, dev)
  else r = gpus[dev]:run(run, self, arr, n, dtype, kind, ptr, init, stream, res, dev) end
  return r
end

-- r:precompile(dtypes): the kernels for these dtypes (names or dtype objects) on the selected
-- device, compiled now and at once (cuda.compile_all), not at each dtype's first call
function Reducer:precompile(dtypes)
  if type(dtypes) ~= "table" then check.error("reducer:precompile", 2, "expected a list of dtypes, got %s", type(dtypes)) end
  local list, plans, todo = {}, {}, {}
  for i, d in ipairs(dtypes) do
    local ok, dt = pcall(core.dtype, d)
    if not ok then check.error("reducer:precompile", 2, "dtypes[%d]: unknown dtype %s", i, tostring(d)) end
    todo[#todo + 1] = dt
  end
  local dev = core.current_device()
  for i, dt in ipairs(todo) do
    plans[i] = plan(self, dt)
    list[i] = { plans[i].src, plans[i].opts }
  end
  local mods, errs = compile.compile_all(list)
  -- every dtype that compiled is kept before the first that did not is reported
  for i, dt in ipairs(todo) do
    if mods[i] then install(self, dt, dev, mods[i], plans[i]) end
  end
  for i, dt in ipairs(todo) do
    if errs and errs[i] then no_compile(self, dt, errs[i], "reducer:precompile") end
  end
  return self
end

function Reducer:__tostring()
  return "cudalua.reducer<" .. (self.expr or "function") .. ">"
end

-- cuda.reduce(expr | {body=, preamble=}, {init=})
function M.reduce(cuda, expr, opts)
  local self = setmetatable({ cuda = cuda, kernels = {} }, Reducer)
  if type(expr) == "string" then
    if not expr:find("%f[%w_][ab]%f[^%w_]") then
      check.error("cuda.reduce", 3, "the expression %q uses neither a nor b", expr)
    end
    self.expr = expr
  elseif type(expr) == "table" then
    for k in pairs(expr) do
      if k ~= "body" and k ~= "preamble" then
        check.error("cuda.reduce", 3, "unknown key '%s' in the expression table"
          .. " (body, preamble; options such as init go in the second argument)", tostring(k))
      end
    end
    if type(expr.body) ~= "string" then
      check.error("cuda.reduce", 3, "a table argument needs body = \"...; return ...;\" (a device function of a and b)")
    end
    if expr.preamble ~= nil and type(expr.preamble) ~= "string" then
      check.error("cuda.reduce", 3, "preamble must be a string of CUDA C")
    end
    self.body, self.preamble = expr.body, expr.preamble
  else
    check.error("cuda.reduce", 3, "expected a CUDA C expression of a and b, got %s", type(expr))
  end
  if opts ~= nil then
    if type(opts) ~= "table" then check.error("cuda.reduce", 3, "options must be a table, got %s", type(opts)) end
    check.options(opts, { "init" }, "cuda.reduce", 4)
    if opts.init ~= nil and type(opts.init) ~= "number" then
      check.error("cuda.reduce", 3, "init must be a number, got %s", type(opts.init))
    end
    self.init = opts.init
  end
  return self
end

return M
