-- cudalua.elementwise: CuPy's ElementwiseKernel (Numba's @vectorize) for cudalua.
--   local saxpy = cuda.elementwise("float32 x, float32 y, float32 a", "float32 z", "z = a * x + y")
--   local z = saxpy(d_x, d_y, 2.5)                 -- z allocated: a device array like d_x
--   saxpy(d_x, d_y, 2.5, d_z, { stream = s })      -- into d_z, on a stream
-- Inputs given as Lua numbers are broadcast (passed by value); arrays all have the same number
-- of elements, and the outputs are allocated like the first array when not given. One kernel
-- is compiled per dtypes-and-scalars signature (through the compile cache): a grid-stride loop
-- whose arrays are read and written 16 bytes at a time when every pointer allows it. An input
-- declared "raw float32 t" is an array of any size the body indexes itself (CuPy's raw
-- arguments), and _i is the element's index (CuPy's i): "y = x / t[_i / cols]".
local core = ...
local compile = require "cudalua.compile"
local check = require "cudalua.check"
local M = {}

-- "float32 x, float32 y" -> { {dtype=, name=}, ... }; "raw float32 t": an array the body
-- indexes itself (raw = true), CuPy's raw arguments
local function parse_params(s, where, level)
  if type(s) ~= "string" then
    check.error(where, level, "parameters must be a string such as \"float32 x, float32 y\", got %s", type(s))
  end
  local list, seen = {}, {}
  if s:match("^%s*$") then return list end
  for part in (s .. ","):gmatch("([^,]*),") do
    local raw, dt, name = part:match("^%s*(raw%s+)([%w_]+)%s+([%a_][%w_]*)%s*$")
    if not raw then dt, name = part:match("^%s*([%w_]+)%s+([%a_][%w_]*)%s*$") end
    if not dt then
      check.error(where, level, "cannot read parameter %q (expected \"dtype name\")", part:match("^%s*(.-)%s*$"))
    end
    local ok, d = pcall(core.dtype, dt)
    if not ok then check.error(where, level, "parameter %s: unknown dtype %q", name, dt) end
    if seen[name] then check.error(where, level, "parameter %s is named twice", name) end
    if name:match("^_cl_") then check.error(where, level, "parameter name %s is reserved", name) end
    seen[name] = true
    list[#list + 1] = { dtype = d, name = name, itemsize = d.itemsize, complex = d.is_complex, raw = raw ~= nil }
  end
  return list
end

-- the body sees values as compile.value_type says (complex: cuda::std::complex); complex
-- elements are stored as cuComplex's float2 / double2, which is also how a scalar comes from Lua
-- ({re, im} or a number), and converted on the way in and out
local STORED = { complex64 = "float2", complex128 = "double2" }
local CONVERT = [[
__device__ __forceinline__ cuda::std::complex<float> _cl_cx(float2 v) { return {v.x, v.y}; }
__device__ __forceinline__ cuda::std::complex<double> _cl_cx(double2 v) { return {v.x, v.y}; }
__device__ __forceinline__ float2 _cl_raw(cuda::std::complex<float> v) { return make_float2(v.real(), v.imag()); }
__device__ __forceinline__ double2 _cl_raw(cuda::std::complex<double> v) { return make_double2(v.real(), v.imag()); }]]
local function ctype(d) return STORED[d.name] or d.ctype end
local function value(d) return (compile.value_type(d)) end
-- (cudalua.reduction builds its kernels from the same parts)
M.parse_params, M.STORED, M.CONVERT, M.ctype, M.value = parse_params, STORED, CONVERT, ctype, value

-- the inputs read element by element: not the raw ones
local function plain_of(ins)
  local plain = {}
  for _, v in ipairs(ins) do if not v.raw then plain[#plain + 1] = v end end
  return plain
end

-- the kernel source for inputs ins (each with .scalar), outputs outs; w: elements a thread
-- reads per step (1: no vector loads)
local function source(ins, outs, body, w)
  local p, headers, complex = {}, {}, false
  local function need(d)
    local _, header = compile.value_type(d)
    if header then headers[header] = true end
    complex = complex or STORED[d.name] ~= nil
  end
  for _, v in ipairs(ins) do
    local ct = ctype(v.dtype)
    need(v.dtype)
    p[#p + 1] = v.scalar and ("%s %s_"):format(ct, v.name) or ("const %s *__restrict__ %s_"):format(ct, v.name)
  end
  local plain = plain_of(ins)
  for _, v in ipairs(outs) do
    need(v.dtype)
    p[#p + 1] = ("%s *__restrict__ %s_"):format(ctype(v.dtype), v.name)
  end
  p[#p + 1] = "long long _cl_n"
  local L = {}
  for h in pairs(headers) do L[#L + 1] = h end
  table.sort(L)   -- the same source, so the same cache entry, every time
  if complex then L[#L + 1] = CONVERT end
  -- one element (index idx, the body's _i): the body sees every parameter by its name, as a
  -- value; a raw one as the array's pointer
  local function element(read, write, idx)
    local e = { ("    const long long _i = %s; (void)_i;"):format(idx) }
    for _, v in ipairs(ins) do e[#e + 1] = v.raw and ("    const %s *%s = %s_;"):format(ctype(v.dtype), v.name, v.name) or nil end
    for _, v in ipairs(plain) do
      local x = v.scalar and (v.name .. "_") or read(v)
      if STORED[v.dtype.name] then x = "_cl_cx(" .. x .. ")" end
      e[#e + 1] = ("    %s %s = %s;"):format(value(v.dtype), v.name, x)
    end
    for _, v in ipairs(outs) do e[#e + 1] = ("    %s %s;"):format(value(v.dtype), v.name) end
    e[#e + 1] = "    { " .. body .. "; }"
    for _, v in ipairs(outs) do
      e[#e + 1] = ("    %s = %s;"):format(write(v), STORED[v.dtype.name] and ("_cl_raw(" .. v.name .. ")") or v.name)
    end
    return table.concat(e, "\n")
  end
  if w > 1 then
    for _, v in ipairs(plain) do
      if not v.scalar then
        L[#L + 1] = ("struct __align__(%d) _cl_v_%s { %s v[%d]; };"):format(v.dtype.itemsize * w, v.name, ctype(v.dtype), w)
      end
    end
    for _, v in ipairs(outs) do
      L[#L + 1] = ("struct __align__(%d) _cl_v_%s { %s v[%d]; };"):format(v.dtype.itemsize * w, v.name, ctype(v.dtype), w)
    end
  end
  L[#L + 1] = ('extern "C" __global__ void cudalua_elementwise(%s) {'):format(table.concat(p, ", "))
  L[#L + 1] = "  long long _cl_stride = (long long)gridDim.x * blockDim.x;"
  L[#L + 1] = "  long long _cl_t = (long long)blockIdx.x * blockDim.x + threadIdx.x;"
  local tail_from = "0"
  if w > 1 then
    L[#L + 1] = ("  for (long long _cl_j = _cl_t; _cl_j < _cl_n / %d; _cl_j += _cl_stride) {"):format(w)
    for _, v in ipairs(plain) do
      if not v.scalar then
        L[#L + 1] = ("    _cl_v_%s _cl_in_%s = reinterpret_cast<const _cl_v_%s *>(%s_)[_cl_j];"):format(v.name, v.name, v.name, v.name)
      end
    end
    for _, v in ipairs(outs) do L[#L + 1] = ("    _cl_v_%s _cl_out_%s;"):format(v.name, v.name) end
    L[#L + 1] = "    #pragma unroll"
    L[#L + 1] = ("    for (int _cl_k = 0; _cl_k < %d; _cl_k++) {"):format(w)
    L[#L + 1] = element(function(v) return ("_cl_in_%s.v[_cl_k]"):format(v.name) end,
                        function(v) return ("_cl_out_%s.v[_cl_k]"):format(v.name) end, ("_cl_j * %d + _cl_k"):format(w))
    L[#L + 1] = "    }"
    for _, v in ipairs(outs) do
      L[#L + 1] = ("    reinterpret_cast<_cl_v_%s *>(%s_)[_cl_j] = _cl_out_%s;"):format(v.name, v.name, v.name)
    end
    L[#L + 1] = "  }"
    tail_from = ("_cl_n / %d * %d"):format(w, w)
  end
  L[#L + 1] = ("  for (long long _cl_i = %s + _cl_t; _cl_i < _cl_n; _cl_i += _cl_stride) {"):format(tail_from)
  L[#L + 1] = element(function(v) return v.name .. "_[_cl_i]" end,
                      function(v) return v.name .. "_[_cl_i]" end, "_cl_i")
  L[#L + 1] = "  }"
  L[#L + 1] = "}"
  return table.concat(L, "\n")
end
M.source = source

local Elementwise = {}
Elementwise.__index = Elementwise
Elementwise.__name = "cudalua.elementwise"

local EW_OPTS = { stream = true, block = true }
local NO_OPTS = {}   -- a call without options makes no table
local sms_of = {}   -- device -> multiprocessors (cuda.devices() builds every device's table)
-- (cudalua.reduction asks too)
function M.multiprocessors(cuda, dev)
  local sms = sms_of[dev]
  if not sms then sms = cuda.devices()[dev + 1].multiprocessors; sms_of[dev] = sms end
  return sms
end

-- cuda.elementwise(in_params, out_params, body [, name]) -> a callable
function M.elementwise(cuda, in_params, out_params, body, name)
  local where = "cuda.elementwise"
  local ins = parse_params(in_params, where, 3)
  local outs = parse_params(out_params, where, 3)
  for _, o in ipairs(outs) do
    if o.raw then check.error(where, 2, "output %s: raw outputs are not supported (raw inputs are)", o.name) end
  end
  if #outs == 0 then check.error(where, 2, "give at least one output parameter") end
  for _, o in ipairs(outs) do
    for _, i in ipairs(ins) do
      if o.name == i.name then check.error(where, 2, "%s is both an input and an output", o.name) end
    end
  end
  if type(body) ~= "string" or body:match("^%s*$") then
    check.error(where, 2, "the body must be a string of C++ statements")
  end
  if name ~= nil and (type(name) ~= "string" or not name:match("^[%a_][%w_]*$")) then
    check.error(where, 2, "name must be an identifier")
  end
  local out_widest = 1   -- the outputs' widest itemsize: every call's vector width counts them
  for _, p in ipairs(outs) do out_widest = math.max(out_widest, p.itemsize) end
  return setmetatable({ cuda = cuda, ins = ins, outs = outs, body = body, name = name or "elementwise",
                        where = ("elementwise '%s'"):format(name or "elementwise"),   -- its calls' errors
                        kernels = {}, out_widest = out_widest }, Elementwise)
end

-- the inputs as source() takes them, scalar where mask has their bit
local function inputs(self, mask)
  local ins = {}
  for i, v in ipairs(self.ins) do ins[i] = { dtype = v.dtype, name = v.name, scalar = mask & (1 << (i - 1)) ~= 0, raw = v.raw } end
  return ins
end

-- module mod's kernel kept for calls of this mask and width on device dev
local function keep(self, mask, w, dev, mod)
  local per = self.kernels[dev]
  if not per then per = {}; self.kernels[dev] = per end
  local k = mod:get("cudalua_elementwise")
  per[mask * 32 + w] = k
  return k
end

-- the kernel for this call's scalars (mask: a bit per scalar input) and vector width (1..16),
-- compiled once per signature and device
local function kernel_for(self, mask, w, dev)
  local k = (self.kernels[dev] or NO_OPTS)[mask * 32 + w]
  if k then return k end
  local src = source(inputs(self, mask), self.outs, self.body, w)
  local ok, mod = pcall(self.cuda.compile, src, { name = self.name .. ".cu" })
  -- named as the call that compiled it (the first with these argument kinds)
  if not ok then
    check.error(self.where, 3, "its code does not compile: %s", check.cause(mod))
  end
  return keep(self, mask, w, dev, mod)
end

-- ew:precompile([scalars]): the kernels of the calls whose inputs named in scalars are Lua
-- numbers (the others arrays), at both vector widths a call can take, compiled now and at once
-- (cuda.compile_all) on the selected device, not at the first such calls
function Elementwise:precompile(scalars)
  local where = "elementwise:precompile"
  if scalars ~= nil and type(scalars) ~= "table" then
    check.error(where, 2, "expected a list of input names, got %s", type(scalars))
  end
  local mask = 0
  for i, name in ipairs(scalars or NO_OPTS) do
    local bit
    for j, p in ipairs(self.ins) do if p.name == name then bit = 1 << (j - 1) end end
    if not bit then check.error(where, 2, "scalars[%d]: %s is not an input of elementwise '%s'", i, tostring(name), self.name) end
    mask = mask | bit
  end
  local widest = self.out_widest
  for i, p in ipairs(self.ins) do
    if mask & (1 << (i - 1)) == 0 then widest = math.max(widest, p.itemsize) end
  end
  local widths, list = { 1, 16 // widest }, {}
  if widths[2] == 1 then widths[2] = nil end
  for i, w in ipairs(widths) do list[i] = { source(inputs(self, mask), self.outs, self.body, w), { name = self.name .. ".cu" } } end
  local mods, errs = compile.compile_all(list)
  local err = errs and (errs[1] or errs[2])
  if err then check.error(where, 2, "the code of elementwise '%s' does not compile: %s", self.name, err) end
  local dev = self.cuda.current_device()
  for i, w in ipairs(widths) do keep(self, mask, w, dev, mods[i]) end
  return self
end

-- a device address that allows w-wide vector accesses of itemsize-byte elements
local function aligned(ptr, itemsize, w) return ptr and ptr % (itemsize * w) == 0 end

local function is_pair(v)
  return type(v) == "table" and getmetatable(v) == nil and rawlen(v) == 2
end

-- an open array's size, dtype, device address (nil for a pageable host array) and whether it
-- is contiguous; nil for anything else
local function array_of(v)
  local ok, n, dt, kind, ptr, _, contig = pcall(core.array_info, v)
  if ok and n then return n, dt, kind ~= "array" and ptr or nil, contig end
end

-- the call's options (a trailing plain table, unless it is a {re, im} pair; taken out of
-- args) -> stream, block. The helpers below raise at level 3: the caller of __call
local function call_options(self, args)
  local where, opts = self.where, nil
  if args.n > 0 and type(args[args.n]) == "table" and getmetatable(args[args.n]) == nil
     and rawlen(args[args.n]) == 0 then
    opts = args[args.n]
    args[args.n] = nil   -- not an output either
    args.n = args.n - 1
  end
  local nin, nout = #self.ins, #self.outs
  if args.n ~= nin and args.n ~= nin + nout then
    check.error(where, 3, "expected %d inputs (and optionally %d outputs), got %d arguments", nin, nout, args.n)
  end
  local stream, block = nil, 256
  for k, v in pairs(opts or NO_OPTS) do
    if not EW_OPTS[k] then check.unknown(k, { "block", "stream" }, where, 4) end
    if k == "stream" then
      if not check.is_stream(v) then
        check.error(where, 3, "stream must be a cudalua stream, got %s", type(v))
      end
      stream = v
    end
    if k == "block" then
      if math.type(v) ~= "integer" or v < 1 or v > 1024 then
        check.error(where, 3, "block must be an integer from 1 to 1024")
      end
      block = v
    end
  end
  return stream, block
end

-- what the arguments say: scan.n (elements) and scan.first (who said it), scan.mask (a bit
-- per scalar input), scan.ptrs (each array argument's device address by position, false: none;
-- for the alignment check), scan.shape_of (the first array input), scan.widest (the widest
-- itemsize among the arrays)
local function check_array(self, scan, v, p, role, i)
  local where = self.where
  local size, dt, ptr, contig = array_of(v)
  if not size then
    if role == "output" then check.error(where, 4, "output %s must be an array, got %s", p.name, type(v)) end
    check.error(where, 4, "input %s must be a number%s or an array, got %s", p.name, p.complex and ", a pair {re, im}" or "", type(v))
  end
  if not contig then   -- (its kernel indexes elements one after another)
    check.error(where, 4, "%s %s is a strided view: this needs a contiguous array (a:copy() makes one)", role, p.name)
  end
  if dt ~= p.dtype then
    check.error(where, 4, "%s %s is %s, the parameter %s", role, p.name, tostring(dt), p.dtype.name)
  end
  if scan.n and size ~= scan.n then
    check.error(where, 4, "%s %s has %d elements, %s has %d", role, p.name, size, scan.first, scan.n)
  end
  scan.n, scan.first, scan.ptrs[i] = scan.n or size, scan.first or p.name, ptr or false
end

local function scan_args(self, args)
  local nin = #self.ins
  local scan = { mask = 0, ptrs = {}, widest = self.out_widest }
  for i, p in ipairs(self.ins) do   -- numbers broadcast, arrays all of one size
    local v = args[i]
    if p.raw then   -- (any size: the body indexes it)
      local size, dt, _, contig = array_of(v)
      if not size then check.error(self.where, 3, "raw input %s must be an array, got %s", p.name, type(v)) end
      if dt ~= p.dtype then check.error(self.where, 3, "raw input %s is %s, the parameter %s", p.name, tostring(dt), p.dtype.name) end
      if not contig then check.error(self.where, 3, "raw input %s is a strided view: this needs a contiguous array", p.name) end
    elseif type(v) == "number" or type(v) == "boolean" or (p.complex and is_pair(v)) then
      scan.mask = scan.mask | (1 << (i - 1))
    else
      check_array(self, scan, v, p, "input", i)
      scan.shape_of, scan.widest = scan.shape_of or v, math.max(scan.widest, p.itemsize)
    end
  end
  for j, p in ipairs(self.outs) do   -- the outputs go in args, after the inputs
    if args[nin + j] ~= nil then check_array(self, scan, args[nin + j], p, "output", nin + j) end
  end
  if not scan.n then
    check.error(self.where, 3, "no array among the inputs or outputs says how many elements")
  end
  return scan
end

-- the vector width: 16 bytes of the widest type, when every array's pointer allows it (a
-- pageable host array has none: copied for the launch, it gets no vector loads)
local function vector_width(self, args, scan)
  local nin, w = #self.ins, 16 // scan.widest
  if w == 1 or scan.n < w * 1024 then return 1 end
  for i, p in ipairs(self.ins) do
    if not p.raw and scan.mask & (1 << (i - 1)) == 0 and not aligned(scan.ptrs[i], p.itemsize, w) then return 1 end
  end
  for j, p in ipairs(self.outs) do
    local ptr = scan.ptrs[nin + j]
    if ptr == nil then ptr = args[nin + j]:ptr() end   -- nil: allocated by the call
    if not aligned(ptr, p.itemsize, w) then return 1 end
  end
  return w
end

-- ew(in1, in2, ... [, out1, ...] [, opts]) -> the outputs
function Elementwise.__call(self, ...)
  local args = table.pack(...)
  local nin, nout = #self.ins, #self.outs
  local stream, block = call_options(self, args)
  local scan = scan_args(self, args)
  local cuda, n = self.cuda, scan.n
  for j, p in ipairs(self.outs) do
    if args[nin + j] == nil then args[nin + j] = cuda.device_array(scan.shape_of and scan.shape_of.shape or n, p.dtype, stream) end
  end
  local w = vector_width(self, args, scan)
  local dev = cuda.current_device()
  local k = kernel_for(self, scan.mask, w, dev)
  if n > 0 then
    local sms = M.multiprocessors(cuda, dev)
    local work = (n + w - 1) // w
    local grid = math.max(1, math.min((work + block - 1) // block, sms * (2048 // block) * 2))
    args[nin + nout + 1] = n
    k[{ grid, block, stream }](table.unpack(args, 1, nin + nout + 1))
  end
  return table.unpack(args, nin + 1, nin + nout)
end

Elementwise.__tostring = function(self)
  return ("cudalua.elementwise<%s>"):format(self.name)
end

return M
