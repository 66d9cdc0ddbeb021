-- cudalua.compile: runtime compilation with NVRTC, and the modules and kernels it gives.
-- Parameter types are read from the compiler, not from signature strings: every kernel found
-- in the source (and every name expression) gets a probe instantiation
-- __cudalua_sig<decltype(kernel)>, whose mangled name spells the kernel's parameter types.
local core = ...
local cache = require "cudalua.cache"
local M = {}

local PROBE = "__cudalua_sig"
local PROBE_SRC = '\n#line 1 "cudalua-probe"\ntemplate<typename T> __global__ void ' .. PROBE .. '() {}\n'

---------------------------------------------------------------------------------------------
-- Itanium C++ ABI demangling, for the one shape we generate: _Z13__cudalua_sigIF<ret><params>EEvv
local builtin = { v = "void", b = "bool", c = "char", a = "signed char", h = "unsigned char",
  s = "short", t = "unsigned short", i = "int", j = "unsigned int", l = "long",
  m = "unsigned long", x = "long long", y = "unsigned long long", f = "float", d = "double",
  e = "long double", n = "__int128", o = "unsigned __int128", w = "wchar_t", z = "..." }
local code_of = { bool = "b", char = "a", ["signed char"] = "a", ["unsigned char"] = "A",
  short = "s", ["unsigned short"] = "S", int = "i", ["unsigned int"] = "I", long = "l",
  ["unsigned long"] = "L", ["long long"] = "l", ["unsigned long long"] = "L", float = "f",
  double = "d", __half = "e", _Float16 = "e", __nv_bfloat16 = "E" }
local std_abbrev = { a = "std::allocator", b = "std::basic_string", s = "std::string",
  i = "std::istream", o = "std::ostream", d = "std::iostream" }

