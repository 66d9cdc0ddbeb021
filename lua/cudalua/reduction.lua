-- cudalua.reduction: CuPy's ReductionKernel for cudalua, along any axes of strided arrays.
--   local mean = cuda.reduction("float32 x", "float32 y", "x", "a + b", "y = a / _count", "0")
--   local rows = mean(d, { axis = 2 })            -- one value per row: shape {rows}
--   mean(d:T(), { axis = 2, out = cols, stream = s })
-- map_expr is computed for every element from the inputs (by their names; Lua numbers passed
-- as inputs are broadcast), reduce_expr folds two mapped values a and b, identity starts each
-- fold, and post_map_expr writes the outputs from the result a (_count: how many elements were
-- folded into it). Inputs may be strided views (Array:sub, Array:transpose); the outputs are
-- contiguous, of the kept axes' shape (keepdims: the reduced axes kept with extent 1; all axes
-- reduced without keepdims: shape {1}). One kernel per signature, layout class and block shape.
-- The kernel (after CuPy's: a block of threads, `stride` consecutive outputs and the rest of
-- its threads lanes of each fold): stride 1 when the inputs' innermost element step is along a
-- reduced axis (a block folds one output, reading along it), else 32 outputs side by side, each
-- lane reading its row of them at once; the lanes' partial results meet in shared memory.
local core = ...
local compile = require "cudalua.compile"
local check = require "cudalua.check"
local elementwise = require "cudalua.elementwise"

local M = {}
local BLOCK = 512
local WHERE = "cuda.reduction"

local Reduction = {}
Reduction.__index = Reduction
Reduction.__name = "cudalua.reduction"

-- a call's error at level (counted from here), named as the reduction; up: the levels of a
-- caller's own between it and the user's code (cuda.reduce's along axes)
local function fail(self, level, ...)
  check.error(self.where, level + 1 + (self.up or 0), ...)
end

local function expr_arg(v, what, level)
  if type(v) ~= "string" or v:match("^%s*$") then
    check.error(WHERE, level, "%s must be a string of CUDA C++, got %s", what,
      type(v) == "string" and "an empty one" or type(v))
  end
  return v
end

-- cuda.reduction(in_params, out_params, map_expr, reduce_expr, post_map_expr, identity [, name | opts])
-- opts: { name =, reduce_type = "float64" (the fold's type; default the first output's) }
function M.reduction(cuda, in_params, out_params, map_expr, reduce_expr, post_map_expr, identity, opts)
  local ins = elementwise.parse_params(in_params, WHERE, 3)
  local outs = elementwise.parse_params(out_params, WHERE, 3)
  for _, p in ipairs(ins) do if p.raw then check.error(WHERE, 2, "input %s: raw parameters are elementwise's", p.name) end end
  for _, p in ipairs(outs) do if p.raw then check.error(WHERE, 2, "output %s: raw parameters are elementwise's", p.name) end end
  if #ins == 0 then check.error(WHERE, 2, "give at least one input parameter") end
  if #outs == 0 then check.error(WHERE, 2, "give at least one output parameter") end
  for _, p in ipairs(ins) do
    if p.name == "a" or p.name == "b" or p.name == "_count" then
      check.error(WHERE, 2, "parameter name %s is the reduction's own (a and b are reduce_expr's operands)", p.name)
    end
    for _, o in ipairs(outs) do
      if o.name == p.name then check.error(WHERE, 2, "%s is both an input and an output", o.name) end
    end
  end
  for _, o in ipairs(outs) do
    if o.name == "a" or o.name == "b" or o.name == "_count" then
      check.error(WHERE, 2, "parameter name %s is the reduction's own (a and b are reduce_expr's operands)", o.name)
    end
  end
  expr_arg(map_expr, "map_expr", 3)
  expr_arg(reduce_expr, "reduce_expr", 3)
  expr_arg(post_map_expr, "post_map_expr", 3)
  if type(identity) == "number" then identity = tostring(identity) end
  expr_arg(identity, "identity", 3)
  if type(opts) == "string" then opts = { name = opts } end
  if opts ~= nil and type(opts) ~= "table" then
    check.error(WHERE, 2, "the 7th argument is a name or {name =, reduce_type =}, got %s", type(opts))
  end
  opts = opts or {}
  check.options(opts, { "name", "reduce_type" }, WHERE, 3)
  local name = opts.name or "reduction"
  if type(name) ~= "string" or not name:match("^[%a_][%w_]*$") then check.error(WHERE, 2, "name must be an identifier") end
  local rtype = outs[1].dtype
  if opts.reduce_type ~= nil then
    local ok, d = pcall(core.dtype, opts.reduce_type)
    if not ok then check.error(WHERE, 2, "reduce_type: unknown dtype %s", tostring(opts.reduce_type)) end
    rtype = d
  end
  return setmetatable({ cuda = cuda, ins = ins, outs = outs, map = map_expr, reduce = reduce_expr,
                        post = post_map_expr, identity = identity, rtype = rtype, name = name,
                        where = ("reduction '%s'"):format(name), kernels = {} }, Reduction)
end

-- ---- the kernel's source ----
-- ins: the inputs ({dtype, name, scalar}); nk, nr: the kept and reduced axes after merging;
-- stride: outputs a block folds side by side. Parameters: the inputs, the outputs, then the
-- kept axes' extents, the reduced axes' extents, and each array input's strides (bytes) over
-- the kept then the reduced axes, then the count of outputs and of elements folded into each.
local function params(self, ins, nk, nr)
  local p, headers, complex = {}, {}, false
  local function need(d)
    local _, header = compile.value_type(d)
    if header then headers[header] = true end
    complex = complex or elementwise.STORED[d.name] ~= nil
  end
  need(self.rtype)
  for _, v in ipairs(ins) do
    need(v.dtype)
    local ct = elementwise.ctype(v.dtype)
    p[#p + 1] = v.scalar and ("%s %s_"):format(ct, v.name) or ("const char *__restrict__ %s_"):format(v.name)
  end
  for _, v in ipairs(self.outs) do
    need(v.dtype)
    p[#p + 1] = ("%s *__restrict__ %s_"):format(elementwise.ctype(v.dtype), v.name)
  end
  for k = 1, nk do p[#p + 1] = "long long _cl_ke" .. k end
  for k = 1, nr do p[#p + 1] = "long long _cl_re" .. k end
  for _, v in ipairs(ins) do
    if not v.scalar then
      for k = 1, nk do p[#p + 1] = ("long long _cl_ks_%s%d"):format(v.name, k) end
      for k = 1, nr do p[#p + 1] = ("long long _cl_rs_%s%d"):format(v.name, k) end
    end
  end
  p[#p + 1] = "long long _cl_nout, long long _count"
  local L = {}
  for h in pairs(headers) do L[#L + 1] = h end
  table.sort(L)   -- the same source, so the same cache entry, every time
  if complex then L[#L + 1] = elementwise.CONVERT end
  return p, L
end

-- the fold of one output (its first element's offsets from its digits over the kept axes,
-- then the lane's elements) into a
local function fold_loop(self, ins, nk, nr, L)
  local S, vt = elementwise.STORED, elementwise.value
  local arrays = {}
  for _, v in ipairs(ins) do if not v.scalar then arrays[#arrays + 1] = v end end
  local function each(fmt, k) for _, v in ipairs(arrays) do L[#L + 1] = fmt:format(v.name, v.name, v.name, k) end end
  each("      long long _cl_b_%s = 0;")
  if nk > 0 then
    L[#L + 1] = "      long long _cl_q = _cl_o, _cl_d;"
    for k = nk, 1, -1 do
      L[#L + 1] = ("      _cl_d = _cl_q %% _cl_ke%d; _cl_q /= _cl_ke%d;"):format(k, k)
      for _, v in ipairs(arrays) do L[#L + 1] = ("      _cl_b_%s += _cl_d * _cl_ks_%s%d;"):format(v.name, v.name, k) end
    end
  end
  L[#L + 1] = "      #pragma unroll 8"   -- (H100, 8192^2 float32: 4 -> 8 took rows 101 -> 95 us)
  L[#L + 1] = "      for (long long _cl_r = _cl_lr; _cl_r < _count; _cl_r += _cl_nl) {"
  if nr == 1 then
    each("        long long _cl_f_%s = _cl_b_%s + _cl_r * _cl_rs_%s1;")
  else
    each("        long long _cl_f_%s = _cl_b_%s;")
    L[#L + 1] = "        long long _cl_t = _cl_r, _cl_e;"
    for k = nr, 1, -1 do
      L[#L + 1] = ("        _cl_e = _cl_t %% _cl_re%d; _cl_t /= _cl_re%d;"):format(k, k)
      for _, v in ipairs(arrays) do L[#L + 1] = ("        _cl_f_%s += _cl_e * _cl_rs_%s%d;"):format(v.name, v.name, k) end
    end
  end
  for _, v in ipairs(ins) do
    local ct = elementwise.ctype(v.dtype)
    local x = v.scalar and (v.name .. "_") or ("*reinterpret_cast<const %s *>(%s_ + _cl_f_%s)"):format(ct, v.name, v.name)
    if S[v.dtype.name] then x = "_cl_cx(" .. x .. ")" end
    L[#L + 1] = ("        const %s %s = %s;"):format(vt(v.dtype), v.name, x)
  end
  L[#L + 1] = ("        const _cl_R b = (_cl_R)(%s);"):format(self.map)
  L[#L + 1] = ("        a = (_cl_R)(%s);"):format(self.reduce)
  L[#L + 1] = "      }"
end

-- the outputs of the fold a, written by the thread for which cond holds
local function write_out(self, L, cond)
  local S, vt = elementwise.STORED, elementwise.value
  L[#L + 1] = "    if (" .. cond .. ") {"
  for _, v in ipairs(self.outs) do L[#L + 1] = ("      %s %s;"):format(vt(v.dtype), v.name) end
  L[#L + 1] = "      { " .. self.post .. "; }"
  for _, v in ipairs(self.outs) do
    L[#L + 1] = ("      %s_[_cl_o] = %s;"):format(v.name, S[v.dtype.name] and ("_cl_raw(" .. v.name .. ")") or v.name)
  end
  L[#L + 1] = "    }"
end

-- a value of any type across the warp (__shfl_down_sync on its 4-byte words)
local SHFL = [[
template <class T> __device__ __forceinline__ T _cl_shfl_down(const T &v, int d) {
  int w[(sizeof(T) + 3) / 4];
  memcpy(w, &v, sizeof(T));
  #pragma unroll
  for (int k = 0; k < (int)((sizeof(T) + 3) / 4); k++) w[k] = __shfl_down_sync(0xffffffffu, w[k], d);
  T r;
  memcpy(&r, w, sizeof(T));
  return r;
}]]

-- a warp folds each output: its lanes along the folded elements, then shuffles (no shared
-- memory, no barrier): the rows of a matrix, each long enough for a warp
local function warp_body(self, ins, nk, nr, L)
  L[#L + 1] = "  const int _cl_lr = threadIdx.x % 32, _cl_nl = 32, _cl_nw = blockDim.x / 32;"
  L[#L + 1] = "  for (long long _cl_o = (long long)blockIdx.x * _cl_nw + threadIdx.x / 32; _cl_o < _cl_nout;"
  L[#L + 1] = "       _cl_o += (long long)gridDim.x * _cl_nw) {"
  L[#L + 1] = ("    _cl_R a = (_cl_R)(%s);"):format(self.identity)
  L[#L + 1] = "    {"
  fold_loop(self, ins, nk, nr, L)
  L[#L + 1] = "    }"
  L[#L + 1] = "    #pragma unroll"
  L[#L + 1] = "    for (int _cl_s = 16; _cl_s > 0; _cl_s >>= 1) {"
  L[#L + 1] = "      const _cl_R b = _cl_shfl_down(a, _cl_s);"
  L[#L + 1] = ("      a = (_cl_R)(%s);"):format(self.reduce)
  L[#L + 1] = "    }"
  write_out(self, L, "_cl_lr == 0")
  L[#L + 1] = "  }"
end

-- the lanes of each output meet (a tree in shared memory); the first writes the outputs
local function meet(self, L)
  L[#L + 1] = "    _cl_sh[threadIdx.x] = a;"
  L[#L + 1] = "    __syncthreads();"
  L[#L + 1] = "    for (int _cl_s = _cl_nl / 2; _cl_s > 0; _cl_s >>= 1) {"
  L[#L + 1] = "      if (_cl_lr < _cl_s) {"
  L[#L + 1] = "        const _cl_R b = _cl_sh[threadIdx.x + _cl_s * _cl_S];"
  L[#L + 1] = ("        a = (_cl_R)(%s);"):format(self.reduce)
  L[#L + 1] = "        _cl_sh[threadIdx.x] = a;"
  L[#L + 1] = "      }"
  L[#L + 1] = "      __syncthreads();"
  L[#L + 1] = "    }"
  write_out(self, L, "_cl_lr == 0 && _cl_o < _cl_nout")
  L[#L + 1] = "    __syncthreads();"
end

local function source(self, ins, nk, nr, stride)
  local p, L = params(self, ins, nk, nr)
  L[#L + 1] = ("typedef %s _cl_R;"):format(elementwise.value(self.rtype))
  if self.preamble then L[#L + 1] = self.preamble end   -- (cuda.reduce's {body =, preamble =})
  if stride == 0 then L[#L + 1] = SHFL end
  L[#L + 1] = ('extern "C" __global__ void cudalua_reduction(%s) {'):format(table.concat(p, ", "))
  if stride == 0 then
    warp_body(self, ins, nk, nr, L)
    L[#L + 1] = "}"
    return table.concat(L, "\n")
  end
  L[#L + 1] = "  extern __shared__ unsigned char _cl_raw_sh[];"
  L[#L + 1] = "  _cl_R *_cl_sh = reinterpret_cast<_cl_R *>(_cl_raw_sh);"
  L[#L + 1] = ("  const int _cl_S = %d, _cl_lo = threadIdx.x %% _cl_S, _cl_lr = threadIdx.x / _cl_S;"):format(stride)
  L[#L + 1] = "  const int _cl_nl = blockDim.x / _cl_S;"
  L[#L + 1] = "  for (long long _cl_ob = (long long)blockIdx.x * _cl_S; _cl_ob < _cl_nout;"
  L[#L + 1] = "       _cl_ob += (long long)gridDim.x * _cl_S) {"
  L[#L + 1] = "    long long _cl_o = _cl_ob + _cl_lo;"
  L[#L + 1] = ("    _cl_R a = (_cl_R)(%s);"):format(self.identity)
  L[#L + 1] = "    if (_cl_o < _cl_nout) {"
  fold_loop(self, ins, nk, nr, L)
  L[#L + 1] = "    }"
  meet(self, L)
  L[#L + 1] = "  }"
  L[#L + 1] = "}"
  return table.concat(L, "\n")
end
M.source = source

-- ---- a call's layout ----
-- the axes to fold (a set of 0-based axes) from opts.axis: nil (all), an axis or a list
local function axes_of(self, ndim, axis)
  local set, list = {}, {}
  if axis == nil then
    for d = 0, ndim - 1 do set[d] = true end
    return set
  end
  if math.type(axis) == "integer" then list = { axis }
  elseif type(axis) == "table" then list = axis
  else fail(self, 3, "axis must be an integer or a list of integers, got %s", type(axis)) end
  for i, k in ipairs(list) do
    if math.type(k) ~= "integer" then fail(self, 3, "axis[%d] must be an integer, got %s", i, type(k)) end
    local d = k < 0 and k + ndim or k - 1
    if d < 0 or d >= ndim then fail(self, 3, "axis %d out of range (1..%d, or -1..-%d)", k, ndim, ndim) end
    if set[d] then fail(self, 3, "axis %d is named twice", k) end
    set[d] = true
  end
  return set
end

-- the kept and reduced axes, merged where every array input steps along two as along one:
-- { ext = {...}, st = { [name] = {...} } } for each
-- (fold: the folded axes' set; folded: true for those, false for the kept ones)
local function merged(shape, strides_of, names, fold, folded)
  local out = { ext = {}, st = {} }
  for _, n in ipairs(names) do out.st[n] = {} end
  for d = 1, #shape do
    if (fold[d - 1] or false) == folded and shape[d] ~= 1 then
      local k = #out.ext
      local joins = k > 0
      for _, n in ipairs(names) do
        joins = joins and out.st[n][k] == strides_of[n][d] * shape[d]
      end
      if joins then
        out.ext[k] = out.ext[k] * shape[d]
        for _, n in ipairs(names) do out.st[n][k] = strides_of[n][d] end
      else
        out.ext[k + 1] = shape[d]
        for _, n in ipairs(names) do out.st[n][k + 1] = strides_of[n][d] end
      end
    end
  end
  return out
end

local CALL_OPTS = { "axis", "keepdims", "out", "stream" }
local NONE = {}

-- the call's arguments: the inputs (arrays of one shape, or numbers), the outputs if given,
-- and the options table last
local function read_args(self, args)
  local opts = NONE
  local last = args[args.n]
  if args.n > 0 and type(last) == "table" and getmetatable(last) == nil and rawlen(last) == 0 then
    opts = args[args.n]
    args[args.n], args.n = nil, args.n - 1
    check.options(opts, CALL_OPTS, self.where, 4)
  end
  if args.n < #self.ins then
    fail(self, 3, "%d inputs given, it takes %d (%s)", args.n, #self.ins, self.ins[#self.ins].name)
  end
  if opts.stream ~= nil and not check.is_stream(opts.stream) then
    fail(self, 3, "stream: expected a stream, got %s", type(opts.stream))
  end
  return opts
end

-- the inputs: scalars (a mask bit each), the arrays' shape and strides
local function scan_inputs(self, args)
  local mask, shape, first, strides_of, names, width = 0, nil, nil, {}, {}, nil
  for i, p in ipairs(self.ins) do
    local v = args[i]
    if type(v) == "number" or type(v) == "boolean" then
      mask = mask | (1 << (i - 1))
    else
      local n, dt, kind = core.array_info(v)
      if not n and type(getmetatable(v)) == "table" and getmetatable(v).__cuda_array_interface then
        v = self.cuda.as_cuda_array(v); args[i] = v
        n, dt, kind = core.array_info(v)
      end
      if not n then fail(self, 3, "input %s must be a number or an array, got %s", p.name, type(v)) end
      if kind == "array" then
        fail(self, 3, "input %s is a pageable host array: give a device (or pinned, mapped, managed) array", p.name)
      end
      if dt ~= p.dtype then fail(self, 3, "input %s is %s, the parameter %s", p.name, tostring(dt), p.dtype.name) end
      local sh = v.shape
      if shape then
        local same = #sh == #shape
        for d = 1, #sh do same = same and sh[d] == shape[d] end
        if not same then
          fail(self, 3, "input %s has shape {%s}, %s has {%s}", p.name, table.concat(sh, ", "), first,
            table.concat(shape, ", "))
        end
      end
      shape, first = shape or sh, first or p.name
      strides_of[p.name] = v.strides
      names[#names + 1], width = p.name, width or p.dtype.itemsize
    end
  end
  if not shape then fail(self, 3, "no array among the inputs says the shape") end
  return mask, shape, strides_of, names, width   -- (width: the first array input's itemsize)
end

-- the outputs' shape: the kept axes (keepdims: every axis, the folded ones of extent 1)
local function out_shape(shape, fold, keepdims)
  local s = {}
  for d = 1, #shape do
    if not fold[d - 1] then s[#s + 1] = shape[d] elseif keepdims then s[#s + 1] = 1 end
  end
  if #s == 0 then s[1] = 1 end
  return s
end

local function prod(t) local n = 1 for _, x in ipairs(t) do n = n * x end return n end

-- the block's shape: when the smallest step of the first array input is along a folded axis,
-- a warp per output (0) where there are outputs enough for a warp on each of the device's
-- slots and elements enough for a warp's lanes, else a block per output (1); otherwise 32
-- outputs side by side, fewer (down to 64 bytes of a row a warp) while the blocks would not
-- fill the device twice (H100, the columns of 8192^2 float32: 32 bytes 143 us, 64 bytes 135,
-- 128 bytes 214)
local function stride_for(kept, red, first, itemsize, nout, count, sms)
  local kmin, rmin = math.huge, math.huge
  for _, s in ipairs(kept.st[first] or NONE) do kmin = math.min(kmin, s) end
  for _, s in ipairs(red.st[first] or NONE) do rmin = math.min(rmin, s) end
  if rmin <= kmin then return (count >= 64 and nout >= sms * 32) and 0 or 1 end
  local stride, least = 32, math.max(1, 64 // itemsize)
  while stride > least and (nout + stride - 1) // stride < sms * (2048 // BLOCK) * 2 do stride = stride // 2 end
  return stride
end

-- the inputs as source() takes them
local function inputs(self, mask)
  local ins = {}
  for i, v in ipairs(self.ins) do ins[i] = { dtype = v.dtype, name = v.name, scalar = mask & (1 << (i - 1)) ~= 0 } end
  return ins
end

-- (kernels: per device, by an integer of mask, the axes (at most 8 each) and the stride (< 1024))
local function kernel_for(self, mask, nk, nr, stride, dev)
  local per = self.kernels[dev]
  if not per then per = {}; self.kernels[dev] = per end
  local key = ((mask * 16 + nk) * 16 + nr) * 1024 + stride
  local k = per[key]
  if k then return k end
  local src = source(self, inputs(self, mask), nk, nr, stride)
  local ok, mod = pcall(self.cuda.compile, src, { name = self.name .. ".cu" })
  if not ok then fail(self, 3, "its code does not compile: %s", check.cause(mod)) end
  k = mod:get("cudalua_reduction")
  per[key] = k
  return k
end


-- r(in1, ... [, out1, ...] [, {axis =, keepdims =, out =, stream =}]) -> the outputs
function Reduction.__call(self, ...)
  local args = table.pack(...)
  local opts = read_args(self, args)
  local mask, shape, strides_of, names, width = scan_inputs(self, args)
  local fold = axes_of(self, #shape, opts.axis)
  local kept = merged(shape, strides_of, names, fold, false)
  local red = merged(shape, strides_of, names, fold, true)
  local oshape = out_shape(shape, fold, opts.keepdims)
  local nout, count = prod(kept.ext), prod(red.ext)
  local cuda, stream, nin = self.cuda, opts.stream, #self.ins
  local outs = {}
  for j, p in ipairs(self.outs) do
    local o = args[nin + j]
    if o == nil and j == 1 then o = opts.out end
    if o == nil then
      o = cuda.device_array(oshape, p.dtype, stream)
    else
      local n, dt, kind, _, _, contig = core.array_info(o)
      if not n then fail(self, 2, "output %s must be an array, got %s", p.name, type(o)) end
      if kind == "array" then fail(self, 2, "output %s is a pageable host array", p.name) end
      if dt ~= p.dtype then
        fail(self, 2, "output %s is %s, the parameter %s", p.name, tostring(dt), p.dtype.name)
      end
      if n ~= nout then fail(self, 2, "output %s has %d elements, the result %d", p.name, n, nout) end
      if not contig then fail(self, 2, "output %s is a strided view: this needs a contiguous array", p.name) end
    end
    outs[j] = o
  end
  -- (serial: each result folded by one thread, in order: cuda.reduce's operations not known to commute)
  local dev = cuda.current_device()
  local sms = elementwise.multiprocessors(cuda, dev)
  local stride = self.serial and BLOCK or stride_for(kept, red, names[1], width, nout, count, sms)
  local k = kernel_for(self, mask, #kept.ext, #red.ext, stride, dev)
  if nout > 0 then
    local kargs = {}
    for i = 1, nin do kargs[#kargs + 1] = args[i] end
    for j = 1, #outs do kargs[#kargs + 1] = outs[j] end
    for _, e in ipairs(kept.ext) do kargs[#kargs + 1] = e end
    for _, e in ipairs(red.ext) do kargs[#kargs + 1] = e end
    for _, n in ipairs(names) do
      for _, s in ipairs(kept.st[n]) do kargs[#kargs + 1] = s end
      for _, s in ipairs(red.st[n]) do kargs[#kargs + 1] = s end
    end
    kargs[#kargs + 1] = nout
    kargs[#kargs + 1] = count
    local per = stride == 0 and BLOCK // 32 or stride   -- (outputs a block takes at once)
    local grid = math.max(1, math.min((nout + per - 1) // per, sms * (2048 // BLOCK) * 4))
    k:launch({ grid = grid, block = BLOCK, stream = stream, shared = BLOCK * self.rtype.itemsize }, table.unpack(kargs))
  end
  return table.unpack(outs)
end

Reduction.__tostring = function(self) return ("cudalua.reduction<%s>"):format(self.name) end

return M