local function demangle_params(s)
  local pos, subs = 1, {}
  local function fail(why) error(("cannot read the type signature %s (%s at %d)"):format(s, why, pos), 0) end
  local function peek(n) return s:sub(pos, pos + (n or 1) - 1) end
  local parse_type, template_args
  local function source_name()
    local len = s:match("^%d+", pos)
    if not len then fail("expected a name") end
    pos = pos + #len
    local name = s:sub(pos, pos + tonumber(len) - 1)
    pos = pos + tonumber(len)
    return name
  end
  local function add(t) subs[#subs + 1] = t; return t end
  local function with_template(t)
    if peek() == "I" then
      local args = template_args()
      local names = {}
      for i, a in ipairs(args) do names[i] = a.name end
      t = add { kind = "class", name = t.name .. "<" .. table.concat(names, ", ") .. ">" }
    end
    return t
  end
  function template_args()
    pos = pos + 1 -- I
    local args = {}
    while peek() ~= "E" do
      if pos > #s then fail("unterminated template arguments") end
      if peek() == "L" then -- literal: L<type><value>E
        local e = s:find("E", pos, true) or fail("bad literal")
        local lit = s:sub(pos + 1, e - 1) -- <builtin type letter><value>, n for minus
        local v = builtin[lit:sub(1, 1)] and lit:sub(2) or lit
        if lit:sub(1, 1) == "b" then v = v == "1" and "true" or "false" end
        args[#args + 1] = { kind = "literal", name = (v:gsub("^n", "-")) }
        pos = e + 1
      else
        args[#args + 1] = parse_type()
      end
    end
    pos = pos + 1
    return args
  end
  function parse_type()
    local c = peek()
    if builtin[c] then pos = pos + 1; return { kind = "builtin", name = builtin[c] } end
    if c == "D" then
      local two = peek(2)
      if two == "Dh" then pos = pos + 2; return { kind = "builtin", name = "_Float16" } end
      if two == "Dn" then pos = pos + 2; return { kind = "builtin", name = "decltype(nullptr)" } end
      local bits = s:match("^DF(%d+)_", pos)
      if bits then pos = pos + 3 + #bits; return { kind = "builtin", name = "_Float" .. bits } end
      fail("unsupported builtin type")
    end
    if c == "r" or c == "V" or c == "K" then
      local q = s:match("^[rVK]+", pos)
      pos = pos + #q
      local inner = parse_type()
      local words = {}
      if q:find("K") then words[#words + 1] = "const" end
      if q:find("V") then words[#words + 1] = "volatile" end
      local w = table.concat(words, " ")
      -- C spelling: a qualified pointer takes the qualifier after the star
      local name = inner.kind == "ptr" and (inner.name .. " " .. w) or (w .. " " .. inner.name)
      return add { kind = "qual", const = q:find("K") ~= nil, inner = inner, name = name }
    end
    if c == "P" or c == "R" or c == "O" then
      pos = pos + 1
      local inner = parse_type()
      return add { kind = c == "P" and "ptr" or "ref", inner = inner,
                   name = inner.name .. (c == "P" and "*" or "&") }
    end
    if c:match("%d") then
      local t = add { kind = "class", name = source_name() }
      return with_template(t)
    end
    if c == "N" then
      pos = pos + 1
      local parts = {}
      while peek() ~= "E" do
        if pos > #s then fail("unterminated nested name") end
        if peek() == "S" then
          parts[#parts + 1] = parse_type().name
        else
          parts[#parts + 1] = source_name()
          add { kind = "class", name = table.concat(parts, "::") }
          if peek() == "I" then
            local t = with_template { name = table.concat(parts, "::") }
            parts = { t.name }
          end
        end
      end
      pos = pos + 1
      return { kind = "class", name = table.concat(parts, "::") }
    end
    if c == "S" then
      local nx = s:sub(pos + 1, pos + 1)
      if nx == "t" then
        pos = pos + 2
        local t = add { kind = "class", name = "std::" .. source_name() }
        return with_template(t)
      end
      if std_abbrev[nx] then pos = pos + 2; return with_template { kind = "class", name = std_abbrev[nx] } end
      local seq = s:match("^S(%w*)_", pos) or fail("bad substitution")
      pos = pos + #seq + 2
      local idx = seq == "" and 1 or tonumber(seq, 36) + 2
      local t = subs[idx] or fail("substitution out of range")
      return with_template(t)
    end
    if c == "F" then
      pos = pos + 1
      if peek() == "Y" then pos = pos + 1 end
      local ret = parse_type()
      local params = {}
      while peek() ~= "E" do
        if pos > #s then fail("unterminated function type") end
        params[#params + 1] = parse_type()
      end
      pos = pos + 1
      if #params == 1 and params[1].name == "void" then params = {} end
      return add { kind = "function", ret = ret, params = params, name = "function" }
    end
    fail("unsupported type")
  end
  -- _Z <len>__cudalua_sig I F ... E E v v
  if s:sub(1, 2) ~= "_Z" then fail("not a mangled name") end
  pos = 3
  add { kind = "class", name = source_name() } -- the template name is substitution S_
  if peek() ~= "I" then fail("expected template arguments") end
  local args = template_args()
  if not args[1] or args[1].kind ~= "function" then fail("expected a function type") end
  return args[1].params
end

-- parameter types -> code letters (see src/module.c) and C spellings for messages
local function param_codes(params)
  local codes, types = {}, {}
  for i, p in ipairs(params) do
    local t = p
    while t.kind == "qual" do t = t.inner end -- top-level qualifiers do not change passing
    if t.kind == "ptr" then
      local pointee = t.inner
      codes[i] = (pointee.kind == "qual" and pointee.const) and "q" or "p"
    elseif t.kind == "ref" then
      error(("parameter %d is a reference (%s): kernels take values and pointers"):format(i, p.name), 0)
    else
      codes[i] = code_of[t.name] or "x"
    end
    types[i] = p.name
  end
  return table.concat(codes), types
end
M.demangle_params, M.param_codes = demangle_params, param_codes

---------------------------------------------------------------------------------------------
-- finding the kernels in a source: names of non-template __global__ functions
local skip_attr = { __launch_bounds__ = true, __maxnreg__ = true, __cluster_dims__ = true,
  __noinline__ = true, __forceinline__ = true, static = true, inline = true, void = true,
  __attribute__ = true, __declspec = true }

local function strip_comments(src)
  src = src:gsub("/%*.-%*/", function(c) return (c:gsub("[^\n]", " ")) end)
  src = src:gsub("//[^\n]*", "")
  return src
end

local function find_kernels(src)
  local names, seen = {}, {}
  local code = strip_comments(src)
  local from = 1
  while true do
    local s, e = code:find("__global__", from, true)
    if not s then break end
    from = e + 1
    -- a template kernel (template<...> before __global__ in the same declaration) is reached
    -- through name expressions instead
    local before = code:sub(1, s - 1)
    local decl_start = math.max((before:match(".*()[;}{]") or 0), 0)
    local is_template = before:sub(decl_start):find("template%s*<") ~= nil
    local pos = e + 1
    while not is_template do
      local ws, ident, after = code:match("^(%s*)([%a_][%w_]*)%s*()", pos)
      if not ident then break end
      if code:sub(after, after) == "(" then
        if skip_attr[ident] then -- skip its parenthesised arguments
          local depth, i = 0, after
          repeat
            local ch = code:sub(i, i)
            if ch == "(" then depth = depth + 1 elseif ch == ")" then depth = depth - 1 end
            i = i + 1
          until depth == 0 or i > #code
          pos = i
        else
          if not seen[ident] then names[#names + 1] = ident; seen[ident] = true end
          break
        end
      else
        pos = after
      end
    end
  end
  return names
end
M.find_kernels = find_kernels

---------------------------------------------------------------------------------------------
-- where the CUDA headers are, for #include <cuda_fp16.h> and friends
local include_dir
local function cuda_include()
  if include_dir ~= nil then return include_dir end
  include_dir = false
  local nvpath = core.nvrtc_identity():match("^(.*):%d+:%d+$")
  local cands = { os.getenv("CUDA_HOME"), os.getenv("CUDA_PATH"), os.getenv("CUDA_DIR"),
                  "/usr/local/cuda", nvpath and nvpath:match("^(.*)/lib[^/]*/[^/]*$"),
                  nvpath and nvpath:match("^(.*)/lib[^/]*/[^/]*/[^/]*$") }
  for i = 1, 6 do
    local base = cands[i]
    if base and base ~= "" then
      local f = io.open(base .. "/include/cuda_fp16.h")
      if f then f:close(); include_dir = base .. "/include"; break end
    end
  end
  return include_dir
end

-- "cc90": the current device's compute capability, for cache keys (needs no NVRTC)
-- also returns the device and its compute_capability {major, minor}; level: as error()'s
local cc_of, cap_of = {}, {}
local function device_cc(level)
  if not core.is_available() then
    error("cuda.compile: " .. core.driver_error() .. "; give opts.arch (e.g. \"sm_90\") to compile without a GPU", level or 3)
  end
  local dev = core.current_device()
  if not cc_of[dev] then
    local cc = core.devices()[dev + 1].compute_capability
    cc_of[dev], cap_of[dev] = ("cc%d%d"):format(cc[1], cc[2]), cc
  end
  return cc_of[dev], dev, cap_of[dev]
end

local arch_of = {}
local function device_arch()
  local _, dev, cc = device_cc(4)
  if arch_of[dev] then return arch_of[dev] end
  local want = cc[1] * 10 + cc[2]
  local archs = core.nvrtc_archs()
  local best = 0
  for _, a in ipairs(archs) do
    if a == want then arch_of[dev] = "sm_" .. want; return arch_of[dev] end
    if a <= want and a > best then best = a end
  end
  if best == 0 then error(("cuda.compile: NVRTC cannot compile for compute capability %d.%d"):format(cc[1], cc[2]), 3) end
  arch_of[dev] = "compute_" .. best -- PTX the driver compiles for the newer device
  return arch_of[dev]
end

local function check_opts(opts)
  if opts == nil then return {} end
  if type(opts) ~= "table" then error("cuda.compile: opts must be a table, got " .. type(opts), 3) end
  local known = { options = "table", name = "string", headers = "table", arch = "string",
                  name_expressions = "table", cache = "boolean" }
  for k, v in pairs(opts) do
    if not known[k] then error(("cuda.compile: unknown option '%s'"):format(tostring(k)), 3) end
    if type(v) ~= known[k] then
      error(("cuda.compile: opts.%s must be a %s, got %s"):format(k, known[k], type(v)), 3)
    end
  end
  for i, o in ipairs(opts.options or {}) do
    if type(o) ~= "string" then error(("cuda.compile: opts.options[%d] must be a string"):format(i), 3) end
  end
  for k, v in pairs(opts.headers or {}) do
    if type(k) ~= "string" or type(v) ~= "string" then
      error("cuda.compile: opts.headers maps header names to their source text (strings)", 3)
    end
  end
  for i, e in ipairs(opts.name_expressions or {}) do
    if type(e) ~= "string" then error(("cuda.compile: opts.name_expressions[%d] must be a string"):format(i), 3) end
  end
  if opts.arch and not opts.arch:match("^sm_%d+a?$") and not opts.arch:match("^compute_%d+a?$") then
    error(("cuda.compile: arch must look like \"sm_90\" or \"compute_90\", got %q"):format(opts.arch), 3)
  end
  return opts
end

---------------------------------------------------------------------------------------------
-- modules: compiled images, loaded on the device on first use of a kernel
local Module = {}
local state = setmetatable({}, { __mode = "k" }) -- module -> private fields

local function load(mod)
  local st = state[mod]
  if not st.handle then st.handle = core.module_load(st.image) end -- a cubin, or PTX the driver compiles
  return st.handle
end

local function get_kernel(mod, expr, level)
  local st = state[mod]
  local k = st.kernels[expr]
  if k then return k end
  local info = st.info[expr]
  if not info then
    local known = {}
    for name in pairs(st.info) do known[#known + 1] = name end
    table.sort(known)
    error(("cudalua: no kernel '%s' in module %s (kernels: %s)"):format(expr, st.name,
          #known > 0 and table.concat(known, ", ") or "none found"), level + 1)
  end
  if info.error then
    error(("cudalua: kernel '%s': %s"):format(expr, info.error), level + 1)
  end
  k = core.module_kernel(load(mod), info.symbol, info.codes, { name = expr, types = info.types,
                                                              symbol = info.symbol })
  st.kernels[expr] = k
  return k
end

function Module.get(mod, expr)
  if type(expr) ~= "string" then error("module:get: expected a kernel name or name expression", 2) end
  return get_kernel(mod, expr, 2)
end

function Module.kernels(mod)
  local t = {}
  for name in pairs(state[mod].info) do t[#t + 1] = name end
  table.sort(t)
  return t
end

function Module.image(mod) return state[mod].image end
function Module.log(mod) return state[mod].log end

local module_mt = {
  __index = function(mod, key)
    local m = Module[key]
    if m then return m end
    return get_kernel(mod, key, 2)
  end,
  __newindex = function() error("cudalua: modules are read-only", 2) end,
  __tostring = function(mod) return "cudalua.module<" .. state[mod].name .. ">" end,
  __name = "cudalua.module",
}

local function new_module(e, name, arch)
  local mod = setmetatable({}, module_mt)
  state[mod] = { image = e.image, log = e.log, info = e.info, kernels = {}, name = name,
                 ptx = e.ptx, arch = arch }
  return mod
end

---------------------------------------------------------------------------------------------
function M.compile(src, opts)
  if type(src) ~= "string" then error("cuda.compile: source must be a string, got " .. type(src), 2) end
  opts = check_opts(opts)
  -- the cache is consulted before anything loads NVRTC (~5 ms): without an explicit arch the
  -- key holds the device's compute capability, and the arch NVRTC gets is chosen on a miss
  local arch = opts.arch
  local arch_key = arch or device_cc()
  local name = opts.name or "cudalua_kernel.cu"
  local options = {}
  local inc = cuda_include()
  if inc then options[#options + 1] = "-I" .. inc end
  for _, o in ipairs(opts.options or {}) do
    -- NVRTC always optimises and knows no -O1..-O3: accepted for nvcc habits, and left out
    if not o:match("^%-O[123]$") then options[#options + 1] = o end
  end
  local headers = {}
  for _, h in ipairs(core.headers) do headers[#headers + 1] = h end
  local user_headers = {}
  for k in pairs(opts.headers or {}) do user_headers[#user_headers + 1] = k end
  table.sort(user_headers)
  for _, k in ipairs(user_headers) do headers[#headers + 1] = { k, opts.headers[k] } end

  local key, mkey
  if opts.cache ~= false then
    local hparts = {}
    for _, k in ipairs(user_headers) do hparts[#hparts + 1] = #k .. ":" .. k .. #opts.headers[k] .. ":" .. opts.headers[k] end
    key = cache.key { arch_key, name, table.concat(options, "\0"), table.concat(hparts),
                      table.concat(opts.name_expressions or {}, "\0"), src }
    -- a module loads into one device's context: the memory cache is per device as well
    mkey = key .. "\0" .. (core.is_available() and core.current_device() or "")
    local mod = cache.get_memory(mkey)
    if mod then return mod end
    local e = cache.get_disk(key)
    if e then
      mod = new_module(e, name, arch_key)
      cache.put_memory(mkey, mod)
      return mod
    end
    cache.stats.misses = cache.stats.misses + 1
  end
  arch = arch or device_arch()
  table.insert(options, 1, "-arch=" .. arch)

  local found = find_kernels(src)
  -- the kernels to look up: the given scanned ones, then the user's name expressions
  local function with_user(kernels)
    local w = {}
    for _, k in ipairs(kernels) do w[#w + 1] = k end
    for _, e in ipairs(opts.name_expressions or {}) do w[#w + 1] = e end
    return w
  end
  local wanted = with_user(found)
  local function exprs_for(list)
    local ex = {}
    for _, e in ipairs(list) do ex[#ex + 1] = e; ex[#ex + 1] = PROBE .. "<decltype(" .. e .. ")>" end
    return ex
  end
  local ptx = arch:match("^compute_") ~= nil
  local image, log, lowered = core.nvrtc_compile(src .. PROBE_SRC, name, options, headers,
                                                 exprs_for(wanted), ptx)
  if not image and #found > 0 and log:find(PROBE, 1, true) then
    -- leave out the scanned kernels the log names (overloaded, in a namespace, ...)
    local keep, dropped = {}, false
    for _, k in ipairs(found) do
      local pat = "decltype ( " .. k .. " )"
      if log:find(pat, 1, true) or log:find('was: " ' .. k .. ' "', 1, true) then dropped = true
      else keep[#keep + 1] = k end
    end
    if dropped then
      local w = with_user(keep)
      local i2, l2, x2 = core.nvrtc_compile(src .. PROBE_SRC, name, options, headers, exprs_for(w), ptx)
      if i2 then image, log, lowered, wanted, found = i2, l2, x2, w, keep end
    end
  end
  if not image and #found > 0 and log:find(PROBE, 1, true) then
    -- a kernel found by scanning could not be probed (overloaded, in a namespace): compile
    -- again with only the user's name expressions
    wanted = with_user({})
    image, log, lowered = core.nvrtc_compile(src .. PROBE_SRC, name, options, headers,
                                             exprs_for(wanted), ptx)
    found = {}
  end
  if not image then
    local msg = (log or ""):gsub("%s+$", "")
    error(("cuda.compile: %s failed to compile (%s):\n%s"):format(name, lowered, msg), 2)
  end
  local info = {}
  for _, e in ipairs(wanted) do
    local sym, sig = lowered[e], lowered[PROBE .. "<decltype(" .. e .. ")>"]
    if sym and sig then
      local ok, params = pcall(demangle_params, sig)
      local entry = { symbol = sym }
      if ok then
        local ok2, codes, types = pcall(param_codes, params)
        if ok2 then entry.codes, entry.types = codes, types else entry.error = codes end
      else
        entry.error = params
      end
      info[e] = entry
    end
  end
  local e = { image = image, log = log, info = info, ptx = ptx }
  local mod = new_module(e, name, arch)
  if key then
    cache.put_memory(mkey, mod)
    cache.put_disk(key, e)
  end
  return mod
end

function M.kernel(src, name, opts)
  if type(name) ~= "string" then error("cuda.kernel: expected the kernel's name as argument 2", 2) end
  local mod = M.compile(src, opts)
  return get_kernel(mod, name, 2)
end

return M
